"""The dream does not consolidate again what ReMe's dream already did; digests' old edges count."""

from __future__ import annotations

import json
import os
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any

import zstandard
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, chat_answer
from reme_fixture_util import FIXTURE, copy_fixture, fixture_notes
from waits import wait_job

from recalld.daemon.store.fsio import REAL
from recalld.daemon.store.records import read_foreign_records, read_records, write_records

AGENT = "dreamer"


class NoteRecorder:
    """A chat model that answers every dream conversation at once, noting its note."""

    def __init__(self, fake: FakeProvider) -> None:
        self.notes: list[str] = []
        self._lock = threading.Lock()
        fake.chat_default = self.answer

    def answer(self, req: Any) -> dict[str, Any]:
        user = next(m["content"] for m in req["messages"] if m["role"] == "user")
        if user.startswith("Daily note "):
            with self._lock:
                self.notes.append(user.split(":", 1)[0].removeprefix("Daily note "))
        return chat_answer("nothing to integrate")


def open_ws(daemon: DaemonHandle, root: Path, fake: FakeProvider) -> None:
    daemon.call("workspace.open", {"agent_id": AGENT, "path": str(root), "config": {
        "dream_cron_enabled": False,
        "chat_model_config": {"backend": "openai", "base_url": fake.url + "/v1",
                              "model_name": "fake", "api_key": "sk-test", "timeout_s": 10.0}}})


def dream(daemon: DaemonHandle) -> dict[str, Any]:
    job_id = daemon.call("jobs.submit", {"agent_id": AGENT, "kind": "auto_dream",
                                         "params": {}})["job_id"]
    job = wait_job(daemon, job_id, agent=AGENT)
    assert job["state"] == "succeeded", job
    result: dict[str, Any] = job["result"]
    return result


def reme_dreamed() -> set[str]:
    path = FIXTURE / "mem_metadata" / "file_catalog" / "dream.jsonl.zst"
    return {r["path"] for r in read_foreign_records(path).records}


def test_only_notes_reme_had_not_consolidated_are_dreamed(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "ws")
    model = NoteRecorder(fake)
    done_by_reme = reme_dreamed()
    daily = [p for p in fixture_notes() if p.startswith("memory/")]
    assert 0 < len(done_by_reme) < len(daily)
    changed = sorted(done_by_reme)[0]  # consolidated by ReMe, changed since
    with (ws / changed).open("a", encoding="utf-8") as f:
        f.write("\nA fact ReMe's dream has not seen.\n")
    open_ws(daemon, ws, fake)
    result = dream(daemon)
    expected = sorted({p for p in daily if p not in done_by_reme} | {changed})
    assert sorted(model.notes) == expected
    assert result["notes"] == len(expected)
    assert result["recognised_from_reme"] == len(done_by_reme) - 1
    # recalld's catalog beside ReMe's; ReMe's stays as ReMe wrote it.
    ours = {r["path"]: r for r in read_records(ws / "mem_metadata/catalog/dream.jsonl.zst")}
    assert set(ours) == set(daily)
    assert {p for p, r in ours.items() if r.get("source") == "reme"} == done_by_reme - {changed}
    assert (ws / "mem_metadata/file_catalog/dream.jsonl.zst").read_bytes() == (
        FIXTURE / "mem_metadata/file_catalog/dream.jsonl.zst").read_bytes()
    # The next run has nothing left; an edit to a note ReMe consolidated is dreamed.
    model.notes.clear()
    assert dream(daemon)["notes"] == 0 and model.notes == []
    other = sorted(done_by_reme)[1]
    with (ws / other).open("a", encoding="utf-8") as f:
        f.write("\nOne more line.\n")
    assert dream(daemon)["notes"] == 1 and model.notes == [other]


def reme_dreams(ws: Path, *notes: str) -> None:
    """ReMe's dream consolidates ``notes`` as they are now (its record: path and mtime)."""
    path = ws / "mem_metadata/file_catalog/dream.jsonl.zst"
    old = {r["path"]: r for r in read_foreign_records(path).records} if path.exists() else {}
    for rel in notes:
        old[rel] = {"path": rel, "st_mtime": (ws / rel).stat().st_mtime, "links": [],
                    "chunk_ids": [], "front_matter": {"name": "", "description": ""}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_records(REAL, path, list(old.values()))


def test_back_and_forth_nothing_reme_dreamed_is_dreamed_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    a, b = "memory/2026-07-01/a.md", "memory/2026-07-01/b.md"
    (ws / a).parent.mkdir(parents=True)
    (ws / a).write_text("Tea, no sugar.\n", "utf-8")
    (ws / b).write_text("Coffee, black.\n", "utf-8")
    reme_dreams(ws, a)
    model = NoteRecorder(fake)
    open_ws(daemon, ws, fake)
    assert dream(daemon)["notes"] == 1 and model.notes == [b]
    # Back in QwenPaw: both notes are edited and ReMe's dream consolidates them. Once
    # recalld serves the workspace again, neither is paid for a second time.
    for rel in (a, b):
        with (ws / rel).open("a", encoding="utf-8") as f:
            f.write("Edited while QwenPaw served the workspace.\n")
    reme_dreams(ws, a, b)
    model.notes.clear()
    result = dream(daemon)
    assert (result["notes"], result["recognised_from_reme"], model.notes) == (0, 2, [])
    # An edit ReMe's dream has not read is dreamed.
    with (ws / a).open("a", encoding="utf-8") as f:
        f.write("One more line.\n")
    assert dream(daemon)["notes"] == 1 and model.notes == [a]


def test_a_catalog_recalld_kept_in_remes_folder_moves_beside_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    note = ws / "memory/2026-07-01/a.md"
    note.parent.mkdir(parents=True)
    note.write_text("Tea, no sugar.\n", "utf-8")
    import hashlib
    sha = hashlib.sha256(note.read_text("utf-8").encode()).hexdigest()
    legacy = ws / "mem_metadata/file_catalog/dream.jsonl.zst"
    legacy.parent.mkdir(parents=True)
    write_records(REAL, legacy, [{"path": "memory/2026-07-01/a.md", "digest": sha,
                                  "state": "processed"}])
    model = NoteRecorder(fake)
    open_ws(daemon, ws, fake)
    note2 = ws / "memory/2026-07-02/b.md"
    note2.parent.mkdir()
    note2.write_text("Coffee, black.\n", "utf-8")
    assert dream(daemon)["notes"] == 1 and model.notes == ["memory/2026-07-02/b.md"]
    assert not legacy.exists()
    moved = {r["path"] for r in read_records(ws / "mem_metadata/catalog/dream.jsonl.zst")}
    assert moved == {"memory/2026-07-01/a.md", "memory/2026-07-02/b.md"}


def test_old_derived_from_and_relates_to_lines_count_as_sources_and_relations() -> None:
    from recalld.daemon.index.links import extract_links
    from recalld.daemon.memory import digest, integration

    path = "digest/wiki/deploy-runbook.md"
    text = (FIXTURE / path).read_text("utf-8").replace(
        "relates_to:: [[digest/wiki/deploy-runbook]]",
        "relates_to:: [[digest/wiki/budget-notes]]")
    kinds = {(lk.kind, lk.dst) for lk in extract_links(path, text)}
    assert ("related", "digest/wiki/budget-notes.md") in kinds
    derived = {dst for kind, dst in kinds if kind == "source"}
    assert len(derived) == 2 and all(d.startswith("memory/") for d in derived)
    node = digest.parse_node(path, text)
    assert set(node.sources) == derived and node.related == ["digest/wiki/budget-notes.md"]
    assert node.confidence == digest.confidence_for(2)
    assert "derived_from" not in node.content and "Consolidated knowledge" in node.content
    # A corroboration adds to the old sources; the node is then written in recalld's form.
    new_source = "memory/2026-06-17/deploy-1.md"
    out = integration.integrate(node, digest.Integration(
        action="CORROBORATE", bucket="wiki", name=node.name, sources=(new_source,),
        node=path), "2026-06-18")
    assert out.status == "applied" and out.text is not None
    again = digest.parse_node(path, out.text)
    assert set(again.sources) == derived | {new_source}
    assert again.confidence == digest.confidence_for(3)
    assert "derived_from::" not in out.text and "## Sources" in out.text
    # Links under recalld's own section headings have the same kinds.
    kinds = {(lk.kind, lk.dst) for lk in extract_links(path, out.text)}
    assert ("source", new_source) in kinds
    assert ("related", "digest/wiki/budget-notes.md") in kinds


def test_resources_reme_interpreted_are_not_interpreted_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # ReMe's auto_resource turned resource files into daily notes (source_resource) and
    # recorded each file's time. Unchanged: its note stands. Changed since: interpreted
    # again into ReMe's note. Never summarized by ReMe: a note of its own.
    from test_resource import catalog, wait_state

    ws = tmp_path / "ws"
    (ws / "resource").mkdir(parents=True)
    for name in ("kept", "changed", "fresh"):
        (ws / f"resource/{name}.md").write_text(f"# {name}\n\nThe heron report, {name}.\n")
    for name in ("kept", "changed"):
        note = ws / f"memory/2026-06-10/{name}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f'---\nname: {name}\nsource_resource: "[[resource/{name}.md]]"\n'
                        f"---\n# {name}\n\n- ReMe's summary of {name}.\n", "utf-8")
    record = ws / "mem_metadata/file_catalog/resource.jsonl.zst"
    record.parent.mkdir(parents=True)
    write_records(REAL, record, [
        {"path": f"resource/{name}.md", "links": [], "chunk_ids": [],
         "st_mtime": (ws / f"resource/{name}.md").stat().st_mtime - (name == "changed")}
        for name in ("kept", "changed")])
    asked: list[str] = []

    def answer(req: Any) -> dict[str, Any]:
        asked.append(next(m["content"] for m in req["messages"] if m["role"] == "user"))
        return chat_answer("A summary by recalld.")

    fake.chat_default = answer
    open_ws(daemon, ws, fake)
    wait_state(ws, "resource/fresh.md", "processed")
    wait_state(ws, "resource/changed.md", "processed")
    entries = catalog(ws)
    assert entries["resource/kept.md"]["state"] == "processed"
    assert entries["resource/kept.md"]["note"] == "memory/2026-06-10/kept.md"
    assert entries["resource/changed.md"]["note"] == "memory/2026-06-10/changed.md"
    assert entries["resource/fresh.md"]["note"] not in {
        "memory/2026-06-10/kept.md", "memory/2026-06-10/changed.md"}
    assert len(asked) == 2 and not any("kept" in a for a in asked)
    assert "ReMe's summary of kept" in (ws / "memory/2026-06-10/kept.md").read_text()
    assert "A summary by recalld" in (ws / "memory/2026-06-10/changed.md").read_text()
    notes = sorted(p.name for p in (ws / "memory").rglob("*.md"))
    assert len(notes) == 3, notes


def test_a_restore_elsewhere_does_not_dream_again_what_reme_consolidated(
        daemon: DaemonHandle, daemon_factory: DaemonFactory, fake: FakeProvider,
        tmp_path: Path) -> None:
    # ReMe knows the notes its dream read by their modification time, in its own record
    # under mem_metadata/: a backup left the record out and a restore gave every note a
    # new time, so another machine dreamed them all again.
    ws = copy_fixture(tmp_path / "ws")
    open_ws(daemon, ws, fake)
    archive = daemon.call("backup.create", {"agents": [AGENT], "include_secrets": True})
    other = daemon_factory()
    other.call("backup.restore", {"file": archive["file"]})
    root = Path(next(w["path"] for w in other.call("workspace.list")["workspaces"]
                     if w["agent_id"] == AGENT))
    assert root != ws
    assert {rel: (root / rel).stat().st_mtime_ns for rel in fixture_notes()} == {
        rel: (ws / rel).stat().st_mtime_ns for rel in fixture_notes()}
    model = NoteRecorder(fake)
    result = dream(other)
    done_by_reme = reme_dreamed()
    daily = [p for p in fixture_notes() if p.startswith("memory/")]
    assert sorted(model.notes) == sorted(p for p in daily if p not in done_by_reme)
    assert result["recognised_from_reme"] == len(done_by_reme)


def test_a_copy_without_file_times_does_not_dream_again_what_reme_consolidated(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # ReMe's dream record knows notes by their modification time only; a copy that did
    # not keep times (cp -r, a download, a checkout) gave every note a new one. ReMe's
    # index (its file graph at the time the dream recorded, its chunks still saying what
    # the note says) shows which are unchanged: only the changed one is dreamed again.
    ws = copy_fixture(tmp_path / "ws")
    done_by_reme = reme_dreamed()
    changed = sorted(done_by_reme)[0]
    with (ws / changed).open("a", encoding="utf-8") as f:
        f.write("\nA fact ReMe's dream has not seen.\n")
    # One ReMe indexed again after its dream read it (edited, then edited back): its
    # index no longer vouches for what the dream read.
    reindexed = sorted(done_by_reme)[1]
    graph = ws / "mem_metadata" / "file_graph" / "default.jsonl.zst"
    nodes = read_foreign_records(graph).records
    for node in nodes:
        if node["path"] == reindexed:
            node["st_mtime"] += 60
    graph.write_bytes(zstandard.compress(b"".join(
        json.dumps(n).encode() + b"\n" for n in nodes)))
    later = time.time() + 3600
    for rel in fixture_notes():
        os.utime(ws / rel, (later, later))
    model = NoteRecorder(fake)
    open_ws(daemon, ws, fake)
    result = dream(daemon)
    daily = [p for p in fixture_notes() if p.startswith("memory/")]
    assert sorted(model.notes) == sorted({p for p in daily if p not in done_by_reme}
                                         | {changed, reindexed})
    assert result["recognised_from_reme"] == len(done_by_reme) - 2


def test_a_note_renamed_or_moved_since_reme_consolidated_it_is_not_dreamed_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "ws")
    model = NoteRecorder(fake)
    done_by_reme = sorted(reme_dreamed())
    daily = [p for p in fixture_notes() if p.startswith("memory/")]
    renamed, moved, replaced = done_by_reme[:3]
    (ws / renamed).rename(ws / renamed.replace(".md", " (kept).md"))
    (ws / "memory" / "archive").mkdir()
    (ws / moved).rename(ws / "memory" / "archive" / "old.md")
    # Another note in the place of one, with its time: it says something else.
    stamp = (ws / replaced).stat().st_mtime_ns
    (ws / replaced).unlink()
    (ws / "memory" / "archive" / "new.md").write_text("# New\n\nA plan ReMe never read.\n")
    os.utime(ws / "memory" / "archive" / "new.md", ns=(stamp, stamp))
    open_ws(daemon, ws, fake)
    result = dream(daemon)
    expected = sorted({p for p in daily if p not in done_by_reme} | {"memory/archive/new.md"})
    assert sorted(model.notes) == expected
    assert result["recognised_from_reme"] == len(done_by_reme) - 1


def test_a_note_whose_name_changed_normal_form_is_not_dreamed_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # ReMe recorded two notes under decomposed names (é as e and a combining accent, as
    # macOS' older file system writes them); the workspace came over by a way that
    # composed the names and did not keep file times (a git checkout, an archive).
    # Neither time nor name as written matches: the name is the same name all the same.
    ws = copy_fixture(tmp_path / "ws")
    done_by_reme = sorted(reme_dreamed())
    renamed = {rel: rel.replace(".md", "-caf\u00e9.md") for rel in done_by_reme[:2]}
    decomposed = {rel: unicodedata.normalize("NFD", new) for rel, new in renamed.items()}
    meta = ws / "mem_metadata"
    for part in ("file_catalog/dream.jsonl.zst", "file_graph/default.jsonl.zst",
                 "file_store/file_chunks_default_v1.jsonl.zst"):
        records = read_foreign_records(meta / part).records
        for rec in records:
            rec["path"] = decomposed.get(rec["path"], rec["path"])
        (meta / part).write_bytes(zstandard.compress(b"".join(
            json.dumps(r).encode() + b"\n" for r in records)))
    for rel, new in renamed.items():
        (ws / rel).rename(ws / new)
    later = time.time() + 3600
    for note in (ws / "memory").rglob("*.md"):
        os.utime(note, (later, later))
    model = NoteRecorder(fake)
    open_ws(daemon, ws, fake)
    result = dream(daemon)
    daily = [p for p in fixture_notes() if p.startswith("memory/")]
    assert sorted(model.notes) == sorted(p for p in daily if p not in done_by_reme)
    assert result["recognised_from_reme"] == len(done_by_reme)


def test_resources_reme_named_in_another_normal_form_are_not_interpreted_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # ReMe read "café" decomposed (as macOS wrote the names), in its record and in its
    # note's source_resource; the files came over composed, with their times. Unchanged:
    # its note stands; changed since: interpreted again into that note, not a second one.
    from test_resource import catalog, wait_state

    ws = tmp_path / "ws"
    (ws / "resource").mkdir(parents=True)
    note_dir = ws / "memory/2026-06-10"
    note_dir.mkdir(parents=True)
    names = {kind: f"caf\u00e9-{kind}.md" for kind in ("kept", "changed")}
    reme_name = {kind: unicodedata.normalize("NFD", name) for kind, name in names.items()}
    for kind, name in names.items():
        (ws / "resource" / name).write_text(f"# {kind}\n\nThe heron report, {kind}.\n")
        (note_dir / f"{kind}.md").write_text(
            f'---\nname: {kind}\nsource_resource: "[[resource/{reme_name[kind]}]]"\n'
            f"---\n# {kind}\n\n- ReMe's summary of {kind}.\n", "utf-8")
    record = ws / "mem_metadata/file_catalog/resource.jsonl.zst"
    record.parent.mkdir(parents=True)
    write_records(REAL, record, [
        {"path": f"resource/{reme_name[kind]}", "links": [], "chunk_ids": [],
         "st_mtime": (ws / "resource" / name).stat().st_mtime - (kind == "changed")}
        for kind, name in names.items()])
    fake.chat_default = lambda req: chat_answer("A summary by recalld.")
    open_ws(daemon, ws, fake)
    wait_state(ws, f"resource/{names['changed']}", "processed")
    entries = catalog(ws)
    assert entries[f"resource/{names['kept']}"]["state"] == "processed"
    for kind, name in names.items():
        assert entries[f"resource/{name}"]["note"] == f"memory/2026-06-10/{kind}.md"
    assert "ReMe's summary of kept" in (note_dir / "kept.md").read_text()
    assert "A summary by recalld" in (note_dir / "changed.md").read_text()
    assert sorted(p.name for p in (ws / "memory").rglob("*.md")) == ["changed.md", "kept.md"]
