"""The supervisor: owns the root nursery and the daemon's lifetime.

Start order (each step only once the previous one can serve):
1. the private data and state directories (never chmod-ed when they exist), the
   data-directory lock (a second daemon exits at once, status 3; :mod:`datadirs`);
   then the socket (bound now, or adopted from systemd) so that a second daemon on the
   same socket also fails fast;
2. the daemon-wide services (:class:`~recalld.daemon.services.DaemonServices`, in field
   order, the workspace registry last), then the default workspace, every
   ``[workspaces.*]`` table and every workspace served before, all at once, each up to
   its search stage (its saved index loaded);
3. the RPC server on that socket: it answers searches (and ``daemon.ping``) at once;
   other calls wait until step 4 (:class:`~recalld.daemon.services.DaemonStart`);
4. the workspaces' other services; once every workspace is open (or failed),
   ``READY=1`` with a STATUS line, and the watchdog task if systemd asked for one.

Signals: SIGTERM/SIGINT send ``STOPPING=1`` and stop in order: the server drains
(in-flight calls get ``graceful_timeout_s``), pending conversation turns are queued for
auto_memory (the jobs get ``graceful_timeout_s``), the jobs still running are stopped
while their workspaces serve them (the journal resumes them after a restart), then the
workspaces close; a second one stops at once (``main.py`` keeps
any that come after the receiver closed from killing the process). SIGHUP reloads
(one that came before the receiver opened, held by ``main.py``, once the services run;
in a task of its own, which a stop cancels: the stop does not wait for the file's read;
a workspace the reload was opening closes like any other, as slowly as its open)
the configuration file into a new frozen object; what can change at runtime (log level,
workspace tables for workspaces opened from now on, newly configured workspaces and
configured ones that failed) is
applied, a bad file is logged and reported in STATUS= while the old config keeps running.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypedDict

import trio

from recalld.daemon import config as config_mod
from recalld.daemon import config_left_out, reload_sharing
from recalld.daemon.config import ConfigError, DaemonConfig
from recalld.daemon.config_warnings import checked_reload, config_warnings
from recalld.daemon.datadirs import owning_data_dir
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.lock import socket_note
from recalld.daemon.refusals import refused_for
from recalld.daemon.rpc import restore_journal
from recalld.daemon.rpc.dispatch import DaemonState, Dispatcher, Methods
from recalld.daemon.rpc.listener import BoundSocket, bind_listener
from recalld.daemon.rpc.server import RpcServer
from recalld.daemon.services import DaemonServices
from recalld.daemon.stopreport import report_slow_stop
from recalld.daemon.systemd import Notifier, SystemdEnvironment, adopt_listener, run_watchdog
from recalld.ipc.errors import InvalidParams, RecalldError

log = logging.getLogger(__name__)

# A reload that cannot read its file within this long (a hung mount) fails, the running
# configuration kept; systemd, told RELOADING=1, then hears READY=1 again.
RELOAD_READ_TIMEOUT_S = 30.0
# Settings a reload leaves as they were until a restart: the socket and data directory
# it holds, the server's limits and the thread pools (built once at the start).
RESTART_ONLY = ("socket_path", "data_dir", "max_request_bytes", "max_batch", "max_connections",
                "idle_timeout_s", "write_timeout_s", "graceful_timeout_s", "cpu_threads",
                "max_concurrent_calls_per_connection", "backfill_threads", "backfill_nice")
# A stop's time beyond its two graceful_timeout_s waits (the last saves), for systemd.
STOP_MARGIN_S = 30.0
# The failed workspaces the systemd status line names; it counts the others.
STATUS_FAILED_NAMED = 5

Reloader = Callable[[], DaemonConfig]


class ReloadError(TypedDict):
    """The last failed reload (both None once a reload succeeds)."""

    reload_error: str | None
    reload_failed_at: float | None


class Supervisor:
    """Runs the whole daemon until SIGTERM/SIGINT (or cancellation)."""

    def __init__(
        self,
        services: DaemonServices,
        methods: Methods,
        *,
        systemd: SystemdEnvironment | None = None,
        reload: Reloader | None = None,
    ) -> None:
        self.services = services
        self._systemd = systemd or SystemdEnvironment()
        self._reload = reload
        self.notifier = Notifier(self._systemd.notify_socket)
        self.events = services.events
        self.registry = services.registry
        self.state = DaemonState(services=services, methods=methods)
        self.state.stats.update(services.statistics())
        # The last failed reload (cleared by a good one): the running config is the old one.
        self.reload_error: ReloadError = {"reload_error": None, "reload_failed_at": None}
        #: The settings (RESTART_ONLY) the last good reload read otherwise than running.
        self.waiting_for_restart: list[str] = []
        self.state.stats["config"] = lambda: {"path": str(self.config.config_path),
                                              "required": self.config.config_required,
                                              "warnings": config_warnings(self.config),
                                              "secrets_left_out": services.config.left_out,
                                              "waiting_for_restart": self.waiting_for_restart,
                                              **self.reload_error}
        self.server: RpcServer | None = None
        self._stop_requested = trio.Event()
        self._stopping = trio.Event()  # a stop began (requested, or at once)
        # What the stop does now, for the log when it takes long (stopreport.py).
        self._stop_stage = "stopping"
        self._ready = False
        # The start's second stage (the workspaces' other services), cancelled by a stop
        # that comes while the server already answers searches.
        self._opening_scope: trio.CancelScope | None = None
        # Around the reloads: a stop cancels the one under way and any that waits.
        self._reloads_scope = trio.CancelScope()
        # Around keep_start_told: READY=1 or a stop ends what systemd hears of the start.
        self._start_told = trio.CancelScope()
        # The configured socket when systemd passed another (a reload compares with it).
        self._configured_socket: Path | None = None
        #: Stop signals have gone to :meth:`run`'s receiver: one that comes outside it now
        #: comes while the daemon stops (see ``main.py``).
        self.signals_taken = False
        #: A SIGHUP came before :meth:`run`'s receiver opened (``main.py`` holds it): one
        #: reload follows once the services run.
        self.reload_asked = False

    @property
    def config(self) -> DaemonConfig:
        """The running configuration (a reload replaces it)."""
        return self.services.config.current

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until a stop signal; raises AlreadyServing if the data dir is taken."""
        cfg = self.config
        # Receive signals before anything else: a SIGTERM during start-up must not kill
        # us with the default handler while the lock and socket are half set up.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            self.signals_taken = True
            with owning_data_dir(cfg) as data_lock:
                # Claim the socket before the slow part of start-up, so a second daemon
                # on the same socket exits at once; clients that connect meanwhile wait
                # in the backlog until the server accepts.
                sock = adopt_listener(self._systemd.listen_fds)
                if sock is not None:
                    self._take_passed_address(sock)
                bound = bind_listener(cfg.socket_path) if sock is None else None
                # Where clients find it when the config file that names the socket
                # cannot be read (status, doctor).
                data_lock.note(socket_note(self.config.socket_path))
                try:
                    # Beside the root nursery: a stop that takes long says what it waits
                    # for, until the root's last task has ended.
                    async with trio.open_nursery() as beside:
                        beside.start_soon(self._report_slow_stop)
                        async with trio.open_nursery() as root:
                            # Reloads in a task of their own (once the services run),
                            # which a stop cancels: a stop never waits for one's read (a
                            # hung mount). One waits while one runs; more SIGHUPs
                            # meanwhile add nothing.
                            want_reload, reloads = trio.open_memory_channel[None](1)
                            if self.reload_asked:
                                log.info("SIGHUP during the start: a reload follows")
                                want_reload.send_nowait(None)
                            root.start_soon(self._handle_signals, signals,
                                            root.cancel_scope, want_reload)
                            await self._serve(root, task_status, sock, bound, reloads)
                        beside.cancel_scope.cancel()
                finally:
                    if bound is not None:
                        bound.close()
                    self.notifier.close()

    def _take_passed_address(self, sock: socket.socket) -> None:
        """The socket systemd passed is where the daemon listens, whatever the config
        says: status and the log name it, and a warning says when clients, which look
        for the configured one, will not find it."""
        passed = sock.getsockname()
        configured = self.config.socket_path
        if not isinstance(passed, str) or not passed or Path(passed) == configured:
            return
        log.warning("the socket systemd passed is %s, but clients look for %s (socket_path): "
                    "make the socket unit's ListenStream= and the configured socket the same "
                    "(recalld install-service writes both)", passed, configured)
        self._configured_socket = configured
        self.services.config.replace(dataclasses.replace(self.config, socket_path=Path(passed)))

    async def _serve(
        self,
        root: trio.Nursery,
        task_status: trio.TaskStatus[None],
        sock: socket.socket | None,
        bound: BoundSocket | None,
        reloads: trio.MemoryReceiveChannel[None],
    ) -> None:
        root.start_soon(self.notifier.tell_start, self.services.start.progress,
                        self._start_told)
        for name, service in self.services.in_start_order():
            self._start_step(f"starting {name}")
            await root.start(service.run)
        root.start_soon(self._reload_loop, reloads)
        await trio.to_thread.run_sync(config_left_out.refresh, self.services.config)
        # A restore this daemon was killed in is finished (or rolled back) before any of
        # its workspaces serves the files it left half replaced.
        self._start_step("finishing an interrupted restore")
        await restore_journal.recover(self.state, self.services.start.progress)
        self._start_step("opening workspaces")
        # Concurrently, each loading its saved index in a worker thread: the configured
        # workspaces, and every workspace served before (by RPC, a middleware, an MCP
        # bridge), so its watcher, resource catalog and dream cron run with no client
        # connected. A configured agent opens at its configured path.
        initial = self.config.configured_agents()
        opening: list[tuple[str, Path | None, JsonObject | None]] = [
            (agent_id, None, None) for agent_id in initial]
        opening += [(agent_id, Path(rec["path"]), rec["config"])
                    for agent_id, rec in self.registry.remembered().items()
                    if agent_id not in initial]
        start = self.services.start
        start.begin(agent_id for agent_id, _, _ in opening)
        server = RpcServer(self.config, Dispatcher(self.state), sock=sock, bound=bound)
        self.server = server
        self.state.stats["server"] = lambda: dataclasses.asdict(server.statistics())
        async with trio.open_nursery() as front:
            async with trio.open_nursery() as opener:
                self._opening_scope = opener.cancel_scope
                for agent_id, path, overrides in opening:
                    opener.start_soon(self._open_at_start, agent_id, path, overrides)
                # Searches first: the server serves once every workspace answers them;
                # the workspaces' other services start meanwhile.
                await start.wait_searchable()
                await front.start(server.run)
                start.serve()
            if not self._stop_requested.is_set():
                start.finish()
                if self._systemd.watchdog_interval_s:
                    await front.start(run_watchdog, self.notifier,
                                      self._systemd.watchdog_interval_s)
                self._ready = True
                self._start_told.cancel()
                self.notifier.ready(self._status_line())
                front.start_soon(self.notifier.keep_status, self.events, self._status_line)
                log.info("recalld serving on %s (%s)", self.config.socket_path,
                         self._status_line())
                task_status.started()
                await self._stop_requested.wait()
            # else: stopped during the start's second stage, with calls already answered:
            # they drain like any others (calls that wait for the start end with it).
            # graceful_timeout_s for the calls, as long for the turns, then the last saves.
            self._stop_stage = "stopping: draining connections"
            self.notifier.stopping(self._stop_stage,
                                   extend_s=2 * self.config.graceful_timeout_s + STOP_MARGIN_S)
            front.cancel_scope.cancel()  # the server drains within graceful_timeout_s
        self._stop_step("stopping: writing pending conversation turns")
        await self._flush_sessions(self.config.graceful_timeout_s)
        # Jobs end while their workspaces serve them: a dream's or auto_memory's inbox
        # item, the turns it commits, go to stores still open (the journal resumes them).
        self._stop_step("stopping: stopping jobs")
        await self.services.jobs.stop("the daemon stops")
        self._stop_step("stopping: closing workspaces")
        root.cancel_scope.cancel()

    async def _open_at_start(self, agent_id: str, path: Path | None,
                             overrides: JsonObject | None) -> None:
        """Open a configured or recorded workspace. A failure (a path on a missing disk, a
        mangled metadata folder) is logged and shown as the workspace's ``failed`` state;
        the daemon serves the others."""
        root = path if path is not None else self.config.workspace_path(agent_id)
        try:
            await self.registry.open(agent_id, path, overrides, again=True)
        except RecalldError as exc:
            message = exc.message
            if overrides is not None and isinstance(exc, InvalidParams):
                # The settings it was recorded with no longer go with the configuration.
                message += ("; with the config recorded for it in workspaces.json: open it "
                            "with a config that fits, or close it with forget")
            log.error("opening workspace %s at %s failed: %s", agent_id, root, message)
            # Refused before it started (a system folder, another user's, another
            # workspace's): shown in status and doctor like a workspace that failed.
            self.registry.record_refused(agent_id, root, message, refused_for(exc))
        finally:
            self.services.start.reached(agent_id)
            self.services.start.progress.step(f"opened workspace {agent_id}")

    async def _flush_sessions(self, deadline_s: float) -> None:
        """Queue auto_memory for every open workspace's uncovered turns and give the jobs
        ``deadline_s``; the journal resumes the unfinished ones after the restart."""
        async with trio.open_nursery() as nursery:
            for ws in self.registry.list():
                if ws.state == "ready":
                    nursery.start_soon(ws.services.capture.flush_for_stop, deadline_s)

    def _status_line(self) -> str:
        workspaces = self.registry.list()
        ready = sum(1 for w in workspaces if w.state == "ready")
        failed = sorted(w.agent_id for w in workspaces if w.state == "failed")
        # systemctl status shows this line: a workspace that did not open is named in it,
        # a few of many (the line must fit what systemd reads, its hint kept) and a count.
        named = ", ".join(failed[:STATUS_FAILED_NAMED])
        if len(failed) > STATUS_FAILED_NAMED:
            named += f" and {len(failed) - STATUS_FAILED_NAMED} more"
        problems = f"; {len(failed)} failed: {named} (recalld status says why)" \
            if failed else ""
        return f"serving {ready} workspace(s) on {self.config.socket_path}{problems}"

    def _start_step(self, stage: str) -> None:
        self.services.start.progress.step(stage)
        self.notifier.status(stage)

    def request_stop(self) -> None:
        self._start_told.cancel()
        self._stop_requested.set()
        self._stopping.set()
        self._reloads_scope.cancel()

    def _stop_step(self, stage: str) -> None:
        self._stop_stage = stage
        self.notifier.status(stage)

    async def _report_slow_stop(self) -> None:
        await self._stopping.wait()
        await report_slow_stop(lambda: self._stop_stage)

    async def _handle_signals(
        self, signals: AsyncIterator[int], root_scope: trio.CancelScope,
        want_reload: trio.MemorySendChannel[None],
    ) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                try:
                    want_reload.send_nowait(None)
                    log.debug("SIGHUP: a reload follows")
                except trio.WouldBlock:
                    log.debug("SIGHUP: merged with the reload that waits (it reads the "
                              "file as it is then)")
                continue
            log.info("received %s, stopping", signal.Signals(signum).name)
            serving = self.services.start.serving
            if self._stop_requested.is_set() or not (self._ready or serving):
                # Asked twice, or still starting with nothing to drain: stop right away.
                self._stop_stage = "stopping at once"
                self.notifier.stopping("stopping during start-up")
                self._stopping.set()
                root_scope.cancel()
                return
            self.request_stop()
            if not self._ready and self._opening_scope is not None:
                # The start's second stage: its services are not waited for, calls waiting
                # for them fail (ShuttingDown), and what the server already answers drains
                # as after a whole start.
                self.notifier.stopping("stopping during start-up: draining connections")
                self.services.start.stop()
                self._opening_scope.cancel()

    async def _reload_loop(self, asked: trio.MemoryReceiveChannel[None]) -> None:
        with self._reloads_scope:  # a stopping daemon opens nothing more
            async for _ in asked:
                try:
                    await self.reload()
                except trio.Cancelled:
                    log.info("reload abandoned: the daemon stops")
                    raise

    async def reload(self) -> None:
        """Re-read the configuration file; keep the old one if the new one is bad, or if
        reading it takes over ``RELOAD_READ_TIMEOUT_S`` (a hung mount: the read is left
        behind in its thread). Cancelled (a stop), the read is left behind the same way;
        a workspace it was opening is closed as on any stop, and the configuration
        stays the old one if the new one was not taken yet."""
        if self._reload is None:
            log.info("SIGHUP: no configuration source to reload")
            return
        # During the start, READY=1 belongs to its end: a reload then tells its status only.
        reloading = self._ready
        if reloading:
            self.notifier.reloading()
        new: DaemonConfig | None = None
        try:
            # A read cannot be interrupted: on a stop or past the deadline it is abandoned.
            with trio.move_on_after(RELOAD_READ_TIMEOUT_S):
                new = await trio.to_thread.run_sync(checked_reload, self._reload, self.config,
                                                    abandon_on_cancel=True)
        except ConfigError as exc:
            self._reload_failed(reloading, str(exc))
            return
        if new is None:
            self._reload_failed(reloading, f"reading the configuration file took over "
                                           f"{RELOAD_READ_TIMEOUT_S:g} s")
            return
        self.reload_error = {"reload_error": None, "reload_failed_at": None}
        for w in config_warnings(new):  # as the start logs them
            log.warning("reload: %s: %s", w["what"], w["fix"])
        old = self.config
        # The socket it listens on and the data directory it locked stay until a restart:
        # new workspaces, backups and status go on using the running ones; so do the
        # server's limits and the thread pools.
        kept = {name: getattr(old, name) for name in RESTART_ONLY
                if getattr(new, name) != getattr(old, name)}
        self.waiting_for_restart = []
        for name in kept:
            if name == "socket_path" and new.socket_path == self._configured_socket:
                continue  # systemd's socket, whose difference the start named
            self.waiting_for_restart.append(name)
            log.warning("reload: %s is %s in the configuration; the daemon keeps %s until "
                        "it is restarted", name, getattr(new, name), kept[name])
        new = dataclasses.replace(new, **kept)
        self.services.config.replace(new)
        await trio.to_thread.run_sync(config_left_out.refresh, self.services.config)
        if new.log_level != old.log_level:
            set_log_level(new.log_level)
        self.services.scheduler.set_jitter(new.schedule_jitter_s)
        # Those that failed before this reload open again, as a start would open them;
        # not those this reload stops (their sharing ended): opened, they would fail again.
        failed = {w.agent_id for w in self.registry.list() if w.state == "failed"}
        unnamed = reload_sharing.unnamed(self.registry.list(), old, new)
        changed = await self.registry.reloaded(old, new)
        dropped = self.registry.drop_unopened(new.configured_agents())
        if dropped:
            log.info("reload: workspace(s) %s, which did not open and which neither the "
                     "configuration nor the record names, are no longer shown",
                     ", ".join(dropped))
        if unnamed:
            log.warning("reload: the configuration no longer names open workspace(s) %s; "
                        "each stays open as it was opened and, recorded, opens again in its "
                        "folder at the next start, without its table's settings (recalld "
                        "workspace close --forget AGENT stops serving it)", ", ".join(unnamed))
        at_open = [name for name in reload_sharing.AT_OPEN
                   if getattr(new, name) != getattr(old, name)]
        if at_open:
            log.warning("reload: %s changed; open workspaces keep what they were opened with "
                        "until each is opened again or the daemon restarts",
                        ", ".join(f"{name} = {getattr(new, name)}" for name in at_open))
        if changed:
            log.warning("reload: the configuration changed the settings or path of open "
                        "workspace(s) %s; each keeps what it was opened with until it is "
                        "opened again (recalld workspace close AGENT, then workspace open "
                        "AGENT) or the daemon restarts", ", ".join(changed))
        opened: list[str] = []
        for agent_id in new.configured_agents():
            ws = self.registry.find(agent_id)
            if ws is None or agent_id in failed:
                try:
                    await self.registry.open(agent_id)
                    opened.append(agent_id)
                except RecalldError as exc:  # one bad workspace must not stop the reload
                    log.error("reload: opening workspace %s failed: %s", agent_id,
                              exc.message)
                    self.registry.record_refused(agent_id, new.workspace_path(agent_id),
                                                 exc.message, refused_for(exc))
                except Exception as exc:
                    log.error("reload: opening workspace %s failed: %s", agent_id, exc)
        if new.config_found:
            log.info("configuration reloaded from %s", new.config_path)
        else:
            log.warning("configuration reloaded: there is no file %s (any more), so the "
                        "defaults apply", new.config_path)
        self.events.publish("daemon.reloaded", {"opened": opened})
        self._reloaded(reloading, f"reloaded; {self._status_line()}")

    def _reload_failed(self, reloading: bool, error: str) -> None:
        log.error("reload failed, keeping the running configuration: %s", error)
        self.reload_error = {"reload_error": error, "reload_failed_at": time.time()}
        self._reloaded(reloading, f"reload failed: {_short(error)}")
        self.events.publish("daemon.reload_failed", {"error": error})

    def _reloaded(self, reloading: bool, status: str) -> None:
        if reloading:
            self.notifier.notify("READY=1", f"STATUS={status}")
        else:
            self.notifier.status(status)


def set_log_level(level: str) -> None:
    logging.getLogger().setLevel(level.upper())


def reloader_for(
    config_arg: str | None, socket_arg: str | None, log_level_arg: str | None = None,
) -> Reloader:
    """Reload with the same command-line sources the daemon was started with; a
    ``--log-level`` given there overrides the file's ``log_level`` in every reload too."""
    def reload() -> DaemonConfig:
        cfg = config_mod.load(config=config_arg, socket=socket_arg)
        return cfg if log_level_arg is None else dataclasses.replace(cfg, log_level=log_level_arg)

    return reload


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
