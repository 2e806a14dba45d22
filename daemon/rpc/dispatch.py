"""The dispatch core: the method registry, the call context and parameter checks.

Each handler module of this package fills a :class:`Methods` table the same way::

    from recalld.daemon.rpc.dispatch import CallContext, Methods, Params

    METHODS = Methods()

    @METHODS.add("memory.search")
    async def search(ctx: CallContext, params: JsonObject) -> SearchAnswer:
        p = Params(params)
        ws = ctx.workspace(p.agent_id())
        query = p.text("query")
        p.done()
        ...

and the application merges them with :meth:`Methods.include`, or names a module's
methods with :meth:`Methods.defer` so that the module is imported on the first call of
one of them (the names are known before: listing and ``MethodNotFound`` need no import;
the immediate check of a deferred name imports its module). Handlers reach the daemon's
services through ``ctx.services`` (a :class:`~recalld.daemon.services.DaemonServices`)
and a workspace's through ``ctx.workspace(agent_id).services``. They raise
:mod:`recalld.ipc.errors` exceptions for client-visible failures; storage and provider
errors become their wire errors here, once (:func:`recalld.daemon.errors.map_exceptions`);
any other exception becomes a generic internal error on the wire (and is logged).
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, overload

from recalld.daemon.config import DaemonConfig
from recalld.daemon.errors import map_exceptions
from recalld.daemon.events import EventBus, View
from recalld.daemon.jsontypes import JsonObject as JsonObject
from recalld.daemon.jsontypes import integer_range
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.services import DaemonServices
from recalld.daemon.store import confine
from recalld.daemon.workspaces import Workspace, check_agent_id
from recalld.ipc import __version__
from recalld.ipc.errors import InvalidParams, MethodNotFound, UnknownWorkspace
from recalld.ipc.protocol import Request

# A params object is a JsonObject (recalld.daemon.jsontypes): handlers check what they
# read (:class:`Params`) and return typed records.
#: What a handler returns: a JSON value (a TypedDict, a JsonObject, a list...).
Result = object
D = TypeVar("D")
_MISSING = object()  # "no default": the param is required
# The JSON types a param may have, as isinstance takes them.
_STR, _INT, _NUMBER, _BOOL = (str,), (int,), (int, float), (bool,)
_OBJECT, _ARRAY = (dict,), (list,)


class Peer(Protocol):
    """What a handler may use of the connection that carries its call."""

    @property
    def connection_id(self) -> int: ...

    @property
    def peer_pid(self) -> int | None: ...

    def subscribe(self, bus: EventBus, patterns: Sequence[str], *, owner: str | None = None,
                  view: View | None = None) -> list[str]:
        """Add ``patterns`` to this connection's event subscription (made for ``owner``,
        seeing what ``view`` shows it); return them all."""
        ...

    def live_patterns(self) -> set[str]:
        """The patterns of this connection's subscription while it receives events
        (empty without one, or once the bus dropped it)."""
        ...

    async def notify(self, topic: str, payload: Mapping[str, object]) -> bool:
        """Send one ``event`` notification to this connection only (progress of its own
        call); False if the connection is gone."""
        ...


StatsProvider = Callable[[], Mapping[str, object]]


@dataclass
class DaemonState:
    """Everything a handler can reach: the daemon's services and the method table."""

    services: DaemonServices
    methods: Methods
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    version: str = __version__
    # Named statistics merged into daemon.status "queues" (server, event bus, jobs...).
    stats: dict[str, StatsProvider] = field(default_factory=dict)
    # What this start did with a restore the daemon stopped in (restore_journal.recover).
    restore_recovery: JsonObject | None = None

    @property
    def config(self) -> DaemonConfig:
        """The running configuration (a reload replaces it)."""
        return self.services.config.current

    @property
    def registry(self) -> WorkspaceRegistry:
        return self.services.registry

    @property
    def events(self) -> EventBus:
        return self.services.events


@dataclass(frozen=True, slots=True)
class CallContext:
    """One call: the daemon state, the connection it came on, and the request.

    The folder of each workspace the call is handed (:meth:`workspace`, :meth:`writable`,
    :meth:`searchable`) stays guarded (:mod:`confine`) until the call ends, as a job's
    does: a workspace that fails meanwhile (a link took the place of its folder or of
    ``metadata_dir``) or closes gives up its own guard, and the call's writes and state
    reads below that folder then go on through its handles, refused, rather than by path
    through the link into another folder, another agent's among them."""

    state: DaemonState
    connection: Peer
    request: Request
    #: The guards of the folders handed out, released as the call ends (``dispatch``).
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False,
                                       compare=False)
    held_roots: set[str] = field(default_factory=set, repr=False, compare=False)

    @property
    def services(self) -> DaemonServices:
        return self.state.services

    def workspace(self, agent_id: str) -> Workspace:
        """The ready workspace of ``agent_id`` (UnknownWorkspace otherwise), its folder
        guarded until the call ends."""
        return self._guarded(self.state.registry.get(agent_id))

    def _guarded(self, ws: Workspace) -> Workspace:
        """``ws``, its folder guarded (:mod:`confine`) until the call ends."""
        root = str(ws.root)
        if root not in self.held_roots:
            # A guard and its release on the stack (not confine.guarded's generator: every
            # search is handed its workspace, and the generator costs it more than the guard).
            confine.guard(ws.root)
            self.held.callback(confine.release, ws.root)
            self.held_roots.add(root)
        return ws

    @contextlib.asynccontextmanager
    async def writable(self, agent_id: str) -> AsyncIterator[Workspace]:
        """:meth:`workspace` for a call that writes to it, which a restore of the agent
        waits for, and which waits for a restore (:mod:`recalld.daemon.writegate`)."""
        async with self.state.registry.writes.writing(agent_id):
            yield self.workspace(agent_id)

    async def searchable(self, agent_id: str) -> Workspace:
        """The workspace of ``agent_id`` to search: ready, or opening with its search
        stage started; while the daemon starts, any other waits for the start to end.
        UnknownWorkspace as :meth:`workspace`."""
        start = self.services.start
        if not start.done:
            try:
                return self._guarded(self.state.registry.searchable(agent_id))
            except UnknownWorkspace:
                await start.wait_started()
        return self._guarded(self.state.registry.searchable(agent_id))


Handler = Callable[[CallContext, JsonObject], Awaitable[Result]]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC method: its handler and how its params are read."""

    name: str
    handler: Handler
    # Names for positional (array) params, in order; None refuses arrays.
    positional: tuple[str, ...] | None = None
    # Answers without waiting on anything (no I/O, locks, threads or sleeps): the server
    # may run it on the connection's reader instead of starting a call task for it.
    immediate: bool = False
    # Or: answers without waiting when ``immediate_when(state, params)`` says so, given
    # what the daemon is doing right now (checked just before the call runs).
    immediate_when: Callable[[DaemonState, JsonObject], bool] | None = None
    # Answered while the daemon still starts (``DaemonStart``): it needs no more than
    # the daemon and the search stage of a workspace. Other calls wait for the start.
    early: bool = False


@dataclass(frozen=True, slots=True)
class Deferred:
    """A handler module imported on the first call of one of its methods.

    ``table`` names the module's attribute: a :class:`Methods` or a function returning
    one; the table must hold exactly ``names``."""

    module: str
    table: str
    names: tuple[str, ...]


class Methods:
    """A registry of method name -> handler. Names are unique across everything merged."""

    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}
        # Method name -> the module that serves it, for modules not imported yet.
        self._deferred: dict[str, Deferred] = {}

    def add(
        self, name: str, *, positional: Sequence[str] | None = None, immediate: bool = False,
        immediate_when: Callable[[DaemonState, JsonObject], bool] | None = None,
        early: bool = False,
    ) -> Callable[[H], H]:
        """Decorator registering ``handler`` as ``name``.

        ``positional`` lists parameter names so that an array ``params`` is accepted
        and mapped by position; without it an array is InvalidParams. ``immediate``
        promises the handler never waits, ``immediate_when`` that it does not wait when
        the predicate holds (see :class:`Method`); a handler that breaks the promise
        stalls its connection's reading while it waits. ``early`` serves it while the
        daemon still starts (see :class:`Method`).
        """

        def register(handler: H) -> H:
            self.register(name, handler, positional=positional, immediate=immediate,
                          immediate_when=immediate_when, early=early)
            return handler

        return register

    def register(
        self, name: str, handler: Handler, *, positional: Sequence[str] | None = None,
        immediate: bool = False,
        immediate_when: Callable[[DaemonState, JsonObject], bool] | None = None,
        early: bool = False,
    ) -> None:
        if name in self._methods or name in self._deferred:
            raise ValueError(f"method {name!r} is already registered")
        self._methods[name] = Method(
            name, handler, tuple(positional) if positional is not None else None, immediate,
            immediate_when, early,
        )

    def include(self, other: Methods) -> Methods:
        for method in other._methods.values():
            self.register(method.name, method.handler, positional=method.positional,
                          immediate=method.immediate, immediate_when=method.immediate_when,
                          early=method.early)
        for deferred in dict.fromkeys(other._deferred.values()):
            self.defer(deferred.module, deferred.table, deferred.names)
        return self

    def defer(self, module: str, table: str, names: Sequence[str]) -> Methods:
        """Serve ``names`` from ``module``'s ``table``, imported on the first call (or
        immediate check) of any of them."""
        deferred = Deferred(module, table, tuple(names))
        for name in deferred.names:
            if name in self._methods or name in self._deferred:
                raise ValueError(f"method {name!r} is already registered")
        for name in deferred.names:
            self._deferred[name] = deferred
        return self

    def _load(self, deferred: Deferred) -> None:
        """Import ``deferred``'s module and register its table in place of the names."""
        found = getattr(importlib.import_module(deferred.module), deferred.table)
        table = found if isinstance(found, Methods) else found()
        if not isinstance(table, Methods) or table._deferred \
                or sorted(table._methods) != sorted(deferred.names):
            raise RuntimeError(f"{deferred.module}.{deferred.table} does not serve exactly "
                               f"{sorted(deferred.names)}")
        for name in deferred.names:
            del self._deferred[name]
        self.include(table)

    def _get(self, name: str) -> Method | None:
        method = self._methods.get(name)
        if method is None:
            deferred = self._deferred.get(name)
            if deferred is None:
                return None
            self._load(deferred)
            method = self._methods[name]
        return method

    def loaded(self, name: str) -> bool:
        """True once ``name``'s handler is imported (False for an unknown name)."""
        return name in self._methods

    def is_immediate(self, request: Request, state: DaemonState) -> bool:
        try:
            method = self._get(request.method)
        except Exception:
            # A handler module that fails to import: not immediate, so the call goes to
            # `dispatch`, which meets the same error and answers it as any handler's.
            return False
        if method is None:
            return False
        when = method.immediate_when
        immediate = method.immediate or (when is not None and isinstance(request.params, dict)
                                         and when(state, request.params))
        # A call that waits for the daemon's start is not answered at once.
        return immediate and (method.early or state.services.start.done)

    def names(self) -> list[str]:
        return sorted([*self._methods, *self._deferred])

    def __contains__(self, name: object) -> bool:
        return name in self._methods or name in self._deferred

    async def dispatch(self, ctx: CallContext) -> Result:
        """Run the handler for ``ctx.request``; MethodNotFound / InvalidParams as needed."""
        request = ctx.request
        method = self._get(request.method)
        if method is None:
            raise MethodNotFound(f"method not found: {request.method}")
        if not method.early:
            await ctx.services.start.wait_started()
        params = request.params
        if isinstance(params, list):
            if method.positional is None:
                raise InvalidParams(f"{request.method} takes named params (an object)")
            if len(params) > len(method.positional):
                raise InvalidParams(f"{request.method} takes at most "
                                    f"{len(method.positional)} positional params")
            params = dict(zip(method.positional, params, strict=False))
        with ctx.held, map_exceptions():  # the folders it was handed, guarded until now
            return await method.handler(ctx, params)


class Dispatcher:
    """The server's view of the API: ``await dispatcher(request, connection)``."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state

    async def __call__(self, request: Request, connection: Peer) -> Result:
        return await self.state.methods.dispatch(CallContext(self.state, connection, request))

    def is_immediate(self, request: Request) -> bool:
        """True if ``request`` will be answered without waiting (the server may run it
        inline)."""
        return self.state.methods.is_immediate(request, self.state)


class Params:
    """Typed access to a params object; every accessor names the field in its error.

    Each accessor takes the field's name and, for an optional field, its default;
    without a default the field is required. Call :meth:`done` after reading to refuse
    unknown fields (typos fail loudly).
    """

    def __init__(self, raw: Mapping[str, object]) -> None:
        self._raw = raw
        self._seen: set[str] = set()

    def _get(self, name: str, kinds: tuple[type, ...], what: str, default: object) -> object:
        self._seen.add(name)
        value = self._raw.get(name)
        if value is None:
            if default is _MISSING:
                raise InvalidParams(f"missing required param {name!r}")
            return default
        # JSON true/false are bools, and bool is an int: only a bool field takes them.
        if not isinstance(value, kinds) or (value.__class__ is bool and bool not in kinds):
            raise InvalidParams(f"param {name!r} must be {what}")
        return value

    @overload
    def text(self, name: str) -> str: ...
    @overload
    def text(self, name: str, default: D) -> str | D: ...
    def text(self, name: str, default: object = _MISSING) -> object:
        return self._get(name, _STR, "a string", default)

    @overload
    def integer(self, name: str, *, minimum: int | None = None) -> int: ...
    @overload
    def integer(self, name: str, default: D, *, minimum: int | None = None) -> int | D: ...
    def integer(self, name: str, default: object = _MISSING, *,
                minimum: int | None = None) -> object:
        what = "an integer" + integer_range(self._raw.get(name))
        value = self._get(name, _INT, what, default)
        if isinstance(value, int) and minimum is not None and value < minimum:
            raise InvalidParams(f"param {name!r} must be at least {minimum}")
        return value

    @overload
    def number(self, name: str) -> float: ...
    @overload
    def number(self, name: str, default: D) -> float | D: ...
    def number(self, name: str, default: object = _MISSING) -> object:
        value = self._get(name, _NUMBER, "a number", default)
        return float(value) if isinstance(value, int | float) else value

    @overload
    def boolean(self, name: str) -> bool: ...
    @overload
    def boolean(self, name: str, default: D) -> bool | D: ...
    def boolean(self, name: str, default: object = _MISSING) -> object:
        return self._get(name, _BOOL, "true or false", default)

    @overload
    def mapping(self, name: str) -> JsonObject: ...
    @overload
    def mapping(self, name: str, default: D) -> JsonObject | D: ...
    def mapping(self, name: str, default: object = _MISSING) -> object:
        return self._get(name, _OBJECT, "an object", default)

    @overload
    def strings(self, name: str) -> list[str]: ...
    @overload
    def strings(self, name: str, default: D) -> list[str] | D: ...
    def strings(self, name: str, default: object = _MISSING) -> object:
        value = self._get(name, _ARRAY, "an array of strings", default)
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise InvalidParams(f"param {name!r} must be an array of strings")
        return value

    def selection(self, name: str, left_out: str) -> list[str] | None:
        """A list of agents that selects: None when left out (``left_out`` says what that
        means); an empty one selects nothing, which is refused rather than taken for the
        list's absence."""
        value: list[str] | None = self.strings(name, None)
        if value == []:
            raise InvalidParams(f"param {name!r} is empty: name at least one agent, or "
                                f"leave it out for {left_out}")
        return value

    @overload
    def array(self, name: str) -> list[object]: ...
    @overload
    def array(self, name: str, default: D) -> list[object] | D: ...
    def array(self, name: str, default: object = _MISSING) -> object:
        return self._get(name, _ARRAY, "an array", default)

    def agent_id(self, name: str = "agent_id") -> str:
        return check_agent_id(self.text(name))

    def done(self) -> None:
        if self._raw.keys() <= self._seen:
            return
        unknown = sorted(set(self._raw) - self._seen)
        if unknown:
            raise InvalidParams(f"unknown param(s): {', '.join(unknown)}")
