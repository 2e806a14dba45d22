"""Failed writes of the daemon's own state files: the workspace record
(``workspaces.json``), the job journal and the scheduler's last runs.

Each writer keeps a :class:`WriteFailure` for its file: set when a write fails (the writer
logs it and serves on), cleared by the next write that succeeds. :func:`statistics` is
their part of ``daemon.status`` (``queues.state_files``), which ``recalld status`` and
``doctor`` show as a problem: until the file can be written, a restart would start from
what it last held.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TypedDict


class FailedWrite(TypedDict):
    file: str
    error: str
    since: float


class StateFilesStatus(TypedDict):
    failing: int
    errors: list[FailedWrite]
    set_aside: list[str]


class WriteFailure:
    """The last failed write of one state file, None once a write succeeds."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.failed: FailedWrite | None = None
        #: A copy of the file that did not verify, set aside at a start (what it held is
        #: not in use), for someone to look at and remove; None if there is none.
        self.set_aside: str | None = None

    def record(self, error: str) -> None:
        since = self.failed["since"] if self.failed is not None else time.time()
        self.failed = {"file": str(self.path), "error": error, "since": since}

    def clear(self) -> None:
        self.failed = None


def statistics(failures: Iterable[WriteFailure]) -> StateFilesStatus:
    """The failing writes, and the copies set aside that are still there (one removed
    is shown no more)."""
    failures = list(failures)
    errors = [f.failed for f in failures if f.failed is not None]
    return {"failing": len(errors), "errors": errors,
            "set_aside": [f.set_aside for f in failures
                          if f.set_aside is not None and os.path.lexists(f.set_aside)]}
