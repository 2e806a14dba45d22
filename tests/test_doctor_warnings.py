"""``recalld doctor`` lists every problem ``recalld status`` lists, at the same severity
(FAIL, WARN, note) and with the same fix: a state file set aside, settings a reload read
that wait for a restart or for a workspace's reopen, the daemon's own config warnings."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from test_cli import recalld
from waits import wait_for


def _status_problems(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(mark, what, fix)`` of each problem human ``recalld status`` lists."""
    lines = recalld("status", env=env).stdout.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("[") and "] " in line:
            mark, what = line.strip()[1:].split("] ", 1)
            fix = lines[i + 1].strip() if i + 1 < len(lines) else ""
            out.append((mark, what, fix if fix.startswith("fix: ") else ""))
    return out


def _settled(d: DaemonHandle) -> bool:
    """No workspace still reading its notes (a passing note status and doctor, asked one
    after the other, need not both see)."""
    return all((w.get("health") or {}).get("state") != "pending"
               for w in d.call("daemon.status")["workspaces"])


def _agree(d: DaemonHandle) -> tuple[str, int]:
    """Doctor's report and exit status, once each problem of status is in it, alike (a
    warning of the config file the file's own check says with its fix, or on its own)."""
    wait_for(lambda: _settled(d), "every workspace's first scan")
    env = d.env
    problems = _status_problems(env)
    assert problems, "status lists no problem"
    proc = recalld("doctor", env=env)
    lines = proc.stdout.splitlines()
    for mark, what, fix in problems:
        at = [i for i, line in enumerate(lines)
              if line.startswith(f"[{mark}] ") and f": {what}" in line]
        assert at, (mark, what, proc.stdout)
        if fix:
            assert lines[at[0] + 1].strip() == fix or fix[5:] in lines[at[0]], proc.stdout
    return proc.stdout, proc.returncode


def _reload(d: DaemonHandle, text: str) -> None:
    done = d.log().count("configuration reloaded")
    d.config_path.write_text(text, encoding="utf-8")
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.log().count("configuration reloaded") > done, "the reload")


def test_doctor_warns_of_a_state_file_set_aside(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory()
    assert d.stop() == 0
    state = d.data_dir / "state"
    (state / "scheduler.json").write_bytes(b'{"version": 2, "entries": {"\xc3\xa9t\xc3')
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    (aside,) = state.glob("scheduler.json.corrupt-*")
    shown, code = _agree(d2)
    assert f"[WARN] state files: {aside} is a copy" in shown, shown
    assert code == 0, shown  # a warning: doctor fails on failures only
    aside.unlink()
    assert str(aside) not in recalld("doctor", env=d2.env).stdout


def test_doctor_notes_settings_that_wait_for_a_restart_or_a_reopen(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    place = tmp_path / "Ärger ünd Tür"
    first = (f'[daemon]\nmax_request_bytes = 2097152\n[workspaces."Equipe_7.x"]\n'
             f'path = "{place}"\ndream_cron = "30 2 * * *"\n')
    d = daemon_factory(first)
    _reload(d, first.replace("2097152", "131072").replace("30 2", "45 5"))
    shown, code = _agree(d)
    assert "[note] config: max_request_bytes changed in the config file" in shown, shown
    assert "[note] workspace Equipe_7.x: dream_cron changed in the config file" in shown, shown
    assert code == 0, shown
    report = json.loads(recalld("--json", "doctor", env=d.env).stdout)
    noted = [c for c in report["checks"] if c["status"] == "note"]
    # (others may be noted too: a workspace still reading its notes under load)
    assert {"config", "workspace Equipe_7.x"} <= {c["name"] for c in noted}, report
    assert all(c["fix"] for c in noted) and report["ok"] is True, report


def test_doctor_keeps_the_daemons_config_warning_once_the_file_drops_it(
        daemon_factory: DaemonFactory) -> None:
    # The daemon runs on the file it read: until a reload, its warning stands even when
    # the file on disk no longer has the table (and is said once while it does).
    key = "sk-ant-" + "Qz8Xw2Vb6Nm4Lk1Jh9Gf3Ds5Ap7Ou0Iy"
    d = daemon_factory(f'[workspaces."{key}"]\nauto_memory_interval = 5\n')
    said = "the agent id looks like a credential"
    shown, _ = _agree(d)
    assert shown.count(said) == 1, shown
    d.config_path.write_text("[workspaces.plain]\n", encoding="utf-8")
    shown, _ = _agree(d)
    assert "[ok  ] config file" in shown and f"[WARN] config: {d.config_path}" in shown, shown
    assert shown.count(said) == 1, shown


def test_doctor_says_a_failed_reload_once_while_the_file_is_as_it_read_it(
        daemon_factory: DaemonFactory) -> None:
    # The reload's failure and the file's own check are one problem, as status says it:
    # not "2 problem(s)". The file mended and not reloaded yet, the failure stands.
    d = daemon_factory("[workspaces.Ops_3]\nauto_memory_interval = 4\n")
    d.config_path.write_text('[workspaces.Ops_3]\nauto_memory_interval = "vier✓"\n',
                             encoding="utf-8")
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.call("daemon.status")["queues"]["config"].get("reload_error"),
             "the failed reload")
    error = d.call("daemon.status")["queues"]["config"]["reload_error"]
    proc = recalld("doctor", env=d.env)
    assert proc.returncode == 1 and proc.stdout.count(error) == 1, proc.stdout
    assert f"[FAIL] config file: {error}" in proc.stdout, proc.stdout
    assert recalld("status", env=d.env).stdout.count(error) == 1
    d.config_path.write_text("[workspaces.Ops_3]\nauto_memory_interval = 5\n", "utf-8")
    shown, code = _agree(d)
    assert "[ok  ] config file" in shown and code == 1, shown
    assert "[FAIL] config: the configuration reload at " in shown, shown
