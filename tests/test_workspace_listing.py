"""Workspaces as the operator lists them and as a command on one that is not open
explains it: real daemons, the real ``recalld`` commands."""

from __future__ import annotations

import shlex
from pathlib import Path

from conftest import DaemonFactory
from test_cli import as_json, recalld

from recalld.ipc.cli_status import render_status


def test_configured_workspaces_that_are_not_open_are_listed(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # One refused at the start (a file where its folder goes) and then closed was never
    # recorded; one closed with --forget is recorded no more. Both open again at the next
    # start or reload, so the listings, status and doctor show them, as not open.
    afile = tmp_path / "notes-file"
    afile.write_text("not a folder\n", encoding="utf-8")
    daemon = daemon_factory(f'[workspaces.plain-file]\npath = "{afile}"\n'
                            "[workspaces.\"kept.one\"]\n")
    env = daemon.env
    assert recalld("workspace", "close", "plain-file", env=env).returncode == 0
    assert recalld("workspace", "close", "kept.one", "--forget", env=env).returncode == 0
    listed = {w["agent_id"]: w for w in as_json(recalld("workspace", "list", "--json",
                                                        env=env))}
    assert listed["plain-file"] == {"agent_id": "plain-file", "path": str(afile),
                                    "state": "closed", "registered": False,
                                    "configured": True}
    assert listed["kept.one"]["state"] == "closed"
    assert listed["kept.one"]["path"] == str(daemon.data_dir / "workspaces" / "kept.one")
    assert listed["default"]["state"] == "ready" and listed["default"]["configured"] is True
    text = recalld("workspace", "list", env=env).stdout
    assert any(line.split()[:2] == ["plain-file", "closed"] for line in text.splitlines()), text
    shown = recalld("status", env=env).stdout
    assert f"plain-file: not open  (closed, {afile})" in shown, shown
    assert "kept.one: not open  (closed, " in shown, shown
    doctor = recalld("doctor", env=env).stdout
    assert "1 workspace(s) (and 2 not open: recalld workspace list)" in doctor, doctor
    # An ad-hoc workspace closed with --forget is gone for good: not listed.
    assert recalld("workspace", "open", "adhoc", env=env).returncode == 0
    assert recalld("workspace", "close", "adhoc", "--forget", env=env).returncode == 0
    ids = [w["agent_id"] for w in as_json(recalld("workspace", "list", "--json", env=env))]
    assert ids == ["default", "kept.one", "plain-file"], ids
    # Forgotten again, a configured one has nothing to forget: the error says what keeps
    # it (not "neither open nor recorded", which it is listed as not being).
    again = recalld("workspace", "close", "kept.one", "--forget", env=env)
    assert again.returncode == 1 and "the configuration names it" in again.stderr, again


def test_a_path_refused_as_leaving_the_workspace_is_a_failure_not_a_usage_error(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The daemon refuses to follow it (exit 1, code -32005), whatever its shape; a command
    # line used wrongly stays a usage error (2).
    daemon = daemon_factory()
    env = daemon.env
    outside = tmp_path / "outside.md"
    outside.write_text("the neighbour's notes\n", encoding="utf-8")
    memory = daemon.data_dir / "workspaces" / "default" / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    (memory / "away.md").symlink_to(outside)
    for path in ("../x.md", "memory/../../x.md", str(outside), "memory/away.md"):
        for extra in ((), ("--json",)):
            proc = recalld("read", path, *extra, env=env)
            assert proc.returncode == 1, (path, extra, proc)
            assert proc.stderr.rstrip().endswith("(code -32005)"), (path, proc.stderr)
            assert proc.stdout == "" and "neighbour" not in proc.stderr, proc
    assert recalld("read", "memory/x.md", "--lines", "5-2", env=env).returncode == 2


def test_a_command_on_a_workspace_not_open_suggests_opening_only_a_known_one(
        daemon_factory: DaemonFactory) -> None:
    # Opening an id that was only mistyped would make a new, empty workspace: a known one
    # (recorded, or configured) is to be opened; for another, the close known ids.
    daemon = daemon_factory('[workspaces."research-notes"]\n')
    env = daemon.env
    assert recalld("workspace", "open", "writer_2", env=env).returncode == 0
    for agent in ("writer_2", "research-notes"):
        assert recalld("workspace", "close", agent, env=env).returncode == 0
    for agent in ("writer_2", "research-notes"):
        for args in (["note", "hi"], ["read", "memory/a.md"], ["search", "q"],
                     ["reindex", "--json"]):
            proc = recalld(*args, "--agent", agent, env=env)
            assert proc.returncode == 1, proc
            assert proc.stderr.rstrip().endswith(
                f"; open it with: recalld workspace open {agent}"), (args, proc.stderr)
    for typo, meant in (("writer-2", "writer_2"), ("research-note", "research-notes"),
                        ("defualt", "default")):
        for args in (["note", "hi"], ["read", "memory/a.md", "--json"], ["dream"]):
            proc = recalld(*args, "--agent", typo, env=env)
            assert proc.returncode == 1, proc
            assert "workspace open" not in proc.stderr, (args, proc.stderr)
            assert (f"no workspace '{typo}' is configured or recorded: did you mean "
                    f"{meant}") in proc.stderr, (args, proc.stderr)
    proc = recalld("search", "q", "--agent", "zzqx", env=env)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc
    assert ("no workspace 'zzqx' is configured or recorded (recalld workspace list shows "
            "them; recalld workspace open zzqx makes a new one)") in proc.stderr, proc.stderr
    ids = {w["agent_id"] for w in as_json(recalld("workspace", "list", "--json", env=env))}
    assert ids == {"default", "research-notes", "writer_2"}, ids


def test_a_configured_workspace_is_not_opened_at_another_path(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Closed, it was opened where it was asked, and at the next start it moved back to
    # its configured place: what was noted meanwhile was no longer served.
    place, elsewhere = tmp_path / "team", tmp_path / "elsewhere"
    place.mkdir()
    elsewhere.mkdir()
    (tmp_path / "team-link").symlink_to(place)
    daemon = daemon_factory(f'[workspaces.team]\npath = "{tmp_path / "team-link"}"\n')
    env = daemon.env
    for agent in ("team", "default"):
        assert recalld("workspace", "close", agent, env=env).returncode == 0
        proc = recalld("workspace", "open", agent, "--path", str(elsewhere), env=env)
        assert proc.returncode == 2, proc
        assert f"the config file puts workspace '{agent}' at " in proc.stderr, proc.stderr
    assert not any(elsewhere.iterdir())
    # Its own place, by any name, and no path at all, open it.
    for args in (["team", "--path", str(place)], ["team", "--path", str(tmp_path / "team-link")],
                 ["default"]):
        proc = recalld("workspace", "open", *args, "--json", env=env)
        assert proc.returncode == 0, proc
    listed = {w["agent_id"]: w for w in as_json(recalld("workspace", "list", "--json",
                                                        env=env))}
    assert listed["team"]["path"] == str(place) and listed["team"]["state"] == "ready"
    assert listed["default"]["state"] == "ready"


def test_an_import_takes_another_id_than_a_configured_workspace_closed_and_forgotten(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # recalld's own `default` opens at its place at every start, recorded or not: a
    # QwenPaw `default` imported meanwhile is given its own id, not refused.
    daemon = daemon_factory()
    env = daemon.env
    assert recalld("workspace", "close", "default", "--forget", env=env).returncode == 0
    ws = tmp_path / "qwenpaw" / "workspaces" / "default"
    (ws / "memory" / "2026-01-02").mkdir(parents=True)
    (ws / "memory" / "2026-01-02" / "n.md").write_text("- the fern is on the balcony\n")
    (ws / "agent.json").write_text('{"id": "default", "running": {}}', "utf-8")
    proc = recalld("import-qwenpaw", str(ws), env=env)
    assert proc.returncode == 0, proc
    assert f"opened {ws} as agent qwenpaw-default" in proc.stdout, proc.stdout


def _suggested(text: str, after: str, before: str = "\n") -> list[str]:
    """The command line ``text`` suggests after ``after`` (up to ``before``), as words."""
    return shlex.split(text.split(after, 1)[1].split(before, 1)[0])


def test_commands_suggested_for_an_agent_id_that_begins_with_a_dash_run(
        daemon_factory: DaemonFactory) -> None:
    """``-night-shift`` is a valid agent id that argparse takes for an option: the
    commands an error or ``recalld status`` suggest for it are written so that they run
    (``--agent=-night-shift``, ``-- -night-shift``), and do what they say."""
    daemon = daemon_factory()
    env = daemon.env
    agent = "-night-shift"
    assert recalld("workspace", "open", "--", agent, env=env).returncode == 0
    assert recalld("workspace", "close", "--", agent, env=env).returncode == 0
    proc = recalld("note", "hi", f"--agent={agent}", env=env)
    assert proc.returncode == 1, proc
    words = _suggested(proc.stderr, "; open it with: recalld ")
    assert words == ["workspace", "open", "--", agent], proc.stderr
    assert recalld(*words, env=env).returncode == 0
    assert recalld("note", "hi", f"--agent={agent}", env=env).returncode == 0

    proc = recalld("search", "q", "--agent=-zzqx", env=env)
    assert proc.returncode == 1, proc
    words = _suggested(proc.stderr, "; recalld ", " makes a new one")
    assert words == ["workspace", "open", "--", "-zzqx"], proc.stderr

    assert recalld("workspace", "close", "--", agent, env=env).returncode == 0
    held = {"job_id": "j1", "agent_id": agent, "kind": "reindex", "state": "queued",
            "held": True, "progress": {}}
    text = render_status(daemon.call("daemon.status"), str(daemon.socket_path), [held],
                         daemon.call("workspace.list")["workspaces"])
    words = _suggested(text, "wait for it to open (recalld ", ")\n")
    assert words == ["workspace", "open", "--", agent], text
    assert recalld(*words, env=env).returncode == 0


def test_status_shows_a_workspace_path_with_a_line_break_on_its_own_line(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The path was printed raw: a line break in it split the workspace's line in two, an
    # escape sequence reached the terminal; workspace list showed both escaped.
    daemon = daemon_factory()
    env = daemon.env
    opened, closed = tmp_path / "night\nshift", tmp_path / "red\x1b[31mtext"
    for agent, where in (("opened", opened), ("closed", closed)):
        where.mkdir()
        daemon.call("workspace.open", {"agent_id": agent, "path": str(where)})
    daemon.call("workspace.close", {"agent_id": "closed"})
    for args in (("status",), ("status", "--verbose")):
        proc = recalld(*args, env=env)
        assert proc.returncode == 0, proc
        lines = proc.stdout.splitlines()
        assert f"opened: OK  (ready, {tmp_path}/night\\nshift)" in lines, proc.stdout
        assert f"closed: not open  (closed, {tmp_path}/red\\x1b[31mtext)" in lines, proc.stdout
        assert "\x1b" not in proc.stdout and "shift)" not in lines, proc.stdout
