"""A warm start through a real daemon: the first search is answered from the committed
generation while the startup reconciles (notes and resources) may still run, and every
change made while the daemon was down is caught all the same."""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import threading
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from hooks import SESSIONS_HELD, start_hook
from test_resource import catalog
from waits import wait_for, wait_log, workspace_status

from recalld.daemon.services import SEARCH_STAGE, WorkspaceServices
from recalld.ipc.errors import RecalldError, ShuttingDown

NOTES = 300  # added while the daemon is down: the startup reconcile has work to do


def ws_status(d: Any) -> dict[str, Any]:
    found = workspace_status(d, "w")
    assert found is not None, "workspace w is not open"
    return found


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def paths(d: Any, query: str) -> list[str]:
    answer = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": 10})
    return [r["path"] for r in answer["results"]]


def build_and_stop(daemon_factory: Any, root: Path) -> tuple[str, Path]:
    """Build ``root`` as workspace ``w`` in a first daemon, wait for its commit and stop
    it; the config and the data directory for the next start."""
    config = f'[workspaces.w]\npath = "{root}"\n[daemon]\npersist_delay_s = 0.05\n'
    d = daemon_factory(config)
    d.call("index.sync", {"agent_id": "w"})

    def committed() -> bool:
        index = ws_status(d)["index"]
        return bool(index.get("last_commit")) and not index.get("uncommitted_changes")

    wait_for(committed, "the first build committed")
    assert d.stop() == 0
    return config, d.data_dir


def test_changes_made_while_down_are_caught_after_the_first_answer(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\nThe 7:40 train to Zurich.\n")
    write(root, "memory/2026-07-24/lunch.md", "# Lunch\nRamen and dumplings.\n")
    write(root, "digest/wiki/gone.md", "# Gone\nA note about the old quokka enclosure.\n")
    (root / "resource").mkdir(parents=True)
    config, data_dir = build_and_stop(daemon_factory, root)

    # While the daemon is down: a note edited, one removed, many added, a resource dropped.
    write(root, "memory/2026-07-24/lunch.md", "# Lunch\nRamen, dumplings and raclette.\n")
    (root / "digest/wiki/gone.md").unlink()
    for i in range(NOTES):
        write(root, f"memory/2026-08-{i % 28 + 1:02d}/n{i}.md",
              f"# Note {i}\nOffline entry number {i} about marmots.\n")
    write(root, "resource/offline.txt", "dropped while the daemon was down\n")

    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(data_dir))
    # The first call: answered from the committed generation, whether or not the startup
    # reconcile is done.
    assert paths(d2, "train Zurich") == ["memory/2026-07-23/commute.md"]
    ws = ws_status(d2)
    index = ws["index"]
    assert index["loaded_generation"] is not None
    watcher = index["watcher"]
    if watcher["last_reconcile"] is None:
        # Answered before the startup reconcile ended: status says it is owed or under
        # way, and health counts the workspace as pending, never clean.
        assert watcher["rescan_owed"] == "startup" or watcher["state"] == "rescanning", watcher
        assert ws["health"]["state"] == "pending", ws["health"]
        assert any("watcher" in r for r in ws["health"]["reasons"]), ws["health"]

    d2.call("index.sync", {"agent_id": "w"})
    startup = ws_status(d2)["index"]["watcher"]["last_reconcile"]
    assert startup["reason"] == "startup", startup
    assert startup["found"] == {"added": NOTES, "changed": 1, "deleted": 1}, startup
    assert paths(d2, "raclette") == ["memory/2026-07-24/lunch.md"]
    assert paths(d2, "quokka") == []
    assert "memory/2026-08-05/n4.md" in paths(d2, "offline entry number 4 marmots")
    assert ws_status(d2)["index"]["files"] == NOTES + 2
    # The resource catalog's own startup reconcile runs once the workspace serves.
    wait_for(lambda: catalog(root).get("resource/offline.txt", {}).get("state")
             in ("pending", "queued", "processed"),
             "the resource dropped while the daemon was down is catalogued")
    assert catalog(root)["resource/offline.txt"]["size"] == len(
        "dropped while the daemon was down\n")


def test_the_search_stage_is_the_first_of_a_workspaces_services() -> None:
    names = [f.name for f in dataclasses.fields(WorkspaceServices)]
    assert tuple(names[:len(SEARCH_STAGE)]) == SEARCH_STAGE


def _open_writer(fifo: Path) -> int | None:
    """A write end of ``fifo`` once someone reads it (None before)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet
            return None
        raise


def test_searches_are_answered_before_the_other_services_and_the_startup_reconcile(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\nThe 7:40 train to Zurich.\n")
    config, data_dir = build_and_stop(daemon_factory, root)

    write(root, "memory/2026-07-25/hike.md", "# Hike\nMarmots on the ridge above Arosa.\n")
    # The sessions store (after the search stage) is held as it starts (hooks.py), and
    # so the daemon's start, until a writer comes.
    held = tmp_path / "hold"
    os.mkfifo(held)
    d2 = daemon_factory(config, wait="searchable", **start_hook(tmp_path, SESSIONS_HELD),
                        HOLD=str(held),
                        HOLD_AGENT="w", RECALLD_DATA_DIR=str(data_dir))
    status: list[Any] = []
    asked = threading.Thread(target=lambda: status.append(d2.call("daemon.status")),
                             daemon=True)
    asked.start()
    writer = wait_for(lambda: _open_writer(held), "the sessions store opens the FIFO")
    try:
        # Searches are answered from the saved generation: the startup reconcile waits
        # for the start, which waits for the held service; other calls wait too.
        assert paths(d2, "train Zurich") == ["memory/2026-07-23/commute.md"]
        assert paths(d2, "marmots Arosa") == []
        assert not status and asked.is_alive()
    finally:
        os.close(writer)  # the store starts
    asked.join(60)
    assert status, "daemon.status answered once the start ended"
    states = {w["agent_id"]: w["state"] for w in status[0]["workspaces"]}
    assert states["w"] == "ready", states
    d2.call("index.sync", {"agent_id": "w"})
    assert paths(d2, "marmots Arosa") == ["memory/2026-07-25/hike.md"]
    startup = ws_status(d2)["index"]["watcher"]["last_reconcile"]
    assert startup["reason"] == "startup" and startup["found"]["added"] == 1, startup


def test_a_stop_during_the_start_fails_the_calls_that_wait_for_it(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\nThe 7:40 train to Zurich.\n")
    config, data_dir = build_and_stop(daemon_factory, root)
    # A second workspace whose sessions store holds the start (as above); w opens whole.
    other = tmp_path / "other"
    held = tmp_path / "hold"
    os.mkfifo(held)
    config += f'[workspaces.v]\npath = "{other}"\n'
    d2 = daemon_factory(config, wait="searchable", **start_hook(tmp_path, SESSIONS_HELD),
                        HOLD=str(held),
                        HOLD_AGENT="v", RECALLD_DATA_DIR=str(data_dir))
    answers: dict[str, Any] = {}

    def ask(name: str, method: str, params: Any = None) -> threading.Thread:
        def run() -> None:
            try:
                answers[name] = d2.call(method, params)
            except RecalldError as exc:
                answers[name] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    asked = [ask("status", "daemon.status")]
    writer = wait_for(lambda: _open_writer(held), "the sessions store opens the FIFO")
    try:
        assert paths(d2, "train Zurich") == ["memory/2026-07-23/commute.md"]
        wait_log(d2.log_path, "workspace w: every service started", "w opened whole")
        # A search of w that waits for its watch, which comes after the start.
        asked.append(ask("synced", "memory.search",
                         {"agent_id": "w", "query": "train", "sync": True}))
        d2.signal(signal.SIGTERM)
        for thread in asked:
            thread.join(60)
        assert isinstance(answers.get("status"), ShuttingDown), answers
        # Answered as the server drains (the stop releases the watch), not cut off.
        synced = answers.get("synced")
        assert isinstance(synced, dict), answers
        assert [r["path"] for r in synced["results"]] == ["memory/2026-07-23/commute.md"]
    finally:
        os.close(writer)  # the held store's thread goes on: so does the stop
    assert d2.stop() == 0
    assert "stopping" in d2.log()


def test_the_vector_backfill_waits_for_the_start(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\nThe 7:40 train to Zurich.\n")
    config, data_dir = build_and_stop(daemon_factory, root)  # keyword only: no vectors yet
    other = tmp_path / "other"  # its sessions store holds the start (as above)
    held = tmp_path / "hold"
    os.mkfifo(held)
    with FakeProvider(dims=8, api_key="k") as fake:
        vectors = (f'embedding_model_config = {{backend = "openai", base_url = '
                   f'"{fake.url}/v1", api_key = "k", model_name = "m", dimensions = 8}}\n')
        config = config.replace("[daemon]\n", vectors + "[daemon]\n", 1)
        config += f'[workspaces.v]\npath = "{other}"\n'
        d2 = daemon_factory(config, wait="searchable", **start_hook(tmp_path, SESSIONS_HELD),
                            HOLD=str(held), HOLD_AGENT="v", RECALLD_DATA_DIR=str(data_dir))
        writer = wait_for(lambda: _open_writer(held), "the sessions store opens the FIFO")
        try:
            # The provider's health check is made at once; no chunk text is sent for its
            # vector while the start goes on.
            wait_for(lambda: fake.requests, "the provider's health check")
            answer = d2.call("memory.search", {"agent_id": "w", "query": "Zurich commute"})
            assert [r["path"] for r in answer["results"]] == ["memory/2026-07-23/commute.md"]
            assert not any(b"7:40" in r.body for r in fake.requests), fake.requests
        finally:
            os.close(writer)
        wait_for(lambda: any(b"7:40" in r.body for r in fake.requests),
                 "the backfill once the start ended")
        vectors_status = ws_status(d2)["index"]["vectors"]
        assert vectors_status["enabled"], vectors_status


def test_a_note_touched_without_a_change_is_read_again_once_not_at_every_start(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A new mtime, the same bytes (touch, a checkout, a sync tool): the index keeps the
    # new stat and saves it, so later starts find the note as it was saved.
    root = tmp_path / "ws"
    for i in range(3):
        write(root, f"memory/2026-07-23/n{i}.md", f"# Note {i}\nsame words {i}\n")
    config, data_dir = build_and_stop(daemon_factory, root)
    for i in range(3):
        note = root / f"memory/2026-07-23/n{i}.md"
        st = note.stat()
        os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))

    def startup_found(d: Any) -> dict[str, int]:
        d.call("index.sync", {"agent_id": "w"})
        last = ws_status(d)["index"]["watcher"]["last_reconcile"]
        assert last["reason"] == "startup", last
        return dict(last["found"])

    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(data_dir))
    assert startup_found(d2) == {"added": 0, "changed": 3, "deleted": 0}
    assert d2.stop() == 0
    d3 = daemon_factory(config, RECALLD_DATA_DIR=str(data_dir))
    assert startup_found(d3) == {"added": 0, "changed": 0, "deleted": 0}
    assert paths(d3, "same words 2")[0] == "memory/2026-07-23/n2.md"


def test_a_note_rewritten_at_its_size_with_its_old_time_is_caught_at_start(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A copy that keeps the modification time (cp -p, rsync -a, tar x) of a version of the
    # same size: the status-change time, which nothing sets back, tells it changed.
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/box.md", "# Box\n- [ ] call the plumber\n")
    write(root, "digest/wiki/code.md", "# Code\nThe gate code is walnut.\n")
    # Copied with an older mtime kept, so its status-change time is later: the resource
    # catalog knows files by their mtime alone (as ReMe's does), and reads none again.
    write(root, "resource/list.csv", "item,qty\nnails,40\n")
    os.utime(root / "resource/list.csv", ns=(1_700_000_000_000_000_000,) * 2)
    config, data_dir = build_and_stop(daemon_factory, root)
    box, code = root / "memory/2026-07-23/box.md", root / "digest/wiki/code.md"
    kept = {note: note.stat() for note in (box, code)}
    box.write_text("# Box\n- [x] call the plumber\n", encoding="utf-8")  # in place
    swap = code.with_name("code.md.new")  # and by a rename, another inode
    swap.write_text("# Code\nThe gate code is cashew.\n", encoding="utf-8")
    swap.replace(code)
    for note, st in kept.items():
        os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (note.stat().st_mtime_ns, note.stat().st_size) == (st.st_mtime_ns, st.st_size)

    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(data_dir))
    d2.call("index.sync", {"agent_id": "w"})
    last = ws_status(d2)["index"]["watcher"]["last_reconcile"]
    assert last["found"] == {"added": 0, "changed": 2, "deleted": 0}, last
    assert paths(d2, "cashew") == ["digest/wiki/code.md"]
    assert paths(d2, "walnut") == []
    assert d2.call("memory.search", {"agent_id": "w", "query": "plumber"})[
        "results"][0]["text"].count("[x]") == 1
    assert d2.call("index.verify", {"agent_id": "w"})["ok"] is True
    wait_for(lambda: ws_status(d2)["resource"]["watcher"]["last_reconcile"] is not None,
             "the resource catalog's startup reconcile")
    resources = ws_status(d2)["resource"]["watcher"]["last_reconcile"]
    assert resources["found"] == {"added": 0, "changed": 0, "deleted": 0}, resources
