"""How the replica's modules run their blocking calls: :func:`in_thread` for file calls
and connecting, :func:`on_conn` for calls on a database connection, which a server that
stops answering must not hold for ever (nor a stop of the daemon)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

import trio

from recalld.daemon.remote import db

if TYPE_CHECKING:
    from outcome import Outcome

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


async def in_thread(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``fn(*args)`` in a worker thread: the replica's file calls and connecting, which
    block. Cancellation waits for the call to return (connecting is bounded by the
    ``connect_timeout`` of :func:`db.connect`); calls on a connection: :func:`on_conn`."""
    return await trio.to_thread.run_sync(fn, *args)


async def on_conn(conn: db.Conn, fn: Callable[[db.Conn, *Ts], T], *args: *Ts,
                  timeout_s: float | None = None) -> T:
    """``fn(conn, *args)`` in a worker thread, given up after ``timeout_s`` (default
    :data:`db.CALL_TIMEOUT_S`) with :class:`db.NoAnswer`. Given up or cancelled, the call
    has its connection shut down under it (:func:`db.sever`) and is waited for, which is
    at once: a server that never answers holds neither the replica nor a stop. (The
    thread is started before anything can cancel: a call is never lost unstarted while
    it is waited for.)"""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    answer: list[Outcome[T]] = []

    def deliver(result: Outcome[T]) -> None:
        answer.append(result)
        token.run_sync_soon(done.set)

    trio.lowlevel.start_thread_soon(partial(fn, conn, *args), deliver)
    limit = db.CALL_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        with trio.move_on_after(limit) as deadline:
            await done.wait()
    finally:
        if not done.is_set():
            db.sever(conn)
            with trio.CancelScope(shield=True):
                await done.wait()
    try:
        return answer[0].unwrap()
    except Exception as exc:
        if deadline.cancelled_caught:
            raise db.NoAnswer(f"the server did not answer within {limit:g} s") from exc
        raise
