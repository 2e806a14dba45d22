"""Paths named in another Unicode form than the disk's: a workspace made on macOS, or
synced from it, holds names decomposed (NFD, ``nai\u0308ve.md``) where people and agents
type them composed (NFC, ``naïve.md``), and the other way round. Real daemon, socket and
files."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from test_index_daemon import open_ws, write

from recalld.ipc.errors import InvalidParams, NotFound


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def read(daemon: Any, path: str) -> dict[str, Any]:
    answer: dict[str, Any] = daemon.call("memory.read", {"agent_id": "w", "path": path})
    return answer


def listed(daemon: Any, prefix: str) -> list[str]:
    answer = daemon.call("memory.list", {"agent_id": "w", "prefix": prefix})
    return [f["path"] for f in answer["files"]]


def test_a_path_typed_in_either_form_reads_the_one_file_on_disk(daemon: Any,
                                                                tmp_path: Path) -> None:
    # A read of the composed name answered "no such file" when the disk held the name
    # decomposed (and the other way round), though search showed the note.
    root = tmp_path / "ws"
    mac = nfd("memory/2026-03-04/Réunions/naïve.md")  # folder and file decomposed
    typed = nfc("digest/wiki/Ærøskøbing ĉe Zoë.md")  # written composed on disk
    write(root, mac, "# Naive\n\nThe quokka plan.\n")
    write(root, typed, "# Island\n\nThe ferry plan.\n")
    open_ws(daemon, root)
    for form in (nfc, nfd):
        got = read(daemon, form(mac))
        assert got["text"] == "# Naive\n\nThe quokka plan.\n", form
        assert got["path"] == mac, form  # named as the disk (and search) names it
        got = read(daemon, form(typed))
        assert got["text"] == "# Island\n\nThe ferry plan.\n", form
        assert got["path"] == typed, form
        # A line range reads so too; a name the disk holds in no form is still missing.
        lines = daemon.call("memory.read", {"agent_id": "w", "path": form(mac),
                                            "start_line": 3, "end_line": 3})
        assert (lines["text"], lines["path"]) == ("The quokka plan.\n", mac), form
        with pytest.raises(NotFound):
            read(daemon, form("memory/2026-03-04/Réunions/naïf.md"))


def test_where_both_forms_exist_the_exact_spelling_wins(daemon: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, nfc("memory/2026-03-04/café.md"), "composed\n")
    write(root, nfd("memory/2026-03-04/café.md"), "decomposed\n")
    # "ệ" has more than two spellings: composed, decomposed, and half of each.
    write(root, nfd("memory/2026-03-05/ệ.md"), "one\n")
    write(root, "memory/2026-03-05/\u00ea\u0323.md", "other\n")
    open_ws(daemon, root)
    assert read(daemon, nfc("memory/2026-03-04/café.md"))["text"] == "composed\n"
    assert read(daemon, nfd("memory/2026-03-04/café.md"))["text"] == "decomposed\n"
    # A prefix names both.
    for form in (nfc, nfd):
        assert sorted(listed(daemon, form("memory/2026-03-04/caf"))) == sorted(
            [nfc("memory/2026-03-04/café.md"), nfd("memory/2026-03-04/café.md")]), form
    # Two names alike, neither as typed: which one is meant is not guessed.
    assert read(daemon, nfd("memory/2026-03-05/ệ.md"))["text"] == "one\n"
    with pytest.raises(InvalidParams, match="Unicode normalisation"):
        read(daemon, nfc("memory/2026-03-05/ệ.md"))


def test_a_list_prefix_in_either_form_lists_the_notes(daemon: Any, tmp_path: Path) -> None:
    # memory.list with a composed prefix listed nothing of a folder written decomposed.
    root = tmp_path / "ws"
    write(root, nfd("digest/wiki/Réunions/équipe.md"), "# Team\n")
    write(root, nfc("memory/2026-03-04/Crème brûlée.md"), "# Dessert\n")
    write(root, "memory/2026-03-04/plain.md", "# Plain\n")
    open_ws(daemon, root)
    for form in (nfc, nfd):
        assert listed(daemon, form("digest/wiki/Réunions")) == [
            nfd("digest/wiki/Réunions/équipe.md")], form
        assert listed(daemon, form("memory/2026-03-04/Crème")) == [
            nfc("memory/2026-03-04/Crème brûlée.md")], form
    assert listed(daemon, "digest/wiki/Reunions") == []


def test_a_topic_write_or_edit_updates_the_file_the_disk_spells_otherwise(
        daemon: Any, tmp_path: Path) -> None:
    # A topic write named composed over a note written decomposed made a second file
    # (and folder) beside it, alike to the eye.
    root = tmp_path / "ws"
    topic = nfd("digest/wiki/Réunions/café.md")
    write(root, topic, "---\nname: cafe\ndescription: coffee\ntype: reference\n---\nOld.\n")
    open_ws(daemon, root)
    folder = root / nfd("digest/wiki/Réunions")
    for form in (nfc, nfd):
        done = daemon.call("memory.topic_write", {
            "agent_id": "w", "path": form("wiki/Réunions/café.md"), "name": "cafe",
            "description": "coffee", "type": "reference", "body": f"Espresso {form.__name__}."})
        assert done["path"] == topic and not done["created"], form
        done = daemon.call("memory.topic_edit", {
            "agent_id": "w", "path": form("wiki/Réunions/café.md"), "old": "Espresso",
            "new": "Ristretto"})
        assert done["path"] == topic and done["changed"], form
        assert (root / topic).read_text().endswith(f"Ristretto {form.__name__}.\n"), form
        assert os.listdir(root / "digest/wiki") == [nfd("Réunions")], form
        assert os.listdir(folder) == [nfd("café.md")], form
    # A new topic file typed composed goes into the folder the disk spells decomposed,
    # under the name as typed.
    done = daemon.call("memory.topic_write", {
        "agent_id": "w", "path": nfc("wiki/Réunions/thé.md"), "name": "tea",
        "description": "tea", "type": "reference", "body": "Sencha."})
    assert done["created"] and done["path"] == nfd("digest/wiki/Réunions/") + nfc("thé.md")
    assert sorted(os.listdir(folder)) == sorted([nfd("café.md"), nfc("thé.md")])


def test_a_workspace_folder_typed_in_another_form_opens_the_one_on_disk(
        daemon: Any, tmp_path: Path) -> None:
    # workspace.open of a folder typed composed, which the disk holds decomposed, made a
    # second, empty folder beside it and served that one.
    place = tmp_path / "places" / nfd("Équipe/Mémoire")
    write(place, "memory/2026-03-04/a.md", "# A\n\nThe okapi note.\n")
    info = daemon.call("workspace.open", {"agent_id": "w", "path": nfc(str(place))})
    assert info["path"] == str(place)
    assert os.listdir(tmp_path / "places") == [nfd("Équipe")]
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "okapi", "sync": True})
    assert [r["path"] for r in answer["results"]] == ["memory/2026-03-04/a.md"]


def test_a_path_prefix_naming_the_workspace_folder_in_another_form_finds_its_notes(
        daemon: Any, tmp_path: Path) -> None:
    # A path_prefix may name the workspace folder by its absolute path: typed composed
    # for a folder the disk spells decomposed, it named another folder and found nothing.
    place = tmp_path / "places" / nfd("Noël/ws")
    write(place, "memory/2026-03-04/a.md", "# A\n\nThe wombat note.\n")
    open_ws(daemon, place)
    for form in (nfc, nfd):
        for prefix in ("", "/memory", "/memory/2026-03-04/a.md"):
            answer = daemon.call("memory.search", {
                "agent_id": "w", "query": "wombat",
                "filters": {"path_prefix": form(str(place) + prefix)}})
            assert [r["path"] for r in answer["results"]] == ["memory/2026-03-04/a.md"], (
                form, prefix)


def test_writes_of_one_new_name_in_two_forms_at_once_make_one_file(
        daemon: Any, tmp_path: Path) -> None:
    # Two agents writing the same new topic at once, one typing it composed and one
    # decomposed, each looked for the name before waiting for the write lock: both
    # found nothing and each made its own file.
    import threading

    root = tmp_path / "ws"
    write(root, "digest/wiki/seed.md", "---\nname: seed\ndescription: s\ntype: user\n---\n")
    open_ws(daemon, root)
    names = [f"wiki/thé {n}.md" for n in range(12)]
    errors: list[BaseException] = []

    def writer(form: Any) -> None:
        try:
            with daemon.connect() as conn:
                for name in names:
                    conn.call("memory.topic_write", {
                        "agent_id": "w", "path": form(name), "name": "tea",
                        "description": "tea", "type": "reference", "body": form.__name__})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(form,)) for form in (nfc, nfd)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    made = sorted(nfc(n) for n in os.listdir(root / "digest/wiki") if n.startswith("th"))
    assert made == sorted(nfc(n.removeprefix("wiki/")) for n in names)


@pytest.mark.parametrize("first, then", [(nfd, nfc), (nfc, nfd)])
def test_a_note_named_in_the_other_form_is_added_to(daemon: Any, tmp_path: Path,
                                                    first: Any, then: Any) -> None:
    # memory.add_note looked for the session's note by the name as typed, found none,
    # and its write (which goes to the file the disk spells) met that note as saved
    # meanwhile each of its 8 tries: every call was refused "try again".
    open_ws(daemon, tmp_path / "ws")
    name = "Olé Réunion naïve"
    notes = []
    for form, text in ((first, "The first llama fact."), (then, "The second llama fact.")):
        notes.append(daemon.call("memory.add_note", {
            "agent_id": "w", "session_id": "s1", "name": form(name), "content": text}))
    assert notes[1]["path"] == notes[0]["path"], notes
    assert (notes[0]["created"], notes[1]["created"]) == (True, False), notes
    text = read(daemon, notes[0]["path"])["text"]
    assert "The first llama fact." in text and "The second llama fact." in text, text
    day = (tmp_path / "ws" / notes[0]["path"]).parent
    assert [p.name for p in day.glob("*.md") if p.name != "index.md"] == [
        Path(notes[0]["path"]).name]
