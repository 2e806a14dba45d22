"""A generation saved by an older version: rebuilt where needed, never reported as damage."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import trio
from hooks import run_first
from waits import until

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index import bm25_saved, passes, persist
from recalld.daemon.index.links import Link
from recalld.daemon.index.persist import IndexStore, snapshot
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.rules import CHUNKING
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.state import IndexState
from recalld.daemon.index.tokenizer import tokenize_query
from recalld.daemon.maintenance import Health, verify
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace
from recalld.ipc.cli_ops import verify_lines
from recalld.ipc.health import assess

NOTE = "---\nname: zeppelin\n---\n# Airships\n\nThey flew over the lake.\n"
REL = "memory/2026-07-23/a.md"


def saved(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / REL).parent.mkdir(parents=True)
    (root / REL).write_text(NOTE, encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(root, [REL], max_chars=1600, digests={})])
    meta = tmp_path / "meta"
    IndexStore(meta).save(snapshot(state))
    return meta


def test_current_generation_loads_as_saved(tmp_path: Path) -> None:
    meta = saved(tmp_path)
    state = IndexState()
    report = IndexStore(meta).load(state)
    assert report.rebuilt == [] and report.corrupt == {}
    assert state.files[REL].digest and state.files[REL].mtime_ns


def test_older_keyword_format_and_chunking_are_redone_not_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm25_saved, "VERSION", 1)
    monkeypatch.setattr(persist, "CHUNKING", 1)
    meta = saved(tmp_path)
    monkeypatch.undo()
    state = IndexState()
    report = IndexStore(meta).load(state)
    assert report.corrupt == {} and sorted(report.rebuilt) == ["bm25", "chunks"]
    # The keyword index is rebuilt from the stored chunks and answers at once ...
    hits = state.bm25.search(tokenize_query("zeppelin"), 5)
    assert [state.chunks[k].path for k, _ in hits] == [REL]
    # ... and every file reads as changed, so the reconcile chunks it again.
    info = state.files[REL]
    assert (info.mtime_ns, info.size, info.digest) == (0, 0, "") and list(info.keys)


def test_links_saved_under_older_rules_are_resolved_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An older version took [[Kafka.md]] as a path from the root, naming no note; a load
    # resolves such an edge by the present rules (the note written is not read again).
    root = tmp_path / "ws"
    rels = ["memory/2026-07-23/kafka.md", "memory/2026-07-23/plan.md"]
    for rel, text in zip(rels, ["# Kafka\nlog\n", "# Plan\nsee [[Kafka.md]]\n"], strict=True):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=1600, digests={})])
    state.graph.add_file(rels[1], [Link(rels[1], "Kafka.md", "link", 2)])
    monkeypatch.setattr(persist, "LINKING", 0)
    IndexStore(tmp_path / "meta").save(snapshot(state))
    monkeypatch.undo()
    state = IndexState()
    report = IndexStore(tmp_path / "meta").load(state)
    assert report.rebuilt == ["links"] and report.corrupt == {}
    assert state.neighbours(rels[1]) == [rels[0]] and state.neighbours(rels[0]) == [rels[1]]
    assert [(lk.dst, lk.resolved, lk.by_name) for lk in state.graph.outgoing(rels[1])] == [
        (rels[0], True, True)]


def test_links_read_by_older_rules_are_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An older version read a link in a comment as an edge: a load makes every note read
    # as changed, so the startup reconcile reads its links by the present rules.
    root = tmp_path / "ws"
    rels = ["memory/2026-07-23/kafka.md", "memory/2026-07-23/plan.md"]
    texts = ["# Kafka\nlog\n", "# Plan\n<!-- see [[kafka]] -->\n"]
    for rel, text in zip(rels, texts, strict=True):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=1600, digests={})])
    state.graph.add_file(rels[1], [Link(rels[1], rels[0], "link", 2, by_name=True)])
    monkeypatch.setattr(persist, "LINKING", 1)
    IndexStore(tmp_path / "meta").save(snapshot(state))
    monkeypatch.undo()
    state = IndexState()
    report = IndexStore(tmp_path / "meta").load(state)
    assert report.rebuilt == ["links"] and report.corrupt == {}
    assert {p: (f.mtime_ns, f.size, f.digest) for p, f in state.files.items()} == {
        p: (0, 0, "") for p in rels}
    digests = {p: f.digest for p, f in state.files.items()}
    state.apply([prepare_files(root, rels, max_chars=1600, digests=digests)])
    assert state.neighbours(rels[1]) == [] and len(state.graph) == 0


def test_generations_saved_under_older_rules_go_once_the_files_are_chunked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Older rules left text unmasked in their chunks: kept as a fallback, such a
    # generation stayed on disk until two more saves (in an idle workspace, for good).
    monkeypatch.setattr(persist, "CHUNKING", 1)
    meta = saved(tmp_path)
    older, state = IndexStore(meta), IndexState()
    older.load(state)
    older.save(snapshot(state))  # a second generation of those rules
    monkeypatch.undo()
    store, state = IndexStore(meta), IndexState()
    store.load(state)
    # A save before the file is chunked again drops the older generations ...
    store.save(snapshot(state))
    names = sorted(p.name for p in (meta / "index").iterdir())
    assert [n for n in names if n.startswith("MANIFEST")] == ["MANIFEST-000003.json"]
    # ... and so does the first one after it: the last with chunks of the old rules.
    state.apply([prepare_files(tmp_path / "ws", [REL], max_chars=1600, digests={})])
    store.save(snapshot(state))
    names = sorted(p.name for p in (meta / "index").iterdir())
    assert [n for n in names if n.startswith("MANIFEST")] == ["MANIFEST-000004.json"]
    assert not [n for n in names if ".g000003." in n or ".g000001." in n], names
    # From then on the previous generation is kept again, as a fallback.
    store.save(snapshot(state))
    names = sorted(p.name for p in (meta / "index").iterdir() if p.name.startswith("MANI"))
    assert names == ["MANIFEST-000004.json", "MANIFEST-000005.json"]


@pytest.mark.parametrize("damaged", ["bm25", "chunks"])
def test_older_rules_are_redone_also_when_a_file_of_the_generation_is_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: str) -> None:
    # Damage found in a generation of older rules (a torn keyword index, chunk records
    # that do not verify) kept its notes as those rules chunked, masked and linked them:
    # saved again under the present rules' numbers, they were never read again.
    monkeypatch.setattr(persist, "CHUNKING", 1)
    monkeypatch.setattr(persist, "LINKING", 1)
    meta = saved(tmp_path)
    monkeypatch.undo()
    (path,) = (meta / "index").glob(f"{damaged}.g*")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    state = IndexState()
    report = IndexStore(meta).load(state)
    assert damaged in report.corrupt and "all" not in report.rebuilt
    assert "chunks" in report.rebuilt and "links" in report.rebuilt
    info = state.files[REL]
    assert (info.mtime_ns, info.size, info.digest) == (0, 0, "") and list(info.keys)
    hits = state.bm25.search(tokenize_query("zeppelin"), 5)
    assert [state.chunks[k].path for k, _ in hits] == [REL]


async def test_status_says_notes_are_read_again_under_these_rules_not_that_files_differ(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # While the startup reconcile read every note of an index saved under older rules
    # again, health said "N file(s) on disk differ from the index" (nothing had changed on
    # disk), listed them as not indexed, and nothing said why.
    caplog.set_level(logging.INFO, logger="recalld.daemon.index.service")
    root = tmp_path / "ws"
    rels = [f"memory/2026-07-23/{name}.md" for name in ("Ærø", "東京", "plan b")]
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n\nwords of {rel}\n", encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=1600, digests={})])
    monkeypatch.setattr(persist, "CHUNKING", CHUNKING - 1)
    IndexStore(root / WorkspaceSettings().metadata_dir).save(snapshot(state))
    monkeypatch.undo()
    reading, release = threading.Event(), threading.Event()

    def hold() -> None:
        reading.set()
        release.wait(120)

    run_first(monkeypatch, passes, "prepare_files", hold)
    ws = Workspace("w", root, WorkspaceSettings())
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    cpu = trio.CapacityLimiter(2)
    index = WorkspaceIndex(ws, cfg, cpu=cpu,
                           watcher_config=WatcherConfig(reconcile_interval_s=3600.0))
    health = Health(ws, index, cpu)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(index.run)
        try:
            await until(reading.is_set, "the startup reconcile reading the notes")
            await until(health.first_scan.is_set, "the startup reconcile's scan")
            report = health.status()
            assert report["state"] == "pending"
            assert (report["unindexed"], report["unindexed_paths"], report["read_again"]) == (
                0, [], 3)
            assert "3 note(s) left to read again under this version's rules (the saved " \
                "index was made under older ones)" in report["reasons"]
            assert not [r for r in report["reasons"] if "differ" in r]
            assert index.status()["load_rebuilt"] == ["chunks"]
            # recalld verify lists them apart: their stat was cleared, not changed on disk.
            checked = await verify(ws, index, cpu)
            assert (checked["stat_differs"]["count"], checked["read_again"]["count"]) == (0, 3)
            assert [line.split(":")[0] for line in verify_lines(dict(checked))] == [
                "  left to read again under this version's rules (the saved index was made "
                "under older ones)"]
            # recalld status and doctor say so too.
            assessed = assess({"agent_id": "w", "state": "open", "health": report,
                               "index": index.status()})
            (fact,) = [text for what, text in assessed.facts if what == "index"]
            assert fact.endswith("indexed, 3 note(s) left to read again under this "
                                 "version's rules") and "not indexed" not in fact, fact
            (problem,) = assessed.problems
            assert problem.what.startswith(
                "pending: 3 note(s) left to read again under this version's rules (the saved "
                "index was made under older ones)"), problem.what
        finally:
            release.set()
        await index.sync()
        report = health.status()
        assert report["read_again"] == 0
        checked = await verify(ws, index, cpu)
        assert checked["read_again"]["count"] == 0 and checked["stat_differs"]["count"] == 0
        assert not [r for r in report["reasons"] if "read again" in r], report["reasons"]
        nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "older rules" in r.getMessage()]
    assert said == ["w: the saved index was made under older rules; every note is chunked "
                    "again"]


def test_a_generation_saved_midway_through_reading_again_goes_too_after_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stop while the notes of older rules were read again saved a generation under
    # these rules' numbers that still held some of the old chunks: loaded at the next
    # start, it was kept as a fallback once they were read, for good in an idle workspace.
    root = tmp_path / "ws"
    rels = ["memory/2026-07-23/ödön.md", "memory/2026-07-23/שלום.md"]
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n\ntext of {rel}\n", encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=1600, digests={})])
    meta = tmp_path / "meta"
    monkeypatch.setattr(persist, "CHUNKING", CHUNKING - 1)
    IndexStore(meta).save(snapshot(state))
    monkeypatch.undo()
    store, state = IndexStore(meta), IndexState()
    store.load(state)
    digests = {p: f.digest for p, f in state.files.items()}
    state.apply([prepare_files(root, rels[:1], max_chars=1600, digests=digests)])
    midway = store.save(snapshot(state))  # the stop: one note still to read again
    store, state = IndexStore(meta), IndexState()  # the next start
    assert store.load(state).rebuilt == [] and state.files[rels[1]].read_again
    digests = {p: f.digest for p, f in state.files.items()}
    state.apply([prepare_files(root, rels[1:], max_chars=1600, digests=digests)])
    store.save(snapshot(state))
    names = sorted(p.name for p in (meta / "index").iterdir())
    assert not [n for n in names if f".g{midway:06d}." in n or n == f"MANIFEST-{midway:06d}.json"
                ], names
