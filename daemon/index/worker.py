"""What runs first in an indexing worker process (``procpool.py`` spawns them).

Kept apart from ``procpool.py``, which needs trio: a spawned worker imports the module
of its initializer, and this one imports nothing heavier than ctypes, so a worker spends
its start-up on what indexing needs (numpy, the tokenizer, the redaction rules).
"""

from __future__ import annotations

import ctypes
import os
import signal

# Workers run at a lower priority than the daemon: a build may take both cores, but a
# search (served by the daemon process) gets one at once.
WORKER_NICE = 10
_PR_SET_PDEATHSIG = 1


def worker_init(parent: int) -> None:
    """Tie a worker's life to the daemon's: a SIGKILLed daemon must not leave workers
    behind (they hold both ends of their queue's pipe, so they would never see EOF)."""
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


__all__ = ["WORKER_NICE", "warm", "worker_init"]
