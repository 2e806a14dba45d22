"""The JSON-RPC server: a thin trio adapter over the sans-IO core in ``recalld.ipc.protocol``.

:class:`RpcServer` owns the listening socket (bound by :mod:`recalld.daemon.listener`,
or passed by systemd), the accept loop, the peer check and the connection cap, the
server-wide counters behind :meth:`RpcServer.statistics`, and a nursery of its own that
holds one task per connection. Each task runs a :class:`recalld.daemon.rpc.connection.Connection`,
which owns everything about one client (reading, calls, writes, events).

Stopping: when :meth:`RpcServer.run` is cancelled it stops accepting, closes the
listener, tells every connection to stop reading, gives calls already running
``graceful_timeout_s`` to answer, then cancels whatever is left. The connection tasks
live under a shielded scope so the outer cancellation does not cut them short; only the
server decides when they end.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from recalld.daemon.config import DaemonConfig
from recalld.daemon.rpc.calls import CallCounters
from recalld.daemon.rpc.connection import Connection
from recalld.daemon.rpc.listener import BoundSocket, bind_listener
from recalld.ipc import errors
from recalld.ipc.peers import PeerCredentials, peer_credentials
from recalld.ipc.protocol import Request, encode, error_response

log = logging.getLogger(__name__)

# Accept failures that mean "out of a resource": keep serving, just slow down.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_BACKOFF_MIN_S = 0.01
ACCEPT_BACKOFF_MAX_S = 1.0
# Descriptors kept for the daemon's own work (index and state files, the watcher, worker
# pipes, backups) however many clients connect: a quarter of the open file limit, at most
# this many. Clients holding every descriptor made the daemon's own writes fail.
FD_RESERVE_MAX = 256

# ``await dispatch(request, connection)`` runs one call. A dispatcher may also have an
# ``is_immediate(request) -> bool`` method (recalld.daemon.rpc.dispatch.Dispatcher has): a call it
# names will not wait, so the connection runs it inline on its reader.
Dispatch = Callable[[Request, Connection], Awaitable[object]]


def _never_immediate(request: Request) -> bool:
    return False


def connection_fd_ceiling() -> int:
    """The lowest descriptor number a client connection may not have: one at or past it
    would leave the daemon fewer than its reserve (see :data:`FD_RESERVE_MAX`) under the
    soft open file limit. A new descriptor takes the lowest free number, so a connection's
    number counts the descriptors open below it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return sys.maxsize
    return soft - min(FD_RESERVE_MAX, soft // 4)


def peer_allowed(cred: PeerCredentials | None, own_uid: int) -> bool:
    """Only processes of the daemon's own user may talk to it."""
    return cred is not None and cred.uid == own_uid


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """The server's counters, for ``daemon.status``."""

    connections_open: int
    connections_total: int
    calls_in_flight: int
    requests_total: int
    errors_total: int
    rejected_overloaded_total: int
    rejected_peer_total: int
    timeouts_total: int
    accept_errors_total: int


class RpcServer:
    """Serves ``dispatch`` on a Unix socket until cancelled.

    ``sock`` is an already listening socket (systemd's fd 3), ``bound`` one bound early by
    the supervisor (the server then removes it when it stops); otherwise :meth:`run`
    binds ``config.socket_path`` itself. ``listener`` replaces the socket entirely
    (tests use it to inject accept failures).
    """

    def __init__(
        self,
        config: DaemonConfig,
        dispatch: Dispatch,
        *,
        sock: socket.socket | None = None,
        bound: BoundSocket | None = None,
        listener: trio.abc.Listener[trio.SocketStream] | None = None,
    ) -> None:
        self.config = config
        self._dispatch = dispatch
        self._is_immediate: Callable[[Request], bool] = getattr(
            dispatch, "is_immediate", _never_immediate
        )
        self._sock = sock
        self._bound = bound
        self._listener = listener
        self._own_uid = os.getuid()
        self._connections: set[Connection] = set()
        self._draining = False
        self._all_closed: trio.Event | None = None
        self.listening = trio.Event()
        # counters for daemon.status; the connections keep the call counters
        self._calls = CallCounters()
        self._connections_total = 0
        self._rejected_overloaded_total = 0
        self._rejected_peer_total = 0
        self._accept_errors_total = 0
        self._fd_ceiling = sys.maxsize  # read at run: the daemon raises the limit first

    def statistics(self) -> ServerStatistics:
        calls = self._calls
        return ServerStatistics(
            connections_open=len(self._connections),
            connections_total=self._connections_total,
            calls_in_flight=calls.calls_in_flight,
            requests_total=calls.requests_total,
            errors_total=calls.errors_total,
            rejected_overloaded_total=self._rejected_overloaded_total,
            rejected_peer_total=self._rejected_peer_total,
            timeouts_total=calls.timeouts_total,
            accept_errors_total=self._accept_errors_total,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._fd_ceiling = connection_fd_ceiling()
        bound = self._bound
        listener = self._listener
        if listener is None:
            sock = bound.sock if bound is not None else self._sock
            if sock is None:
                bound = bind_listener(self.config.socket_path)
                sock = bound.sock
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        try:
            connections_scope = trio.CancelScope(shield=True)
            async with trio.open_nursery() as outer:
                conn_nursery: trio.Nursery = await outer.start(
                    self._host_connections, connections_scope
                )
                try:
                    self.listening.set()
                    task_status.started()
                    await self._accept_loop(listener, conn_nursery)
                finally:
                    with trio.CancelScope(shield=True):
                        # Stop accepting and remove the socket file first, so new clients
                        # see "not running" at once instead of waiting in the backlog.
                        await trio.aclose_forcefully(listener)
                        if bound is not None:
                            bound.close()
                            bound = None
                        await self._drain(connections_scope)
        finally:
            if bound is not None:
                bound.close()

    async def _host_connections(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[trio.Nursery]
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                task_status.started(nursery)
                await trio.sleep_forever()

    async def _accept_loop(
        self, listener: trio.abc.Listener[trio.SocketStream], nursery: trio.Nursery
    ) -> None:
        backoff = ACCEPT_BACKOFF_MIN_S
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                # Out of descriptors or memory: the pending client stays in the backlog;
                # retry after a pause instead of spinning or dying (RELIABILITY 18).
                self._accept_errors_total += 1
                if backoff == ACCEPT_BACKOFF_MIN_S:
                    log.error("accept failed: %s; retrying with backoff", exc.strerror)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF_MAX_S)
                continue
            backoff = ACCEPT_BACKOFF_MIN_S
            nursery.start_soon(self._handle, stream)

    async def _drain(self, connections_scope: trio.CancelScope) -> None:
        self._draining = True
        self._all_closed = trio.Event()
        if not self._connections:
            self._all_closed.set()
        for conn in list(self._connections):
            conn.stop_reading()
        with trio.move_on_after(self.config.graceful_timeout_s) as grace:
            await self._all_closed.wait()
        if grace.cancelled_caught:
            log.warning("%d connection(s) still busy after %.1f s; closing them",
                        len(self._connections), self.config.graceful_timeout_s)
        connections_scope.cancel()

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One connection, start to end. Never raises: a bug here must not stop the server."""
        self._connections_total += 1
        cid = self._connections_total
        try:
            try:
                cred: PeerCredentials | None = peer_credentials(stream.socket)
            except OSError:
                cred = None
            if not peer_allowed(cred, self._own_uid):
                self._rejected_peer_total += 1
                log.warning("refused connection from uid %s", cred.uid if cred else "unknown")
                return
            out_of_fds = stream.socket.fileno() >= self._fd_ceiling
            if (len(self._connections) >= self.config.max_connections or out_of_fds
                    or self._draining):
                self._rejected_overloaded_total += 1
                code = errors.SHUTTING_DOWN if self._draining else errors.OVERLOADED
                message = ("shutting down" if self._draining else
                           "too many connections: the daemon's open file limit is nearly "
                           "reached" if out_of_fds else "too many connections")
                with trio.move_on_after(self.config.write_timeout_s):
                    await stream.send_all(encode(error_response(None, code, message)))
                return
            conn = Connection(
                stream, connection_id=cid, peer_pid=cred.pid if cred else None,
                config=self.config, dispatch=self._dispatch, answers_now=self._is_immediate,
                counters=self._calls,
            )
            self._connections.add(conn)
            try:
                await conn.serve()
            finally:
                self._connections.discard(conn)
                if self._all_closed is not None and not self._connections:
                    self._all_closed.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            log.exception("connection %d failed", cid)
        finally:
            await trio.aclose_forcefully(stream)
