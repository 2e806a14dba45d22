"""SIGHUP's reload in a task of its own: a stop never waits for the configuration file's
read, and cancels a reload under way; SIGHUPs during a reload add one reload; a read
that does not end fails the reload and the running configuration stays."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
from hooks import CONFIG_READ_HELD, SESSIONS_HELD, start_hook
from test_cli import recalld
from test_systemd import FakeSystemd
from test_warm_start import _open_writer
from waits import wait_for

from recalld.ipc.errors import InvalidParams

if TYPE_CHECKING:
    from conftest import DaemonFactory


def test_a_stop_does_not_wait_for_a_reload_that_hangs(daemon_factory: DaemonFactory,
                                                      tmp_path: Path) -> None:
    # A configuration file that cannot be read to its end (as a file on a hung mount:
    # CONFIG_READ_HELD) holds a reload: the daemon still answers, and SIGTERM still
    # stops it, cleanly.
    hold = tmp_path / "hold-config"
    d = daemon_factory("", **start_hook(tmp_path, CONFIG_READ_HELD), HOLD_CONFIG=str(hold))
    assert d.call("daemon.ping")["pong"] is True
    os.mkfifo(hold)
    d.signal(signal.SIGHUP)
    writer = wait_for(lambda: _open_writer(hold), "the reload opens the config file")
    try:
        assert d.call("daemon.ping")["pong"] is True
        assert d.stop() == 0, d.log()[-2000:]
        assert "recalld stopped" in d.log()
        assert "configuration reloaded" not in d.log()
    finally:
        os.close(writer)


def test_a_stop_cancels_the_reload_under_way(daemon_factory: DaemonFactory, short_dir: Path,
                                             tmp_path: Path) -> None:
    # A reload that reads its file while the daemon stops must not go on to open
    # workspaces or tell systemd READY=1 after STOPPING=1. The stop is held in its drain
    # by a call under way: a workspace.open held as its sessions store starts (as in
    # test_warm_start).
    held, hold_config = tmp_path / "hold", tmp_path / "hold-config"
    os.mkfifo(held)
    fake = FakeSystemd(short_dir / "notify")
    writers: list[int] = []
    try:
        d = daemon_factory("[daemon]\ngraceful_timeout_s = 120\n", wait=False,
                           **start_hook(tmp_path, SESSIONS_HELD, CONFIG_READ_HELD),
                           HOLD=str(held), HOLD_AGENT="held", HOLD_CONFIG=str(hold_config),
                           NOTIFY_SOCKET=str(fake.path))
        fake.wait_for("READY")
        with d.connect() as conn:
            conn.send_bytes(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "workspace.open",
                                          "params": {"agent_id": "held",
                                                     "path": str(tmp_path / "held")}}) + b"\n")
            writers.append(wait_for(lambda: _open_writer(held), "the open reads the FIFO"))
            os.mkfifo(hold_config)
            d.signal(signal.SIGHUP)
            writers.append(wait_for(lambda: _open_writer(hold_config), "the reload reads"))
            fake.wait_for("RELOADING")
            d.signal(signal.SIGTERM)
            fake.wait_for("STOPPING")
            wait_for(lambda: "reload abandoned: the daemon stops" in d.log(), "the reload ends")
            # The file arrives while the daemon stops: too late for a reload.
            extra = tmp_path / "extra"
            os.write(writers[1], f'[workspaces.extra]\npath = "{extra}"\n'.encode())
            os.close(writers.pop())
            os.close(writers.pop())  # the open goes on, the drain ends
            assert conn.recv_response()["id"] == 1
        assert d.proc.wait(timeout=60) == 0, d.log()[-2000:]
        stopping = next(i for i, m in enumerate(fake.messages) if "STOPPING" in m)
        assert not any("READY" in m for m in fake.messages[stopping:]), fake.messages
        assert "configuration reloaded" not in d.log()
        assert "workspace extra" not in d.log()
    finally:
        for fd in writers:
            os.close(fd)
        fake.close()


def test_sighups_during_a_reload_add_one_reload(daemon_factory: DaemonFactory,
                                               tmp_path: Path) -> None:
    debug = '[daemon]\nlog_level = "DEBUG"\n'
    hold = tmp_path / "hold-config"
    d = daemon_factory(debug, **start_hook(tmp_path, CONFIG_READ_HELD),
                       HOLD_CONFIG=str(hold))
    os.mkfifo(hold)
    d.signal(signal.SIGHUP)
    writer = wait_for(lambda: _open_writer(hold), "the first reload reads")
    try:
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.log().count("SIGHUP: a reload follows") == 2,
                 "a second reload waits")
        d.signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: merged" in d.log(), "a third SIGHUP merged")
        os.write(writer, f'{debug}[workspaces.a]\npath = "{tmp_path / "a"}"\n'.encode())
        os.close(writer)
        wait_for(lambda: d.log().count("configuration reloaded") == 1, "the first reload")
        # The one that waited reads the file as it is now.
        writer = wait_for(lambda: _open_writer(hold), "the second reload reads")
        os.write(writer, f'{debug}[workspaces.b]\npath = "{tmp_path / "b"}"\n'.encode())
        os.close(writer)
        wait_for(lambda: d.log().count("configuration reloaded") == 2, "the second reload")
        writer = -1
        names = {w["agent_id"] for w in d.call("workspace.list")["workspaces"]}
        assert {"a", "b"} <= names, names
        assert d.stop() == 0
        assert d.log().count("configuration reloaded") == 2
    finally:
        if writer >= 0:
            os.close(writer)


def test_a_read_that_does_not_end_fails_the_reload(daemon_factory: DaemonFactory,
                                                  short_dir: Path, tmp_path: Path) -> None:
    started = start_hook(tmp_path, CONFIG_READ_HELD, "from recalld.daemon import supervisor",
                         "supervisor.RELOAD_READ_TIMEOUT_S = 0.5")
    hold = tmp_path / "hold-config"
    fake = FakeSystemd(short_dir / "notify")
    try:
        d = daemon_factory("", wait=False, **started, NOTIFY_SOCKET=str(fake.path),
                           HOLD_CONFIG=str(hold))
        fake.wait_for("READY")
        os.mkfifo(hold)
        d.signal(signal.SIGHUP)
        fake.wait_for("RELOADING")
        failed = fake.wait_for("READY")  # systemd hears the reload is over
        assert "reload failed" in failed["STATUS"], failed
        assert "took over 0.5 s" in d.call("daemon.status")["queues"]["config"]["reload_error"]
        # The next reload reads a file again (the first read stays abandoned).
        hold.unlink()
        d.config_path.write_text(f'[workspaces.c]\npath = "{tmp_path / "c"}"\n')
        d.signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in d.log(), "the next reload")
        status = d.call("daemon.status")
        assert status["queues"]["config"]["reload_error"] is None
        assert d.stop() == 0
    finally:
        fake.close()


def test_a_reload_keeps_the_socket_and_data_dir_it_started_with(
        daemon_factory: DaemonFactory, short_dir: Path, tmp_path: Path) -> None:
    # Both apply only after a restart: until then new workspaces, backups and status use
    # the data directory the daemon locked and the socket it listens on.
    d = daemon_factory("")
    elsewhere = tmp_path / "elsewhere"
    d.config_path.write_text(f'[daemon]\ndata_dir = "{elsewhere}"\n'
                             f'socket_path = "{short_dir / "other.sock"}"\n')
    d.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.log(), "the reload")
    status = d.call("daemon.status")
    assert status["socket_path"] == str(d.socket_path)
    assert status["data_dir"] == str(d.data_dir)
    assert "the daemon keeps" in d.log()
    opened = d.call("workspace.open", {"agent_id": "fresh"})
    assert Path(opened["path"]).parent == (d.data_dir / "workspaces").resolve()
    made = d.call("backup.create", {"agents": ["fresh"]})
    assert Path(made["file"]).parent == d.data_dir / "backups"
    # The backups folder is still the daemon's own: no workspace may be opened in it.
    with pytest.raises(InvalidParams, match="recalld's own folder"):
        d.call("workspace.open", {"agent_id": "inside", "path": str(d.data_dir / "backups")})
    assert not elsewhere.exists()
    assert d.stop() == 0


def test_a_reload_names_open_workspaces_whose_settings_changed(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # They apply when each is opened again: the log says which and how, not nothing.
    d = daemon_factory("[workspaces.coder]\nauto_memory_interval = 3\n")
    d.config_path.write_text("[workspaces.coder]\nauto_memory_interval = 4\n"
                             f'[workspaces.fresh]\npath = "{tmp_path / "fresh"}"\n')
    d.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.log(), "the reload")
    assert ("reload: the configuration changed the settings or path of open workspace(s) "
            "coder; each keeps") in d.log(), d.log()
    d.signal(signal.SIGHUP)  # the same file again: nothing changed
    wait_for(lambda: d.log().count("configuration reloaded") == 2, "the second reload")
    assert d.log().count("changed the settings or path") == 1
    assert d.stop() == 0


def test_a_reload_says_which_daemon_settings_wait_for_a_restart(
        daemon_factory: DaemonFactory) -> None:
    # The server's limits and thread pools are built at the start: a reload that changes
    # them says so and keeps the running values, rather than "reloaded" and nothing.
    d = daemon_factory("[daemon]\nmax_request_bytes = 1048576\n")
    d.config_path.write_text("[daemon]\nmax_request_bytes = 65536\ncpu_threads = 1\n"
                             "chunk_max_chars = 500\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.log(), "the reload")
    log = d.log()
    assert ("max_request_bytes is 65536 in the configuration; the daemon keeps 1048576 "
            "until it is restarted") in log, log
    assert "cpu_threads is 1 in the configuration; the daemon keeps 2" in log
    assert "chunk_max_chars = 500 changed; open workspaces keep" in log
    # The running limit is the one it started with.
    with d.connect() as conn:
        conn.send_bytes(b'{"jsonrpc": "2.0", "id": 1,' + b" " * 200_000
                        + b'"method": "daemon.ping"}\n')
        assert conn.recv_response()["result"]["pong"] is True
    # Status says so too, until a reload reads them as they run.
    config = d.call("daemon.status")["queues"]["config"]
    assert config["waiting_for_restart"] == ["max_request_bytes", "cpu_threads"], config
    said = next(line for line in recalld("status", env=d.env).stdout.splitlines()
                if "until it is restarted" in line)
    assert "[note] max_request_bytes, cpu_threads changed in the config file" in said, said
    done = d.log().count("configuration reloaded")
    d.config_path.write_text("[daemon]\nchunk_max_chars = 500\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.log().count("configuration reloaded") > done, "the reload")
    assert d.call("daemon.status")["queues"]["config"]["waiting_for_restart"] == []
    assert d.stop() == 0


def test_a_log_level_from_the_command_line_outlasts_reloads(
        daemon_factory: DaemonFactory) -> None:
    # `serve --log-level WARNING` overrides the file's log_level, also once the file's
    # changes and a reload reads it.
    d = daemon_factory("[daemon]\nlog_level = \"INFO\"\n", args=["--log-level", "WARNING"])
    d.config_path.write_text('[daemon]\nlog_level = "DEBUG"\n[workspaces.fresh]\n')
    d.signal(signal.SIGHUP)
    wait_for(lambda: any(w["agent_id"] == "fresh" for w in d.call("workspace.list")["workspaces"]),
             "the reload")
    assert d.stop() == 0
    assert " DEBUG " not in d.log() and " INFO " not in d.log(), d.log()


def test_a_reload_asked_for_while_the_daemon_starts_waits_for_its_services(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A SIGHUP right after the socket was bound ran the reload before the workspace
    # registry had started: it logged the default workspace as refused ("the workspace
    # registry is not running") while the start went on to open it.
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    held = start_hook(
        tmp_path,
        "import os, trio",
        "from recalld.daemon.registry import WorkspaceRegistry",
        "run = WorkspaceRegistry.run",
        "async def held(self, **kw):",
        "    await trio.to_thread.run_sync(lambda: open(os.environ['HOLD'], 'rb').read())",
        "    await run(self, **kw)",
        "WorkspaceRegistry.run = held")
    d = daemon_factory('[daemon]\nlog_level = "DEBUG"\n', **held, wait=False,
                       HOLD=str(fifo))
    writer = wait_for(lambda: _open_writer(fifo), "the registry's start held")
    try:
        d.signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: a reload follows" in d.log(), "the SIGHUP taken")
    finally:
        os.close(writer)
    d.wait_ready()
    wait_for(lambda: "configuration reloaded" in d.log(), "the reload done")
    assert "registry is not running" not in d.log()
    listed = {w["agent_id"]: w for w in d.call("workspace.list")["workspaces"]}
    assert listed["default"]["state"] == "ready" and "refused" not in listed["default"]


def test_a_reload_without_its_file_says_the_defaults_apply(
        daemon_factory: DaemonFactory) -> None:
    # The file found by default (not named) was removed: the reload applies the defaults,
    # and the log says so rather than "reloaded from" a file that is not there.
    d = daemon_factory("[daemon]\npersist_delay_s = 1.5\n")
    d.config_path.unlink()
    d.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.log(), "the reload")
    log = d.log()
    assert f"configuration reloaded from {d.config_path}" not in log, log
    assert (f"configuration reloaded: there is no file {d.config_path} (any more), so the "
            "defaults apply") in log, log
    d.config_path.write_text("[daemon]\npersist_delay_s = 2.5\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: f"configuration reloaded from {d.config_path}" in d.log(),
             "the reload of the file written again")
    assert d.stop() == 0


def test_a_sighup_while_the_daemon_imports_its_modules_is_a_reload(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A reload asked for (systemctl reload, kill -HUP) while the daemon still imports its
    # modules, before its signal receiver opens, used to end it (SIGHUP's default action).
    # The start is held there, after the socket's lock and the configuration were taken.
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    # SIGHUP at its default action, as systemd or a shell starts the daemon (a suite run
    # under nohup would pass it on ignored, and an ignored SIGHUP stays ignored).
    held = start_hook(
        tmp_path,
        "import os, signal",
        "signal.signal(signal.SIGHUP, signal.SIG_DFL)",
        "from recalld.daemon import app",
        "build = app.build_supervisor",
        "def held(*args, **kw):",
        "    open(os.environ['HOLD'], 'rb').read()",
        "    return build(*args, **kw)",
        "app.build_supervisor = held")
    d = daemon_factory("", **held, wait=False, HOLD=str(fifo))
    writer = wait_for(lambda: _open_writer(fifo), "the start held before the supervisor")
    try:
        d.signal(signal.SIGHUP)
        d.signal(signal.SIGHUP)  # several make one reload
    finally:
        os.close(writer)
    d.wait_ready()
    wait_for(lambda: "configuration reloaded" in d.log(), "the reload after the start")
    assert d.log().count("SIGHUP during the start: a reload follows") == 1
    assert d.log().count("configuration reloaded") == 1
    assert d.call("daemon.ping")["pong"] is True
    assert d.stop() == 0
