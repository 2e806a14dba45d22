"""What :mod:`recalld.ipc.health` finds in a workspace's status: facts, and problems with
their fixes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from recalld.ipc import disks
from recalld.ipc.answers import DaemonStatus

Severity = Literal["fail", "warn", "info"]


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong (fail), likely wrong (warn) or worth knowing (info), with its fix."""

    severity: Severity
    what: str
    fix: str = ""
    #: What it is about, where a list names it (``doctor``'s check of a daemon problem).
    topic: str = ""
    #: The error it reports as another check may say it too (a reload failure's, which
    #: the config file's own check repeats while the file is as the reload read it).
    cause: str = ""


@dataclass(slots=True)
class Assessment:
    """What is known of one workspace: its facts and problems."""

    agent_id: str
    facts: list[tuple[str, str]] = field(default_factory=list)  # (label, text)
    problems: list[Problem] = field(default_factory=list)

    @property
    def worst(self) -> str:
        kinds = {p.severity for p in self.problems}
        return "fail" if "fail" in kinds else "warn" if "warn" in kinds else "ok"


def restore_problems(status: DaemonStatus) -> list[Problem]:
    """A restore the daemon was stopped in, and what a start did with it (one no start
    could resolve is said at every start until it is resolved or acknowledged)."""
    r = status.get("restore_recovery")
    if not isinstance(r, dict):
        return []
    what = (f"the {r.get('interrupted')} of {', '.join(map(str, r.get('agents') or []))} "
            f"from {r.get('archive')} was interrupted (the daemon stopped)")
    if r.get("outcome") == "finished":
        return [Problem("warn", f"{what}; a start finished it", "nothing to do", "restore")]
    if r.get("outcome") == "rolled_back":
        return [Problem("warn", f"{what}; it could not be finished ({r.get('finish_error')}), "
                        "so a start put back the state from before it",
                        "restore again if you still want the backup's state", "restore")]
    return [Problem("fail", f"{what}; it could neither be finished nor rolled back: the "
                    "workspaces may hold files of both",
                    "restore a backup of them (recalld backup list)"
                    + (f"; or {r['acknowledge']}" if r.get("acknowledge") else ""), "restore")]


def disk_problems(status: DaemonStatus) -> list[Problem]:
    """File systems low on space (or read-only) the daemon measured as it answered (data directory,
    workspaces), by the rule ``recalld doctor`` applies (:mod:`recalld.ipc.disks`)."""
    return [Problem(d["level"], *disks.problem(d), "disk")
            for d in status.get("disks") or [] if d["level"] != "ok"]
