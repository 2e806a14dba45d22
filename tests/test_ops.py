"""Operations through a real daemon and the real CLI: verify, compact, metrics, doctor,
status, and the backup commands; plus truthful health on an index whose watcher misses
a change (a silent change source, as when inotify drops events)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from clirun import run_recalld
from conftest import DaemonHandle
from waits import wait_value, workspace_status

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.maintenance import Health, verify
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import ScriptedChangeSource
from recalld.daemon.workspaces import Workspace


def cli(d: DaemonHandle, *args: str, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_recalld(["--socket", str(d.socket_path), *args], env=env or d.env,
                       input=stdin)


def note(d: DaemonHandle, rel: str, text: str, agent: str = "default") -> Path:
    path = d.data_dir / "workspaces" / agent / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_verify_reports_damaged_derived_state_and_compact_repairs_it(
        daemon: DaemonHandle) -> None:
    # A new, empty workspace has committed nothing, and needed not: no difference.
    empty = cli(daemon, "verify")
    assert empty.returncode == 0 and "default: ok" in empty.stdout, empty.stdout
    for i in range(6):
        note(daemon, f"memory/2026-07-0{i + 1}/n.md", f"# Day {i}\n\nwalrus number {i}\n")
    daemon.call("index.sync", {"agent_id": "default"})
    ws = daemon.data_dir / "workspaces" / "default"
    (ws / "memory/2026-07-01/n.md").unlink()  # a deletion leaves a dead keyword row
    daemon.call("index.sync", {"agent_id": "default"})
    deadline_commit = daemon.call("index.compact", {"agent_id": "default"})
    assert deadline_commit["keyword_after"]["dead_rows"] == 0
    report = daemon.call("index.verify", {"agent_id": "default"})
    assert report["ok"] is True, report
    assert report["files_on_disk"] == report["files_indexed"] == 5
    assert report["generation"]["records"]["catalog"] == 5

    # Nothing is written under ReMe's names: a workspace ReMe also serves keeps its files.
    assert not (ws / "mem_metadata" / "file_store").exists()
    assert not (ws / "mem_metadata" / "file_graph").exists()
    chunks = next((ws / "mem_metadata" / "index").glob("chunks.g*.jsonl.zst"))
    chunks.write_bytes(chunks.read_bytes()[:-4])
    damaged = daemon.call("index.verify", {"agent_id": "default"})
    assert damaged["ok"] is False and "chunks" in damaged["generation"]["corrupt"]
    proc = cli(daemon, "verify")
    assert proc.returncode == 1 and "DIFFERENCES FOUND" in proc.stdout

    compacted = daemon.call("index.compact", {"agent_id": "default"})
    assert compacted["generation"] > deadline_commit["generation"]
    assert daemon.call("index.verify", {"agent_id": "default"})["ok"] is True
    proc = cli(daemon, "verify")
    assert proc.returncode == 0 and "default: ok" in proc.stdout, proc.stdout + proc.stderr


PROM_LINE = re.compile(r'^([a-z_]+)(\{[^}]*\})? (-?[0-9.e+-]+|\+Inf)$')


def test_metrics_count_rpc_search_and_apply_and_print_prometheus(daemon: DaemonHandle) -> None:
    note(daemon, "digest/wiki/x.md", "the quokka is a marsupial\n")
    for _ in range(3):
        daemon.call("daemon.ping")
    daemon.call("memory.search", {"agent_id": "default", "query": "quokka", "sync": True})
    try:
        daemon.call("no.such_method")
    except Exception as exc:
        assert "not found" in str(exc)
    families = {f["name"]: f for f in daemon.call("daemon.metrics")["families"]}
    rpc = {s["labels"]["method"]: s for s in families["recalld_rpc_seconds"]["samples"]}
    assert rpc["daemon.ping"]["count"] >= 3
    assert "no.such_method" not in rpc and rpc["unknown"]["count"] == 1
    assert families["recalld_search_seconds"]["samples"][0]["count"] == 1
    assert families["recalld_index_apply_seconds"]["samples"][0]["count"] >= 1
    files = families["recalld_workspace_files"]["samples"]
    assert files == [{"labels": {"agent_id": "default"}, "value": 1.0}]

    proc = cli(daemon, "metrics", "--prometheus")
    assert proc.returncode == 0, proc.stderr
    types: dict[str, str] = {}
    buckets: dict[str, list[float]] = {}
    counts: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
            continue
        if line.startswith("# HELP "):
            continue
        m = PROM_LINE.match(line)
        assert m, f"not exposition format: {line!r}"
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert base in types or name in types, f"{name} has no # TYPE"
        if name.endswith("_bucket"):
            key = base + re.sub(r',?le="[^"]*"', "", labels)
            buckets.setdefault(key, []).append(float(value))
            assert 'le="' in labels
        elif name.endswith("_count") and types.get(base) == "histogram":
            counts[base + labels] = float(value)
    assert types["recalld_rpc_seconds"] == "histogram"
    assert types["recalld_workspace_files"] == "gauge"
    for key, series in buckets.items():
        assert series == sorted(series), f"{key} buckets must be cumulative"
        # The +Inf bucket equals _count.
        assert series[-1] == counts[key.replace("{}", "")], key
    assert 'recalld_rpc_seconds_bucket{method="daemon.ping",le="+Inf"}' in proc.stdout


def wait_settled(d: DaemonHandle, agent: str = "default") -> None:
    """Wait until ``agent``'s workspace runs all its services and its first disk scan is
    in (health "clean"): before that, doctor rightly reports it as pending."""
    wait_value(lambda: workspace_status(d, agent),
               lambda ws: ws and ws["state"] == "ready"
               and (ws.get("health") or {}).get("state") == "clean",
               f"{agent} ready and clean")


def test_doctor_finds_a_wrong_socket_dir_mode_and_a_missing_unit(
        daemon: DaemonHandle) -> None:
    wait_settled(daemon)
    proc = cli(daemon, "doctor", "--json")
    report = orjson.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert proc.returncode == 0 and report["ok"] is True, proc.stdout
    assert checks["socket_dir"]["status"] == "ok" and checks["socket"]["status"] == "ok"
    assert checks["daemon"]["status"] == "ok"
    assert checks["workspace default"]["status"] == "ok"
    assert checks["unit"]["status"] == "warn"
    assert "recalld install-service" in checks["unit"]["fix"]  # --write-only without a bus
    assert checks["inotify"]["status"] in ("ok", "warn", "skip")
    # The daemon's own instance (one for all its watchers) is counted.
    instances = checks["inotify instances"]
    assert instances["status"] in ("ok", "warn"), instances
    assert int(instances["detail"].split(" in use")[0]) >= 1

    sock_dir = daemon.socket_path.parent
    os.chmod(sock_dir, 0o755)
    try:
        proc = cli(daemon, "doctor")
    finally:
        os.chmod(sock_dir, 0o700)
    assert proc.returncode == 1
    assert "[FAIL] socket_dir" in proc.stdout and f"chmod 700 {sock_dir}" in proc.stdout

    installed = cli(daemon, "install-service", "--write-only")
    assert installed.returncode == 0, installed.stderr
    checks = {c["name"]: c for c in orjson.loads(cli(daemon, "doctor", "--json").stdout)
              ["checks"]}
    assert checks["unit"]["status"] == "ok"

    daemon.stop()
    proc = cli(daemon, "doctor", "--json")
    checks = {c["name"]: c for c in orjson.loads(proc.stdout)["checks"]}
    assert proc.returncode == 1 and checks["daemon"]["status"] == "fail"
    assert "recalld serve" in checks["daemon"]["fix"]


def test_status_shows_health_files_and_watcher(daemon: DaemonHandle) -> None:
    note(daemon, "memory/2026-07-01/a.md", "# A\n\nalpha\n")
    daemon.call("index.sync", {"agent_id": "default"})
    daemon.call("index.compact", {"agent_id": "default"})  # commits derived state now
    daemon.call("index.verify", {"agent_id": "default"})  # also refreshes the disk scan
    status = daemon.call("daemon.status")
    health = status["workspaces"][0]["health"]
    assert health["state"] == "clean" and health["files_on_disk"] == 1
    assert health["derived_bytes"] > 0
    proc = cli(daemon, "status")
    assert proc.returncode == 0, proc.stderr
    assert "default: OK" in proc.stdout and "clean: 1 file(s), 1 chunk(s)" in proc.stdout
    proc = cli(daemon, "status", "--verbose")
    header, row = [ln for ln in proc.stdout.splitlines() if ln.startswith(("AGENT", "default "))]
    assert header.split() == ["AGENT", "STATE", "HEALTH", "FILES", "CHUNKS", "PENDING",
                              "WATCHER", "DERIVED"]
    assert row.split()[:7] == ["default", "ready", "clean", "1/1", "1", "0", "watching"]


def test_cli_backup_restore_needs_yes_and_rolls_back(daemon: DaemonHandle,
                                                    tmp_path: Path) -> None:
    original = note(daemon, "digest/personal/a.md", "I keep bees.\n")
    out = tmp_path / "b.zip"
    made = cli(daemon, "backup", "create", "--agent", "default", "--out", str(out))
    assert made.returncode == 0 and out.is_file(), made.stderr
    listed = orjson.loads(cli(daemon, "backup", "list", "--json").stdout)
    assert listed["backups"] == []  # --out wrote outside the backups dir
    assert cli(daemon, "backup", "verify", str(out)).stdout.startswith("ok: ")

    original.write_text("I keep wasps now.\n")
    extra = note(daemon, "memory/2026-07-02/later.md", "written after the backup\n")
    refused = cli(daemon, "backup", "restore", str(out))
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert original.read_text() == "I keep wasps now.\n"
    # What it would do, said before it asks; a dry run changes nothing. The backup holds
    # the note and the workspace's own state (pending turns, inbox); only later.md goes.
    plan = orjson.loads(cli(daemon, "backup", "restore", str(out), "--dry-run", "--json").stdout)
    (summary,) = plan["plans"]
    assert plan["dry_run"] is True and summary["removes"] == ["memory/2026-07-02/later.md"]
    writes, overwrites = summary["write"], summary["overwrite"]
    assert writes >= 1 and summary["remove"] == 1
    assert (f"will write {writes} file(s)" in refused.stdout
            and "remove 1 file(s)" in refused.stdout)
    dry = cli(daemon, "backup", "restore", str(out), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert (f"default: will write {writes} file(s) into " in dry.stdout
            and f"({overwrites} replace existing ones) and remove 1 file(s) the backup lacks"
            in dry.stdout)
    assert "  remove memory/2026-07-02/later.md" in dry.stdout
    assert dry.stdout.endswith("dry run: nothing was changed\n")
    assert extra.exists() and original.read_text() == "I keep wasps now.\n"

    done = cli(daemon, "backup", "restore", str(out), "--yes")
    assert done.returncode == 0, done.stderr
    assert "recalld backup rollback" in done.stdout
    assert original.read_text() == "I keep bees.\n"
    hits = daemon.call("memory.search", {"agent_id": "default", "query": "bees"})["results"]
    assert [h["path"] for h in hits] == ["digest/personal/a.md"]

    assert not extra.exists()
    dry_back = cli(daemon, "backup", "rollback", "--dry-run")
    assert dry_back.returncode == 0 and "remove 0 file(s)" in dry_back.stdout, dry_back.stderr
    back = cli(daemon, "backup", "restore", "--rollback", "--yes")
    assert back.returncode == 0, back.stderr
    assert original.read_text() == "I keep wasps now.\n"
    hits = daemon.call("memory.search", {"agent_id": "default", "query": "wasps"})["results"]
    assert [h["path"] for h in hits] == ["digest/personal/a.md"]


# --------------------------------------------------- health with a watcher that missed it


def indexed_workspace(tmp_path: Path, note: str, source: ScriptedChangeSource,
                      config: WatcherConfig) -> tuple[Workspace, WorkspaceIndex,
                                                      trio.CapacityLimiter]:
    """A workspace with one note at ``memory/2026-07-01/<note>`` and its (unstarted) index,
    watched through ``source``."""
    root = tmp_path / "ws"
    (root / "memory" / "2026-07-01").mkdir(parents=True)
    (root / "memory" / "2026-07-01" / note).write_text("# Seen\n\nindexed at start\n")
    ws = Workspace("w", root, WorkspaceSettings())
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    cpu = trio.CapacityLimiter(2)
    index = WorkspaceIndex(ws, cfg, cpu=cpu)
    index.watcher = Watcher(root, ["memory", "digest"], apply=index.apply_paths,
                            known=lambda: index.state.known(), source=source,
                            config=config, limiter=cpu)
    return ws, index, cpu


async def test_health_started_after_the_startup_reconcile_scans_at_once(
        tmp_path: Path) -> None:
    # Other workspace services can start between the index and health; when the index's
    # startup reconcile has ended by then, health scans itself instead of waiting for it.
    ws, index, cpu = indexed_workspace(tmp_path, "a.md", ScriptedChangeSource(),
                                       WatcherConfig(reconcile_interval_s=3600.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)  # returns after its startup reconcile
        health = Health(ws, index, cpu)
        await nursery.start(health.run)
        with trio.fail_after(10):  # far below the fallback wait for a reconcile
            await health.first_scan.wait()
        assert health.status()["state"] == "clean"
        assert health.status()["files_on_disk"] == 1
        nursery.cancel_scope.cancel()


async def test_a_health_scan_someone_waits_for_takes_no_background_token(
        tmp_path: Path) -> None:
    # A restore and index.verify wait for the scan's answer: it must not queue behind
    # other workspaces' background work; the periodic scan does wait for a token.
    ws, index, cpu = indexed_workspace(tmp_path, "a.md", ScriptedChangeSource(),
                                       WatcherConfig(reconcile_interval_s=3600.0))
    background = trio.CapacityLimiter(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        health = Health(ws, index, cpu, background=background)
        release = trio.Event()

        async def hold_background(task_status: trio.TaskStatus[None]) -> None:
            async with background:  # all background work taken elsewhere
                task_status.started()
                await release.wait()

        await nursery.start(hold_background)
        with trio.fail_after(60):
            await health.scan()
        assert health.status()["files_on_disk"] == 1
        scanned_at = health.scanned_at
        periodic_done = trio.Event()

        async def periodic() -> None:
            await health.scan(unattended=True)
            periodic_done.set()

        nursery.start_soon(periodic)
        with trio.fail_after(60):  # the periodic scan queues for the token
            while background.statistics().tasks_waiting != 1:
                await trio.sleep(0.01)
        assert not periodic_done.is_set() and health.scanned_at == scanned_at
        release.set()
        with trio.fail_after(60):
            await periodic_done.wait()
        nursery.cancel_scope.cancel()


async def test_health_says_pending_for_a_file_the_watcher_missed(tmp_path: Path) -> None:
    source = ScriptedChangeSource()
    # No periodic reconcile and no quick restart during the test: what it sees stays put.
    ws, index, cpu = indexed_workspace(
        tmp_path, "seen.md", source,
        WatcherConfig(reconcile_interval_s=3600.0, restart_backoff_initial_s=3600.0))
    root = ws.root
    async with trio.open_nursery() as nursery:
        # Health first, so that it takes the view of the watcher's startup reconcile
        # (which index.run finishes before it reports started).
        health = Health(ws, index, cpu)
        await nursery.start(health.run)
        assert health.status()["state"] == "pending"  # until the first scan is done
        await nursery.start(index.run)
        assert health.first_scan.is_set()
        assert health.status()["state"] == "clean"

        source.silent = True  # the kernel dropped the events (inotify overflow)
        (root / "memory" / "2026-07-01" / "missed.md").write_text("# Missed\n\nunseen\n")
        await health.scan()
        status: dict[str, Any] = health.status()
        assert status["state"] == "pending"
        assert status["unindexed_paths"] == ["memory/2026-07-01/missed.md"]
        assert status["files_on_disk"] == 2 and status["files_indexed"] == 1
        report = await verify(ws, index, cpu)
        assert report["ok"] is False
        assert report["not_indexed"] == {"count": 1, "paths": ["memory/2026-07-01/missed.md"]}

        # Same size and mtime but other bytes: only the content digest tells.
        seen = root / "memory" / "2026-07-01" / "seen.md"
        st = seen.stat()
        seen.write_text("# Seen\n\nINDEXED AT START\n")
        os.utime(seen, ns=(st.st_atime_ns, st.st_mtime_ns))
        report = await verify(ws, index, cpu)
        assert report["content_differs"]["paths"] == ["memory/2026-07-01/seen.md"]

        await index.watcher.reconcile("test")  # what the periodic rescan does
        assert health.status()["state"] == "clean"  # re-checked without a new scan
        assert health.status()["unindexed"] == 0

        index.persist_error = {"time": 1.0, "error": "disk full", "disk_full": True}
        degraded = health.status()
        assert degraded["state"] == "degraded"
        assert degraded["last_errors"][-1]["error"] == "disk full"
        index.persist_error = None

        source.fail(OSError("inotify instance vanished"))
        with trio.fail_after(10):
            while True:
                now = health.status()
                watcher_errors = [e for e in now["last_errors"] if e["what"] == "watcher"]
                if watcher_errors and watcher_errors[0]["time"] is not None:
                    break
                await trio.sleep(0.05)
        assert now["state"] == "degraded" and now["watcher"] == "failed"
        assert any("watcher failed" in r for r in now["reasons"])
        assert "inotify instance vanished" in watcher_errors[0]["error"]
        nursery.cancel_scope.cancel()


# ------------------------------------------------- doctor's systemd and linger checks


def _tool(bin_dir: Path, name: str, output: str, status: int) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\nexit {status}\n")
    path.chmod(0o755)


def test_doctor_checks_the_config_file_a_restart_would_read(daemon: DaemonHandle) -> None:
    def config_check() -> tuple[int, dict[str, str]]:
        proc = cli(daemon, "doctor", "--json")
        checks = {c["name"]: c for c in orjson.loads(proc.stdout)["checks"]}
        return proc.returncode, checks["config file"]

    assert config_check()[1]["status"] == "ok"
    # Edited while the daemon runs: it serves on, a restart would refuse the file.
    daemon.config_path.parent.mkdir(parents=True, exist_ok=True)
    daemon.config_path.write_text("[daemon]\ncpu_threads = -1\n")
    code, check = config_check()
    assert code == 1 and check["status"] == "fail", check
    assert "cpu_threads = -1" in check["detail"] and str(daemon.config_path) in check["fix"]
    assert daemon.call("daemon.ping")["pong"] is True
    # A file that is not TOML at all: every other check still runs (the socket found by
    # the environment and defaults) and this one says what is wrong.
    daemon.config_path.write_text("[daemon\ncpu_threads = \n")
    env = {k: v for k, v in daemon.env.items() if k not in ("RECALLD_SOCKET",
                                                          "RECALLD_DATA_DIR")}
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "doctor", "--json"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    check = {c["name"]: c for c in orjson.loads(proc.stdout)["checks"]}["config file"]
    assert check["status"] == "fail" and "line 1" in check["detail"], check
    assert daemon.call("daemon.ping")["pong"] is True
    daemon.config_path.write_text("[daemon]\ncpu_threads = 1\n")
    assert config_check()[1]["status"] == "ok"


def test_doctor_asks_systemctl_and_loginctl_and_says_what_to_fix(
        tmp_path: Path, monkeypatch: Any) -> None:
    from recalld.ipc.doctor import Doctor

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runtime = tmp_path / "run"
    runtime.mkdir()
    (runtime / "bus").write_text("")  # a user bus is reachable
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime)}
    doctor = Doctor(runtime / "recalld" / "recalld.sock", env)

    _tool(bin_dir, "systemctl", "disabled", 1)
    _tool(bin_dir, "loginctl", "Linger=no", 0)
    enabled, linger = doctor.enabled(), doctor.linger()
    assert enabled.status == "warn" and "enable --now recalld.socket" in enabled.fix
    assert linger.status == "warn" and linger.fix.startswith("loginctl enable-linger ")

    _tool(bin_dir, "systemctl", "enabled\nenabled", 0)
    _tool(bin_dir, "loginctl", "Linger=yes", 0)
    assert doctor.enabled().status == "ok" and doctor.linger().status == "ok"

    (runtime / "bus").unlink()
    assert doctor.enabled().status == "skip"  # no bus: says so instead of guessing
    assert doctor.daemon().status == "fail"  # and nothing listens on the socket


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder another owner")
def test_doctor_counts_only_this_users_inotify_instances(tmp_path: Path) -> None:
    # The limit is per user: another user's instances (which root sees in /proc) are not
    # ours to count. A /proc of two processes holding two instances each, one ours.
    from recalld.ipc.doctor import _inotify_instances_in_use

    for pid, owner in (("100", os.getuid()), ("200", 65534)):
        fds = tmp_path / pid / "fd"
        fds.mkdir(parents=True)
        for fd in ("3", "4"):
            (fds / fd).symlink_to("anon_inode:inotify")
        (fds / "5").symlink_to("/dev/null")
        os.chown(tmp_path / pid, owner, owner)
    assert _inotify_instances_in_use(tmp_path) == 2

