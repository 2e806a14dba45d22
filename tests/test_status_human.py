"""Human ``recalld status`` and ``doctor`` answer "is my memory OK?" first, with the fix."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider
from test_cli import recalld
from waits import wait_status, wait_value

from recalld.ipc.cli_status import render_status
from recalld.ipc.health import assess

NO_KEY = {"OPENAI_API_KEY": "", "RECALLD_EMBEDDING_API_KEY": ""}


def default_ws(status: dict[str, Any]) -> dict[str, Any]:
    return next(w for w in status["workspaces"] if w["agent_id"] == "default")


def test_status_names_missing_key_bad_cron_and_pending_resource(
        daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    resource = Path(env["XDG_DATA_HOME"]) / "recalld/workspaces/default/resource"
    resource.mkdir(parents=True)
    (resource / "notes.txt").write_text("the code word is swordfish\n")
    good = ('[workspace_defaults.embedding_model_config]\n'
            'model_name = "text-embedding-3-small"\n')
    d = daemon_factory(good, **NO_KEY)
    assert "vectors are off: no API key for embedding backend 'openai'" in d.log()
    wait_status(d, lambda s: (default_ws(s).get("resource") or {}).get("files", {}).get(
        "pending") == 1, "the resource waits for a chat model")

    # An invalid cron reaches a running daemon through a reload: it keeps the old config.
    d.config_path.write_text(good + '[workspace_defaults]\ndream_cron = "0 25 * * *"\n')
    d.signal(signal.SIGHUP)
    wait_status(d, lambda s: bool(s["queues"]["config"]["reload_error"]), "reload failed")

    proc = recalld("status", env=d.env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # In doctor's words (below: its FAIL and its WARN of this workspace): a failure is a
    # problem, a warning a warning; the reload's failure is the daemon's own.
    assert "default: 1 problem(s), 1 warning(s)  (ready" in out, out
    assert "vectors:" in out and "off: no API key for embedding backend 'openai'" in out
    assert "[FAIL] vectors are off" in out and "RECALLD_EMBEDDING_API_KEY" in out
    assert 'dream_cron = "0 25 * * *"' in out and "[FAIL] the configuration reload" in out
    assert "1 resource file(s) wait for a chat model" in out
    assert "fix: set chat_model_config.model_name" in out
    assert "dream:" in out and "next " in out  # the running schedule still shows
    # Internals only with --verbose.
    assert "server:" not in out and "prepare_pool" not in out
    wait_status(d, lambda s: bool(default_ws(s)["health"].get("scanned_at")), "a disk scan")
    verbose = recalld("status", "--verbose", env=d.env).stdout
    assert "server:" in verbose and "DERIVED" in verbose and "as of the disk scan" in verbose

    doctor = recalld("doctor", env=d.env)
    assert doctor.returncode == 1, doctor.stdout
    for needle in ("[FAIL] workspace default: vectors are off",
                   "[WARN] workspace default: 1 resource file(s) wait for a chat model",
                   "[FAIL] config file: "):
        assert needle in doctor.stdout, doctor.stdout
    # The reload's failure is the file's, said once (by its check, the file as it read it).
    assert doctor.stdout.count('dream_cron = "0 25 * * *"') == 1, doctor.stdout
    assert doctor.stdout.count("fix: ") >= 3

    # A good reload clears the reload problem.
    d.config_path.write_text(good)
    d.signal(signal.SIGHUP)
    wait_status(d, lambda s: not s["queues"]["config"]["reload_error"], "reload ok")
    assert "configuration reload" not in recalld("status", env=d.env).stdout


def test_a_healthy_workspace_is_ok_and_says_why_vectors_are_off(daemon: DaemonHandle) -> None:
    out = recalld("status", env=daemon.env).stdout
    assert "default: OK" in out, out
    assert "off: no embedding model configured" in out
    assert "dream:" in out and "no run yet" in out


def _ws(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "agent_id": "a", "state": "ready", "path": "/w",
        "health": {"state": "clean", "reasons": []}, "index": {"files": 1, "chunks": 2},
        "vectors": {"enabled": True, "state": "backfill", "embedded": 5, "total": 10,
                    "coverage": 0.5, "health": "ok", "parked": 0, "provider": {}},
        "dream": {"cron": "0 23 * * *", "enabled": True,
                  "next_run": "2026-12-01T23:00:00+00:00"},
    }
    base.update(extra)
    return base


def test_turns_waiting_for_auto_memory_get_the_fix_that_writes_them() -> None:
    # "wait: it catches up by itself" was the fix of every pending workspace: turns that
    # wait for a chat model, or for a flush with no idle flush, never are written so.
    def fix(reason: str, idle_s: float) -> str:
        line = f"2 conversation message(s) of 1 session(s) wait for auto_memory: {reason}"
        ws = _ws(health={"state": "pending", "reasons": ["3 change(s) waiting", line]},
                 capture={"reason": reason, "idle_s": idle_s, "waiting_messages": 2})
        assessed = assess(ws)
        assert ("index", "pending: 1 file(s), 2 chunk(s) indexed") in assessed.facts
        alone = assess({**ws, "health": {"state": "pending", "reasons": [line]}})
        # Only the turns wait: the index is not said to be pending.
        assert ("index", "clean: 1 file(s), 2 chunk(s) indexed") in alone.facts
        problems = {p.what: p.fix for p in assessed.problems}
        assert problems.pop("pending: 3 change(s) waiting").startswith("wait: it catches up")
        ((what, how),) = problems.items()
        assert what == f"pending: {line}"
        return how

    assert "give the workspace a chat model" in fix("no chat model configured", 600.0)
    assert "flush: true" in fix("the last auto_memory job left them pending (failed: HTTP "
                                "400); waiting for 5 user turns or a flush", 0.0)
    assert fix("waiting for 5 user turns or 600 s idle or a flush", 600.0).startswith(
        "wait: the idle flush")
    # A job covers them all: no flush to make (without an idle flush it said to make one).
    assert fix("auto_memory job queued or running", 0.0).startswith("wait: the queued")


def test_assess_reads_runtime_problems() -> None:
    a = assess(_ws(sessions={"sessions": 1, "pending_messages": 4},
                   inbox={"items": 3, "unacked": 2}))
    assert ("capture", "4 conversation message(s) wait for auto_memory") in a.facts
    assert ("inbox", "2 unseen item(s) (recalld inbox list --agent a)") in a.facts
    assert ("vectors", "backfill, 5 of 10 chunk(s) embedded (50%, backfill under way), "
                       "provider ok") in a.facts
    assert a.worst == "ok"
    # Before the first scan of the folder the chunks are not counted: no "0 of 0".
    starting = _ws(vectors={"enabled": True, "state": "health_check", "counted": False,
                            "embedded": 0, "total": None, "coverage": None,
                            "health": "unknown", "parked": 0, "provider": {}})
    assert ("vectors", "health_check, not counted yet (the first scan of the notes is under "
                       "way), provider unknown") in assess(starting).facts

    failing = _ws(vectors={"enabled": True, "state": "backfill", "embedded": 0, "total": 3,
                           "coverage": 0.0, "health": "fail", "parked": 3,
                           "last_error": "expected 1024 dimensions, got 8",
                           "provider": {"breaker": {"state": "open"}}})
    what = [p.what for p in assess(failing).problems]
    assert any("embedding provider failing: expected 1024 dimensions" in w for w in what)
    assert any("3 chunk(s) parked" in w for w in what)
    # The provider refused one text: the rest is embedded, nothing is under way.
    refused = _ws(vectors={"enabled": True, "state": "waiting", "embedded": 7, "total": 8,
                           "coverage": 0.875, "pending": 1, "health": "ok", "parked": 1,
                           "last_error": "HTTP 400: input refused", "provider": {}})
    a = assess(refused)
    assert ("vectors", "waiting, 7 of 8 chunk(s) embedded (88%, the rest parked), "
                       "provider ok") in a.facts
    # The daemon does not count that chunk as pending (no wait brings it in): the index is
    # clean, and no note says it catches up by itself (the parked problem says what it is).
    a = assess({**refused, "health": {"state": "clean", "reasons": []}})
    assert ("index", "clean: 1 file(s), 2 chunk(s) indexed") in a.facts
    assert not [p for p in a.problems if "pending" in p.what]
    assert any("1 chunk(s) parked" in p.what for p in a.problems)
    behind = {**refused["vectors"], "embedded": 6}  # one more is still under way
    a = assess({**refused, "vectors": behind, "health": {
        "state": "pending", "reasons": ["vectors: 6 of 8 chunks embedded"]}})
    assert any(p.what == "pending: vectors: 6 of 8 chunks embedded" for p in a.problems)
    parked = next(p for p in a.problems if "1 chunk(s) parked" in p.what)
    # A model change: the new model's vectors fill while the old ones serve searches.
    changing = _ws(vectors={"enabled": True, "state": "embedding", "embedded": 2,
                            "total": 8, "coverage": 0.25, "health": "ok", "parked": 0,
                            "migrating": True, "serving_space": "openai-old", "provider": {}})
    assert ("vectors", "embedding, 2 of 8 chunk(s) embedded with the new model (25%, "
                       "backfill under way; the previous model's vectors serve searches "
                       "meanwhile), provider ok") in assess(changing).facts
    assert "refuses these texts" in parked.fix and "every text" in parked.fix
    remote = {"state": "online", "outbox": 0, "name": "team", "server": "postgresql://db/m"}
    catching_up = _ws(remote={**remote, "behind": 1200})
    assert ("remote", "online, outbox 0, 1200 change(s) to pull (team at "
                      "postgresql://db/m)") in assess(catching_up).facts
    assert ("remote", "online, outbox 0 (team at postgresql://db/m)") in assess(
        _ws(remote={**remote, "behind": 0})).facts

    bad_cron = _ws(dream={"cron": "61 * * * *", "enabled": True,
                          "error": "invalid cron expression '61 * * * *'"})
    a = assess(bad_cron, [{"agent_id": "a", "kind": "reindex", "state": "failed",
                           "job_id": "j1", "error": "disk full", "finished_at": 10.0},
                          {"agent_id": "b", "kind": "reindex", "state": "failed",
                           "job_id": "j2", "error": "other agent", "finished_at": 11.0}])
    assert a.worst == "fail"
    texts = [p.what for p in a.problems]
    assert "dream_cron '61 * * * *' is not scheduled: invalid cron expression '61 * * * *'" \
        in texts
    assert any("the last reindex job (j1" in t and "disk full" in t for t in texts)
    assert not any("other agent" in t for t in texts)
    # A later success clears a failed run of the same kind.
    a = assess(_ws(), [{"agent_id": "a", "kind": "reindex", "state": "failed", "job_id": "j1",
                        "finished_at": 10.0},
                       {"agent_id": "a", "kind": "reindex", "state": "succeeded",
                        "job_id": "j3", "finished_at": 12.0}])
    assert a.problems == []


def test_a_state_file_the_daemon_cannot_save_shows_until_it_can(daemon: DaemonHandle) -> None:
    # The record of the workspaces it reopens at start cannot be written (here: a folder
    # in its place): the daemon serves on, and status and doctor say what a restart
    # would lose, until a later write succeeds.
    record = daemon.data_dir / "state" / "workspaces.json"
    record.unlink()
    record.mkdir()
    daemon.call("workspace.open", {"agent_id": "later"})
    files = daemon.call("daemon.status")["queues"]["state_files"]
    assert files["failing"] == 1 and files["errors"][0]["file"] == str(record), files
    out = recalld("status", env=daemon.env).stdout
    assert f"[FAIL] recalld cannot save {record} since" in out, out
    assert f"make {record.parent} writable" in out
    doctor = recalld("doctor", env=daemon.env)
    assert doctor.returncode == 1 and "[FAIL] state files: recalld cannot save" in doctor.stdout
    record.rmdir()
    daemon.call("workspace.open", {"agent_id": "again"})
    assert daemon.call("daemon.status")["queues"]["state_files"]["failing"] == 0
    assert "cannot save" not in recalld("status", env=daemon.env).stdout
    assert record.is_file()


def test_status_names_the_workspaces_that_are_not_open(daemon: DaemonHandle,
                                                       tmp_path: Path) -> None:
    # A closed workspace opens again at the next start: status named only the open ones,
    # so the jobs waiting for it (held) showed nowhere but in `jobs list`.
    daemon.call("workspace.open", {"agent_id": "resting", "path": str(tmp_path / "r")})
    daemon.call("workspace.close", {"agent_id": "resting"})
    out = recalld("status", env=daemon.env).stdout
    assert f"\nresting: not open  (closed, {tmp_path / 'r'})\n" in out, out
    assert "default: OK" in out
    status = daemon.call("daemon.status")
    listed = daemon.call("workspace.list")["workspaces"]
    held = {"job_id": "j1", "agent_id": "resting", "kind": "reindex", "state": "queued",
            "held": True, "progress": {}}
    text = render_status(status, str(daemon.socket_path), [held], listed)
    assert ("resting: not open  (closed, " in text and "  jobs: reindex wait for it to open "
            "(recalld workspace open resting)\n" in text), text


def test_a_dream_failed_for_want_of_a_chat_model_gets_that_fix(daemon: DaemonHandle) -> None:
    # Running the dream again, as the fix said, fails the same way: the model comes first.
    proc = recalld("dream", "--agent", "default", env=daemon.env)
    assert proc.returncode == 1 and "no chat model configured" in proc.stderr, proc.stderr
    out = recalld("status", env=daemon.env).stdout
    assert "[WARN] the last dream failed: no chat model configured" in out, out
    fix = out.split("the last dream failed: no chat model configured\n", 1)[1].splitlines()[0]
    assert fix.startswith("         fix: give the workspace a chat model "
                          "(chat_model_config in [workspaces.default]"), fix
    assert fix.endswith("; then recalld dream --agent default"), fix


def test_a_job_that_waits_on_its_provider_shows_how_far_it_is_and_for_how_long(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # A dream whose chat model never answered showed as "auto_dream running" for as long
    # as it waited: nothing told a job stuck for an hour from one started a second ago.
    root = tmp_path / "ws"
    (root / "memory" / "2026-04-01").mkdir(parents=True)
    (root / "memory" / "2026-04-01" / "walk.md").write_text("# Walk\nheron by the canal\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nchat_model_config = {{base_url = '
                       f'"{fake.url}/v1", api_key = "k", model_name = "m", timeout_s = 60.0}}\n')
    held = fake.gate(lambda body: True)
    try:
        job = d.call("jobs.submit", {"agent_id": "w", "kind": "auto_dream"})["job_id"]
        assert held.entered.wait(60), "the dream asks the chat model"
        assert d.call("jobs.get", {"agent_id": "w", "job_id": job})["state"] == "running"
        line = wait_value(
            lambda: next(x for x in recalld("status", env=d.env).stdout.splitlines()
                         if x.startswith("  jobs:")),
            lambda x: " for 0m 0s" not in x, "a status a second into the job")
        assert re.fullmatch(r"  jobs: +auto_dream running \d+/\d+ for \d+m \d+s", line), line
    finally:
        held.open()
