"""A fake recalld daemon for the client tests: a small trio JSON-RPC server on a real Unix
socket, and the fixtures that run one (``fake``) in a short temporary directory
(``sockdir``).

The server runs in its own thread (its own trio loop) and is built on the same
ServerProtocol as the daemon, so the sync, trio and asyncio clients all talk to it the
same way. It has a few test-only methods: ``test.emit`` sends events before answering,
``test.sleep`` answers late, ``test.drop`` closes the connection without an answer,
``test.peer`` answers the pid of the process that opened the connection,
``test.emit_later`` answers first and sends its events once the test sets ``emit_now``.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from recalld.ipc import errors
from recalld.ipc.protocol import (
    FrameTooLarge,
    LineFramer,
    Request,
    ServerProtocol,
    encode,
    error_response,
    event_notification,
    result_response,
)
from recalld.ipc.types import render_result

Send = Callable[[bytes], Awaitable[None]]


class _Dropped(Exception):
    pass


class FakeDaemon:
    """A JSON-RPC server on ``path``, run in a thread; ``restart()`` replaces it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: list[tuple[str, Any]] = []
        #: Events sent by ``test.emit_later`` so far; it sends them once this is set.
        self.events_sent = 0
        self.emit_now = threading.Event()
        # Methods answered with a bare string instead of their documented shape.
        self.misshapen: set[str] = set()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main, ready), daemon=True)
        self._thread.start()
        assert ready.wait(10), "fake daemon did not start"

    def stop(self) -> None:
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        assert self._thread is not None
        self._thread.join(10)
        self.path.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    async def _main(self, ready: threading.Event) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.path.unlink(missing_ok=True)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        sock.listen(64)
        with trio.CancelScope() as scope:
            self._scope = scope
            ready.set()
            await trio.serve_listeners(self._handle, [trio.SocketListener(sock)])

    async def _handle(self, stream: trio.SocketStream) -> None:
        framer, protocol, lock = LineFramer(), ServerProtocol(), trio.Lock()

        async def send(data: bytes) -> None:
            async with lock:
                await stream.send_all(data)

        async with stream, trio.open_nursery() as nursery:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                try:
                    lines = framer.feed(data)
                except FrameTooLarge:
                    await send(encode(error_response(
                        None, errors.REQUEST_TOO_LARGE, "frame too large")))
                    break
                for line in lines:
                    nursery.start_soon(self._serve_line, protocol, line, send, stream)

    async def _serve_line(self, protocol: ServerProtocol, line: bytes, send: Send,
                          stream: trio.SocketStream) -> None:
        incoming = protocol.receive_line(line)
        answers: list[dict[str, Any] | None] = []
        try:
            for call in incoming.calls:
                answers.append(await self._answer(call, send, stream))
            reply = protocol.reply(incoming, answers)
            if reply is not None:
                await send(reply)
        except (_Dropped, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _answer(self, call: Request, send: Send,
                      stream: trio.SocketStream) -> dict[str, Any] | None:
        self.calls.append((call.method, call.params))
        if call.method == "test.emit_later":
            count = call.params.get("count", 1)
            await send(encode(result_response(call.id, {"later": count})))
            # Until the test has its answer back and the client is idle.
            await trio.to_thread.run_sync(self.emit_now.wait, 30.0)
            for i in range(count):
                await send(event_notification("job.progress", {"i": i}))
                self.events_sent += 1
            raise _Dropped  # answered above
        try:
            result = await self._method(call.method, dict(call.params), send, stream)
        except errors.RecalldError as exc:
            return error_response(call.id, exc.code, exc.message, exc.data)
        return None if call.is_notification else result_response(call.id, result)

    async def _method(self, method: str, params: dict[str, Any], send: Send,
                      stream: trio.SocketStream) -> Any:
        if method in self.misshapen:
            return f"not what {method} answers"
        if method == "daemon.ping":
            return {"pong": True}
        if method == "daemon.status":
            return {"version": "0.1.0", "pid": os.getpid(), "uptime_s": 1.5,
                    "workspaces": [{"agent_id": "default", "state": "ready", "path": "/w"}]}
        if method == "events.subscribe":
            return {"subscribed": params["topics"]}
        if method == "test.emit":
            for i in range(params.get("count", 1)):
                await send(event_notification(params.get("topic", "job.progress"), {"i": i}))
            return {"sent": params.get("count", 1)}
        if method == "test.huge":  # an answer line of about that many bytes
            return "x" * params["bytes"]
        if method == "test.sleep":
            await trio.sleep(params["s"])
            return params.get("value")
        if method == "test.peer":  # the pid of the process that opened this connection
            cred = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            return int.from_bytes(cred[:4], "little")
        if method == "test.drop":
            await stream.aclose()
            raise _Dropped
        if method == "workspace.open":
            if params["agent_id"] == "ghost":
                raise errors.UnknownWorkspace("unknown workspace: ghost", {"agent_id": "ghost"})
            return {"agent_id": params["agent_id"], "path": params.get("path", "/w"),
                    "state": "ready"}
        if method == "workspace.list":
            return {"workspaces": [{"agent_id": "default", "state": "ready"}]}
        if method == "memory.read":
            if ".." in params["path"]:
                raise errors.PathOutsideWorkspace("path leaves the workspace")
            return {"path": params["path"], "text": "hello\n", "start_line": 1, "end_line": 1}
        if method == "memory.search":
            hits = [
                {"path": f"memory/n{i}.md", "start_line": 1, "end_line": 3,
                 "text": params["query"], "score": 1.0 / (i + 1), "vector": None,
                 "keyword": 2.5, "links": []}
                for i in range(params.get("max_results", 5))
            ]
            linked = {"path": "digest/wiki/x.md", "start_line": 2, "end_line": 2, "text": "x",
                      "score": 0.0, "vector": None, "keyword": None}
            return {"results": hits, "expanded": [linked], "mode": "keyword",
                    "rendered": "\n\n".join(render_result(h, hybrid=False) for h in hits),
                    "vector_hits": 0, "keyword_hits": len(hits), "took_ms": 0.5}
        raise errors.MethodNotFound(f"method not found: {method}")


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake(sockdir: Path) -> Iterator[FakeDaemon]:
    daemon = FakeDaemon(sockdir / "d.sock")
    daemon.start()
    yield daemon
    daemon.stop()
