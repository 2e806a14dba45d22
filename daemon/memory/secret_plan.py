"""How :func:`redact.find_spans` applies a sequence of rules, prepared once for every
text: the rules by kind (token rules, other format rules, context rules), each set of
hints numbered once (rules share theirs: the context rules all do), and for the format
rules that look over the whole text, which rules each hint lets run, so that a text is
searched for all their hints at once and only those rules run (:func:`hints_in`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from recalld.daemon.memory.secret_anchors import ANCHOR_WORDS
from recalld.daemon.memory.secret_rules import (
    FORMAT_RULES,
    RULES,
    AnchoredFinder,
    Finder,
    Rule,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


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
    #: For each of ``plain_hints``, the pairs of adjacent characters it holds, as bits of
    #: :func:`_pair_codes` (0: none, a hint of one character; or one not ASCII).
    plain_pairs: tuple[int, ...]
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
                 _hint_pairs(tuple(plain_by_hint)), tuple(anchored))
    if rules is RULES or rules is FORMAT_RULES:
        _PLANS[id(rules)] = plan
    return plan


# -- looking for the hints --------------------------------------------------------------

#: Texts this long or longer are looked for the plain hints through the pairs of ASCII
#: characters they hold (numpy): the ~80 hints, each a scan of the whole text, cost
#: ~0.1 ms over a Chinese note of 2,000 characters, the pairs (one pass rules out nearly
#: all of them; only the hints left are scanned for) ~0.03 ms. Shorter texts are not
#: worth the arrays.
PAIRS_CHARS: Final = 256


def _pairs(hint: str) -> set[int]:
    """The pairs of adjacent characters of an ASCII ``hint``, each as a number < 2**14."""
    return {ord(a) << 7 | ord(b) for a, b in itertools.pairwise(hint)}


def _hint_pairs(hints: tuple[str, ...]) -> tuple[int, ...]:
    """Each hint's pairs of adjacent characters, as bits numbered in :func:`_pair_codes`."""
    codes = _pair_codes(hints)
    return tuple(sum(1 << codes[p] for p in _pairs(h)) if h.isascii() else 0 for h in hints)


def _pair_codes(hints: tuple[str, ...]) -> dict[int, int]:
    """Pair (:func:`_pairs`) -> its bit, for the pairs the ASCII hints hold."""
    pairs = sorted(set[int]().union(*(_pairs(h) for h in hints if h.isascii())))
    return {code: bit for bit, code in enumerate(pairs)}


def hints_in(plan: Plan, lower: str) -> list[str]:
    """The plain hints of ``plan`` that ``lower`` (a text in lowercase) holds."""
    hints = plan.plain_hints
    if len(lower) < PAIRS_CHARS:
        return [h for h in hints if h in lower]
    # A hint the text holds has each of its pairs of characters in the text's ASCII
    # characters read without the others (dropping them only joins more pairs): a hint
    # missing one of its pairs there is not in the text. The others are looked for.
    present = _pairs_present(plan, lower)
    return [h for h, need in zip(hints, plan.plain_pairs, strict=True)
            if present & need == need and h in lower]


def _pairs_present(plan: Plan, lower: str) -> int:
    """The bits of ``plan``'s hint pairs (:func:`_hint_pairs`) found in ``lower``."""
    import numpy as np

    chars = np.frombuffer(lower.encode("ascii", "ignore"), dtype=np.uint8).astype(np.uint16)
    seen = np.zeros(1 << 14, dtype=np.bool_)
    seen[chars[:-1] << 7 | chars[1:]] = True
    found = seen[_codes_array(plan.plain_hints)]
    return int.from_bytes(np.packbits(found, bitorder="little").tobytes(), "little")


@functools.cache
def _codes_array(hints: tuple[str, ...]) -> npt.NDArray[np.intp]:
    """The pair codes of ``hints``, in the order of their bits."""
    import numpy as np

    return np.array(list(_pair_codes(hints)), dtype=np.intp)
