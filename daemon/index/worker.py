"""What runs in an indexing worker process (``procpool.py`` spawns them): :func:`serve`.

Kept apart from ``procpool.py``, which needs trio: a spawned worker imports the module
of its target, and this one imports nothing heavier than ctypes, so a worker spends its
start-up on what indexing needs (numpy, the tokenizer, the redaction rules).
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# Workers run at a lower priority than the daemon: a build may take both cores, but a
# search (served by the daemon process) gets one at once.
WORKER_NICE = 10
_PR_SET_PDEATHSIG = 1


def worker_init(parent: int) -> None:
    """Tie a worker's life to the daemon's: a SIGKILLed daemon must not leave a worker
    behind finishing a call no one will read (an idle one reads the end of its pipe)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the daemon died before the line above
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the daemon to handle
    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass


def warm() -> None:
    """Import what preparing files needs, so that a worker started ahead of a pass
    (``PreparePool.warm``) has it loaded when the first batch comes."""
    import recalld.daemon.index.prepare
    import recalld.daemon.memory.redact  # noqa: F401


#: A worker's answer to one call: its result, or the exception it raised.
Answer = tuple[Literal[True], object] | tuple[Literal[False], BaseException]


def serve(conn: Connection, parent: int, preload: bool) -> None:
    """Run the calls the daemon sends on ``conn`` (``(fn, args)``), one at a time, and
    answer each with ``(True, result)`` or ``(False, exception)``, until ``conn`` ends.

    The pipe is this worker's alone: should it die part-way through an answer, the
    daemon reads the end of the pipe rather than waiting on the rest.
    """
    from multiprocessing.reduction import ForkingPickler

    worker_init(parent)
    if preload:
        warm()
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):  # the daemon closed its end, or is gone
            return
        try:
            fn, args = ForkingPickler.loads(message)
            reply: Answer = (True, fn(*args))
        except BaseException as exc:  # the daemon re-raises it
            reply = (False, exc)
        del message
        try:
            conn.send(reply)  # pickled whole before a byte is written
        except (EOFError, OSError):
            return
        except Exception as exc:  # the result or the error does not pickle
            conn.send((False, RuntimeError(f"the worker could not send its answer: {exc!r}")))
        del reply


__all__ = ["WORKER_NICE", "Answer", "serve", "warm", "worker_init"]
