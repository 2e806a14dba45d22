"""Progress of long jobs: a bar on a terminal, a line every few seconds otherwise, JSON
lines with --json; rate and ETA within a phase; Ctrl-C leaves the job running."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_cli import SCRIPT
from test_dream import AGENT, open_ws, write
from waits import wait_for

from recalld.ipc.progress import LINE_INTERVAL_S, Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bar_shows_counts_phase_rate_and_eta() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress(out, "reindex", "j1", mode="bar", clock=clock)
    p.update("running", {"done": 0, "total": 1000, "message": "scanning"})
    p.update("running", {"done": 0, "total": 1000, "message": "indexing"})
    clock.now += 2.0
    p.update("running", {"done": 400, "total": 1000, "message": "indexing"})
    p.close()
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("reindex [#########..............." + "] 400/1,000 (40%) indexing")
    assert "200.0/s" in last and "ETA 0:03" in last and last.endswith("\n")


def test_no_rate_or_eta_from_readings_that_arrive_together() -> None:
    # A phase's start and its first counts come in one burst: no rate of millions a
    # second, no "ETA 0:00" at 1%; once a second has passed, both are measured.
    out, clock = io.StringIO(), Clock()
    p = Progress(out, "backup create", None, mode="json", clock=clock)
    p.update("running", {"done": 0, "total": 30_012, "message": "writing the archive"})
    p.update("running", {"done": 93, "total": 30_012, "message": "writing the archive"})
    clock.now += 0.5
    p.update("running", {"done": 700, "total": 30_012, "message": "writing the archive"})
    clock.now += 1.5
    p.update("running", {"done": 3_000, "total": 30_012, "message": "writing the archive"})
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["rate_per_s"], r["eta_s"]) for r in records[:3]] == [(None, None)] * 3
    assert records[3]["rate_per_s"] == 1_500.0 and records[3]["eta_s"] == 18.0


def test_lines_when_not_a_terminal_every_few_seconds_and_at_phase_changes() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress(out, "reindex", "j1", mode="lines", clock=clock)
    p.update("running", {"done": 0, "total": 10, "message": "scanning"})
    p.update("running", {"done": 1, "total": 10, "message": "indexing"})  # new phase: a line
    clock.now += 1.0
    p.update("running", {"done": 2, "total": 10, "message": "indexing"})  # too soon
    clock.now += LINE_INTERVAL_S
    p.update("running", {"done": 8, "total": 10, "message": "indexing"})
    lines = out.getvalue().splitlines()
    assert lines[0] == "reindex j1: 0/10 (0%) scanning (running)"
    assert lines[1] == "reindex j1: 1/10 (10%) indexing (running)"
    assert lines[2].startswith("reindex j1: 8/10 (80%) indexing (running) 1.2/s ETA 0:02")
    assert len(lines) == 3 and "\r" not in out.getvalue()


def test_json_lines_only_when_something_changed() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress(out, "reindex", "j1", mode="json", clock=clock)
    p.update("running", {"done": 0, "total": 4, "message": "scanning"})
    clock.now += 1
    p.update("running", {"done": 0, "total": 4, "message": "scanning"})
    p.update("running", {"done": 4, "total": 4, "message": "done"})
    p.update("succeeded", {"done": 4, "total": 4, "message": "done"})  # the result says it
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["state"], r["phase"], r["done"]) for r in records] == [
        ("running", "scanning", 0), ("running", "done", 4)]
    assert records[0]["job_id"] == "j1" and records[0]["event"] == "progress"


def test_duration() -> None:
    assert (duration(0), duration(61.4), duration(3725)) == ("0:00", "1:01", "1:02:05")


# Runs a command with SIGINT at its default action, as a terminal starts it, also when
# this suite was started with SIGINT ignored (which its children inherit: a background
# job of a non-interactive shell, for one); Python turns SIGINT into KeyboardInterrupt
# only where it is not ignored at start.
AS_FROM_A_TERMINAL = (
    sys.executable, "-S", "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
)


def _recalld(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    return subprocess.Popen([*AS_FROM_A_TERMINAL, *cmd, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)


def test_reindex_piped_and_json_show_progress(daemon: DaemonHandle) -> None:
    root = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-01"
    root.mkdir(parents=True)
    for i in range(50):
        (root / f"n{i}.md").write_text(f"# Note {i}\nword{i}\n")
    with _recalld("reindex", env=daemon.env) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "reindex job" in out and "succeeded" in out
    assert "reindex " in err and "/50" in err and "\r" not in err  # lines, not a bar
    with _recalld("reindex", "--json", env=daemon.env) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["state"] == "succeeded"
    records = [json.loads(line) for line in err.splitlines()]
    assert records and all(r["event"] == "progress" and r["kind"] == "reindex" for r in records)
    assert records[-1]["done"] == records[-1]["total"] == 50
    # Saving the new index has nothing to count: no bar at 100% while it goes on.
    saving = [r for r in records if r["phase"] == "saving"]
    assert saving and all(r["total"] is None and r["eta_s"] is None for r in saving), records


def test_ctrl_c_says_the_job_goes_on_and_how_to_follow_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-01/a.md", "# Day\nwe chose the blue tent\n")
    open_ws(daemon, root, fake)
    # The dream's model calls wait until the CLI has been interrupted: the job is still
    # running when the interrupt comes, however slow the machine.
    gate = fake.gate(lambda body: "messages" in body)
    try:
        with _recalld("dream", "--agent", AGENT, env=daemon.env) as proc:
            def running() -> list[Any]:
                assert proc.poll() is None
                return [j for j in daemon.call("jobs.list", {"agent_id": AGENT})["jobs"]
                        if j["kind"] == "auto_dream" and j["state"] == "running"]
            wait_for(running, "the dream to run")
            # The CLI follows the job once its first progress line is out (before that an
            # interrupt has no job id to name).
            assert proc.stderr is not None
            first = proc.stderr.readline()
            assert first.startswith("auto_dream"), first
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
    finally:
        gate.open()
    assert proc.returncode == 130, err
    job = next(j for j in daemon.call("jobs.list", {"agent_id": AGENT})["jobs"]
               if j["kind"] == "auto_dream")
    last = err.strip().splitlines()[-1]
    assert last == (f"recalld: interrupted; the auto_dream job {job['job_id']} goes on in the "
                    f"daemon. Follow it: recalld jobs get {job['job_id']}; stop it: "
                    f"recalld jobs cancel {job['job_id']}")
    assert "Traceback" not in err
    assert job["state"] in ("running", "succeeded", "failed")  # not cancelled by Ctrl-C


def test_indexing_notice_says_what_a_sync_waits_for(daemon: DaemonHandle) -> None:
    from recalld.ipc.progress import IndexingNotice

    out = io.StringIO()
    with IndexingNotice(daemon.socket_path, "default", out, after_s=0.0):
        wait_for(out.getvalue, "the notice")
    line = out.getvalue().splitlines()[0]
    assert line.startswith("recalld: waiting for the index of default: ")
    assert "file(s) indexed so far" in line
    notice = IndexingNotice(daemon.socket_path, "default", out)
    status = {"workspaces": [{"agent_id": "default", "index": {"files": 1200,
                                                                "pending_changes": 3},
                              "health": {"reasons": ["first disk scan under way"]}}]}
    assert notice.line(status) == ("recalld: waiting for the index of default: first disk "
                                   "scan under way (1,200 file(s) indexed so far)")
    assert notice.line({"workspaces": []}) is None
