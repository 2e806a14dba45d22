"""Writing whole frames to one client's socket, one at a time, within a write timeout.

:class:`FrameWriter` owns, for one connection, the write lock and whether the stream
is still usable; it writes with plain non-blocking writes on the descriptor (ADR 0018).
It starts no task. The connection decides what a failed write means for it: a client
that is :attr:`FrameWriter.gone` (it closed, or shut down its reading) is not one that is
stuck (it did not read for ``write_timeout_s``).
"""

from __future__ import annotations

import logging
import os

import trio

from recalld.daemon.rpc.calls import CallCounters

log = logging.getLogger(__name__)


class FrameWriter:
    """Whole frames to one descriptor: serialized, each within ``write_timeout_s``."""

    def __init__(self, fd: int, *, connection_id: int, write_timeout_s: float,
                 counters: CallCounters) -> None:
        self._fd = fd
        self._id = connection_id
        self._write_timeout_s = write_timeout_s
        self._counters = counters
        self._lock = trio.Lock()
        self._broken = False
        self._gone = False

    @property
    def gone(self) -> bool:
        """True once a write found the client gone (EPIPE, ECONNRESET): it takes nothing
        more, and it did not merely stop reading for a while."""
        return self._gone

    async def write(self, data: bytes) -> bool:
        """Write all of ``data`` after the frames before it; False if the client is gone
        or did not read for ``write_timeout_s`` (the stream is then unusable).
        Cancelled while writing, a half written frame marks the stream unusable."""
        lock = self._lock
        try:
            # Uncontended (the usual case): no scheduler round trip for the lock.
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            return await self._write(data)
        finally:
            lock.release()

    def write_now(self, data: bytes | None) -> None:
        """Write ``data`` now if the socket takes it (the connection is being cut)."""
        if data is None or self._broken or self._lock.locked():
            return
        try:
            sent = os.write(self._fd, data)
        except OSError:  # full (BlockingIOError), or the client is gone
            sent = 0
        self._broken = 0 < sent < len(data)

    async def _write(self, data: bytes) -> bool:
        """Write all of ``data`` (the caller holds the lock)."""
        if self._broken:
            return False
        fd = self._fd
        try:
            # Most answers fit the socket buffer: then no wait, no timer, no checkpoint
            # (every caller checkpoints while it waits for its next piece of work).
            sent = os.write(fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:  # EPIPE, ECONNRESET: the client is gone
            self._broken = self._gone = True
            return False
        if sent == len(data):
            return True
        view = memoryview(data)[sent:]
        try:
            with trio.move_on_after(self._write_timeout_s) as timer:
                while view:
                    try:
                        await trio.lowlevel.wait_writable(fd)
                        view = view[os.write(fd, view):]
                    except BlockingIOError:
                        continue
                    except OSError:  # the client is gone
                        self._gone = True
                        break
                    except trio.ClosedResourceError:
                        break
        finally:
            # A frame cut short (also by cancellation) leaves the stream unusable.
            self._broken = bool(view)
        if view and timer.cancelled_caught:
            self._counters.timeouts_total += 1
            log.info("connection %d: client did not read for %.1f s, closing",
                     self._id, self._write_timeout_s)
        return not view
