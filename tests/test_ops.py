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
from clirun import run_recalld
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_job, wait_value, workspace_status


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


def _counter(d: DaemonHandle, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    families = {f["name"]: f for f in d.call("daemon.metrics")["families"]}
    family = families.get(name, {"samples": []})
    return {tuple(sorted(s["labels"].items())): s["value"] for s in family["samples"]}


def test_metrics_count_jobs_by_kind_and_end(daemon_factory: DaemonFactory) -> None:
    # No cron dream: the jobs counted are the test's only.
    d = daemon_factory("[workspace_defaults]\ndream_cron_enabled = false\n")
    assert _counter(d, "recalld_jobs_total") == {}
    for kind in ("reindex", "auto_dream"):  # the dream fails: no chat model
        job_id = d.call("jobs.submit", {"agent_id": "default", "kind": kind})["job_id"]
        wait_job(d, job_id, agent="default")
    assert _counter(d, "recalld_jobs_total") == {
        (("kind", "reindex"), ("state", "succeeded")): 1.0,
        (("kind", "auto_dream"), ("state", "failed")): 1.0}


def test_metrics_time_chat_calls_and_count_those_that_fail(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(
        f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
        'dream_cron_enabled = false\n'
        f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "k", '
        'model_name = "fake-model", timeout_s = 10.0}\n')

    def flush(messages: list[dict[str, str]]) -> dict[str, Any]:
        job_id = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s",
                                             "messages": messages, "flush": True})["job_id"]
        return wait_job(d, job_id)

    # Two completions, the first answered at its second attempt; then one refused.
    fake.script(Reply(status=500), Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "food", "description": "food", "content": "- Likes ramen"})])),
        Reply(json=chat_answer("saved")))
    assert flush([{"role": "user", "content": "I like ramen."},
                  {"role": "assistant", "content": "Noted."}])["state"] == "succeeded"
    fake.script(Reply(status=400))
    assert flush([{"role": "user", "content": "I live in Basel."}])["state"] == "failed"
    assert len([r for r in fake.requests if r.path.endswith("/chat/completions")]) == 4
    families = {f["name"]: f for f in d.call("daemon.metrics")["families"]}
    assert [s["count"] for s in families["recalld_chat_seconds"]["samples"]] == [3]
    assert _counter(d, "recalld_chat_errors_total") == {(): 1.0}


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
