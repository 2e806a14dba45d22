"""Resource files that are there but are not read (not a regular file, a link), files of
every suffix a text format is saved with, and a file deleted while its note is written:
a real daemon and the scripted chat model (see test_resource.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, write
from test_resource import catalog, open_ws, wait_state
from test_resource_life import active_jobs
from waits import wait_for, wait_value, workspace_status

from recalld.daemon.index.frontmatter import parse_frontmatter


def chat_calls(fake: FakeProvider) -> int:
    return sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))


PLAN = "resource/plan.txt"


def _processed_plan(daemon: DaemonHandle, fake: FakeProvider, root: Path) -> tuple[Path, str]:
    """``resource/plan.txt`` written to the workspace ``res`` at ``root`` and processed by
    the scripted model: its note and the note's text."""
    ScriptedModel(fake)
    write(root, PLAN, "Launch on May 3.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, PLAN, "processed")
    note = root / catalog(root)[PLAN]["note"]
    return note, note.read_text()


def test_a_file_that_cannot_be_read_is_skipped_with_why_not_removed(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A processed file replaced by a FIFO, or by a link, is there but not read: skipped
    with the reason (listed in status), its note not marked as of a removed file; back
    with the bytes its note was written from, it is processed again without the model."""
    root = tmp_path / "ws"
    note, written = _processed_plan(daemon, fake, root)
    calls = chat_calls(fake)
    for swap, why in ((lambda p: os.mkfifo(p), "not a regular file"),
                      (lambda p: p.symlink_to(root / "elsewhere.txt"), "symbolic link")):
        (root / PLAN).unlink()
        swap(root / PLAN)
        wait_state(root, PLAN, "skipped")
        entry = catalog(root)[PLAN]
        assert why in entry["reason"] and entry["note"] == str(note.relative_to(root))
        skipped = workspace_status(daemon, "res")["resource"]["skipped"]  # type: ignore[index]
        assert {"path": PLAN, "reason": entry["reason"]} in skipped, skipped
        (root / PLAN).unlink()
        write(root, PLAN, "Launch on May 3.\n")
        wait_state(root, PLAN, "processed")
        assert note.read_text() == written
        assert "source_removed" not in parse_frontmatter(note.read_text())[0]
    assert chat_calls(fake) == calls


def test_a_file_removed_twice_around_a_spell_unread_comes_back_to_an_unmarked_note(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Removed (its note marked), a FIFO in its place (skipped), removed again and back with
    its bytes before the job got to the second removal: its note is unmarked. The second
    removal took the note for unmarked, so the file back left it saying it was removed."""
    root = tmp_path / "ws"
    note, written = _processed_plan(daemon, fake, root)
    (root / PLAN).unlink()
    wait_for(lambda: "source_removed" in parse_frontmatter(note.read_text())[0],
             "the note marked as of a removed file")
    os.mkfifo(root / PLAN)
    wait_state(root, PLAN, "skipped")
    # The job is held reading another file: the second removal is recorded, not marked.
    gate = fake.gate(lambda body: "Slow going" in json.dumps(body))
    write(root, "resource/slow.txt", "Slow going.\n")
    assert gate.entered.wait(30), "the job did not ask about slow.txt"
    (root / PLAN).unlink()
    wait_state(root, PLAN, "removed")
    write(root, PLAN, "Launch on May 3.\n")
    wait_state(root, PLAN, "processed")
    gate.open()
    wait_state(root, "resource/slow.txt", "processed", "failed")
    assert note.read_text() == written


def test_every_suffix_of_a_text_format_is_read(daemon: DaemonHandle, fake: FakeProvider,
                                               tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    files = {"resource/conf.yml": "port: 8080\n", "resource/conf.yaml": "port: 8081\n",
             "resource/page.htm": "<p>Hello</p>\n", "resource/read.markdown": "# Read\n",
             "resource/UPPER.YML": "host: a\n"}
    for rel, text in files.items():
        write(root, rel, text)
    open_ws(daemon, "res", root, fake)
    for rel in files:
        wait_state(root, rel, "processed", "skipped", "failed")
        assert catalog(root)[rel]["state"] == "processed", catalog(root)[rel]


def test_a_file_deleted_while_the_model_reads_it_leaves_no_unmarked_note(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The watcher catalogs the deletion while the job asks the model about the file:
    the file ends removed, and no note of it stays unmarked (a note written for it is
    marked as of a removed file)."""
    root = tmp_path / "ws"
    ScriptedModel(fake)
    rel = "resource/brief.txt"
    gate = fake.gate(lambda body: "Budget: 10k" in str(body.get("messages")))
    write(root, rel, "Budget: 10k.\n")
    open_ws(daemon, "res", root, fake)
    assert gate.entered.wait(30)
    (root / rel).unlink()
    wait_state(root, rel, "removed")
    gate.open()
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    entry = catalog(root).get(rel)  # dropped if no note was written: it keeps nothing
    assert entry is None or entry["state"] == "removed", entry
    for note in (root / "memory").rglob("*.md"):
        fields = parse_frontmatter(note.read_text())[0]
        if fields.get("source_resource") == f"[[{rel}]]":
            assert fields.get("source_removed") and entry and entry.get("marked"), note.read_text()


def test_a_file_seen_empty_while_written_again_keeps_its_note(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """An editor that truncates and then writes lets the watcher see the file empty a
    moment: back to the bytes its note was written from, the file is that note's again,
    with no model call."""
    root = tmp_path / "ws"
    note, written = _processed_plan(daemon, fake, root)
    calls = chat_calls(fake)
    (root / PLAN).write_text("")
    # The job asked for the empty file has read it: the catalog says the file is queued
    # before that job is asked for, and a job that read it only once it was written
    # again would ask the model about those bytes.
    wait_value(lambda: catalog(root)[PLAN], lambda e: e.get("size") == 0
               and e["state"] == "skipped", "the job sees it empty")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"), "no job running")
    (root / PLAN).write_text("Launch on May 3.\n")
    wait_state(root, PLAN, "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"), "no job running")
    entry = catalog(root)[PLAN]
    assert entry["size"] == len("Launch on May 3.\n") and entry["reason"] == "", entry
    assert note.read_text() == written and chat_calls(fake) == calls


def test_bytes_the_watcher_has_not_seen_yet_are_cataloged_before_the_model_is_asked(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The watcher cataloged the file empty, between its creation and its write; the job
    reads it once written, before the watcher sees those bytes (here: written through
    another name of it, outside resource/). Back to the bytes its note was written from,
    the file is that note's again with no model call: the job asked the model about
    bytes the catalog did not have, and wrote the note with the empty file's digest."""
    root = tmp_path / "ws"
    note, written = _processed_plan(daemon, fake, root)
    calls = chat_calls(fake)
    # The job is held asking about another file while the file is emptied and written.
    gate = fake.gate(lambda body: "Slow going" in json.dumps(body))
    write(root, "resource/slow.txt", "Slow going.\n")
    assert gate.entered.wait(30), "the job did not ask about slow.txt"
    (root / PLAN).write_text("")
    wait_value(lambda: catalog(root)[PLAN], lambda e: e.get("size") == 0
               and e["state"] == "queued", "the watcher sees it empty")
    other = tmp_path / "plan-elsewhere.txt"
    os.link(root / PLAN, other)
    other.write_text("Launch on May 3.\n")
    gate.open()
    wait_state(root, "resource/slow.txt", "processed", "failed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"), "no job running")
    entry = catalog(root)[PLAN]
    assert entry["state"] == "processed" and entry["size"] == len("Launch on May 3.\n"), entry
    assert note.read_text() == written
    assert chat_calls(fake) == calls + 1  # slow.txt's


def test_a_socket_is_not_a_regular_file_and_a_secret_in_its_name_stays_out_of_the_log(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket bound under resource/ cannot be opened (ENXIO): it is skipped as not a
    regular file, as a FIFO is; it was reported as a file that cannot be read, and the
    warning named it (a key in its name) by its full path, unmasked."""
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/plan.txt", "Launch on May 3.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/plan.txt", "processed")  # the watcher runs
    key = "ghp_" + "Q7x9Lm2Pz8Rt4Vb6Nk1Hs3Jd5Fg0Wc7Yq2Ea"
    rels = ["resource/relay.txt", f"resource/deploy-{key}.txt"]
    monkeypatch.chdir(root)  # a socket's address holds at most 107 bytes
    with contextlib.ExitStack() as bound:
        for rel in rels:
            sock = bound.enter_context(socket.socket(socket.AF_UNIX))
            sock.bind(rel)
        for rel in rels:
            wait_state(root, rel, "skipped")
            assert "not a regular file" in catalog(root)[rel]["reason"], catalog(root)[rel]
    skipped = workspace_status(daemon, "res")["resource"]["skipped"]  # type: ignore[index]
    assert [s["path"] for s in skipped] == ["resource/deploy-[REDACTED].txt",
                                            "resource/relay.txt"], skipped
    assert key not in daemon.log_path.read_text(encoding="utf-8")
