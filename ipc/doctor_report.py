"""What ``recalld doctor`` reports: a check's outcome, and the report of them all."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def render(checks: list[Check]) -> str:
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    lines = []
    for c in checks:
        lines.append(f"[{marks.get(c.status, c.status)}] {c.name}: {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"       fix: {c.fix}")
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    lines.append(f"{failed} problem(s), {warned} warning(s)")
    return "\n".join(lines) + "\n"
