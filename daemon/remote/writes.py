"""A server that answers but refuses this host's writes, as a whole.

Unlike a change whose own data the server refuses (``refusals.py``), these refusals are
about the server or the role the DSN logs in as, and hold for every change: a read-only
server (a standby after a failover, ``default_transaction_read_only``: SQLSTATE 25006),
a full disk (53100), a role without the rights it needs (42501). The server is not
offline: the replica keeps reading the change feed and searching in the server where it
can, local changes wait in the outbox, and uploading is tried again with backoff (and at
each new local change) until the server takes writes again.

Pure bookkeeping, no I/O: the uploader (``remote/filesync.py``), the chunk backfill
(``remote/searcher.py``), the jobs' catalog (``remote/catalog.py``) and the connection loop
(``remote/replica.py``) ask and record; whoever waits for writes to be taken again
waits in :meth:`WriteRefusal.wait_taken`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import psycopg
import trio

from recalld.daemon.providers.retry import RetryPolicy

log = logging.getLogger(__name__)

#: SQLSTATE to the kind of refusal status names.
KINDS = {"25006": "read-only", "53100": "disk full", "42501": "permission denied"}
#: How soon writing is tried again while the server refuses (a new local change tries
#: at once).
RETRY = RetryPolicy(backoff_base_s=1.0, backoff_max_s=60.0)


def refusal_kind(exc: BaseException) -> str | None:
    """The kind of refusal ``exc`` is (see :data:`KINDS`), or None when it is not one."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if not isinstance(exc, psycopg.Error):
        return None
    return KINDS.get(exc.sqlstate or "")


class WriteRefusal:
    """Whether the server refuses this host's writes now, which kind, since when."""

    def __init__(self) -> None:
        self.kind: str | None = None
        #: The server's message, on one line.
        self.reason: str | None = None
        self.since: float | None = None
        self._attempt = 0
        self._rng = random.Random()  # noqa: S311 (backoff jitter)
        self._taken = trio.Event()
        #: How long the last refusal said to wait before writing again.
        self.delay_s = 0.0
        #: Called at each refusal recorded (the uploader, waiting idle, wakes to retry).
        self.on_refused: Callable[[], None] = lambda: None

    def refused(self, exc: BaseException, name: str) -> float | None:
        """Record ``exc`` if it is such a refusal (logged when it starts or changes kind,
        for shared workspace ``name``): how long to wait before writing again, or None
        when it is no such refusal."""
        kind = refusal_kind(exc)
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if kind is None or not isinstance(exc, psycopg.Error):
            return None
        reason = " ".join((exc.diag.message_primary or str(exc)).split())
        if self.kind != kind:
            log.warning("shared workspace %s: the server refuses this host's writes (%s: "
                        "%s); local changes wait in the outbox, notes of the other hosts "
                        "still come down where the server lets them be read", name, kind,
                        reason)
        if self.kind is None:
            self.since = time.time()
        self.kind, self.reason = kind, reason
        delay = self.delay_s = RETRY.backoff_s(self._attempt, self._rng)
        self._attempt = min(self._attempt + 1, 16)
        self.on_refused()
        return delay

    def cleared(self) -> bool:
        """The server took a write; whether it refused before."""
        was = self.kind is not None
        self.kind = self.reason = self.since = None
        self._attempt = 0
        self._taken.set()
        self._taken = trio.Event()
        return was

    async def wait_taken(self, delay_s: float) -> None:
        """Wait until a write is taken (:meth:`cleared`), at most ``delay_s``."""
        with trio.move_on_after(delay_s):
            await self._taken.wait()
