"""The MCP bridge's stdin, ended by its end of file or by a signal that stops the bridge.

An MCP host stops its server by closing the server's stdin, or with SIGTERM (after a
grace period, or at once), and a person at a terminal with Ctrl-C; a closed terminal
sends SIGHUP. Each is the end of the conversation: the bridge then answers the requests
it read, ends its sessions (their turns go to auto_memory at once) and exits 0.

:class:`StdinReader` waits on the event loop for stdin to be readable, so that a signal
can end a read that waits (a read blocked in a worker thread kept the process alive
until stdin closed). A regular file or ``/dev/null``, which cannot be waited on and never
blocks, is read in a worker thread. Only the first signal is caught: a second one has its
default action and stops the bridge at once.
"""

from __future__ import annotations

import os
import signal
import stat
import sys

import anyio

#: The signals that end the bridge's input as its end of file does.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StdinReader:
    """``read(n)`` of file descriptor ``fd`` for :func:`~recalld.ipc.mcp_lines.bounded_lines`
    until its end of file or :meth:`end`."""

    def __init__(self, fd: int | None) -> None:
        self._fd = -1 if fd is None else fd  # None: no stdin, an empty input
        self._threaded = fd is not None and stat.S_ISREG(os.fstat(fd).st_mode)
        self._ended = fd is None
        self._waiting: anyio.CancelScope | None = None

    @classmethod
    def of_process(cls) -> StdinReader:
        """The process's stdin: an empty input for a process started with it closed
        (``sys.stdin`` is None; fd 0 may be another file since, such as the event
        loop's)."""
        return cls(None if sys.stdin is None else sys.stdin.fileno())

    def end(self) -> None:
        """End the input: a read waiting, and every read after it, give ``b""``."""
        self._ended = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def read(self, size: int) -> bytes:
        """Up to ``size`` bytes once some are there; ``b""`` at the end."""
        while not self._threaded:
            if self._ended:
                return b""
            with anyio.CancelScope() as self._waiting:  # cancelled by end()
                try:
                    # anyio >= 4.7; the MCP SDK the bridge runs on needs 4.9.
                    await anyio.wait_readable(self._fd)
                except PermissionError:  # epoll takes no regular file, nor /dev/null
                    self._threaded = True
                else:
                    return os.read(self._fd, size)
            self._waiting = None
        return b"" if self._ended else await anyio.to_thread.run_sync(os.read, self._fd, size)

    async def end_on_signal(self) -> None:
        """End the input at the first of :data:`STOP_SIGNALS` (a task of its own,
        cancelled once the bridge is done)."""
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async for _ in signals:
                self.end()
                return
