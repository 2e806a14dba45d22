"""What ``recalld doctor`` reports: a check's outcome, and the report of them all."""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from recalld.ipc.problems import Problem
from recalld.ipc.regular_files import not_a_folder
from recalld.ipc.types import visible


@dataclass(frozen=True, slots=True)
class Check:
    """One check of ``recalld doctor``: its name, status and detail."""

    name: str
    status: str  # ok | note | warn | fail | skip
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def problem_check(name: str, problem: Problem) -> Check:
    """A problem of ``recalld status`` as a check, at the severity status gives it: a
    failure, a warning, or a note (status's ``[note]``: worth knowing, not wrong)."""
    status = "note" if problem.severity == "info" else problem.severity
    return Check(name, status, problem.what, problem.fix)


def render(checks: list[Check]) -> str:
    """One line a check, and one for its fix; a path named in them (a socket, a data
    folder) with a line break or another control character shown escaped, in a pipe
    too, so that it stays on its check's line."""
    marks = {"ok": "ok  ", "note": "note", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    lines = []
    for c in checks:
        lines.append(f"[{marks.get(c.status, c.status)}] {c.name}: {visible(c.detail)}")
        if c.fix and c.status in ("note", "warn", "fail"):
            lines.append(f"       fix: {visible(c.fix)}")
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    lines.append(f"{failed} problem(s), {warned} warning(s)")
    return "\n".join(lines) + "\n"


def unreachable(name: str, path: Path) -> Check:
    """A failed check of ``path``, which cannot be looked at: what is in the way (a file
    where a folder on its way goes, a folder this user may not enter)."""
    for folder in (*reversed(path.parents), path):
        try:
            st = os.stat(folder)
        except OSError as exc:
            why = (not_a_folder(folder) if os.path.islink(folder)
                   else f"{folder}: {exc.strerror}")
            break
        if folder != path and not stat.S_ISDIR(st.st_mode):
            why = not_a_folder(folder)
            break
    else:
        folder, why = path, f"{path} cannot be read"
    return Check(name, "fail", f"cannot reach {path}: {why}",
                 f"{folder} must be a folder of yours: move what is there away, or choose "
                 "another socket (--socket, RECALLD_SOCKET or XDG_RUNTIME_DIR)")
