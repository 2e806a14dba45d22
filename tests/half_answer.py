"""A worker process killed part-way through sending its answer, as the OOM killer ends
one: it writes the start of a many-MB answer to every pipe and socket it can write to
(its answer's, whichever it is), then is SIGKILLed before the rest.

Imported by worker processes (the spawned ones of ``PreparePool``, of a test or of a
real daemon), so it imports only the standard library.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import struct
from contextlib import suppress


def write_part_of_an_answer_then_die(*_: object) -> None:
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker._resource_tracker, "_fd", None)
    start = struct.pack("!i", 64 << 20) + bytes(8192)  # says 64 MB follow
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd == tracker:
            continue
        with suppress(OSError):
            mode = os.fstat(fd).st_mode
            writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
            if writable and (stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)):
                os.write(fd, start)
    os.kill(os.getpid(), signal.SIGKILL)
