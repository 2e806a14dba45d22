"""What a starting daemon refuses, seen from outside: real daemons, real folders, the real
``recalld status`` and ``doctor``.

- The data and state folders are created private (0700); an existing one is never chmod-ed.
  A data folder other users may enter (``data_dir = "~"``) keeps its mode while recalld's
  own folders in it are private; a state folder that is not private, or a data folder of
  another user, is refused with a clear message.
- A configured workspace path the root checks refuse (a system folder, another user's
  folder) is shown as a failed workspace with the
  reason in status and doctor, and the daemon serves the rest.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DaemonFactory, DaemonHandle
from waits import wait_gone, wait_log

from recalld.ipc.client import Client
from recalld.ipc.errors import InvalidParams

SCRIPT = Path(sys.executable).parent / "recalld"


def recalld(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_shared_data_folder_keeps_its_mode(daemon_factory: DaemonFactory,
                                             tmp_path: Path) -> None:
    home = tmp_path / "home-like"
    home.mkdir()
    os.chmod(home, 0o755)
    (home / "notes.txt").write_text("the user's own file\n", encoding="utf-8")
    daemon = daemon_factory(RECALLD_DATA_DIR=str(home))
    assert _mode(home) == 0o755
    assert _mode(home / "state") == 0o700
    assert _mode(home / "workspaces") == 0o700
    assert _mode(home / "backups") == 0o700
    assert "is open to other users; its mode is left alone" in daemon.log()
    with Client(daemon.socket_path) as c:
        c.add_note("default", "the kestrel nests on the north tower")
        hits = c.search("default", "kestrel", sync=True).results
    assert hits and hits[0].path.startswith("memory/")
    assert daemon.stop() == 0
    assert _mode(home) == 0o755


def test_a_fresh_data_folder_is_created_private(daemon_factory: DaemonFactory,
                                                tmp_path: Path) -> None:
    data = tmp_path / "fresh" / "recalld"
    daemon = daemon_factory(RECALLD_DATA_DIR=str(data))
    assert _mode(data) == 0o700
    assert _mode(data / "state") == 0o700
    assert "open to other users" not in daemon.log()
    assert daemon.stop() == 0


def test_a_state_folder_open_to_others_is_refused_not_changed(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "state").mkdir(parents=True)
    os.chmod(data, 0o700)
    os.chmod(data / "state", 0o755)
    daemon = daemon_factory(RECALLD_DATA_DIR=str(data), wait=False)
    assert daemon.proc.wait(timeout=60) == 2  # a restart cannot mend it
    log = daemon.log()
    assert log.strip().splitlines()[-1].startswith(
        "recalld: configuration error: cannot keep data private: "), log
    assert f"{data / 'state'} is open to other users (mode 755)" in log, log
    assert f"chmod 700 {data / 'state'}" in log
    assert "Traceback" not in log
    assert _mode(data / "state") == 0o755


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a folder another user's")
def test_a_data_folder_of_another_user_is_refused(daemon_factory: DaemonFactory,
                                                  tmp_path: Path) -> None:
    data = tmp_path / "theirs"
    data.mkdir(mode=0o700)
    os.chown(data, 4321, 4321)
    daemon = daemon_factory(RECALLD_DATA_DIR=str(data), wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert "belongs to uid 4321" in daemon.log()
    assert list(data.iterdir()) == []


@pytest.mark.parametrize("blocked", ["a file above it", "a folder as its lock",
                                     "a FIFO as its lock"])
def test_a_data_folder_the_file_system_refuses_is_one_line(daemon_factory: DaemonFactory,
                                                           tmp_path: Path,
                                                           blocked: str) -> None:
    # A data_dir that cannot be made (a file where a parent should be; no permission, a
    # read-only disk alike) or locked: one line naming it, not a traceback.
    if blocked == "a file above it":
        (tmp_path / "file").write_text("x")
        data = tmp_path / "file" / "data"
    else:
        data = tmp_path / "data"
        (data / "state").mkdir(parents=True)
        if blocked == "a folder as its lock":
            (data / "state" / "daemon.lock").mkdir()
        else:
            os.mkfifo(data / "state" / "daemon.lock")
        os.chmod(data, 0o700)
        os.chmod(data / "state", 0o700)
    daemon = daemon_factory(RECALLD_DATA_DIR=str(data), wait=False)
    # 2: a restart cannot mend it, and systemd does not retry it (RestartPreventExitStatus).
    assert daemon.proc.wait(timeout=60) == 2
    lines = daemon.log().strip().splitlines()
    assert lines[-1].startswith(f"recalld: cannot use the data directory {data}: "), lines
    if blocked == "a FIFO as its lock":
        assert "daemon.lock" in lines[-1] and "not a regular file" in lines[-1], lines
    if blocked == "a file above it":  # the file in the way, not mkdir's "File exists"
        assert lines[-1].endswith(f": {tmp_path / 'file'} is not a directory"), lines
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("below", ["log", "logs/recalld.log"])
def test_a_log_file_under_a_file_names_the_file_in_the_way(daemon_factory: DaemonFactory,
                                                           tmp_path: Path, below: str) -> None:
    # --log-file whose folder is a file: mkdir said "[Errno 17] File exists: '...'".
    (tmp_path / "afile").write_text("x")
    log_file = tmp_path / "afile" / below
    daemon = daemon_factory(args=["--log-file", str(log_file)], wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert daemon.log().strip().splitlines()[-1] == (
        f"recalld: cannot open the log file {log_file}: {tmp_path / 'afile'} is not a "
        "directory"), daemon.log()


def test_a_socket_whose_lock_cannot_be_opened_is_one_line(daemon_factory: DaemonFactory,
                                                           tmp_path: Path) -> None:
    # The socket's folder refuses its lock file (here a folder in its place; a folder we
    # may not write in alike): one line naming it, not a traceback.
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    (folder / "r.sock.lock").mkdir()
    daemon = daemon_factory(RECALLD_SOCKET=str(folder / "r.sock"), wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert daemon.log().strip().splitlines()[-1] == (
        f"recalld: cannot create the socket: cannot open {folder / 'r.sock.lock'}: "
        "Is a directory"), daemon.log()
    assert "Traceback" not in daemon.log()


def test_a_socket_folder_under_a_file_is_one_line_and_not_retried(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    folder = tmp_path / "afile" / "run"
    daemon = daemon_factory(RECALLD_SOCKET=str(folder / "r.sock"), wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert daemon.log().strip().splitlines()[-1] == (
        f"recalld: cannot create the socket: cannot create {folder}: {tmp_path / 'afile'} "
        "is not a directory"), \
        daemon.log()
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("place", ["~", "~/", "/usr/share", "data/recalld/backups/w",
                                   "config", "/tmp/../etc"])
def test_check_config_refuses_a_workspace_place_a_start_would_refuse(
        daemon_factory: DaemonFactory, tmp_path: Path, place: str) -> None:
    # `serve --check-config` said 0 for a [workspaces.X] path the start then refuses (the
    # home folder holds the daemon's data and config file): only status showed it.
    env = daemon_factory.environment()
    home = Path(env["HOME"])
    given = place if place.startswith(("~", "/")) else str(home / place)
    cfg = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    cfg.parent.mkdir(parents=True)
    fine = tmp_path / "fine"
    cfg.write_text(f'[workspaces.good]\npath = "{fine}"\n\n[workspaces.w]\npath = "{given}"\n')
    proc = recalld("serve", "--check-config", env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"recalld: configuration error: {cfg}: [workspaces.w] path = "), line
    assert "system folder" in line or "recalld's own folder" in line or (
        "configuration file" in line), line
    assert not fine.exists()  # only checked: nothing is created


def test_check_config_passes_the_workspace_places_a_start_takes(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The refusals above are of the refused place alone: the same file without it passes.
    env = daemon_factory.environment()
    cfg = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'[workspaces.good]\npath = "{tmp_path / "fine"}"\n')
    assert recalld("serve", "--check-config", env=env).returncode == 0


def test_refused_workspace_paths_show_in_status_and_doctor(daemon_factory: DaemonFactory,
                                                           tmp_path: Path) -> None:
    good = tmp_path / "good"
    (good / "memory").mkdir(parents=True)
    (good / "memory" / "facts.md").write_text(
        "# Facts\n\nThe osprey ledger sits on the top shelf.\n", encoding="utf-8")
    # A path in /proc leads where the daemon's process is, not to a folder the client
    # named: this one resolves to an ordinary folder, and was served there.
    paths = {"etc": "/etc", "root": "/", "good": str(good),
             "proc": f"/proc/self/root{tmp_path}/via-proc"}
    refused = {"etc": "system folder", "root": "system folder", "proc": "system folder",
               "theirs": "belongs to uid", "hop": "is not available: Permission denied"}
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4321, 4321)
        paths["theirs"] = str(theirs)
    if _unreadable_link("/proc/1/cwd"):
        # A link on the way that cannot be read stopped the whole start (exit 1).
        (tmp_path / "hop").symlink_to("/proc/1/cwd")
        paths["hop"] = str(tmp_path / "hop" / "x")
    config = "".join(f'[workspaces.{name}]\npath = "{path}"\n\n'
                     for name, path in paths.items())
    config = config.replace('path = "/etc"\n', 'path = "/etc"\ndaily_dir = "journal"\n')
    daemon = daemon_factory(config)  # answers: the refusals did not stop it
    status = daemon.call("daemon.status")
    states = {w["agent_id"]: w for w in status["workspaces"]}
    assert states["good"]["state"] == "ready"
    for name in set(paths) - {"good"}:
        ws = states[name]
        assert ws["state"] == "failed" and ws["refused"] is True, ws
        assert ws["refused_for"] == "place" and refused[name] in ws["error"], ws
    # Shown with the settings it was refused with, not the defaults.
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    assert listed["etc"]["settings"]["daily_dir"] == "journal"
    assert listed["root"]["settings"]["daily_dir"] == "memory"
    assert not (Path("/etc") / "memory").exists()
    assert not (tmp_path / "via-proc").exists()

    shown = recalld("status", env=daemon.env)
    assert shown.returncode == 0, shown.stderr
    for name in set(paths) - {"good"}:
        assert f"workspace not opened: {states[name]['error']}" in shown.stdout, shown.stdout
        assert f"fix: give it a folder of its own ([workspaces.{name}] path" in shown.stdout
        # No index to count: said so, not "-: - file(s), - chunk(s) indexed".
        block = shown.stdout.split(f"\n{name}: ", 1)[1].splitlines()
        assert block[1].split(None, 1) == [
            "index:", "none: the workspace is not open (the problem below says why)"], block
    # Metrics too: an alert on a workspace's health sees the ones that failed.
    health = next(f for f in daemon.call("daemon.metrics")["families"]
                  if f["name"] == "recalld_workspace_health")["samples"]
    failed = {s["labels"]["agent_id"] for s in health
              if s["labels"]["state"] == "failed" and s["value"] == 1.0}
    assert failed == set(paths) - {"good"}, health
    doctor = recalld("doctor", "--json", env=daemon.env)
    checks = json.loads(doctor.stdout)["checks"]
    failing = {c["name"]: c for c in checks if c["status"] == "fail"}
    for name in set(paths) - {"good"}:
        check = failing[f"workspace {name}"]
        assert refused[name] in check["detail"], check
        assert f"[workspaces.{name}] path" in check["fix"], check
    # The file names such a place too: a start fails that workspace, not the daemon.
    detail = failing["config file"]["detail"]
    assert "a start would fail that workspace and serve the others" in detail, detail
    assert "would refuse it" not in detail
    with Client(daemon.socket_path) as c:
        hits = c.search("good", "osprey ledger", sync=True).results
        assert any("top shelf" in h.text for h in hits)
        # Opened by a client, the same places are refused the same way.
        for name in set(paths) & {"proc", "hop"}:
            with pytest.raises(InvalidParams, match=refused[name]):
                c.workspace_open(f"{name}-again", path=paths[name])
        # Closing a refused workspace drops it at once; nothing was running.
        c.call("workspace.close", {"agent_id": "etc"})
    agents = {w["agent_id"] for w in daemon.call("daemon.status")["workspaces"]}
    assert "etc" not in agents
    assert daemon.stop() == 0


def _unreadable_link(path: str) -> bool:
    try:
        os.readlink(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def test_a_workspace_folder_half_made_names_what_stands_in_the_way(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A file where one of a workspace's folders goes (its metadata folder, a note folder
    # as a link to nothing, a file above the workspace itself) failed it with "cannot
    # create workspace directories under ROOT: File exists" and, in status, the fix to
    # open it again: which failed the same way, the file never named.
    meta, link, above = tmp_path / "meta", tmp_path / "link", tmp_path / "afile"
    meta.mkdir()
    (meta / "mem_metadata").write_text("x")
    link.mkdir()
    (link / "memory").symlink_to(tmp_path / "nowhere")
    above.write_text("x")
    blocked = {"meta": (meta, meta / "mem_metadata"), "link": (link, link / "memory"),
               "above": (above / "ws", above)}
    for agent, (root, in_the_way) in blocked.items():
        with pytest.raises(InvalidParams) as refused:
            daemon.call("workspace.open", {"agent_id": agent, "path": str(root)})
        assert refused.value.message == (
            f"cannot create workspace directories under {root}: {in_the_way} is in the "
            "way: it is not a folder, and one goes there; move it away, then open the "
            "workspace again"), refused.value.message
    shown = recalld("status", env=daemon.env)
    for agent, (_, in_the_way) in blocked.items():
        block = shown.stdout.split(f"\n{agent}: ", 1)[1].split("\n\n", 1)[0]
        assert f"{in_the_way} is in the way" in block and (
            f"fix: recalld workspace open {agent}") in block, block
    # Moved away, the workspace opens.
    (meta / "mem_metadata").unlink()
    assert daemon.call("workspace.open", {"agent_id": "meta", "path": str(meta)})[
        "state"] == "ready"


def test_an_autostarted_daemon_finds_its_data_folder_private(
        daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    data = Path(env["XDG_DATA_HOME"]) / "recalld"
    code = ("import json\nfrom recalld.ipc.client import Client\n"
            "with Client(autostart=True) as c:\n    print(json.dumps(c.status()['pid']))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout)
    try:
        assert _mode(data) == 0o700
        assert _mode(data / "state") == 0o700
        log = data / "state" / "recalld.log"
        assert "open to other users" not in wait_log(log, "recalld serving on",
                                                     "the daemon's log file")
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_gone(pid, "the auto-started daemon to stop on SIGTERM")


def test_a_refused_recorded_workspace_shows_its_recorded_settings(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to hand a folder to another user")
    ws = tmp_path / "mine"
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "mine", "path": str(ws),
                              "config": {"daily_dir": "journal"}})
    assert d.stop() == 0
    os.chown(ws, 4321, 4321)  # no longer this user's: refused at the next start
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    listed = {w["agent_id"]: w for w in d2.call("workspace.list")["workspaces"]}
    assert listed["mine"]["refused"] is True and "belongs to uid" in listed["mine"]["error"]
    assert listed["mine"]["settings"]["daily_dir"] == "journal"


def test_a_served_workspace_whose_folder_is_gone_or_empty_is_not_made_again(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Made again empty at the start, a folder on a disk not yet mounted took the notes
    # written meanwhile (hidden under the mount once it came), and the folder moved back
    # landed inside the new one.
    ws, away = tmp_path / "disk" / "notes", tmp_path / "away"
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "far", "path": str(ws)})
    d.call("memory.add_note", {"agent_id": "far", "content": "the otter holt is upstream"})
    assert d.stop() == 0
    ws.rename(away)
    for shape in ("missing", "empty"):
        d = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
        listed = {w["agent_id"]: w for w in d.call("workspace.list")["workspaces"]}
        assert listed["far"]["state"] == "failed", listed["far"]
        assert f"{ws} is {shape}" in listed["far"]["error"]
        assert listed["far"]["refused_for"] == "missing", listed["far"]
        if shape == "missing":  # the fix is to put it back, not to find it another place
            block = recalld("status", env=d.env).stdout.split("\nfar: ", 1)[1]
            assert "fix: put its folder back (mount its disk), then: recalld workspace " \
                   "open far; or stop serving it" in block, block
            assert "a folder of its own" not in block, block
        assert d.stop() == 0
        if shape == "missing":
            assert not ws.exists()
            ws.mkdir()  # an empty mount point
    assert list(ws.iterdir()) == []
    ws.rmdir()
    away.rename(ws)
    d = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    hits = d.call("memory.search", {"agent_id": "far", "query": "otter holt"})["results"]
    assert hits and hits[0]["path"].endswith("agent-notes.md")


AUTOSTART_REFUSED = {
    "sync": ("from recalld.ipc.client import Client\n"
             "def ping():\n"
             "    Client(autostart=True).ping()\n"),
    "asyncio": ("import asyncio\nfrom recalld.ipc.aclient import AsyncClient\n"
                "async def aping():\n"
                "    async with AsyncClient(autostart=True) as c:\n"
                "        await c.ping()\n"
                "def ping():\n"
                "    asyncio.run(aping())\n"),
}


@pytest.mark.parametrize("flavour", sorted(AUTOSTART_REFUSED))
def test_an_autostart_stops_waiting_when_the_started_daemon_exits(
        flavour: str, daemon_factory: DaemonFactory) -> None:
    # A data directory whose lock file cannot be opened: the daemon says so and exits 2,
    # without the words "configuration error". The client stops waiting as soon as it has
    # exited, with its reason, long before the (here hour-long) autostart deadline.
    env = daemon_factory.environment()
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    state = Path(env["XDG_DATA_HOME"]) / "recalld" / "state"
    (state / "daemon.lock").mkdir(parents=True)
    for folder in (state.parent, state):
        folder.chmod(0o700)
    code = (AUTOSTART_REFUSED[flavour]
            + "from recalld.ipc import _core\n"
            "from recalld.ipc.errors import DaemonNotRunning\n"
            "_core.AUTOSTART_WAIT_S = 3600.0\n"
            "try:\n"
            "    ping()\n"
            "except DaemonNotRunning as exc:\n"
            "    print(exc.message)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.strip()
    assert "but it exited: recalld: cannot use the data directory" in said, said
    assert f"Is a directory: {state / 'daemon.lock'}" in said, said
    assert "recalld-start.log" in said and len(said.splitlines()) == 1


def test_a_socket_passed_to_another_pid_is_named_as_the_reason_the_start_fails(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # A wrapper that forks recalld rather than exec'ing it: LISTEN_PID is the wrapper's,
    # so the passed socket is not taken, yet it listens on the socket's path. The start
    # fails (another listener is there) and the log says whose socket that is.
    path = short_dir / "r.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    launcher = (sys.executable, "-c",
                f"import os, sys; os.dup2({listener.fileno()}, 3);"
                "os.environ['LISTEN_PID'] = str(os.getppid()); os.environ['LISTEN_FDS'] = '1';"
                "os.execv(sys.executable, [sys.executable, '-m', 'recalld.daemon.main', "
                "*sys.argv[1:]])")
    try:
        d = daemon_factory(launcher=launcher, pass_fds=(listener.fileno(),), wait=False,
                           RECALLD_SOCKET=str(path))
        assert d.proc.wait(timeout=60) == 3, d.log()
        assert f"something else already listens on {path}: pid {os.getpid()} (" in d.log()
        assert "LISTEN_FDS='1' is meant for pid '" in d.log(), d.log()
        assert "must exec it" in d.log() and "Traceback" not in d.log()
    finally:
        listener.close()


def test_an_open_that_fails_leaves_the_folder_as_it_found_it(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The note folders were made before the lock was taken and left when the open then
    # failed: a folder where the lock file goes, or a file where another note folder goes,
    # left new empty memory/, digest/, mem_session/ and resource/ folders behind.
    locked, blocked = tmp_path / "locked", tmp_path / "блок 区"
    (locked / "mem_metadata" / "recalld.lock").mkdir(parents=True)
    blocked.mkdir()
    (blocked / "resource").write_text("x")
    for agent, root in (("locked", locked), ("blocked", blocked)):
        before = sorted(root.rglob("*"))
        with pytest.raises(InvalidParams):
            daemon.call("workspace.open", {"agent_id": agent, "path": str(root)})
        assert sorted(root.rglob("*")) == before, agent
    fresh = tmp_path / "fresh" / "ws"
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "ws").write_text("x")  # the workspace folder itself is a file
    with pytest.raises(InvalidParams):
        daemon.call("workspace.open", {"agent_id": "fresh", "path": str(fresh / "deep")})
    assert sorted((tmp_path / "fresh").rglob("*")) == [fresh]
    (blocked / "resource").unlink()
    daemon.call("workspace.open", {"agent_id": "blocked", "path": str(blocked)})
    assert {p.name for p in blocked.iterdir()} == {
        "memory", "digest", "mem_session", "resource", "mem_metadata"}
