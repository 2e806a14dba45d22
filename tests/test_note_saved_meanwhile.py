"""A note the daemon adds to while a person's editor or a script saves it: the save made
between the daemon's read of the note and its write is kept, and so is what the daemon
added (a real daemon; the save is made by a start hook at that very point, once)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hooks import run_first, start_hook
from test_capture import config
from test_fileops import make_ops, no_temp_files

from recalld.daemon.memory import fileops
from recalld.daemon.memory.fileops import WriteConflict

#: Start hook lines: the first time the daemon publishes over a file named $SAVE_NAME, the
#: file is saved first as an editor of style $SAVE_STYLE would, with the line $SAVE_LINE
#: added: after the daemon read it, before its write.
SAVED_BEFORE_WRITE = "\n".join([
    "import os",
    "from recalld.daemon.memory import fileops",
    "real_write = fileops.write_confined",
    "done = []",
    "def saved_first(root, path, data, **kw):",
    "    target = os.path.join(root, path)",
    "    if (not done and os.path.basename(path) == os.environ['SAVE_NAME']",
    "            and os.path.exists(target)):",
    "        done.append(path)",
    "        line, style = os.environ['SAVE_LINE'], os.environ['SAVE_STYLE']",
    "        new = open(target, encoding='utf-8').read() + line + '\\n'",
    "        if style == 'rename':",
    "            tmp = os.path.join(os.path.dirname(target), '.saving')",
    "            open(tmp, 'w', encoding='utf-8').write(new)",
    "            os.replace(tmp, target)",
    "        elif style == 'truncate':",
    "            with open(target, 'r+', encoding='utf-8') as f:",
    "                f.truncate(0)",
    "                f.write(new)",
    "        else:",
    "            with open(target, 'a', encoding='utf-8') as f:",
    "                f.write(line + '\\n')",
    "    return real_write(root, path, data, **kw)",
    "fileops.write_confined = saved_first"])


@pytest.mark.parametrize("style", ["rename", "truncate", "append"])
def test_a_note_saved_between_the_read_and_the_write_keeps_both(
        daemon_factory: Any, tmp_path: Path, style: str) -> None:
    # memory.add_note read the note, added its content and wrote the whole text back:
    # a line a person saved into the note in between was gone, without a word.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, None), **start_hook(tmp_path, SAVED_BEFORE_WRITE),
                       SAVE_NAME="trip.md", SAVE_LINE="- Hotel: Казино Ρόδος 旅館 (by hand)",
                       SAVE_STYLE=style)
    first = d.call("memory.add_note", {"agent_id": "w", "session_id": "s", "name": "trip",
                                       "content": "Flights booked for 14 May."})
    note = root / first["path"]
    text = note.read_text(encoding="utf-8")
    assert "Flights booked for 14 May." in text
    # The file did not exist at the first write: the hook had nothing to save into.
    second = d.call("memory.add_note", {"agent_id": "w", "session_id": "s", "name": "trip",
                                        "content": "Seats 12A and 12B."})
    assert second["path"] == first["path"] and second["changed"] is True
    text = note.read_text(encoding="utf-8")
    assert "- Hotel: Казино Ρόδος 旅館 (by hand)" in text, text
    assert "Seats 12A and 12B." in text and "Flights booked for 14 May." in text, text
    assert text.count("Seats 12A and 12B.") == 1, text
    found = d.call("memory.search", {"agent_id": "w", "query": "Казино", "sync": True})
    assert [r["path"] for r in found["results"]] == [first["path"]]


def _saved_by_hand(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, note: Path,
                   text: str) -> None:
    """The first call of ``owner.name`` (after the operation read ``note``) is preceded by a
    person's save of ``text`` into ``note`` through a rename, as most editors save."""
    done: list[bool] = []

    def save() -> None:
        if not done:
            done.append(True)
            tmp = note.with_name(".saving")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, note)

    run_first(monkeypatch, owner, name, save)


async def test_a_node_saved_before_its_removal_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A dream's removal read the node, compared it with what it had read, then unlinked
    # whatever the file held by then: a save made in between was deleted with it.
    ops, _ = make_ops(tmp_path)
    node = tmp_path / "digest/wiki/trip.md"
    node.parent.mkdir(parents=True)
    node.write_text("Trip to Lisbon.\n", encoding="utf-8")
    saved = "Trip to Lisbon.\nHotel: 旅館 Ρόδος (by hand)\n"
    _saved_by_hand(monkeypatch, fileops, "unlink_confined", node, saved)
    with pytest.raises(WriteConflict):
        await ops.remove("digest/wiki/trip.md", "Trip to Lisbon.\n")
    assert node.read_text(encoding="utf-8") == saved
    assert no_temp_files(tmp_path)


@pytest.mark.parametrize("operation", ["edit", "frontmatter_update"])
async def test_an_edit_is_made_from_the_note_as_saved_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str) -> None:
    ops, _ = make_ops(tmp_path)
    note = tmp_path / "memory/2026-07-23/trip.md"
    note.parent.mkdir(parents=True)
    note.write_text("---\nname: trip\n---\nFlights on 14 May.\n", encoding="utf-8")
    saved = "---\nname: trip\n---\nFlights on 14 May.\nالفندق: by hand\n"
    _saved_by_hand(monkeypatch, fileops, "write_confined", note, saved)
    if operation == "edit":
        await ops.edit("memory/2026-07-23/trip.md", "14 May", "15 May")
    else:
        await ops.frontmatter_update("memory/2026-07-23/trip.md", {"tags": ["travel"]})
    text = note.read_text(encoding="utf-8")
    assert "الفندق: by hand" in text, text
    assert ("15 May" in text) if operation == "edit" else ("travel" in text), text
    assert ops.changes[-1].before == saved
    assert no_temp_files(tmp_path)


def test_a_note_saved_in_another_encoding_is_left_and_the_content_goes_on(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A person saved the session's note in Windows-1252: the daemon never writes over it
    # (what it read is a guess), so the content goes into the next note of that name.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, None))
    first = d.call("memory.add_note", {"agent_id": "w", "session_id": "s", "name": "trip",
                                       "content": "Flights booked."})
    note = root / first["path"]
    saved = note.read_text(encoding="utf-8") + "Le café “crème” coûte 3 €\n"
    note.write_bytes(saved.encode("cp1252"))
    second = d.call("memory.add_note", {"agent_id": "w", "session_id": "s", "name": "trip",
                                        "content": "Seats 12A and 12B."})
    assert second["path"] == first["path"].replace("trip.md", "trip-2.md"), second
    assert note.read_bytes() == saved.encode("cp1252")
    assert "Seats 12A and 12B." in (root / second["path"]).read_text(encoding="utf-8")
