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
commit, which follows the pass, needs the most memory of all. Results come back through a
``concurrent.futures`` callback handed to trio with ``run_sync_soon``: no thread waits on
them. Should a worker die (killed, out of memory), the pool is dropped and the caller gets
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
from typing import TYPE_CHECKING, TypedDict, TypeVar, TypeVarTuple

import trio

from recalld.daemon import memtrim
from recalld.daemon.index.worker import warm, worker_init

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor
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


class PreparePool:
    """A lazily started, idle-stopped process pool shared by every workspace."""

    def __init__(self, workers: int, *, idle_s: float = 30.0) -> None:
        self.workers = max(1, workers)
        self.idle_s = idle_s
        self._executor: ProcessPoolExecutor | None = None
        self._busy = 0
        self._last_end = 0.0
        self._ended = trio.Event()  # set when the last call in flight ends
        self._holders = 0  # passes under way that will call again soon
        self._closed = False  # run() has ended: the daemon is stopping, start nothing
        # The processes the executor started (it starts them as calls come): killed when
        # the pool stops with no call in flight (see _stop).
        self._started: set[BaseProcess] = set()
        self.starts = 0
        self.calls = 0

    @property
    def alive(self) -> bool:
        return self._executor is not None

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
                while self._executor is not None and self._busy == 0:
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
        if self._executor is not None or self._closed:
            return
        from concurrent.futures.process import BrokenProcessPool

        try:
            for _ in range(self.workers):
                self._submit(warm)
        except (BrokenProcessPool, RuntimeError, OSError) as exc:
            self._drop(exc)
            return
        if not self._busy:  # the idle timer starts now
            self._last_end = trio.current_time()
            self._ended.set()

    async def call(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """``fn(*args)`` in a worker process; ``fn`` must be importable, args plain data.

        Raises :class:`PoolUnavailable` if the pool cannot run it. A cancelled call is
        abandoned (the worker finishes it and the result is dropped).
        """
        from concurrent.futures import CancelledError as FutureCancelled
        from concurrent.futures.process import BrokenProcessPool

        self._busy += 1
        self.calls += 1
        try:
            try:
                # Trimmed after each call: a worker then holds its result's buffers
                # between calls, not the peak of the last one.
                run: Callable[[Callable[[*Ts], T], *Ts], T] = memtrim.trimmed
                future = self._submit(run, fn, *args)
            except (BrokenProcessPool, RuntimeError, OSError) as exc:
                self._drop(exc)
                raise PoolUnavailable(str(exc)) from exc
            done = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def wake(_: Future[T]) -> None:
                try:
                    token.run_sync_soon(done.set)
                except trio.RunFinishedError:
                    pass

            future.add_done_callback(wake)
            try:
                await done.wait()
            except BaseException:
                future.cancel()
                raise
            try:
                return future.result()
            except BrokenProcessPool as exc:
                self._drop(exc)
                raise PoolUnavailable(str(exc)) from exc
            except FutureCancelled as exc:  # the pool was dropped under this call
                raise PoolUnavailable("the worker processes were stopped") from exc
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._last_end = trio.current_time()
                self._ended.set()

    def _submit(self, fn: Callable[[*Ts], T], *args: *Ts) -> Future[T]:
        import multiprocessing

        executor = self._ensure()
        before = set(multiprocessing.active_children())
        future = executor.submit(fn, *args)
        self._started.update(p for p in multiprocessing.active_children() if p not in before)
        return future

    def _ensure(self) -> ProcessPoolExecutor:
        if self._executor is None:
            if self._closed:
                raise PoolUnavailable("the daemon is stopping")
            # multiprocessing and the process pool are imported with the first pool: a
            # daemon that only loads and searches never starts one.
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn, not fork: the daemon has threads (trio's, the provider loop) whose
            # locks a forked child would inherit half-held.
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=worker_init, initargs=(os.getpid(),))
            self.starts += 1
            log.info("started %d indexing worker processes", self.workers)
        return self._executor

    def _drop(self, exc: BaseException) -> None:
        log.warning("indexing worker processes failed (%s); preparing in threads", exc)
        self._stop()

    def _stop(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            # With no call in flight the processes hold nothing worth finishing: they are
            # killed rather than left to run their interpreter's exit, which at their
            # lower priority on a busy machine comes late, keeping their memory through
            # the pass's last apply and commit (the build's peak).
            started, self._started = self._started, set()
            executor.shutdown(wait=False, cancel_futures=True)
            if not self._busy:
                for process in started:
                    # Nothing happens to one that has exited and been reaped already.
                    with suppress(ValueError):  # closed: long gone
                        process.kill()
            log.info("stopped the indexing worker processes")


__all__ = ["PoolUnavailable", "PreparePool", "cpu_count"]
