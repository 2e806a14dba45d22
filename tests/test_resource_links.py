"""auto_resource and what a note stands on: what in resource/ is not a plain file (a
folder link, a FIFO), file names (long, or masked by redaction), the note's own
fields. A real daemon, a real resource folder, the scripted chat model."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, write
from test_resource import active_jobs, catalog, note_of, open_ws, wait_state
from waits import wait_for, workspace_status


def test_a_folder_link_into_the_notes_is_not_read_as_resources(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # resource/notes -> ../memory: each daily note (the resource notes among them) would
    # be summarised into a note of its own, read once when the link appears and never
    # again (the watcher's scans do not descend folder links).
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "memory/2026-11-03/meeting.md", "# Meeting\nThe venue is Porto.\n")
    write(root, "resource/first.txt", "Budget: 10k.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/first.txt", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    os.symlink("../memory", root / "resource/notes")
    write(root, "resource/later.txt", "Venue: Porto.\n")  # after the link's event
    wait_state(root, "resource/later.txt", "processed")
    cat = catalog(root)
    assert not [p for p in cat if p.startswith("resource/notes/")], sorted(cat)
    assert not any(b"resource/notes/" in r.body for r in fake.requests)
    assert sorted(p.name for p in (root / "memory").rglob("resource-*.md")) == [
        "resource-first-txt.md", "resource-later-txt.md"]


def test_a_notes_link_and_digest_are_not_masked_by_its_words(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A note is redacted as one text: a credential word in the file's name or in the
    # summary masked random-looking text near it, the note's digest and its link to the
    # file among them. A name masked on its own is skipped, as a key in a name is.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    model.resource_answer = "The wifi password list.\n- rotate it monthly"
    clean = ["resource/api-key-rotation.txt", "resource/2026-11-05/Hx8kQ2mZ9pLw4Rt7v.txt",
             "resource/password policy.md"]
    named = "resource/db password Qm3Zx8Lp4Wr7Tn2Kv.txt"
    for rel in [*clean, named]:
        write(root, rel, f"what {rel} holds\n")
    open_ws(daemon, "res", root, fake)
    for rel in clean:
        wait_state(root, rel, "processed", "skipped", "failed")
        assert catalog(root)[rel]["state"] == "processed", catalog(root)[rel]
        fields, text = note_of(root, rel)
        assert fields["source_resource"] == f"[[{rel}]]", text
        assert fields["resource_digest"] == catalog(root)[rel]["digest"], text
        assert text.rstrip().endswith(f"Source: [[{rel}]]"), text
    wait_state(root, named, "skipped", "processed", "failed")
    entry = catalog(root)[named]
    assert entry["state"] == "skipped" and "credential" in entry["reason"], entry
    notes = "".join(p.name + p.read_text() for p in (root / "memory").rglob("*.md"))
    assert "qm3zx8lp4wr7tn2kv" not in notes.lower()
    assert not any(b"Qm3Zx8Lp4Wr7Tn2Kv" in r.body for r in fake.requests)


def test_a_fifo_in_resource_is_not_read(daemon: DaemonHandle, fake: FakeProvider,
                                        tmp_path: Path) -> None:
    # Reading a FIFO takes the bytes another program waits for.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/first.txt", "Budget: 10k.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/first.txt", "processed")
    os.mkfifo(root / "resource/pipe.txt")
    fd = os.open(root / "resource/pipe.txt", os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, b"for the reader\n")
        write(root, "resource/later.txt", "Venue: Porto.\n")  # after the FIFO's event
        wait_state(root, "resource/later.txt", "processed")
        entry = catalog(root)["resource/pipe.txt"]
        assert entry["state"] == "skipped" and "not a regular file" in entry["reason"]
        assert os.read(fd, 100) == b"for the reader\n"
    finally:
        os.close(fd)


def test_a_name_of_four_byte_characters_gets_a_note(daemon: DaemonHandle,
                                                     fake: FakeProvider,
                                                     tmp_path: Path) -> None:
    # The note's name takes 80 characters of the path: of CJK Extension B characters
    # (four bytes each), more than a file name holds.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    rare = "".join(chr(0x20000 + n) for n in range(90))
    rel = f"resource/{rare[:45]}/{rare[45:]}.txt"
    write(root, rel, "A name in rare characters.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, rel, "processed", "failed")
    entry = catalog(root)[rel]
    assert entry["state"] == "processed", entry["reason"]
    assert entry["note"].startswith(f"memory/{entry['date']}/resource-{rare[:40]}")
    fields, _ = note_of(root, rel)
    assert fields["source_resource"] == f"[[{rel}]]"


def test_a_notes_name_keeps_the_words_of_its_files_name(daemon: DaemonHandle,
                                                         fake: FakeProvider,
                                                         tmp_path: Path) -> None:
    # Vowel signs (Devanagari, Tamil) are marks, a word without them another word; an
    # accent saved decomposed is the same letter; a zero-width space shows nothing.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    names = {"हिन्दी नोट.txt": "हिन्दी-नोट-txt", "தமிழ்.md": "தமிழ்-md",
             "cafe\u0301 menu.txt": "café-menu-txt", "road\u200bmap.txt": "roadmap-txt"}
    for name in names:
        write(root, f"resource/{name}", "A name in other letters.\n")
    open_ws(daemon, "res", root, fake)
    for name, stem in names.items():
        wait_state(root, f"resource/{name}", "processed", "failed")
        entry = catalog(root)[f"resource/{name}"]
        assert entry["note"] == f"memory/{entry['date']}/resource-{stem}.md", entry
        assert note_of(root, f"resource/{name}")[0]["source_resource"] == f"[[resource/{name}]]"


def source_target(text: str) -> str:
    """The file the ``Source:`` line of the note ``text`` links: a wikilink's target as
    the index reads it (no bracket, ``|`` or ``#`` in it), or a Markdown link's."""
    line = text.rstrip("\n").rsplit("\n", 1)[-1]
    wiki = re.fullmatch(r"Source: \[\[([^\[\]\n|#]*)\]\]", line)
    if wiki is not None:
        return wiki.group(1)
    md = re.fullmatch(r"Source: \[(?:\\.|[^\\\[\]])*\]\(<([^<>\n]*)>\)", line)
    assert md is not None, line
    return unquote(md.group(1))


def test_a_notes_link_names_its_file_whatever_the_name_holds(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # ``[[resource/a]]b.txt]]`` links ``resource/a``; ``|`` starts an alias, ``#`` a
    # heading, a line break shown as ``\n`` names another file. Each link names its
    # file, also once the file is renamed, and a name a wikilink holds keeps one.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    names = ["resource/a]]b.txt", "resource/[[draft]] v2.md", "resource/Q3|Q4.csv",
             "resource/minutes #4.md", "resource/line\nbreak.txt", "resource/50%20off <b>.txt",
             "resource/back\\slash.txt", "resource/Übergabe (final).txt"]
    for rel in names:
        write(root, rel, f"what {rel!r} holds\n")
    open_ws(daemon, "res", root, fake)
    for rel in names:
        wait_state(root, rel, "processed")
        fields, text = note_of(root, rel)
        assert fields["source_resource"] == f"[[{rel}]]", text
        assert source_target(text) == rel, text
    assert note_of(root, names[-1])[1].endswith(f"Source: [[{names[-1]}]]\n")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    for old, new in (("resource/a]]b.txt", "resource/c|d.txt"),
                     ("resource/Übergabe (final).txt", "resource/Übergabe #2.txt"),
                     ("resource/line\nbreak.txt", "resource/plain.txt")):
        (root / old).rename(root / new)
        wait_for(lambda old=old: old not in catalog(root), f"{old} followed")
        wait_state(root, new, "processed")
        assert source_target(note_of(root, new)[1]) == new


def test_links_and_fifos_there_before_the_workspace_opens_are_skipped_with_why(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """What is in resource/ but not read, there already when the workspace opens (put
    there while the daemon was stopped), is cataloged as skipped with why, as it is when
    it appears while the daemon runs; a link out of the workspace is never read."""
    root = tmp_path / "ws"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "plans.txt").write_text("Merger talks with Initech on Friday.\n")
    ScriptedModel(fake)
    write(root, "resource/first.txt", "Budget: 10k.\n")
    (root / "resource/out.txt").symlink_to(outside / "plans.txt")
    (root / "resource/dangling.md").symlink_to(outside / "gone.md")
    (root / "resource/loop.txt").symlink_to("loop.txt")  # leads nowhere: ELOOP
    os.mkfifo(root / "resource/pipe.txt")
    (root / "resource/folder").symlink_to(outside)  # a folder link: not descended
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/first.txt", "processed")  # saved after what the scan found
    # The job's end (its inbox item told) settles the record: read it after.
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    cat = catalog(root)
    for rel, why in (("resource/out.txt", "symbolic link"),
                     ("resource/dangling.md", "symbolic link"),
                     ("resource/loop.txt", "symbolic link"),
                     ("resource/pipe.txt", "not a regular file")):
        assert cat.get(rel, {}).get("state") == "skipped", (rel, cat.get(rel))
        assert why in cat[rel]["reason"] and not cat[rel].get("note"), cat[rel]
    assert not any(p.startswith("resource/folder") for p in cat), sorted(cat)
    assert not any(b"Initech" in r.body for r in fake.requests)
    # Opened again, its scan finds them as they were recorded: nothing to catalog anew.
    daemon.call("workspace.close", {"agent_id": "res"})
    open_ws(daemon, "res", root, fake)
    found = wait_for(lambda: ((workspace_status(daemon, "res") or {}).get("resource") or {})
                     .get("watcher", {}).get("last_reconcile"))
    assert found["found"] == {"added": 0, "changed": 0, "deleted": 0}, found
    assert catalog(root) == cat
