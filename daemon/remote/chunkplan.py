"""The chunk rows of an upload, made before its transaction (``db.ChunkPlan``).

When some host searches a shared workspace in the server, every upload writes its notes'
chunk rows (``remote/chunks.py``). Masking, chunking and tokenizing a big note takes long
(seconds per megabyte of token-like lines), and the upload's transaction holds the
workspace row's lock that every other host's upload waits on, under the call limit
(``db.CALL_TIMEOUT_S``). So the uploader reads the settings the rows depend on first
(``db.chunk_settings``), makes the rows in worker threads under the daemon's CPU limiter,
and the transaction uses them where the settings are still the same
(``db.upload_many``). A note whose rows take longer than ``db.PREPARE_TIMEOUT_S``
(counted from when its thread has a CPU token) is left out of the run and named
(:attr:`Plan.slow`): the uploader holds it back, and the notes after it go up. Its thread
is abandoned, and it stops at its next check of the cancellation (masking checks every
few hundred token runs or anchors, ``redact.find_spans``; chunking between chunks),
giving its CPU token back within milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import trio

from recalld.daemon.remote import chunks, db
from recalld.daemon.remote.calls import on_conn
from recalld.daemon.remote.outbox import Change
from recalld.daemon.safepath import masked
from recalld.ipc.health_remote import SLOW_TO_PREPARE


@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`prepare` made: the rows (None when the workspace's uploads write no
    chunks) and the paths of the notes that took too long, each with why."""

    rows: db.ChunkPlan | None
    slow: dict[str, str] = field(default_factory=dict)


async def prepare(conn: db.Conn, workspace_id: int, batch: Sequence[tuple[Change, str, int]],
                  *, writer_lock: trio.Lock, cpu: trio.CapacityLimiter) -> Plan:
    """The chunk rows of ``batch``'s changes (see the module), each given up after
    ``db.PREPARE_TIMEOUT_S``. The settings are read on ``conn`` under ``writer_lock``;
    the rows are made without holding it. Cancelled, the threads under way are
    abandoned."""
    async with writer_lock:
        chunked, max_chars = await on_conn(conn, db.chunk_settings, workspace_id)
    if not chunked:
        return Plan(None)
    rows: dict[str, list[chunks.ChunkRow]] = {}
    slow: dict[str, str] = {}
    for change, target, _base in batch:
        if change.data is None:
            continue
        made = await rows_of(target, change.data, max_chars, cpu)
        if made is None:
            slow[change.path] = too_slow(change.path)
        else:
            rows[change.id] = made
    return Plan(db.ChunkPlan(chunked, max_chars, rows), slow)


async def rows_of(path: str, data: bytes, max_chars: int, cpu: trio.CapacityLimiter
                  ) -> list[chunks.ChunkRow] | None:
    """The chunk rows of the note ``path`` holding ``data``, made in a worker thread
    under ``cpu``; None when they took longer than ``db.PREPARE_TIMEOUT_S`` (see the
    module)."""
    with trio.CancelScope() as scope:
        make = partial(_timed, scope, db.PREPARE_TIMEOUT_S, path, data, max_chars)
        return await trio.to_thread.run_sync(make, limiter=cpu, abandon_on_cancel=True)
    return None


def too_slow(path: str) -> str:
    """Why ``path`` has no chunks in the server: :func:`rows_of` gave up."""
    return (f"{masked(path)} takes longer than {db.PREPARE_TIMEOUT_S:g} s "
            f"{SLOW_TO_PREPARE} (masking and chunking it)")


def _timed(scope: trio.CancelScope, limit: float, path: str, data: bytes,
           max_chars: int) -> list[chunks.ChunkRow]:
    """``chunks.chunk_rows`` in a worker thread, ``scope`` given its deadline once the
    thread has its CPU token (a wait for the limiter, busy with another workspace's
    rebuild, is not the note's slowness)."""
    trio.from_thread.run_sync(_start_clock, scope, limit)
    return chunks.chunk_rows(path, data, max_chars=max_chars,
                             check=trio.from_thread.check_cancelled)


def _start_clock(scope: trio.CancelScope, limit: float) -> None:
    scope.deadline = trio.current_time() + limit
