"""What ``recalld doctor`` reports: a check's outcome, and the report of them all."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from recalld.ipc.types import visible


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def render(checks: list[Check]) -> str:
    """One line a check, and one for its fix; a path named in them (a socket, a data
    folder) with a line break or another control character shown escaped, in a pipe
    too, so that it stays on its check's line."""
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    lines = []
    for c in checks:
        lines.append(f"[{marks.get(c.status, c.status)}] {c.name}: {visible(c.detail)}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"       fix: {visible(c.fix)}")
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    lines.append(f"{failed} problem(s), {warned} warning(s)")
    return "\n".join(lines) + "\n"
