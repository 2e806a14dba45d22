"""auto_resource end to end: files dropped into resource/ become daily notes.

A real daemon watches a real resource folder; the chat model is the scripted fake.
"""

from __future__ import annotations

import hashlib
import os
from datetime import date
from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply
from test_cli import recalld
from test_dream import ScriptedModel, chat_config, run_job, write
from waits import wait_for, wait_value, workspace_status

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.store.records import read_records
from recalld.ipc.errors import MethodNotFound


def active_jobs(daemon: DaemonHandle, agent: str, kind: str) -> list[dict[str, Any]]:
    jobs = daemon.call("jobs.list", {"agent_id": agent})["jobs"]
    return [j for j in jobs if j["kind"] == kind and j["state"] in ("queued", "running")]


def catalog(root: Path, metadata_dir: str = "mem_metadata") -> dict[str, dict[str, Any]]:
    path = root / metadata_dir / "catalog/resource.jsonl.zst"
    if not path.exists():
        return {}
    return {r["path"]: r for r in read_records(path)}


def wait_state(root: Path, rel: str, *states: str, metadata_dir: str = "mem_metadata") -> None:
    wait_value(lambda: catalog(root, metadata_dir).get(rel, {}),
               lambda entry: entry.get("state") in states, f"{rel} {' or '.join(states)}")


def note_of(root: Path, rel: str) -> tuple[dict[str, Any], str]:
    note = catalog(root)[rel]["note"]
    text = (root / note).read_text(encoding="utf-8")
    return parse_frontmatter(text)[0], text


def resource_items(daemon: DaemonHandle, agent: str) -> list[dict[str, Any]] | None:
    try:
        answer = daemon.call("inbox.list", {"agent_id": agent})
    except MethodNotFound:
        return None
    items = answer["items"] if isinstance(answer, dict) else answer
    return [i for i in items if i["kind"] == "auto_resource"]


def open_ws(daemon: DaemonHandle, agent: str, root: Path, fake: FakeProvider | None) -> None:
    config: dict[str, Any] = {"dream_cron_enabled": False}
    if fake is not None:
        config["chat_model_config"] = chat_config(fake)
    daemon.call("workspace.open", {"agent_id": agent, "path": str(root), "config": config})


def failed_once(daemon: DaemonHandle, fake: FakeProvider, agent: str, root: Path, rel: str,
                text: str) -> None:
    """Open ``root`` as ``agent`` with one resource file ``rel`` whose interpretation
    fails (a broken model answer), and wait until the job that failed has ended (the
    catalog is saved before it ends; one job of a kind runs at a time)."""
    ScriptedModel(fake)
    fake.script(Reply(raw=b"garbage"))
    write(root, rel, text)
    open_ws(daemon, agent, root, fake)
    wait_state(root, rel, "failed")
    wait_for(lambda: not active_jobs(daemon, agent, "auto_resource"))


def test_resources_dated_interpreted_changed_deleted(daemon: DaemonHandle, fake: FakeProvider,
                                                     tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    today = date.today().isoformat()
    write(root, "resource/top.txt", "Quarterly numbers: 42 units.\n")
    write(root, "resource/2026-11-01/deep/nested/x.md", "# Trip\nFlight at 9.\n")
    write(root, "resource/2026-11-02/data.csv", "a,b\n1,2\n")
    write(root, "resource/notes/misc.json", '{"k": 1}\n')
    write(root, "resource/2026-13-40/odd.txt", "not a real date folder\n")
    (root / "resource/image.png").write_bytes(b"\x89PNG\r\n")
    open_ws(daemon, "res", root, fake)
    wanted = {
        "resource/top.txt": f"memory/{today}/resource-top-txt.md",
        "resource/2026-11-01/deep/nested/x.md": "memory/2026-11-01/resource-deep-nested-x-md.md",
        "resource/2026-11-02/data.csv": "memory/2026-11-02/resource-data-csv.md",
        "resource/notes/misc.json": f"memory/{today}/resource-notes-misc-json.md",
        "resource/2026-13-40/odd.txt": f"memory/{today}/resource-2026-13-40-odd-txt.md",
    }
    for rel in wanted:
        wait_state(root, rel, "processed")
    # The inbox is told of the notes when the job that wrote them ends.
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    cat = catalog(root)
    for rel, note in wanted.items():
        assert cat[rel]["note"] == note, cat[rel]
        fields, text = note_of(root, rel)
        assert fields["source_resource"] == f"[[{rel}]]"
        digest = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        assert fields["resource_digest"] == digest == cat[rel]["digest"]
        assert "- it has facts" in text and f"[[{rel}]]" in text
    assert cat["resource/image.png"]["state"] == "skipped"
    assert ".png" in cat["resource/image.png"]["reason"]
    assert "note" not in cat["resource/image.png"] or not cat["resource/image.png"]["note"]
    found = daemon.call("memory.search", {"agent_id": "res", "query": "facts", "sync": True})
    assert set(wanted.values()) <= {r["path"] for r in found["results"]} | set(
        r["path"] for r in daemon.call("memory.search", {
            "agent_id": "res", "query": "facts", "max_results": 20})["results"])
    first_items = resource_items(daemon, "res")

    # Same bytes again, saved the way editors do (a new file renamed over the old one, so
    # the watcher never sees it half written): no model call, nothing new.
    calls = len(fake.requests)
    again = tmp_path / "top.txt.new"
    again.write_text("Quarterly numbers: 42 units.\n")
    os.replace(again, root / "resource/top.txt")
    saved_ns = (root / "resource/top.txt").stat().st_mtime_ns
    wait_for(lambda: catalog(root)["resource/top.txt"]["mtime_ns"] == saved_ns)
    daemon.call("index.sync", {"agent_id": "res"})
    assert len(fake.requests) == calls
    if first_items is not None:
        assert resource_items(daemon, "res") == first_items and first_items

    # A changed file rewrites its own note.
    model.resource_answer = "Updated.\n- now 43 units"
    (root / "resource/top.txt").write_text("Quarterly numbers: 43 units.\n")
    new_digest = hashlib.sha256(b"Quarterly numbers: 43 units.\n").hexdigest()
    wait_for(lambda: catalog(root)["resource/top.txt"].get("digest") == new_digest
             and catalog(root)["resource/top.txt"]["state"] == "processed")
    fields, text = note_of(root, "resource/top.txt")
    assert fields["resource_digest"] == new_digest and "now 43 units" in text
    assert catalog(root)["resource/top.txt"]["note"] == wanted["resource/top.txt"]

    # A deleted file's note is kept and marked.
    (root / "resource/2026-11-02/data.csv").unlink()
    wait_state(root, "resource/2026-11-02/data.csv", "removed")
    note = root / wanted["resource/2026-11-02/data.csv"]
    wait_for(lambda: "source_removed" in note.read_text())
    fields, text = parse_frontmatter(note.read_text())[0], note.read_text()
    assert fields["source_removed"] == today and "was removed" in text
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    items = resource_items(daemon, "res")
    if items is not None:
        assert any(wanted["resource/2026-11-02/data.csv"] in i["changes"] for i in items)

    # A folder moved out and another moved in.
    (root / "resource/2026-11-01").rename(tmp_path / "moved-out")
    (tmp_path / "incoming/sub").mkdir(parents=True)
    (tmp_path / "incoming/sub/new.txt").write_text("moved in\n")
    (tmp_path / "incoming").rename(root / "resource/2026-11-04")
    wait_state(root, "resource/2026-11-01/deep/nested/x.md", "removed")
    wait_state(root, "resource/2026-11-04/sub/new.txt", "processed")
    assert catalog(root)["resource/2026-11-04/sub/new.txt"]["note"] == (
        "memory/2026-11-04/resource-sub-new-txt.md")
    moved_note = root / wanted["resource/2026-11-01/deep/nested/x.md"]
    wait_for(lambda: "source_removed" in moved_note.read_text())


def test_resources_without_model_and_with_failing_model(daemon: DaemonHandle,
                                                        fake: FakeProvider,
                                                        tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    write(plain, "resource/a.txt", "hello\n")
    open_ws(daemon, "nomodel", plain, None)
    wait_state(plain, "resource/a.txt", "pending")
    assert catalog(plain)["resource/a.txt"]["reason"] == "no chat model configured"
    assert not (plain / "memory").exists() or not list((plain / "memory").rglob("*.md"))
    assert resource_items(daemon, "nomodel") in (None, [])
    # A run without a chat model does not report success while files wait for one.
    wait_for(lambda: not active_jobs(daemon, "nomodel", "auto_resource"))
    job = run_job(daemon, "auto_resource", agent="nomodel")
    assert job["state"] == "failed", job
    assert "no chat model configured: 1 resource file(s) wait" in str(job["error"]), job

    root = tmp_path / "ws"
    failed_once(daemon, fake, "flaky", root, "resource/b.txt", "the code word is swordfish\n")
    assert catalog(root)["resource/b.txt"]["reason"]
    job = run_job(daemon, "auto_resource", agent="flaky")  # a manual run retries failures
    assert job["state"] == "succeeded", job
    assert job["result"]["outcomes"] == {"processed": 1}
    assert catalog(root)["resource/b.txt"]["state"] == "processed"

    # Input to the model is bounded; the note says it saw only the first part.
    write(root, "resource/2026-11-03/big.txt", "lorem ipsum " * 5000)
    wait_state(root, "resource/2026-11-03/big.txt", "processed")
    fields, _ = note_of(root, "resource/2026-11-03/big.txt")
    assert fields["truncated_input"] is True and fields["date"] == "2026-11-03"
    last = [r.json for r in fake.requests if r.path.endswith("/chat/completions")][-1]
    prompt = last["messages"][-1]["content"]
    assert "first part only" in prompt and len(prompt) < 16_000 + 200


def test_a_file_the_model_failed_on_is_tried_again_by_the_nightly_dream(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    failed_once(daemon, fake, "nightly", root, "resource/notes/plan.txt",
                "the launch moved to Thursday\n")
    # recalld status says so, and what tries it again (no CLI command would).
    shown = recalld("status", env=daemon.env).stdout
    assert "1 resource file(s) failed" in shown and "the nightly dream" in shown, shown
    assert "resource/notes/plan.txt: chat completion: answer is not valid JSON" in shown
    # Not that it tries them again when it is off.
    assert "tries them again" not in shown and "dream_cron_enabled = false)" in shown, shown
    # A dream started by hand leaves it; the dream the cron starts has it tried again.
    assert run_job(daemon, "auto_dream", agent="nightly")["state"] == "succeeded"
    assert catalog(root)["resource/notes/plan.txt"]["state"] == "failed"
    assert run_job(daemon, "auto_dream", {"trigger": "cron"}, agent="nightly")["state"] == (
        "succeeded")
    wait_state(root, "resource/notes/plan.txt", "processed")
    fields, _ = note_of(root, "resource/notes/plan.txt")
    assert fields["source_resource"] == "[[resource/notes/plan.txt]]"


def test_folders_named_as_the_metadata_dir_are_passed_by(daemon: DaemonHandle,
                                                        tmp_path: Path) -> None:
    # The resource watcher passes by every folder named as the workspace's metadata_dir
    # (the daemon's own state, were the resources the workspace itself), whatever that
    # is named here; other folders, the default name among them, are cataloged. So in
    # the startup scan, as files appear, and in a folder moved in.
    root = tmp_path / "ws"
    for where in ("state", "2026-11-01/state", "mem_metadata", "keep"):
        write(root, f"resource/{where}/scanned.txt", f"{where}\n")
    daemon.call("workspace.open", {"agent_id": "meta", "path": str(root), "config": {
        "dream_cron_enabled": False, "metadata_dir": "state"}})

    def wait_pending(rel: str) -> None:
        # Cataloged: queued, or pending once a resource job has seen it (there is no chat
        # model); a file written after the startup's job ends stays queued.
        wait_state(root, rel, "queued", "pending", metadata_dir="state")

    def passed_by() -> list[str]:
        return [p for p in catalog(root, "state") if "/state/" in p]

    wait_pending("resource/keep/scanned.txt")
    wait_pending("resource/mem_metadata/scanned.txt")
    assert passed_by() == []
    # Files written before the live watch is up are the next reconcile's (minutes away).
    wait_for(lambda: (workspace_status(daemon, "meta") or {}).get("resource", {}).get(
        "watcher", {}).get("state") == "watching", "the resource watcher watching")
    # The file written last is cataloged once the events before it were taken (they come
    # in order and are applied in one batch or in earlier ones).
    write(root, "resource/state/live.txt", "live\n")
    write(root, "resource/2026-11-01/state/live.txt", "live\n")
    write(root, "resource/mem_metadata/live.txt", "live\n")
    write(root, "resource/keep/live.txt", "live\n")
    wait_pending("resource/keep/live.txt")
    assert "resource/mem_metadata/live.txt" in catalog(root, "state")
    assert passed_by() == []
    # A folder moved in stands for the files below it, except those the watcher passes by.
    write(tmp_path, "incoming/trip/state/moved.txt", "moved\n")
    write(tmp_path, "incoming/trip/moved.txt", "moved\n")
    (tmp_path / "incoming/trip").rename(root / "resource/trip")
    wait_pending("resource/trip/moved.txt")
    assert passed_by() == []
    assert sorted(catalog(root, "state")) == [
        "resource/keep/live.txt", "resource/keep/scanned.txt",
        "resource/mem_metadata/live.txt", "resource/mem_metadata/scanned.txt",
        "resource/trip/moved.txt"]


def test_a_file_whose_note_cannot_be_written_fails_alone(daemon: DaemonHandle,
                                                         fake: FakeProvider,
                                                         tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    model.resource_answer = "A long answer.\n" + "- one more fact\n" * 100_000  # > 1 MiB
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "memory").mkdir(parents=True)
    (root / "memory/2026-11-05").symlink_to(outside)  # its notes cannot be written there
    write(root, "resource/2026-11-05/linked.txt", "a file of a day whose folder is a link\n")
    write(root, "resource/long.txt", "a file the model answers at length about\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/long.txt", "processed")
    wait_state(root, "resource/2026-11-05/linked.txt", "failed")
    assert "no free note name" in catalog(root)["resource/2026-11-05/linked.txt"]["reason"]
    assert list(outside.iterdir()) == []
    fields, text = note_of(root, "resource/long.txt")
    assert fields["source_resource"] == "[[resource/long.txt]]"
    assert "- one more fact" in text and "[summary cut" in text and len(text) < 40_000


def test_a_file_named_with_a_credential_gets_no_note(daemon: DaemonHandle,
                                                     fake: FakeProvider,
                                                     tmp_path: Path) -> None:
    """Its note would carry the name in its own file name, title and link: the file is
    skipped with the reason, and the model never sees the name."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    token = "ghp_" + "Zq8Wx7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9Ff8Dd7S"
    named = f"resource/2026-11-05/deploy-{token}.txt"
    write(root, named, "the deploy runbook\n")
    write(root, "resource/2026-11-05/deploy.txt", "the deploy runbook\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/2026-11-05/deploy.txt", "processed")
    wait_state(root, named, "skipped", "processed", "failed")
    assert catalog(root)[named]["state"] == "skipped"
    assert "credential" in catalog(root)[named]["reason"]
    assert not catalog(root)[named].get("note")
    notes = "".join(p.name + p.read_text() for p in (root / "memory").rglob("*.md"))
    assert token.lower() not in notes.lower() and model.resource_answer
    assert not any(token in r.body.decode() for r in fake.requests)


def test_a_key_the_input_cut_falls_inside_is_not_sent_in_part(daemon: DaemonHandle,
                                                               fake: FakeProvider,
                                                               tmp_path: Path) -> None:
    """The model reads the first ``max_input_chars`` (16,000) characters of a file: a key
    across that limit is masked whole, not sent as a piece too short to be recognised."""
    root = tmp_path / "ws"
    ScriptedModel(fake)
    key = "sk-proj-" + "Zq8Wx7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9F"
    write(root, "resource/export.txt", "x" * 15_979 + " " + key + " and more\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/export.txt", "processed", "failed")
    prompts = [r.body.decode() for r in fake.requests if b"export.txt" in r.body]
    assert prompts and "[REDACTED]" in prompts[0]
    assert not any(key[:20] in p for p in prompts)


def test_a_key_in_the_summary_is_not_kept_in_part_by_its_description(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The note's description is the summary's first line cut to 200 characters: a key
    the cut falls inside is masked whole."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    key = "sk-proj-" + "Zq8Wx7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9F"
    model.resource_answer = "y" * 180 + " " + key + " is the key.\n- it is a key"
    write(root, "resource/keyfile.txt", "what the model summarizes\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/keyfile.txt", "processed", "failed")
    fields, text = note_of(root, "resource/keyfile.txt")
    assert "[REDACTED]" in text and key[:19] not in text, fields["description"]


def test_a_file_deleted_while_the_model_reads_it_gets_no_note(daemon: DaemonHandle,
                                                              fake: FakeProvider,
                                                              tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    gate = fake.gate(lambda body: "resource/gone.txt" in str(body.get("messages")))
    write(root, "resource/gone.txt", "a file deleted soon\n")
    open_ws(daemon, "res", root, fake)
    assert gate.entered.wait(30)
    (root / "resource/gone.txt").unlink()
    wait_state(root, "resource/gone.txt", "removed")
    gate.open()
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    # Its record keeps nothing (no note to mark or take back): the job dropped it.
    assert "resource/gone.txt" not in catalog(root), catalog(root)
    assert not (root / "memory").exists() or not list((root / "memory").rglob("*.md"))


def test_a_resource_renamed_keeps_its_note(daemon: DaemonHandle, fake: FakeProvider,
                                           tmp_path: Path) -> None:
    # A rename (or a move within resource/, or a case-only rename) is one file: its note
    # follows it; the model is not asked again and no note says its source was removed.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/Report Q3.txt", "Revenue grew 12 percent in Q3.\n")
    open_ws(daemon, "mv", root, fake)
    wait_state(root, "resource/Report Q3.txt", "processed")
    note = catalog(root)["resource/Report Q3.txt"]["note"]
    calls = len(fake.requests)
    for old, new in (("resource/Report Q3.txt", "resource/2026-10/report q3.txt"),
                     ("resource/2026-10/report q3.txt", "resource/2026-10/REPORT Q3.txt")):
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        (root / old).rename(root / new)
        wait_state(root, new, "processed")
        wait_for(lambda old=old: old not in catalog(root))
        assert catalog(root)[new]["note"] == note
        fields, text = parse_frontmatter((root / note).read_text())[0], (root / note).read_text()
        assert fields["source_resource"] == f"[[{new}]]" and f"Source: [[{new}]]" in text
        assert "source_removed" not in fields and f"[[{old}]]" not in text
    daemon.call("index.sync", {"agent_id": "mv"})
    assert len(fake.requests) == calls
    assert [p.relative_to(root).as_posix() for p in (root / "memory").rglob("*.md")
            if "resource" in p.name] == [note]


def test_a_resource_back_after_its_note_was_marked_removed_keeps_the_note(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The two halves of a move can come apart (a busy machine, a move through another
    # folder, a file put back from a backup, copied in parts): its note was marked
    # "source removed" by then. The same bytes arriving take the note back, unmarked,
    # without the model.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/minutes.md", "The board approved the Lisbon office.\n")
    open_ws(daemon, "back", root, fake)
    wait_state(root, "resource/minutes.md", "processed")
    note = catalog(root)["resource/minutes.md"]["note"]
    data = (root / "resource/minutes.md").read_bytes()
    (root / "resource/minutes.md").unlink()
    wait_for(lambda: catalog(root).get("resource/minutes.md", {}).get("marked") is True)
    assert "source_removed" in parse_frontmatter((root / note).read_text())[0]
    calls = len(fake.requests)
    # Copied in, as cp does: the file is seen empty first, then whole.
    (root / "resource/archive").mkdir()
    (root / "resource/archive/minutes-2026.md").write_bytes(b"")
    wait_state(root, "resource/archive/minutes-2026.md", "skipped")
    (root / "resource/archive/minutes-2026.md").write_bytes(data)
    wait_state(root, "resource/archive/minutes-2026.md", "processed")
    assert catalog(root)["resource/archive/minutes-2026.md"]["note"] == note
    assert "resource/minutes.md" not in catalog(root)
    fields, text = note_of(root, "resource/archive/minutes-2026.md")
    assert "source_removed" not in fields and "was removed" not in text, text
    assert fields["source_resource"] == "[[resource/archive/minutes-2026.md]]"
    assert "Source: [[resource/archive/minutes-2026.md]]" in text
    daemon.call("index.sync", {"agent_id": "back"})
    assert len(fake.requests) == calls
    assert [p.relative_to(root).as_posix() for p in (root / "memory").rglob("*.md")
            if "resource" in p.name] == [note]


def test_files_empty_binary_utf16_or_named_with_a_line_break(daemon: DaemonHandle,
                                                             fake: FakeProvider,
                                                             tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/empty.txt", "")
    write(root, "resource/blank.md", " \n\n\t\n")
    (root / "resource/photo.txt").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01" * 50)
    (root / "resource/windows.txt").write_bytes("Budget 2027: 1.2 M€\n".encode("utf-16"))
    write(root, "resource/line\nbreak.md", "Two lines in a name.\n")
    # Not UTF-8: Windows-1251 (all but undecodable: no summary of guesses), Latin-1.
    (root / "resource/cp1251.txt").write_bytes("Протокол: встреча в понедельник.\n"
                                                .encode("cp1251"))
    (root / "resource/latin.txt").write_bytes("Meeting at the café at 9.\n".encode("latin-1"))
    open_ws(daemon, "res", root, fake)
    for rel in ("resource/windows.txt", "resource/line\nbreak.md", "resource/latin.txt"):
        wait_state(root, rel, "processed")
    for rel, why in (("resource/empty.txt", "empty"), ("resource/blank.md", "empty"),
                     ("resource/photo.txt", "not text"), ("resource/cp1251.txt", "UTF-8")):
        wait_state(root, rel, "skipped", "processed")
        assert why in catalog(root)[rel]["reason"], catalog(root)[rel]
    asked = [r.json["messages"][1]["content"] for r in fake.requests
             if r.path.endswith("/chat/completions")]
    # The model is asked about the three text files only, each as its text.
    assert len(asked) == 3, asked
    assert any(a.endswith("\n\nBudget 2027: 1.2 M€\n") for a in asked), asked
    fields, text = note_of(root, "resource/line\nbreak.md")
    assert fields["source_resource"] == "[[resource/line\nbreak.md]]"  # the file, exactly
    body = text.split("---\n", 2)[2]
    assert body.startswith("# line\\nbreak.md\n\n") and body.endswith(  # names the file
        "Source: [resource/line\\\\nbreak.md](<resource/line%0Abreak.md>)\n")
    (root / "resource/line\nbreak.md").unlink()
    wait_for(lambda: catalog(root)["resource/line\nbreak.md"].get("marked"))
    _, text = note_of(root, "resource/line\nbreak.md")
    assert text.endswith(f"\n\n> The source file resource/line\\nbreak.md was removed on "
                         f"{date.today().isoformat()}; this note is kept as the memory of it.\n")


def test_a_summary_the_model_wrapped_in_a_markdown_fence_is_the_note(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake).resource_answer = "```markdown\nMinutes of the board.\n- budget: 3 M\n```"
    write(root, "resource/minutes.txt", "Board minutes: budget 3 M.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/minutes.txt", "processed")
    fields, text = note_of(root, "resource/minutes.txt")
    assert fields["description"] == "Minutes of the board."
    assert "\n\nMinutes of the board.\n- budget: 3 M\n\nSource:" in text and "```" not in text
