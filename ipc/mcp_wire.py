"""The stdout of ``recalld mcp``: the wire its MCP client reads answers from.

The MCP SDK writes answers to stdout and stops the whole server at the first write that
fails: when the client closes its end (it quit, or a script's ``| head -1``), every
request still being served was cancelled, each daemon call in the middle of it with
asyncio's ``InvalidStateError`` noise on stderr, a note half written in parts, and the
sessions the bridge ends on the way out left for the daemon's idle flush.
:class:`StdoutWire` is handed to the SDK as its stdout instead: once the client's end is
closed, it says so once on stderr and drops the answers nobody can read, and the bridge
finishes what it read and stops at the end of stdin, as after any other client.

:func:`claimed_stdout` makes the wire a private copy of fd 1 and points fd 1 itself at
stderr while the bridge serves, as the SDK does with a stdout of its own choosing, so
that stray output (a library's print) cannot break a message in two; fd 1 is restored
at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO

import anyio


class StdoutWire:
    """Text written to ``wire`` (a binary file), as the SDK's stdio transport writes its
    answers (``write``, then ``flush``); dropped, once the reader is gone."""

    def __init__(self, wire: BinaryIO) -> None:
        self._wire = wire
        #: The client's end was closed: what is written goes nowhere.
        self.gone = False

    async def write(self, text: str) -> int:
        if not self.gone:  # the SDK's one writer task writes one message at a time
            data = text.encode("utf-8")
            await self._io(lambda: self._wire.write(data))
        return len(text)

    async def flush(self) -> None:
        if not self.gone:
            await self._io(self._wire.flush)

    async def _io(self, call: Callable[[], object]) -> None:
        try:
            await anyio.to_thread.run_sync(call)
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True
            with contextlib.suppress(OSError):
                print("recalld mcp: the MCP client closed its end of stdout; the requests "
                      "already read are finished without answers", file=sys.stderr,
                      flush=True)


@contextlib.contextmanager
def claimed_stdout() -> Iterator[StdoutWire]:
    """A :class:`StdoutWire` on a private copy of fd 1, with fd 1 pointed at stderr until
    the end (restored then)."""
    if sys.stdout is not None:  # what was printed before goes out first
        sys.stdout.flush()
    private = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        os.dup2(2, 1)
        try:
            # Buffered: a write is whole (the buffer writes on where a pipe took part).
            wire = open(private, "wb", closefd=False)
            try:
                yield StdoutWire(wire)
            finally:
                with contextlib.suppress(OSError):  # what a gone reader did not take
                    wire.close()
        finally:
            os.dup2(private, 1)
    finally:
        os.close(private)
