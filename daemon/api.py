"""The method registry, the call context, parameter checks and the core daemon methods.

Other modules add their methods the same way this one does, without touching it::

    from recalld.daemon.api import CallContext, Methods, Params

    METHODS = Methods()

    @METHODS.add("memory.search")
    async def search(ctx: CallContext, params: dict[str, Any]) -> Any:
        p = Params(params)
        ws = ctx.workspace(p.agent_id())
        query = p.text("query")
        p.done()
        ...

and the supervisor merges them with :meth:`Methods.include` (see ``build_methods``).
Handlers raise :mod:`recalld.ipc.errors` exceptions for client-visible failures; any
other exception becomes a generic internal error on the wire (and is logged).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from recalld.daemon import safepath, sharing
from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.events import EventBus, check_topic_pattern
from recalld.daemon.workspaces import Workspace, WorkspaceRegistry, check_agent_id
from recalld.ipc import __version__
from recalld.ipc.errors import InvalidParams, MethodNotFound
from recalld.ipc.protocol import Request

MAX_READ_BYTES = 512 * 1024
_MISSING: Any = object()
T = TypeVar("T")


class Peer(Protocol):
    """What a handler may use of the connection that carries its call."""

    @property
    def connection_id(self) -> int: ...

    @property
    def peer_pid(self) -> int | None: ...

    def subscribe(self, bus: EventBus, patterns: Sequence[str]) -> list[str]:
        """Add ``patterns`` to this connection's event subscription; return them all."""
        ...


StatsProvider = Callable[[], Mapping[str, Any]]


@dataclass
class DaemonState:
    """Everything a handler can reach. ``config`` is replaced (never mutated) on reload."""

    config: DaemonConfig
    registry: WorkspaceRegistry
    events: EventBus
    methods: Methods
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    version: str = __version__
    # Named statistics merged into daemon.status "queues" (server, event bus, jobs...).
    stats: dict[str, StatsProvider] = field(default_factory=dict)
    # Named daemon-wide services handlers may use ("jobs", "providers", "scheduler"...).
    services: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallContext:
    """One call: the daemon state, the connection it came on, and the request."""

    state: DaemonState
    connection: Peer
    request: Request

    def workspace(self, agent_id: str) -> Workspace:
        """The ready workspace of ``agent_id`` (UnknownWorkspace otherwise)."""
        return self.state.registry.get(agent_id)


Handler = Callable[[CallContext, dict[str, Any]], Awaitable[Any]]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    handler: Handler
    # Names for positional (array) params, in order; None refuses arrays.
    positional: tuple[str, ...] | None = None
    # Answers without waiting on anything (no I/O, locks, threads or sleeps): the server
    # may run it on the connection's reader instead of starting a call task for it.
    immediate: bool = False
    # Or: answers without waiting when ``immediate_when(state, params)`` says so, given
    # what the daemon is doing right now (checked just before the call runs).
    immediate_when: Callable[[DaemonState, dict[str, Any]], bool] | None = None


class Methods:
    """A registry of method name -> handler. Names are unique across everything merged."""

    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}

    def add(
        self, name: str, *, positional: Sequence[str] | None = None, immediate: bool = False,
        immediate_when: Callable[[DaemonState, dict[str, Any]], bool] | None = None,
    ) -> Callable[[H], H]:
        """Decorator registering ``handler`` as ``name``.

        ``positional`` lists parameter names so that an array ``params`` is accepted
        and mapped by position; without it an array is InvalidParams. ``immediate``
        promises the handler never waits, ``immediate_when`` that it does not wait when
        the predicate holds (see :class:`Method`); a handler that breaks the promise
        stalls its connection's reading while it waits.
        """

        def register(handler: H) -> H:
            self.register(name, handler, positional=positional, immediate=immediate,
                          immediate_when=immediate_when)
            return handler

        return register

    def register(
        self, name: str, handler: Handler, *, positional: Sequence[str] | None = None,
        immediate: bool = False,
        immediate_when: Callable[[DaemonState, dict[str, Any]], bool] | None = None,
    ) -> None:
        if name in self._methods:
            raise ValueError(f"method {name!r} is already registered")
        self._methods[name] = Method(
            name, handler, tuple(positional) if positional is not None else None, immediate,
            immediate_when,
        )

    def include(self, other: Methods) -> Methods:
        for method in other._methods.values():
            self.register(method.name, method.handler, positional=method.positional,
                          immediate=method.immediate, immediate_when=method.immediate_when)
        return self

    def is_immediate(self, request: Request, state: DaemonState) -> bool:
        method = self._methods.get(request.method)
        if method is None:
            return False
        if method.immediate:
            return True
        when = method.immediate_when
        return when is not None and isinstance(request.params, dict) and when(
            state, request.params)

    def names(self) -> list[str]:
        return sorted(self._methods)

    def __contains__(self, name: object) -> bool:
        return name in self._methods

    async def dispatch(self, ctx: CallContext) -> Any:
        """Run the handler for ``ctx.request``; MethodNotFound / InvalidParams as needed."""
        request = ctx.request
        method = self._methods.get(request.method)
        if method is None:
            raise MethodNotFound(f"method not found: {request.method}")
        params = request.params
        if isinstance(params, list):
            if method.positional is None:
                raise InvalidParams(f"{request.method} takes named params (an object)")
            if len(params) > len(method.positional):
                raise InvalidParams(f"{request.method} takes at most "
                                    f"{len(method.positional)} positional params")
            params = dict(zip(method.positional, params, strict=False))
        return await method.handler(ctx, params)


class Dispatcher:
    """The server's view of the API: ``await dispatcher(request, connection)``."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state

    async def __call__(self, request: Request, connection: Peer) -> Any:
        return await self.state.methods.dispatch(CallContext(self.state, connection, request))

    def is_immediate(self, request: Request) -> bool:
        """True if ``request`` will be answered without waiting (the server may run it
        inline)."""
        return self.state.methods.is_immediate(request, self.state)


class Params:
    """Typed access to a params object; every accessor names the field in its error.

    Call :meth:`done` after reading to refuse unknown fields (typos fail loudly).
    """

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self._raw = raw
        self._seen: set[str] = set()

    def _get(self, name: str, kinds: type | tuple[type, ...], what: str, default: Any) -> Any:
        self._seen.add(name)
        value = self._raw.get(name)
        if value is None:
            if default is _MISSING:
                raise InvalidParams(f"missing required param {name!r}")
            return default
        bad_bool = isinstance(value, bool) and bool not in (
            kinds if isinstance(kinds, tuple) else (kinds,)
        )
        if not isinstance(value, kinds) or bad_bool:
            raise InvalidParams(f"param {name!r} must be {what}")
        return value

    def text(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, str, "a string", default)

    def integer(self, name: str, default: Any = _MISSING, *, minimum: int | None = None) -> Any:
        value = self._get(name, int, "an integer", default)
        if value is not None and minimum is not None and value < minimum:
            raise InvalidParams(f"param {name!r} must be at least {minimum}")
        return value

    def number(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, (int, float), "a number", default)
        return float(value) if value is not None else None

    def boolean(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, bool, "true or false", default)

    def mapping(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, dict, "an object", default)

    def strings(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, list, "an array of strings", default)
        if value is not None and not all(isinstance(v, str) for v in value):
            raise InvalidParams(f"param {name!r} must be an array of strings")
        return value

    def agent_id(self, name: str = "agent_id") -> str:
        return check_agent_id(self.text(name))

    def done(self) -> None:
        if self._raw.keys() <= self._seen:
            return
        unknown = sorted(set(self._raw) - self._seen)
        if unknown:
            raise InvalidParams(f"unknown param(s): {', '.join(unknown)}")


def settings_for_wire(settings: WorkspaceSettings) -> dict[str, Any]:
    """Workspace settings as JSON, with secrets masked."""
    raw = dataclasses.asdict(settings)
    for key in ("embedding_model_config", "chat_model_config"):
        nested = raw.get(key)
        if isinstance(nested, dict) and nested.get("api_key"):
            nested["api_key"] = "***"
    return raw


def workspace_info(ws: Workspace) -> dict[str, Any]:
    return {**ws.describe(), "settings": settings_for_wire(ws.settings)}


# ---------------------------------------------------------------- the core daemon methods

CORE = Methods()


@CORE.add("daemon.ping", immediate=True)
async def ping(ctx: CallContext, params: dict[str, Any]) -> Any:
    Params(params).done()
    return {"pong": True, "time": time.time()}


@CORE.add("daemon.status", immediate=True)
async def status(ctx: CallContext, params: dict[str, Any]) -> Any:
    Params(params).done()
    state = ctx.state
    queues: dict[str, Any] = {}
    for name, provider in state.stats.items():
        queues[name] = dict(provider())
    return {
        "version": state.version,
        "pid": os.getpid(),
        "started_at": state.started_at,
        "uptime_s": round(time.monotonic() - state.started_monotonic, 3),
        "socket": str(state.config.socket_path),
        "socket_path": str(state.config.socket_path),
        "data_dir": str(state.config.data_dir),
        "config_path": str(state.config.config_path),
        "workspaces": [ws.describe() for ws in state.registry.list()],
        "queues": queues,
    }


@CORE.add("workspace.open")
async def workspace_open(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    path = p.text("path", None)
    overrides = p.mapping("config", None)
    p.done()
    if path is not None and ("\x00" in path or not path.strip()):
        raise InvalidParams("param 'path' must be a non-empty path without NUL")
    ws = await ctx.state.registry.open(
        agent_id, Path(path) if path is not None else None, overrides
    )
    return workspace_info(ws)


@CORE.add("workspace.list", immediate=True)
async def workspace_list(ctx: CallContext, params: dict[str, Any]) -> Any:
    Params(params).done()
    return {"workspaces": [workspace_info(ws) for ws in ctx.state.registry.list()]}


@CORE.add("workspace.close")
async def workspace_close(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    p.done()
    await ctx.state.registry.close(agent_id)
    return {"agent_id": agent_id, "closed": True}


@CORE.add("memory.read")
async def memory_read(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    path = p.text("path")
    start_line: int = p.integer("start_line", 1, minimum=1)
    end_line: int | None = p.integer("end_line", None, minimum=1)
    # Who asks, when it is not the workspace's owner (see recalld.daemon.sharing).
    as_agent: str = check_agent_id(p.text("as_agent", agent_id))
    p.done()
    if end_line is not None and end_line < start_line:
        raise InvalidParams("end_line must not be smaller than start_line")
    parts = safepath.split_relative(path)  # refuse bad names before touching anything
    ws = sharing.readable(ctx.state.registry, as_agent, agent_id)
    got = await trio.to_thread.run_sync(
        lambda: safepath.read_lines(
            ws.root, path, start_line=start_line, end_line=end_line, max_bytes=MAX_READ_BYTES
        )
    )
    return {
        "agent_id": agent_id,
        "path": "/".join(parts),
        "start_line": got.start_line,
        "end_line": got.end_line,
        "total_lines": got.total_lines,
        "text": got.text,
        "truncated": got.truncated,
    }


@CORE.add("events.subscribe")
async def events_subscribe(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    topics: list[str] = p.strings("topics")
    p.done()
    if not topics:
        raise InvalidParams("param 'topics' must not be empty")
    try:
        checked = [check_topic_pattern(t) for t in topics]
    except ValueError as exc:
        raise InvalidParams(str(exc)) from None
    return {"subscribed": ctx.connection.subscribe(ctx.state.events, checked)}


def build_methods(extra: Iterable[Methods] = ()) -> Methods:
    """The core daemon methods plus ``extra`` registries (index, jobs, search...)."""
    methods = Methods().include(CORE)
    for more in extra:
        methods.include(more)
    return methods
