"""`recalld serve --check-config` checks what serving would meet, beyond the config file."""

from __future__ import annotations

import signal
from pathlib import Path

from conftest import DaemonFactory
from test_cli import assert_one_line_error, recalld
from waits import wait_for


def test_check_config_checks_the_log_file_as_serving_opens_it(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # --check-config passed a --log-file that serving then could not open.
    env = daemon_factory.environment()
    (tmp_path / "file").write_text("", "utf-8")
    for log_file, why in ((tmp_path / "file" / "logs" / "recalld.log",
                           f"{tmp_path / 'file'} is not a directory"),
                          (tmp_path, f"Is a directory: {tmp_path}")):
        line = assert_one_line_error(recalld("serve", "--check-config", "--log-file",
                                             str(log_file), env=env), 2)
        assert line == f"recalld: cannot open the log file {log_file}: {why}", line
    # A folder not there yet is made when serving starts: fine, and not made by a check.
    proc = recalld("serve", "--check-config", "--log-file",
                   str(tmp_path / "new" / "recalld.log"), env=env)
    assert proc.returncode == 0 and not (tmp_path / "new").exists(), proc.stderr


def test_a_key_pasted_into_another_setting_is_masked_in_the_error(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A key pasted into the wrong field or as a field's name: the
    # message names the setting, never the key (it reaches the log and the journal).
    key = "sk-proj-" + "Cf9gHj2kLm5nPq8rSt1uVw4xYz7aBc0dEf3gHi6jKl9m"
    ws = f'[workspaces.w]\npath = "{tmp_path / "ws"}"\n'
    configs = {
        "base_url": ws + f'chat_model_config = {{base_url = "{key}", model_name = "m"}}\n',
        "backend": ws + f'embedding_model_config = {{backend = "{key}"}}\n',
        "timeout_s": ws + f'chat_model_config = {{timeout_s = "token {key}"}}\n',
        "dream_cron": ws + f'dream_cron = "{key}"\n',
        "log_level": f'[daemon]\nlog_level = "{key}"\n',
        "field": ws + f'"{key}" = 1\n',
    }
    env = daemon_factory.environment()
    config = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    for where, text in configs.items():
        config.write_text(text, "utf-8")
        line = assert_one_line_error(recalld("serve", "--check-config", env=env), 2)
        assert "[REDACTED]" in line and key[8:20] not in line, (where, line)
    # Serving refuses it with the same line, in its log too.
    d = daemon_factory(configs["base_url"], wait=False)
    assert d.proc.wait(timeout=60) == 2
    assert "[REDACTED]" in d.log() and key[8:20] not in d.log(), d.log()


def test_a_workspace_table_named_by_a_key_is_served_with_a_warning_never_showing_it(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """``[workspaces."<key>"]``: workspace.open refuses such an id, but a file that named
    one keeps starting; check-config, doctor and the start's log warn, with the fix,
    and show the id masked."""
    key = "sk-proj-" + "Wa4rNi9nGk3eYt7aBl2eNa5mEq8rSt1uVw6xYz0aBc"
    text = f'[workspaces."{key}"]\nauto_memory_interval = 3\n'
    env = daemon_factory.environment()
    config = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text, "utf-8")
    check = recalld("serve", "--check-config", env=env)
    doctor = recalld("doctor", env=env)
    assert check.returncode == 0, check.stderr
    for shown in (check.stderr, doctor.stdout):
        assert key[8:20] not in shown, shown
        assert '[workspaces."[REDACTED]"]: the agent id looks like a credential' in shown
        assert "rename the table" in shown
    assert "[WARN] config file" in doctor.stdout, doctor.stdout
    d = daemon_factory(text)
    assert key in {w["agent_id"] for w in d.call("workspace.list")["workspaces"]}
    assert "the agent id looks like a credential" in d.log(), d.log()


def test_a_qwenpaw_agent_json_without_a_path_says_where_the_workspace_is(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """The workspace of ``qwenpaw_agent_json`` alone stays ``<data>/workspaces/X`` (where
    one configured so has its memory), and check-config, doctor, the start's log and
    status say so with the ``path`` that serves the agent.json's folder; with a path,
    nothing."""
    agent = tmp_path / "qwenpaw" / "workspaces" / "coder"
    agent.mkdir(parents=True)
    (agent / "agent.json").write_text('{"running": {}}', "utf-8")
    env = daemon_factory.environment()
    config = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    text = f'[workspaces.coder]\nqwenpaw_agent_json = "{agent / "agent.json"}"\n'
    config.write_text(text, "utf-8")
    check = recalld("serve", "--check-config", env=env)
    assert check.returncode == 0, check.stderr
    for shown in (check.stderr, recalld("doctor", env=env).stdout):
        assert "[workspaces.coder] qwenpaw_agent_json has no path" in shown, shown
        assert f'set path = "{agent}"' in shown, shown
    d = daemon_factory(text)
    assert f'set path = "{agent}"' in d.log(), d.log()
    status = recalld("status", env=d.env).stdout
    assert "[workspaces.coder] qwenpaw_agent_json has no path" in status, status
    assert f'fix: set path = "{agent}"' in status, status
    config.write_text(text + f'path = "{agent}"\n', "utf-8")
    check = recalld("serve", "--check-config", env=env)
    assert check.returncode == 0 and "warning" not in check.stderr, check.stderr


def test_a_reload_warns_of_a_table_it_takes_as_a_start_does(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """A reload that takes a key-named table logs the warning (masked) and status
    shows it, as after a start with that file."""
    d = daemon_factory("")
    key = "ghp_" + "Re9lOa2dWa4rNi7nGk1eYt3aBl5eNa8mEq0rSt6u"
    d.config_path.write_text(f'[workspaces."{key}"]\nauto_memory_interval = 3\n', "utf-8")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "reload: " in d.log() and "looks like a credential" in d.log(),
             "the reload's warning")
    status = recalld("status", env=d.env).stdout
    assert "[WARN]" in status and "rename the table" in status, status
    warned = [line for line in d.log().splitlines() if "looks like a credential" in line]
    assert warned and all(key[4:16] not in line for line in warned), warned


def test_check_config_refuses_tables_a_start_would_not_open_side_by_side(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Two tables naming one folder (written two ways; or the folder of one the file
    # names without a path), or one inside the other's without the two shared with each
    # other: the start fails one of them (or both), so the check says so; shared with
    # each other, they are fine.
    env = daemon_factory.environment()
    config = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    outer, inner = tmp_path / "notes", tmp_path / "notes" / "team"
    default = Path(env["XDG_DATA_HOME"]) / "recalld" / "workspaces" / "default"

    def table(agent: str, place: str, shared: str = "") -> str:
        return (f'[workspaces.{agent}]\npath = "{place}"\n'
                + (f'shared_with = ["{shared}"]\n' if shared else ""))

    for text, why in (
            (table("one", str(outer)) + table("two", f"{tmp_path}/./notes/"),
             f"[workspaces.two] path = '{outer}': {outer} is the folder of "
             "workspace 'one' too"),
            (table("one", str(outer)) + table("two", str(inner)),
             f"[workspaces.two] path = '{inner}': {inner} lies inside the workspace of "
             f"agent 'one' ({outer})"),
            # The folder of a workspace the file names without a path: the default one's.
            (table("one", str(default)),
             f"[workspaces.one] path = '{default}': {default} is the folder of workspace "
             "'default' too")):
        config.write_text(text, "utf-8")
        line = assert_one_line_error(recalld("serve", "--check-config", env=env), 2)
        assert line.startswith(f"recalld: configuration error: {config}: {why}"), line
    config.write_text(table("one", str(outer), "two") + table("two", str(inner), "one"),
                      "utf-8")
    proc = recalld("serve", "--check-config", env=env)
    assert proc.returncode == 0, proc.stderr
    # What the check refused, a start serves with a failed workspace.
    d = daemon_factory(table("one", str(outer)) + table("two", str(inner)))
    states = {w["agent_id"]: w["state"] for w in d.call("workspace.list")["workspaces"]}
    assert "failed" in (states["one"], states["two"]), states
    assert d.stop() == 0


def test_a_config_file_not_in_utf8_names_the_line_and_column(
        daemon_factory: DaemonFactory) -> None:
    # A file saved in Latin-1 (an accent in a comment): the error was Python's
    # "'utf-8' codec can't decode byte 0xe9 in position 44: invalid continuation byte".
    d = daemon_factory('[daemon]\nlog_level = "INFO"\n')
    config = Path(d.env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    config.write_bytes('[daemon]\nlog_level = "INFO"\n# déjà: caf'.encode() + b"\xe9\n")
    why = (f"{config}: not UTF-8 text: byte 0xe9 at line 3, column 12 (TOML files are "
           "UTF-8: save it as UTF-8, e.g. iconv -f latin1 -t utf-8)")
    line = assert_one_line_error(recalld("serve", "--check-config", env=d.env), 2)
    assert line == f"recalld: configuration error: {why}", line
    d.signal(signal.SIGHUP)  # the running daemon keeps its configuration and says why
    error = wait_for(lambda: d.call("daemon.status")["queues"]["config"]["reload_error"],
                     "the reload fails")
    assert why in error, error
    assert d.call("daemon.ping")["pong"] is True


def test_a_config_file_linked_to_nothing_is_refused_not_taken_for_none(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # config.toml a link into a dotfiles folder that was moved: starts served the
    # defaults and reloads went back to them, every setting dropped without a word.
    target = tmp_path / "dotfiles" / "recalld.toml"
    target.parent.mkdir()
    target.write_text('[daemon]\nlog_level = "DEBUG"\n', "utf-8")
    env = daemon_factory.environment()
    config = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    config.parent.mkdir(parents=True)
    config.symlink_to(target)
    d = daemon_factory(**{k: v for k, v in env.items() if k.startswith("XDG_")})
    target.unlink()
    why = (f"{config} is a symbolic link to {target}, which leads to nothing; mend it, or "
           "remove it for the defaults")
    line = assert_one_line_error(recalld("serve", "--check-config", env=d.env), 2)
    assert line == f"recalld: configuration error: {why}", line
    d.signal(signal.SIGHUP)  # the running daemon keeps what it read, and says why
    error = wait_for(lambda: d.call("daemon.status")["queues"]["config"]["reload_error"],
                     "the reload fails")
    assert why in error, error
    assert "SIGHUP: a reload follows" in d.log()  # DEBUG: the link was read at start
