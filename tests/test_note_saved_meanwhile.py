"""A note the daemon adds to while a person's editor or a script saves it: the save made
between the daemon's read of the note and its write is kept, and so is what the daemon
added (a real daemon; the save is made by a launcher hook at that very point, once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hooks import launcher
from test_capture import config

#: Launcher lines: the first time the daemon publishes over a file named $SAVE_NAME, the
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
    d = daemon_factory(config(root, None), launcher=launcher(SAVED_BEFORE_WRITE),
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
