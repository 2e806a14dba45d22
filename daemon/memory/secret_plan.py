"""How :func:`redact.find_spans` applies a sequence of rules, prepared once for every
text: the rules by kind (token rules, other format rules, context rules), each set of
hints numbered once (rules share theirs: the context rules all do), and for the format
rules that look over the whole text, which rules each hint lets run, so that a text is
searched for all their hints at once and only those rules run (:func:`hints_in`).
"""

from __future__ import annotations

import functools
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
    #: For each of ``plain_hints``, the runs of three characters it holds, as bits of
    #: :func:`_gram_bits` (0: none, a hint of one or two characters; or one not ASCII).
    plain_grams: tuple[int, ...]
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
                 _hint_grams(tuple(plain_by_hint)), tuple(anchored))
    if rules is RULES or rules is FORMAT_RULES:
        _PLANS[id(rules)] = plan
    return plan


# -- looking for the hints --------------------------------------------------------------

#: Texts this long or longer are looked for the plain hints of three characters or more
#: through the runs of three ASCII characters they hold (numpy): the ~80 hints, each a
#: scan of the whole text, cost ~0.1 ms over a Chinese note of 2,000 characters; one pass
#: over its runs rules out nearly all of them, and only the hints left are scanned for.
#: Shorter texts are not worth the arrays.
GRAMS_CHARS: Final = 256
#: Runs are numbered by a hash below this (a text's are marked in a table of this size;
#: :func:`_grams_present` computes the hash in 16 bits).
_GRAM_TABLE: Final = 1 << 16


def _grams(hint: str) -> set[int]:
    """The numbers of an ASCII ``hint``'s runs of three characters, as
    :func:`_grams_present` numbers a text's."""
    c = [ord(x) for x in hint]
    return {(a << 10 ^ b << 5 ^ d) % _GRAM_TABLE for a, b, d in zip(c, c[1:], c[2:], strict=False)}


def _hint_grams(hints: tuple[str, ...]) -> tuple[int, ...]:
    """Each hint's runs (:func:`_grams`), as bits numbered in :func:`_gram_bits`."""
    bits = _gram_bits(hints)
    return tuple(sum(1 << bits[g] for g in _grams(h)) if h.isascii() and len(h) > 2 else 0
                 for h in hints)


def _gram_bits(hints: tuple[str, ...]) -> dict[int, int]:
    """Run number (:func:`_grams`) -> its bit, for the runs the ASCII hints hold."""
    grams = sorted(set[int]().union(*(_grams(h) for h in hints
                                      if h.isascii() and len(h) > 2)))
    return {gram: bit for bit, gram in enumerate(grams)}


def hints_in(plan: Plan, lower: str) -> list[str]:
    """The plain hints of ``plan`` that ``lower`` (a text in lowercase) holds."""
    hints = plan.plain_hints
    if len(lower) < GRAMS_CHARS:
        return [h for h in hints if h in lower]
    # A hint the text holds has each of its runs in the text's ASCII characters read
    # without the others (dropping them only joins more runs; two runs numbered alike
    # only let more hints on): a hint missing one of its runs there is not in the text.
    # The others are looked for.
    # A hint of two characters is in the text only where both its characters are: those
    # are searched for first, each by a search for one character, much faster than
    # one for two (marking the text's pairs of characters as its runs cost more still).
    present = _grams_present(plan, lower)
    return [h for h, need in zip(hints, plan.plain_grams, strict=True)
            if present & need == need and (len(h) != 2 or (h[0] in lower and h[1] in lower))
            and h in lower]


def _grams_present(plan: Plan, lower: str) -> int:
    """The bits of ``plan``'s hint runs (:func:`_hint_grams`) found in ``lower``."""
    import numpy as np

    # In 16 bits the shifts drop what :func:`_grams` takes ``% _GRAM_TABLE`` off.
    c = np.frombuffer(lower.encode("ascii", "ignore"), dtype=np.uint8).astype(np.uint16)
    seen = np.zeros(_GRAM_TABLE, dtype=np.bool_)
    seen[c[:-2] << 10 ^ c[1:-1] << 5 ^ c[2:]] = True
    found = seen[_gram_array(plan.plain_hints)]
    return int.from_bytes(np.packbits(found, bitorder="little").tobytes(), "little")


@functools.cache
def _gram_array(hints: tuple[str, ...]) -> npt.NDArray[np.intp]:
    """The run numbers of ``hints``, in the order of their bits."""
    import numpy as np

    return np.array(list(_gram_bits(hints)), dtype=np.intp)
