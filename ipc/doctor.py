"""``recalld doctor``: check the environment the daemon runs in and say what to fix.

Each check returns ok, warn, fail or skip with a one-line detail and, unless ok, the
command or setting that fixes it. The checks only read: file modes, /proc limits, free
space, the daemon's own status, the configuration file (by the daemon's own rules, the
one part of the daemon it imports: what a restart or reload would make of the file), and
(when present) ``systemctl --user`` and ``loginctl`` with short timeouts. Runs in the
client process.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from recalld.ipc import disks, errors, install, paths
from recalld.ipc._core import held_fix
from recalld.ipc.answers import DaemonStatus, JobInfo, WorkspaceInfo
from recalld.ipc.client import Client
from recalld.ipc.disks import DiskSpace
from recalld.ipc.doctor_report import Check, problem_check, unreachable
from recalld.ipc.health import assess, daemon_problems
from recalld.ipc.peers import listener_of
from recalld.ipc.regular_files import blocked_on_way, not_a_folder

COMMAND_TIMEOUT_S = 5.0
CHECK_CONFIG_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 3.0
UNIT_NAMES = ("recalld.service", "recalld.socket")


class Doctor:
    """Runs the checks for one socket path and environment."""

    def __init__(self, socket_path: Path, environ: Mapping[str, str] | None = None,
                 *, timeout_s: float = 10.0,
                 run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None
                 ) -> None:
        self.socket_path = socket_path
        self.env = os.environ if environ is None else environ
        self.timeout_s = timeout_s
        self._run = run or _run
        self.status: DaemonStatus | None = None
        self.workspaces: list[WorkspaceInfo] = []

    def _data_dir(self) -> Path:
        """The data directory as the daemon finds it, or by the environment and defaults
        when the config file cannot be read (:meth:`config_file` says why)."""
        try:
            return paths.data_dir(self.env)
        except paths.PathError:
            return paths.choose_data_dir(self.env, None, Path())

    def checks(self) -> list[Check]:
        out = [self.socket_dir(), self.socket(), self.daemon(),
               self.config_file(), *self.shell_config()]
        out += self.health(" ".join(c.detail for c in out))
        out += [self.inotify(), self.inotify_instances(), *self.disks(), *self.providers(),
                self.unit(), self.enabled(), self.linger()]
        return out

    # -- the socket -----------------------------------------------------------------
    def socket_dir(self) -> Check:
        d = self.socket_path.parent
        try:
            st = d.lstat()
        except FileNotFoundError:
            if (blocked := blocked_on_way(d)) is not None:  # a start would fail there too
                return Check("socket_dir", "fail", f"cannot make {d}: {not_a_folder(blocked)}",
                             f"{blocked} must be a folder of yours: move what is there away, "
                             "or choose another socket (--socket, RECALLD_SOCKET or "
                             "XDG_RUNTIME_DIR)")
            return Check("socket_dir", "warn", f"{d} does not exist (daemon never started?)",
                         "start the daemon: recalld serve (or systemctl --user start recalld)")
        except OSError:  # a file in the way of a folder above it, no permission
            return unreachable("socket_dir", d)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            return Check("socket_dir", "fail", f"{d} is not a plain directory",
                         f"remove {d} and restart the daemon")
        if st.st_uid != os.getuid():
            return Check("socket_dir", "fail", f"{d} belongs to uid {st.st_uid}",
                         f"remove {d} and restart the daemon as yourself")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            return Check("socket_dir", "fail",
                         f"{d} has mode {mode:04o}; other users may reach the socket",
                         f"chmod 700 {d}")
        return Check("socket_dir", "ok", f"{d} mode {mode:04o}")

    def socket(self) -> Check:
        s = self.socket_path
        try:
            st = s.lstat()
        except FileNotFoundError:  # a daemon that holds its lock would refuse a start
            if blocked_on_way(s.parent) is not None:  # said by the socket_dir check
                return Check("socket", "skip", f"no socket at {s}: its folder cannot be made")
            return Check("socket", "warn", f"no socket at {s}", held_fix(s) or
                         "start the daemon: recalld serve (or systemctl --user start recalld)")
        except OSError:  # a file in the way of its folder, no permission
            return unreachable("socket", s)
        if not stat.S_ISSOCK(st.st_mode):
            return Check("socket", "fail", f"{s} is not a socket", f"remove {s}")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o177:
            return Check("socket", "fail", f"{s} has mode {mode:04o}", f"chmod 600 {s}")
        if not paths.answers(s):  # left by a daemon killed: not a socket to call ok
            return Check("socket", "warn", f"{s} mode {mode:04o}, but nothing listens on it "
                         "(left by a daemon that ended; a start replaces it)",
                         "start the daemon: recalld serve (or systemctl --user start recalld)")
        return Check("socket", "ok", f"{s} mode {mode:04o}")

    def daemon(self) -> Check:
        try:
            with Client(self.socket_path, timeout_s=self.timeout_s,
                        connect_timeout_s=CONNECT_TIMEOUT_S) as client:
                self.status = client.status()
                self.workspaces = client.workspace_list()
        except errors.DaemonNotRunning as exc:
            held = held_fix(self.socket_path)  # the error says what holds the socket
            return Check("daemon", "fail", exc.message if held else f"no daemon answers on "
                         f"{self.socket_path}", held or "recalld serve (or systemctl --user "
                         "start recalld.socket recalld.service)")
        except (errors.RecalldError, TimeoutError, OSError) as exc:
            # A socket unit's listener is systemd's, with or without a daemon behind it:
            # what listens says whether to look at the service or at a stuck process.
            who = listener_of(self.socket_path)
            held = f" ({who} listens on {self.socket_path})" if who else ""
            fix = ("the socket is recalld.socket's: see whether recalld.service runs and "
                   "why it does not answer: systemctl --user status recalld.service; "
                   "journalctl --user -u recalld" if who.endswith("(systemd)") else
                   "see journalctl --user -u recalld")
            return Check("daemon", "fail", f"the daemon did not answer: {exc}{held}", fix)
        s = self.status
        served = {w.get("agent_id") for w in s.get("workspaces") or []}
        # Closed ones that open again at the next start (recorded or configured) count too.
        away = sum(1 for w in self.workspaces if w.get("agent_id") not in served)
        more = f" (and {away} not open: recalld workspace list)" if away else ""
        return Check("daemon", "ok", f"recalld {s.get('version')} pid {s.get('pid')}, "
                                     f"{len(served)} workspace(s){more}")

    def config_file(self) -> Check:
        """The configuration file on disk as the next restart or reload would read it (the
        running daemon keeps what it read; its failed reloads are :meth:`health`'s)."""
        running = self.status.get("config_path") if self.status is not None else None
        path = Path(str(running)) if running else paths.config_path(None, self.env)
        if not path.exists() and blocked_on_way(path) is None:  # a broken link is refused
            queues = self.status.get("queues") if self.status is not None else None
            config = queues.get("config") if isinstance(queues, dict) else None
            if self.status is None and self.env.get("RECALLD_CONFIG"):
                # Named by RECALLD_CONFIG: a start from here would refuse to run.
                return Check("config file", "fail",
                             f"{path}: no such file (RECALLD_CONFIG names it: recalld serve "
                             "would refuse to start)",
                             f"create {path}, or unset RECALLD_CONFIG for the defaults")
            if isinstance(config, dict) and config.get("required"):
                # Named with --config or RECALLD_CONFIG: not the defaults, a failed start.
                return Check("config file", "fail",
                             f"{path}: no such file (the daemon was started with it named: "
                             "a restart or reload would refuse to run)",
                             f"put {path} back; the running daemon keeps the one it read")
            return Check("config file", "ok", f"no {path}: the defaults apply")
        error = self._refused(path)
        if error is None:
            return Check("config file", "ok", f"{path} is valid")
        if isinstance(error, Check):
            return error
        kept = "; the running daemon keeps the one it read" if self.status else ""
        # A workspace's place (``--check-config`` refuses it) fails that workspace alone.
        effect = ("a start would fail that workspace and serve the others"
                  if "] path = " in error and "[workspaces." in error
                  else "a restart or reload would refuse it")
        return Check("config file", "fail", f"{error} ({effect})", f"fix {path}{kept}")

    def shell_config(self) -> list[Check]:
        """The configuration file of this shell (``RECALLD_CONFIG``, ``XDG_CONFIG_HOME``)
        when the running daemon read another: the one ``recalld`` commands run here read
        (they exit 2 when they cannot parse it or its ``socket_path``) and a ``recalld
        serve`` started here would run on (it exits 2 on any value it refuses)."""
        running = self.status.get("config_path") if self.status is not None else None
        if not running:
            return []  # config_file checked this shell's file
        named = "RECALLD_CONFIG" if self.env.get("RECALLD_CONFIG") else "XDG_CONFIG_HOME"
        try:
            path = paths.config_path(None, self.env)
        except paths.PathError as exc:
            return [Check("shell config", "fail", f"{exc}: recalld commands here exit 2",
                          f"fix or unset {named}")]
        if paths.same_file(path, Path(str(running))):
            return []
        if not path.exists():
            if named == "RECALLD_CONFIG":
                return [Check("shell config", "fail",
                              f"{path}: no such file (RECALLD_CONFIG names it here; the daemon "
                              f"reads {running}): recalld commands here exit 2",
                              f"export RECALLD_CONFIG={shlex.quote(str(running))}, or create "
                              f"{path}")]
            return [Check("shell config", "warn",
                          f"no {path} here, so a recalld serve started here runs on the "
                          f"defaults; the daemon reads {running}",
                          f"export RECALLD_CONFIG={shlex.quote(str(running))}")]
        error = self._refused(path)
        if isinstance(error, Check):
            return [Check("shell config", error.status, error.detail)]
        if error is not None:
            try:  # the commands read only the file's syntax and socket_path
                paths.socket_path(None, self.env)
                who = "a recalld serve started here exits 2 on it; recalld commands run"
            except paths.PathError:
                who = "read by recalld commands here, which exit 2"
            return [Check("shell config", "fail", f"{error} ({who}; the daemon reads {running})",
                          f"fix {path}, or export RECALLD_CONFIG={shlex.quote(str(running))}")]
        return [Check("shell config", "warn",
                      f"{path} is valid, but the daemon reads {running}: commands here and a "
                      "daemon started here may find another socket and settings",
                      f"export RECALLD_CONFIG={shlex.quote(str(running))}")]

    def _refused(self, path: Path) -> str | Check | None:
        """Why the daemon's own rules refuse the file ``path`` (None: valid; a skip Check
        when it could not be checked, a warn one for a file it takes with warnings). Read
        by the daemon's entry point: this package imports nothing of the daemon's."""
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "recalld.daemon.main", "--check-config", "--config",
                 str(path)], env=dict(self.env), capture_output=True, text=True,
                timeout=CHECK_CONFIG_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Check("config file", "skip", f"{path} not checked: {exc}")
        warned = [w[18:] for w in proc.stderr.splitlines() if w.startswith("recalld: warning: ")]
        if proc.returncode == 0:  # the warnings of a file it takes say their fix
            return Check("config file", "warn", "; ".join(warned)) if warned else None
        return proc.stderr.strip().removeprefix("recalld: configuration error: ") or "refused"

    def health(self, said: str = "") -> list[Check]:
        """The daemon's problems and each workspace's, as human ``status`` shows them, with
        the fix; one whose cause the checks before (``said``: the config file's) already
        show is not said twice."""
        if self.status is None:
            return []
        out = [problem_check(p.topic, p) for p in daemon_problems(self.status)
               if not (p.cause and p.cause in said) and p.topic != "disk"]  # measured here
        jobs: list[JobInfo] = []
        try:
            with Client(self.socket_path, timeout_s=self.timeout_s,
                        connect_timeout_s=CONNECT_TIMEOUT_S) as client:
                jobs = client.jobs_of_every_workspace()
        except (errors.RecalldError, TimeoutError, OSError):
            jobs = []  # the workspaces' own state still shows
        for ws in self.status.get("workspaces") or []:
            a = assess(ws, jobs)
            name = f"workspace {a.agent_id}"
            out += [problem_check(name, p) for p in a.problems]
            if not any(p.severity != "info" for p in a.problems):
                h = ws.get("health") or {}
                out.append(Check(name, "ok", f"{h.get('files_indexed')} files, "
                                             f"{h.get('chunks')} chunks"))
        return out

    # -- the machine ----------------------------------------------------------------
    def _watched_roots(self) -> list[Path]:
        roots = []
        for ws in self.workspaces:
            settings = ws.get("settings") or {}
            base = Path(str(ws.get("path", "")))
            for key in ("daily_dir", "digest_dir", "resource_dir"):
                if settings.get(key):
                    roots.append(base / str(settings[key]))
        if not roots:
            roots = [self._data_dir() / "workspaces"]
        return roots

    def inotify(self) -> Check:
        try:
            limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text().strip())
        except (OSError, ValueError):
            return Check("inotify", "skip", "no /proc/sys/fs/inotify (not Linux?)")
        dirs = sum(1 for root in self._watched_roots() for _ in _dirs(root))
        fix = ("echo fs.inotify.max_user_watches=524288 | sudo tee "
               "/etc/sysctl.d/90-recalld.conf && sudo sysctl --system")
        detail = f"{dirs} watched directories, max_user_watches={limit}"
        if dirs >= limit:
            return Check("inotify", "fail", detail + " (changes go unseen until a rescan)", fix)
        if dirs > limit // 2:
            return Check("inotify", "warn", detail + " (shared with every other program)", fix)
        return Check("inotify", "ok", detail)

    def inotify_instances(self) -> Check:
        """The daemon holds one inotify instance for all its workspaces; the per-user
        limit is shared with every other program of this user."""
        try:
            limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text().strip())
        except (OSError, ValueError):
            return Check("inotify instances", "skip", "no /proc/sys/fs/inotify (not Linux?)")
        used = _inotify_instances_in_use()
        detail = (f"{used} in use by this user, max_user_instances={limit}, "
                  "the daemon needs one")
        fix = ("echo fs.inotify.max_user_instances=1024 | sudo tee "
               "/etc/sysctl.d/91-recalld.conf && sudo sysctl --system")
        if used >= limit:
            return Check("inotify instances", "fail",
                         detail + " (a restarted daemon could not watch)", fix)
        if used > limit * 3 // 4:
            return Check("inotify instances", "warn", detail, fix)
        return Check("inotify instances", "ok", detail)

    def disks(self) -> list[Check]:
        """Free space on each file system the daemon writes to: the data directory's and
        that of every workspace kept elsewhere (its notes and derived state live there)."""
        status = self.status
        data_dir = status.get("data_dir") if status is not None else None
        targets = [("data", Path(str(data_dir)) if data_dir else self._data_dir())]
        there = blocked_on_way(targets[0][1])
        if there is not None:  # a file or a broken link: RECALLD_DATA_DIR, or on its way
            return [Check("data dir", "fail", f"{not_a_folder(there)}: recalld serve "
                          "would refuse to start", f"move {there} away, or name a "
                          "directory (RECALLD_DATA_DIR, [daemon] data_dir)")]
        if status is not None:
            targets += [(f"workspace {ws.get('agent_id')}", Path(str(ws["path"])))
                        for ws in status.get("workspaces") or [] if ws.get("path")]
        return [self._disk(d) for d in disks.measure(targets)]

    def _disk(self, disk: DiskSpace) -> Check:
        if disk["level"] == "ok":
            return Check("disk", "ok", disks.described(disk))
        what, fix = disks.problem(disk)
        return Check("disk", disk["level"], what.removeprefix("low on disk space: "), fix)

    def providers(self) -> list[Check]:
        urls: dict[str, str] = {}
        for ws in self.workspaces:
            settings = ws.get("settings") or {}
            for key in ("embedding_model_config", "chat_model_config"):
                cfg = settings.get(key) or {}
                if isinstance(cfg, dict) and cfg.get("base_url") and cfg.get("model_name"):
                    urls.setdefault(str(cfg["base_url"]), f"{key} of {ws.get('agent_id')}")
        if not urls:
            return [Check("providers", "skip", "no embedding or chat provider configured")]
        out = []
        for url, who in sorted(urls.items()):
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                with socket.create_connection((parts.hostname or "", port), CONNECT_TIMEOUT_S):
                    pass
            except OSError as exc:
                out.append(Check("provider", "fail", f"{url} ({who}) unreachable: {exc}",
                                 "check base_url, the network, or start the local server"))
                continue
            out.append(Check("provider", "ok", f"{url} ({who}) accepts connections"))
        return out

    # -- systemd --------------------------------------------------------------------
    def unit(self) -> Check:
        unit_dir = install.unit_dir(self.env)
        missing = [n for n in UNIT_NAMES if not (unit_dir / n).is_file()]
        if missing:
            return Check("unit", "warn", f"{', '.join(missing)} not in {unit_dir}",
                         "recalld install-service" if self._bus() else
                         "no user systemd is reachable from here, so install-service would "
                         "refuse: recalld install-service --write-only, then enable the "
                         "units from a session that has one; or keep running recalld serve")
        listen = self._unit_socket(unit_dir / "recalld.socket")
        if listen is not None and listen != self.socket_path:
            return Check("unit", "warn",
                         f"recalld.socket listens on {listen}, but clients look for "
                         f"{self.socket_path}",
                         f"recalld install-service (it writes the socket clients find), or "
                         f"point clients at it: RECALLD_SOCKET={listen} or [daemon] "
                         "socket_path")
        program = self._unit_program(unit_dir / "recalld.service")
        if program is not None and not os.access(program, os.X_OK):
            return Check("unit", "fail",
                         f"recalld.service runs {program}, which is missing or not "
                         "executable (the environment it was installed from moved or "
                         "was removed)",
                         "install the units again with the recalld the service is to run: "
                         "/path/to/env/bin/recalld install-service")
        return Check("unit", "ok", f"units installed in {unit_dir}")

    def _unit_program(self, unit: Path) -> Path | None:
        """The program the service unit's ``ExecStart=`` runs (None when it cannot be
        told: a specifier other than ``%h`` and ``%%``, a relative name)."""
        value = install.unit_value(unit, "ExecStart")
        try:
            words = shlex.split((value or "").lstrip("-@:+!"))
        except ValueError:
            return None
        home = str(paths.home_dir(self.env))
        program = install.specified(words[0], {"h": home}) if words else None
        return Path(program) if program and program.startswith("/") else None

    def _unit_socket(self, unit: Path) -> Path | None:
        """The path the socket unit's ``ListenStream=`` names, as systemd reads it (``%t``
        is the runtime directory, ``%%`` one ``%``); None when it cannot be told."""
        value = install.unit_value(unit, "ListenStream")
        if value is None:
            return None
        runtime = paths.xdg_dir(self.env, "XDG_RUNTIME_DIR")
        value = install.specified(value, {"t": runtime} if runtime else {})
        return Path(value) if value and value.startswith("/") else None

    def _bus(self) -> bool:
        runtime = paths.xdg_dir(self.env, "XDG_RUNTIME_DIR")
        return bool(self.env.get("DBUS_SESSION_BUS_ADDRESS")) or bool(
            runtime and Path(runtime, "bus").exists())

    def enabled(self) -> Check:
        if shutil.which("systemctl") is None:
            return Check("enabled", "skip", "systemctl not found: cannot check the service")
        if not self._bus():
            return Check("enabled", "skip", "no user D-Bus session reachable (no "
                         "XDG_RUNTIME_DIR/bus): cannot ask systemd --user")
        try:
            proc = self._run(["systemctl", "--user", "is-enabled", *UNIT_NAMES])
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Check("enabled", "skip", f"systemctl --user did not answer: {exc}")
        states = proc.stdout.split()
        if proc.returncode == 0 and states and all(s == "enabled" for s in states):
            return Check("enabled", "ok", "recalld.socket and recalld.service are enabled")
        return Check("enabled", "warn", f"is-enabled says: {' '.join(states) or 'nothing'}",
                     "systemctl --user enable --now recalld.socket recalld.service")

    def linger(self) -> Check:
        if shutil.which("loginctl") is None:
            return Check("linger", "skip", "loginctl not found")
        user = pwd.getpwuid(os.getuid()).pw_name
        try:
            proc = self._run(["loginctl", "show-user", user, "-p", "Linger"])
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Check("linger", "skip", f"loginctl did not answer: {exc}")
        value = proc.stdout.strip().partition("=")[2]
        if proc.returncode != 0 or not value:
            return Check("linger", "skip", "loginctl knows no session of this user")
        if value == "yes":
            return Check("linger", "ok", "lingering: the daemon runs without a login")
        return Check("linger", "warn", "not lingering: the daemon stops at logout",
                     f"loginctl enable-linger {user}")


def _dirs(root: Path) -> Iterator[str]:
    for dirpath, dirnames, _ in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        yield dirpath


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False,
                          timeout=COMMAND_TIMEOUT_S)


def _inotify_instances_in_use(proc: Path = Path("/proc")) -> int:
    """inotify instances held by processes of this user that /proc lets us see."""
    count = 0
    uid = os.getuid()
    for fd_dir in proc.glob("[0-9]*/fd"):
        try:
            if fd_dir.parent.stat().st_uid != uid:
                continue  # another user's (root sees them all): not counted in our limit
            entries = list(fd_dir.iterdir())
        except OSError:
            continue  # another user's process, or gone
        for entry in entries:
            try:
                if os.readlink(entry) == "anon_inode:inotify":
                    count += 1
            except OSError:
                continue
    return count
