"""Local changes the server refuses to store, each held back by itself.

Some changes the server refuses every time, whatever the connection: a note whose path
is too long for the server's index (PostgreSQL's B-tree keys hold about 2.7 kB, a path on
Linux up to 4 kB), a name with a character the database's encoding lacks. Such an error
is about the change, not the server: the replica stays online, the change stays in the
outbox and is passed by (the changes after it, to other files, go up), the path is named
in status with the server's reason (``refused``), and the change is tried again every
:data:`RETRY_S` and at each new connection. A later change of the same path (the note
renamed, deleted, edited) takes its place: only the path's newest content counts.

Pure bookkeeping, no I/O: the uploader (``remote/filesync.py``) asks and records. The
reasons (and :func:`cannot_write`'s, of a file of the feed this host cannot write) name
a note masked where a name in its path looks like a credential, as search shows it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

import psycopg
import trio

from recalld.daemon.safepath import masked, masked_about

log = logging.getLogger(__name__)

#: SQLSTATE classes of an error about a change's own data: 22 (data exception: a
#: character the encoding lacks, a value out of range), 54 (program limit exceeded: an
#: index row too large).
REFUSED_CLASSES = ("22", "54")
#: How soon a refused change is tried again.
RETRY_S = 60.0


def refuses(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a change's data (see the module docstring)."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "")[:2] in REFUSED_CLASSES


def reason(path: str, exc: psycopg.Error) -> str:
    """Why the server refuses ``path``, on one line (its primary message: the detail and
    hint of PostgreSQL's error say nothing a user of recalld can act on), naming it
    masked where a name in it looks like a credential, as search shows it."""
    text = masked_about(exc.diag.message_primary or str(exc), path)
    return f"the server refuses to store {masked(path)}: {' '.join(text.split())}"


def cannot_write(path: str, exc: BaseException) -> str:
    """Why this host cannot write ``path`` of the feed (``exc``: the error met), on one
    line, naming it as :func:`reason` does."""
    why = " ".join(masked_about(str(exc), path).split())
    return f"cannot write {masked(path)}: {why}"


class Refusals:
    """Paths whose change the server refused, with the reason and when."""

    def __init__(self) -> None:
        self._refused: dict[str, tuple[str, float]] = {}

    @property
    def reasons(self) -> dict[str, str]:
        return {path: why for path, (why, _at) in self._refused.items()}

    def add(self, name: str, path: str, why: str, *, until_changed: bool = False) -> None:
        """Record why the change of ``path`` (of shared workspace ``name``: logged the
        first time) does not go up: the server refused it (:func:`reason`), tried again
        after :data:`RETRY_S`, or ``until_changed``: it waits for a later change of the
        path (or the next session) instead."""
        if path not in self._refused:
            log.warning("shared workspace %s: %s; the change stays in the outbox and is "
                        "tried again %s", name, why,
                        "when it changes" if until_changed else "later")
        self._refused[path] = (why, math.inf if until_changed else trio.current_time())

    def clear(self, paths: Iterable[str] | None = None) -> None:
        """Forget ``paths`` (stored now, or their changes gone); None: every path (a new
        connection tries them all again)."""
        if paths is None:
            self._refused.clear()
            return
        for path in paths:
            self._refused.pop(path, None)

    def held(self, pending: Callable[[str], int]) -> frozenset[str]:
        """Paths whose changes wait now: refused less than :data:`RETRY_S` ago, and no
        later change of the path (``pending``: how many changes name it) came since."""
        now = trio.current_time()
        return frozenset(p for p, (_why, at) in self._refused.items()
                         if now - at < RETRY_S and pending(p) == 1)

    def wait_s(self, pending: Callable[[str], int]) -> float:
        """How long the uploader may sleep before a refused change is due again (paths
        no change names any more, says ``pending``, are forgotten)."""
        self.clear([p for p in self._refused if not pending(p)])
        if not self._refused:
            return float("inf")
        now = trio.current_time()
        return max(0.0, min(at + RETRY_S - now for _why, at in self._refused.values()))
