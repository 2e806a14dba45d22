"""Progress of a long call, sent to the connection that made it.

A client that passes ``progress_token`` (1-64 characters) to a long method
(``backup.create``, ``backup.verify``, ``backup.restore``, ``backup.rollback``,
``workspace.open`` with ``import_report``) receives on that connection, and only there,
``event`` notifications with topic ``call.progress``: ``{token, method, phase, done,
total, bytes_done, bytes_total}``, the counts of the current phase (``total`` and the
byte counts null when unknown). One is sent when a phase starts and when it ends, and
in between at most every ``interval_s`` while the counts move; all of them before the
call's answer. Without a token nothing is sent and nothing runs.

The work reports from worker threads (:meth:`CallProgress.phase`,
:meth:`CallProgress.advance`, under a lock); a trio task of the call
(:meth:`CallProgress.pumping`) samples and sends. It stops with the call; cancelling
the call cancels it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Final, TypedDict

import trio

from recalld.ipc.errors import InvalidParams

TOPIC: Final = "call.progress"
MAX_TOKEN_CHARS: Final = 64
Notify = Callable[[str, Mapping[str, object]], Awaitable[bool]]
#: A phase's counts read when sent: ``(shown, done, total)``, ``shown`` the name to show
#: for where the phase is now (a step of it whose total is unknown, or its own name).
Sample = Callable[[], tuple[str, int, int | None]]


class Reading(TypedDict):
    token: str
    method: str
    phase: str
    done: int
    total: int | None
    bytes_done: int | None
    bytes_total: int | None


def check_token(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TOKEN_CHARS:
        raise InvalidParams(f"progress_token must be a string of 1-{MAX_TOKEN_CHARS} characters")
    return value


class CallProgress:
    """The counts of one call's current phase (see the module docstring)."""

    def __init__(self, notify: Notify | None, token: str | None, method: str, *,
                 interval_s: float = 0.25) -> None:
        self._notify = notify if token is not None else None
        self._token = token or ""
        self._method = method
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._phase = ""
        self._done = 0
        self._total: int | None = None
        self._bytes_done: int | None = None
        self._bytes_total: int | None = None
        self._sample: Sample | None = None
        self._milestones: list[Reading] = []  # phase starts and ends, all sent in order
        self._sent: Reading | None = None

    @property
    def enabled(self) -> bool:
        return self._notify is not None

    def _reading(self) -> Reading:
        phase = self._phase
        if self._sample is not None:
            phase, self._done, self._total = self._sample()
        return {"token": self._token, "method": self._method, "phase": phase,
                "done": self._done, "total": self._total, "bytes_done": self._bytes_done,
                "bytes_total": self._bytes_total}

    def phase(self, name: str, total: int | None = None, bytes_total: int | None = None,
              sample: Sample | None = None) -> None:
        """Start phase ``name`` (ending the one before); ``sample`` reads the counts
        (and the name to show) when they are not reported with :meth:`advance`. Safe
        from any thread."""
        if not self.enabled:
            return
        with self._lock:
            if self._phase:
                self._milestones.append(self._reading())
            self._phase, self._done, self._total, self._sample = name, 0, total, sample
            self._bytes_total = bytes_total
            self._bytes_done = 0 if bytes_total is not None else None
            self._milestones.append(self._reading())

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        """Count ``n`` more items (and ``nbytes`` bytes) done. Safe from any thread."""
        if not self.enabled:
            return
        with self._lock:
            self._done += n
            if self._bytes_done is not None:
                self._bytes_done += nbytes

    async def _flush(self) -> None:
        assert self._notify is not None
        with self._lock:
            due = self._milestones
            self._milestones = []
            now = self._reading() if self._phase else None
        if now is not None and (not due or due[-1] != now):
            due.append(now)
        for reading in due:
            if reading != self._sent:
                self._sent = reading
                await self._notify(TOPIC, reading)

    @asynccontextmanager
    async def pumping(self) -> AsyncIterator[CallProgress]:
        """Send progress while the body runs, and what is left once it ends (not when
        it fails: the error answers)."""
        if not self.enabled:
            yield self
            return
        try:
            async with trio.open_nursery() as nursery:
                async def pump() -> None:
                    while True:
                        await self._flush()
                        await trio.sleep(self._interval_s)

                nursery.start_soon(pump)
                yield self
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The body's own error, as the caller would see it without the pump.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        if self._phase:
            with self._lock:
                self._milestones.append(self._reading())
        await self._flush()
