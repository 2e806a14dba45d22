"""The provider bridge: the only place that touches asyncio.

aiohttp needs an asyncio loop, the daemon runs on trio. :class:`ProviderBridge` owns ONE
thread that runs an asyncio loop and one ``aiohttp.ClientSession`` (connection pooling, a
per-host limit). Trio code calls :meth:`ProviderBridge.request`, which performs a SINGLE HTTP
attempt; deadlines across attempts, retries and backoff live on the trio side
(``retry.py``), so trio's clock governs them.

Starts: :meth:`run` calls ``task_status.started()`` at once; the thread, its loop and
session (and the import of aiohttp, ~0.1 s) wait for the first request, so a daemon that
never calls a provider has neither. Stops: cancelling :meth:`run` tells the loop to cancel
in-flight requests, close the session and end; it waits for the thread for at most
``stop_timeout_s`` (shielded).

Hand-over between the two worlds: a request is started on the loop with
``loop.call_soon_threadsafe`` (which keeps start and cancel in FIFO order, so a cancel can
never overtake its start), and the asyncio task's done-callback wakes the waiting trio task
through the run's ``TrioToken``. No worker thread is parked per call. If the trio caller is
cancelled, the asyncio task is cancelled and the caller waits (shielded, bounded by
``cancel_timeout_s``) until it has really finished, so no request outlives its caller.
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
import outcome
import trio

from recalld.daemon.providers.errors import (
    ProviderBadResponse,
    ProviderConfigError,
    ProviderConnectError,
    ProviderError,
    ProviderTimeout,
    redact,
    unexpected,
)

if TYPE_CHECKING:
    import asyncio

    import aiohttp

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HttpResult:
    """One HTTP answer. Header names are lower-cased."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class BridgeStatistics:
    """The provider bridge's counters, for ``daemon.status``."""

    running: bool
    in_flight: int
    requests_total: int


@dataclass(slots=True, eq=False)
class _Call:
    """One request crossing the bridge; the asyncio side fills it, then sets ``done``."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None
    timeout_s: float
    done: trio.Event = field(default_factory=trio.Event)
    task: asyncio.Task[HttpResult] | None = None
    result: HttpResult | None = None
    error: BaseException | None = None
    cancelled: bool = False


#: How aiohttp quotes the start of a TLS record (a handshake, an alert) where it expected
#: an HTTP status line: an http:// URL to a port that speaks HTTPS.
_TLS_RECORDS = ("'\\x16\\x03", "'\\x15\\x03")
#: OpenSSL's reasons for a handshake answered by what is no TLS (an https:// URL to a
#: port that speaks plain HTTP).
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG"})


def _translate(exc: BaseException, url: str) -> BaseException:
    """Map library exceptions to the provider error family (once, here); one nobody
    foresaw is that request's :class:`ProviderFault` (its traceback logged), never
    its caller's crash."""
    if isinstance(exc, ProviderError):
        return exc
    import aiohttp  # loaded by the thread that raised ``exc``

    where = redact(url.split("?", 1)[0])
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError
        return ProviderTimeout(f"request to {where} timed out")
    if isinstance(exc, aiohttp.InvalidURL):
        return ProviderConfigError(f"invalid provider URL {where!r}")
    # aiohttp's messages run over several lines: one line for a status and a log.
    said = f"{type(exc).__name__}: {redact(' '.join(str(exc).split()))}".rstrip(": ")
    if isinstance(exc, aiohttp.ClientPayloadError):
        # It answered, but less than it announced (or a body it could not decode): a
        # dropped connection all the same, not a server out of reach.
        return ProviderConnectError(f"the answer from {where} was cut short: {said}")
    if (isinstance(exc, aiohttp.ClientResponseError)
            and not isinstance(exc, aiohttp.ClientHttpProxyError)):
        # Statuses are returned, not raised (raise_for_status=False): this is an answer
        # whose head aiohttp could not read (not HTTP, an encoding it cannot decode). Its
        # status is the parser's own 400, which no provider sent: naming it would read as
        # the provider refusing the input, and "cannot reach" as a network fault.
        message = redact(" ".join(str(exc.message).split()))
        if any(record in message for record in _TLS_RECORDS):
            # The bytes of a TLS record quoted: what the operator is to do, not them.
            message = "the server speaks TLS on this port: use https:// in base_url"
        return ProviderBadResponse(f"the answer from {where} cannot be read: {message}")
    if isinstance(exc, aiohttp.ClientConnectorSSLError) and getattr(
            exc.os_error, "reason", None) in _NOT_TLS:
        return ProviderConnectError(
            f"cannot reach {where}: the server does not speak TLS on this port: use "
            f"http:// in base_url ({said})")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return ProviderConnectError(f"cannot reach {where}: {said}")
    if isinstance(exc, ValueError | TypeError):  # a request aiohttp will not build
        return ProviderConfigError(f"cannot send to {where}: {redact(str(exc))}")
    if isinstance(exc, Exception):
        return unexpected(exc, f"request to {where}")
    return exc


def _without_url_credentials(url: str, headers: Mapping[str, str]) -> dict[str, str]:
    """``headers``, less any Authorization when ``url`` carries a user (and password):
    those are sent (basic auth), and a request has one Authorization header."""
    if urllib.parse.urlsplit(url).username is None:
        return dict(headers)
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


#: Redirects followed in one attempt (those :func:`followed` takes).
MAX_REDIRECTS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: urllib.parse.SplitResult) -> tuple[str, str | None, int | None]:
    scheme = url.scheme.lower()
    return scheme, url.hostname, url.port or _DEFAULT_PORTS.get(scheme)


def followed(url: str, status: int, location: str | None) -> str | None:
    """Where a redirect of a request to ``url`` is followed, or None (the answer stands).

    Only a 307 or 308 within ``url``'s origin is: they resend the same method and body,
    and the headers (an API key among them) stay with the server they were meant for. A
    301, 302 or 303 would turn the POST into a bodiless GET, and another origin (http to
    https among them) would get the key or answer without it; either way the call could
    only fail with a misleading error or hand the key over, so the redirect is the
    answer, and ``base_url`` is to be set to where it leads.
    """
    if status not in (307, 308) or not location:
        return None
    try:
        target = urllib.parse.urljoin(url, location.strip())
        same = _origin(urllib.parse.urlsplit(target)) == _origin(urllib.parse.urlsplit(url))
    except ValueError:  # no URL (an IPv6 host left open), a port out of range
        return None
    return target if same else None


class ProviderBridge:
    """One asyncio thread with one aiohttp session, callable from trio."""

    def __init__(
        self,
        *,
        limit: int = 64,
        limit_per_host: int = 8,
        max_body_bytes: int = 64 << 20,
        start_timeout_s: float = 10.0,
        stop_timeout_s: float = 5.0,
        cancel_timeout_s: float = 5.0,
    ) -> None:
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._max_body_bytes = max_body_bytes
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._cancel_timeout_s = cancel_timeout_s
        self._token: trio.lowlevel.TrioToken | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[HttpResult]] = set()
        self._stopping = False
        self._active = False
        self._requests_total = 0
        self._nursery: trio.Nursery | None = None
        self._starting = trio.Lock()

    # ----------------------------------------------------------------- service

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; the asyncio thread starts with the first request. Raises
        if that thread dies on its own."""
        if self._active:
            raise RuntimeError("ProviderBridge.run() is already running")
        self._active = True
        # The token stays set after run() ends: a late completion may still need to wake a
        # waiting caller in this trio run.
        self._token = trio.lowlevel.current_trio_token()
        self._stopping = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._stopping = True
            self._active = False
            self._loop = None
            self._session = None

    async def _ensure_thread(self) -> None:
        async with self._starting:
            if self._session is None and self._nursery is not None and not self._stopping:
                try:
                    await self._nursery.start(self._run_thread)
                except Exception as exc:
                    self._stopping = False  # the next request tries again
                    raise ProviderConnectError(
                        f"the provider bridge did not start: {exc}") from exc
                except BaseException:
                    self._stopping = False  # cancelled while starting: the next one tries again
                    raise

    async def _run_thread(self, *, task_status: trio.TaskStatus[None]) -> None:
        ready = trio.Event()
        finished = trio.Event()
        result: list[outcome.Outcome[None]] = []

        def deliver(out: outcome.Outcome[None]) -> None:
            result.append(out)
            self._wake(finished.set)

        trio.lowlevel.start_thread_soon(
            lambda: self._thread_main(ready), deliver, name="recalld-provider-bridge"
        )
        try:
            with trio.fail_after(self._start_timeout_s):
                async with trio.open_nursery() as nursery:
                    async def first(event: trio.Event) -> None:
                        await event.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(first, ready)
                    nursery.start_soon(first, finished)
            if finished.is_set():
                result[0].unwrap()
                raise RuntimeError("provider bridge thread ended during start")
            log.debug("provider bridge started")
            task_status.started()
            await finished.wait()
            result[0].unwrap()
            raise RuntimeError("provider bridge thread ended unexpectedly")
        finally:
            self._stopping = True
            self._request_stop()
            with trio.move_on_after(self._stop_timeout_s) as cs:
                cs.shield = True
                await finished.wait()
            if cs.cancelled_caught:
                log.warning("provider bridge thread did not stop within %.1fs",
                            self._stop_timeout_s)

    def _wake(self, fn: Callable[[], object]) -> None:
        token = self._token
        if token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(fn)

    def _request_stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is None or stop is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stop.set)

    # ----------------------------------------------------------- asyncio side

    def _thread_main(self, ready: trio.Event) -> None:
        # asyncio too is loaded here: a daemon that never calls a provider never needs it.
        import asyncio

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._amain(loop, ready))
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                self._loop = None
                loop.close()

    async def _amain(self, loop: asyncio.AbstractEventLoop, ready: trio.Event) -> None:
        import asyncio

        import aiohttp  # here, in the thread: only a daemon that calls providers pays for it

        self._stop = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit_per_host)
        async with aiohttp.ClientSession(connector=connector, raise_for_status=False) as session:
            self._session = session
            self._loop = loop
            if self._stopping:  # cancelled before we got here
                self._stop.set()
            self._wake(ready.set)
            await self._stop.wait()
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=self._stop_timeout_s)
            self._session = None

    def _start(self, call: _Call) -> None:
        loop = self._loop
        if self._stopping or loop is None or self._session is None:
            call.error = ProviderConnectError("the provider bridge is not running")
            self._wake(call.done.set)
            return
        task = loop.create_task(self._attempt(call))
        call.task = task
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._finished(call, t))

    def _finished(self, call: _Call, task: asyncio.Task[HttpResult]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            call.cancelled = True
        elif (exc := task.exception()) is not None:
            call.error = _translate(exc, call.url)
        else:
            call.result = task.result()
        self._wake(call.done.set)

    @staticmethod
    def _cancel(call: _Call) -> None:
        if call.task is not None:
            call.task.cancel()

    async def _attempt(self, call: _Call) -> HttpResult:
        import asyncio

        import aiohttp

        session = self._session
        assert session is not None
        url = call.url
        async with asyncio.timeout(call.timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                timeout = aiohttp.ClientTimeout(total=call.timeout_s)
                async with session.request(
                    call.method, url, headers=dict(call.headers), data=call.body,
                    timeout=timeout, allow_redirects=False,
                ) as resp:
                    headers = {k.lower(): v for k, v in resp.headers.items()}
                    target = followed(url, resp.status, headers.get("location"))
                    if target is None:
                        return HttpResult(resp.status, headers,
                                          await self._read(call, resp.content))
                url = target
        raise ProviderBadResponse(
            f"{redact(call.url.split('?', 1)[0])} redirected more than {MAX_REDIRECTS} times")

    async def _read(self, call: _Call, content: aiohttp.StreamReader) -> bytes:
        body = bytearray()
        async for chunk in content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > self._max_body_bytes:
                raise ProviderBadResponse(
                    f"answer from {redact(call.url.split('?', 1)[0])} exceeds "
                    f"{self._max_body_bytes} bytes"
                )
        return bytes(body)

    # -------------------------------------------------------------- trio side

    @property
    def running(self) -> bool:
        """Serving requests: ``run`` is active (the thread may still wait for its first
        request)."""
        return self._active and not self._stopping

    def statistics(self) -> BridgeStatistics:
        return BridgeStatistics(self.running, len(self._tasks), self._requests_total)

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        json: object = None,
        timeout_s: float,
    ) -> HttpResult:
        """One HTTP attempt; any status is returned, transport failures raise.

        Raises ProviderConnectError (no connection, dropped, bridge not running),
        ProviderTimeout (``timeout_s`` passed), ProviderConfigError (bad URL) or
        ProviderBadResponse (an oversized answer, or one whose head cannot be read: not
        HTTP, an encoding it cannot decode). On cancellation the asyncio task is
        cancelled and awaited (bounded) before Cancelled propagates.
        """
        if not self.running:
            raise ProviderConnectError("the provider bridge is not running")
        await self._ensure_thread()
        loop = self._loop
        if loop is None or self._stopping:
            raise ProviderConnectError("the provider bridge is not running")
        body = None
        hdrs = _without_url_credentials(url, headers)
        if json is not None:
            body = orjson.dumps(json)
            hdrs.setdefault("Content-Type", "application/json")
        call = _Call(method, url, hdrs, body, timeout_s)
        try:
            loop.call_soon_threadsafe(self._start, call)
        except RuntimeError:
            raise ProviderConnectError("the provider bridge is not running") from None
        self._requests_total += 1
        try:
            await call.done.wait()
        except trio.Cancelled:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._cancel, call)
            with trio.move_on_after(self._cancel_timeout_s) as cs:
                cs.shield = True
                await call.done.wait()
            if cs.cancelled_caught:
                log.warning("an HTTP request did not finish cancelling within %.1fs",
                            self._cancel_timeout_s)
            raise
        if call.result is not None:
            return call.result
        if call.error is not None:
            raise call.error
        raise ProviderConnectError("the provider bridge stopped during the request")
