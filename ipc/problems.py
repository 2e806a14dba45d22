"""What :mod:`recalld.ipc.health` finds in a workspace's status: facts, and problems with
their fixes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
