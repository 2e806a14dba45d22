"""Worker processes for big indexing passes: first builds, rebuilds, large reconciles.

Reading, chunking, tokenizing and counting a note is pure Python and holds the GIL; in
threads it runs on one core and makes every search of every workspace wait for the
interpreter. :class:`PreparePool` runs :func:`~recalld.daemon.index.state.prepare_files`
in a daemon-wide pool of spawned processes instead (one pool for all workspaces, never one
per workspace). The daemon then only applies the results: mapping each batch's distinct
terms to its own ids and merging numpy arrays.

The pool is started on the first big pass and shut down as soon as the last pass that
holds it (:meth:`PreparePool.holding`) ends, or once it has been idle for ``idle_s``, so
an idle daemon has no worker processes: a worker holds tens of MB, and a first build's
commit, which follows the pass, needs the most memory of all.

Each worker has a pipe of its own (:func:`~recalld.daemon.index.worker.serve` at the
other end), never one shared by all: a worker killed at any moment (by the OOM killer,
part-way through writing its answer) leaves no half-written message on a pipe the others
keep open, and no lock held; the daemon's end of its pipe reads end-of-file. A call
waits for an idle worker in trio, then sends and reads in a thread, since an answer may
be many MB. Should a worker die, the pool is dropped and the caller gets
:class:`PoolUnavailable`, upon which it prepares in a thread as it would without a pool.
Work is small function calls with plain-data results (no persisted state goes through
pickle; the process boundary is the only place it is used).

Its ``run`` service stops by cancellation and shuts the processes down.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, TypedDict, TypeVar, TypeVarTuple, cast

import trio

from recalld.daemon import memtrim
from recalld.daemon.index.worker import Answer, serve

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

log = logging.getLogger(__name__)
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class PoolStatus(TypedDict):
    workers: int
    alive: bool
    busy: int  # calls in flight
    starts: int
    calls: int


class PoolUnavailable(Exception):
    """No worker process could run the call; do the work in this process instead."""


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Worker:
    """A worker process and the daemon's end of its pipe."""

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn

    def kill(self) -> None:
        # Nothing happens to one that has exited and been reaped already.
        with suppress(ValueError):  # closed: long gone
            self.process.kill()


class _Procs:
    """The processes of one start of the pool."""

    def __init__(self, workers: int) -> None:
        self.started: list[_Worker] = []  # alive, idle or in a call
        self.idle: list[_Worker] = []
        self.stopped = False
        self.freed = trio.lowlevel.ParkingLot()  # calls waiting for an idle worker
        # The threads that send and read: one a worker (an abandoned call's keeps it).
        self.threads = trio.CapacityLimiter(workers)


class PreparePool:
    """A lazily started, idle-stopped process pool shared by every workspace."""

    def __init__(self, workers: int, *, idle_s: float = 30.0) -> None:
        self.workers = max(1, workers)
        self.idle_s = idle_s
        self._procs: _Procs | None = None
        self._busy = 0
        self._last_end = 0.0
        self._ended = trio.Event()  # set when the last call in flight ends
        self._holders = 0  # passes under way that will call again soon
        self._closed = False  # run() has ended: the daemon is stopping, start nothing
        self._killed: list[BaseProcess] = []  # reaped as the pool starts and stops
        self.starts = 0
        self.calls = 0

    @property
    def alive(self) -> bool:
        return self._procs is not None

    def status(self) -> PoolStatus:
        return {"workers": self.workers, "alive": self.alive, "busy": self._busy,
                "starts": self.starts, "calls": self.calls}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Stop the processes ``idle_s`` after the last call; on cancellation, at once."""
        task_status.started()
        try:
            while True:
                await self._ended.wait()  # no timer runs while calls are in flight
                self._ended = trio.Event()
                while self._procs is not None and self._busy == 0:
                    deadline = self._last_end + self.idle_s
                    if trio.current_time() >= deadline:
                        self._stop()
                        break
                    await trio.sleep_until(deadline)  # a call meanwhile moves the deadline
        finally:
            self._closed = True
            self._stop()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Keep the processes for a pass of many calls; when the last pass holding them
        ends with no call in flight, stop them at once rather than after ``idle_s``."""
        self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1
            if not self._holders and not self._busy:
                self._stop()

    def warm(self) -> None:
        """Start the processes now, and have them import what preparing needs, for a
        pass about to begin (a first build whose files are still being listed): their
        start then overlaps that listing. Stopped after ``idle_s`` if no call comes."""
        if self._procs is not None or self._closed:
            return
        try:
            procs = self._ensure()
            while len(procs.started) < self.workers:
                procs.idle.append(self._start(procs, preload=True))
        except OSError as exc:
            self._drop(exc)
            return
        if not self._busy:  # the idle timer starts now
            self._last_end = trio.current_time()
            self._ended.set()

    async def call(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """``fn(*args)`` in a worker process; ``fn`` must be importable, args plain data.

        Raises :class:`PoolUnavailable` if the pool cannot run it, or its worker dies
        meanwhile. A cancelled call is abandoned (the worker finishes it and the result
        is dropped).
        """
        self._busy += 1
        self.calls += 1
        try:
            procs, worker = await self._checkout()
            # Trimmed after each call: a worker then holds its result's buffers between
            # calls, not the peak of the last one.
            run: Callable[[Callable[[*Ts], T], *Ts], T] = memtrim.trimmed
            token = trio.lowlevel.current_trio_token()

            def send_and_read() -> Answer:
                from multiprocessing.reduction import ForkingPickler

                whole = True  # the pipe holds no part of a message
                try:
                    message = ForkingPickler.dumps((run, (fn, *args)))
                    whole = False
                    worker.conn.send_bytes(message)
                    del message
                    answer = worker.conn.recv_bytes()
                    whole = True
                    reply: Answer = ForkingPickler.loads(answer)
                    return reply
                finally:
                    with suppress(trio.RunFinishedError):
                        token.run_sync_soon(self._checkin, procs, worker, whole)

            try:
                reply = await trio.to_thread.run_sync(
                    send_and_read, abandon_on_cancel=True, limiter=procs.threads)
            except (EOFError, OSError) as exc:  # the worker died, or was stopped
                self._lost(procs, exc)
                raise PoolUnavailable(f"an indexing worker process ended: {exc!r}") from exc
            if not reply[0]:
                raise reply[1]
            return cast("T", reply[1])  # what ``fn`` returned
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._last_end = trio.current_time()
                self._ended.set()

    async def _checkout(self) -> tuple[_Procs, _Worker]:
        """An idle worker (started if fewer run than ``workers``), waiting for one."""
        while True:
            procs = self._ensure()
            if procs.idle:
                return procs, procs.idle.pop()
            if len(procs.started) < self.workers:
                try:
                    return procs, self._start(procs, preload=False)
                except OSError as exc:
                    self._drop(exc)
                    raise PoolUnavailable(str(exc)) from exc
            await procs.freed.park()
            if procs.stopped:  # the pool was dropped while this call waited
                raise PoolUnavailable("the worker processes were stopped")

    def _checkin(self, procs: _Procs, worker: _Worker, whole: bool) -> None:
        """Back from a call (or an abandoned one): idle again, or ended if its pipe was
        left part-way through a message or the pool has stopped meanwhile."""
        if whole and not procs.stopped:
            procs.idle.append(worker)
            procs.freed.unpark()
            return
        with suppress(ValueError):
            procs.started.remove(worker)
        self._end(worker)
        if not whole:
            self._lost(procs, EOFError("a worker's pipe ended part-way through a message"))

    def _ensure(self) -> _Procs:
        if self._procs is None:
            if self._closed:
                raise PoolUnavailable("the daemon is stopping")
            self._procs = _Procs(self.workers)
            self.starts += 1
            self._killed = [p for p in self._killed if p.is_alive()]  # reaps the others
            log.info("started %d indexing worker processes", self.workers)
        return self._procs

    def _start(self, procs: _Procs, *, preload: bool) -> _Worker:
        # multiprocessing is imported with the first pool: a daemon that only loads and
        # searches never starts one.
        import multiprocessing

        # spawn, not fork: the daemon has threads (trio's, the provider loop) whose
        # locks a forked child would inherit half-held. A spawned child gets only the
        # descriptors handed to it, so the worker alone holds its end of the pipe.
        context = multiprocessing.get_context("spawn")
        conn, child_end = context.Pipe()
        try:
            process = context.Process(target=serve, args=(child_end, os.getpid(), preload),
                                      daemon=True)
            process.start()
        except BaseException:
            conn.close()
            raise
        finally:
            child_end.close()
        worker = _Worker(process, conn)
        procs.started.append(worker)
        return worker

    def _end(self, worker: _Worker) -> None:
        worker.conn.close()
        worker.kill()
        self._killed.append(worker.process)

    def _lost(self, procs: _Procs, exc: BaseException) -> None:
        if procs is self._procs:
            self._drop(exc)

    def _drop(self, exc: BaseException) -> None:
        log.warning("indexing worker processes failed (%s); preparing in threads", exc)
        self._stop()

    def _stop(self) -> None:
        procs, self._procs = self._procs, None
        if procs is None:
            return
        procs.stopped = True
        procs.freed.unpark_all()  # calls waiting for a worker fail over to threads
        # Idle processes hold nothing worth finishing: they are killed rather than left
        # to run their interpreter's exit, which at their lower priority on a busy
        # machine comes late, keeping their memory through the pass's last apply and
        # commit (the build's peak). One in a call is ended as it answers, or at once
        # when the daemon stops.
        for worker in procs.idle:
            procs.started.remove(worker)
            self._end(worker)
        procs.idle.clear()
        if self._closed:
            for worker in procs.started:
                worker.kill()  # its call's thread reads end-of-file and closes the pipe
        log.info("stopped the indexing worker processes")


__all__ = ["PoolUnavailable", "PreparePool", "cpu_count"]
