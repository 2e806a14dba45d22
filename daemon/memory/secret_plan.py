"""How :func:`redact.find_spans` applies a sequence of rules, prepared once for every
text: the rules by kind (token rules, other format rules, context rules), each set of
hints numbered once (rules share theirs: the context rules all do), and for the format
rules that look over the whole text, which rules each hint lets run, so that a text is
searched for all their hints at once and only those rules run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recalld.daemon.memory.secret_anchors import ANCHOR_WORDS
from recalld.daemon.memory.secret_rules import (
    FORMAT_RULES,
    RULES,
    AnchoredFinder,
    Finder,
    Rule,
)


@dataclass(frozen=True, slots=True)
class Plan:
    """A sequence of rules prepared once for every text: its rules by kind, each with
    the number of its set of hints (-1: none; a set shared by rules is numbered once)."""

    rules: Sequence[Rule]
    groups: tuple[tuple[str, ...], ...]
    #: Token rules (they look inside the token runs).
    token: tuple[tuple[Finder, int], ...]
    #: Other format rules (they look over the whole text): those that always run, and
    #: for each of their hints, those it lets run.
    plain: tuple[Finder, ...]
    plain_always: tuple[int, ...]
    plain_hints: tuple[str, ...]
    plain_by_hint: dict[str, tuple[int, ...]]
    #: Context rules, and whether their hints are anchor words (looked for where those
    #: start, not over the text).
    anchored: tuple[tuple[AnchoredFinder, bool, int], ...]


#: The plans of the rule tables (other sequences of rules are planned on each call).
_PLANS: dict[int, Plan] = {}


def plan_of(rules: Sequence[Rule]) -> Plan:
    """The plan of ``rules`` (made once for the rule tables)."""
    plan = _PLANS.get(id(rules))
    if plan is not None and plan.rules is rules:
        return plan
    numbers: dict[tuple[str, ...], int] = {}
    token: list[tuple[Finder, int]] = []
    plain: list[Finder] = []
    always: list[int] = []
    plain_by_hint: dict[str, list[int]] = {}
    anchored: list[tuple[AnchoredFinder, bool, int]] = []
    for rule in rules:
        group = numbers.setdefault(rule.hints, len(numbers)) if rule.hints else -1
        if rule.anchored is not None:
            anchored.append((rule.anchored, ANCHOR_WORDS.issuperset(rule.hints), group))
        elif rule.find is not None and rule.token:
            token.append((rule.find, group))
        elif rule.find is not None:
            for hint in rule.hints:
                plain_by_hint.setdefault(hint, []).append(len(plain))
            if not rule.hints:
                always.append(len(plain))
            plain.append(rule.find)
    plan = Plan(rules, tuple(numbers), tuple(token), tuple(plain), tuple(always),
                 tuple(plain_by_hint), {h: tuple(i) for h, i in plain_by_hint.items()},
                 tuple(anchored))
    if rules is RULES or rules is FORMAT_RULES:
        _PLANS[id(rules)] = plan
    return plan
