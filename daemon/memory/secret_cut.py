"""A token cut at the end of a text whose rest comes later (a chat client splitting a
long paste over two ``memory.add_turns`` calls): its start is masked at once, as the text
is written before the rest comes. No I/O, no state."""

from __future__ import annotations

import itertools
import re
from typing import Final

from recalld.daemon.memory.redact import RUN_END, SEAM, find_spans
from recalld.daemon.memory.secret_forms import as_ascii
from recalld.daemon.memory.secret_rules import FORMAT_RULES, Span
from recalld.daemon.memory.secret_values import classes

#: Token characters read after a text that ends in a run of them, as the rest of a token
#: cut there could be, each at every length up to ``_REST_CHARS``: many formats have a
#: fixed length. The rest goes on as the run's last characters do (digits, upper case
#: and digits, lower-case hex), and in mixed case (the last).
_RESTS: Final = ("8302749165", "Q7X2K9M4ZP3R8T6W5N1V", "3f9a0c7e1b5d2a8f6e4c",
                 "kT9vQ2xR7mW4pZ8sN3bL")
_REST_OF: Final = (re.compile(r"[0-9]+\Z"), re.compile(r"[A-Z0-9]+\Z"),
                   re.compile(r"[a-f0-9]+\Z"))
_REST_CHARS: Final = 64
#: The shortest start of a cut token masked at a text's end (a shorter one tells little,
#: and is more likely a word: ``sk-learn``); the characters before it read with it.
_MIN_CUT_CHARS: Final = 10
_CUT_CONTEXT: Final = 16


def cut_token_spans(text: str) -> list[Span]:
    """The span of the start of a token ``text`` ends in, cut before its end (a chat client
    splitting a long paste, the rest handed over in the next call): a run of token
    characters at the very end that a format rule finds were it to go on, by what the run
    holds (a distinctive prefix: ``ghp_``, ``sk-proj-``, ``AKIA``...), not by the rest read
    after it alone (an identifier, a hash or a path followed by random characters is not
    taken). The text is written before the next call comes, so the start is masked now;
    :func:`~recalld.daemon.memory.redact.seam_spans` masks the rest then."""
    start = max(0, len(text) - SEAM)
    end_of = as_ascii(text[start:])
    tail = RUN_END.search(end_of)
    if tail is None or tail.end() - tail.start() < _MIN_CUT_CHARS:
        return []
    lead = max(0, tail.start() - _CUT_CONTEXT)
    start, before, run = start + lead, end_of[lead:tail.start()], end_of[tail.start():]
    cut = len(before) + len(run)
    read = before + run
    # Only a rule one of whose hints the run holds where a token starts (a prefix, not
    # a lone ``-`` or ``:``, nor the ``ac`` of ``back``) finds a token by what it holds.
    low = run.lower()
    rules = [rule for rule in FORMAT_RULES
             if any(len(hint) > 1 and _starts(low, hint) for hint in rule.hints)]
    rests = [rest * ((len(run) + _REST_CHARS) // len(rest) + 1) for rest in _RESTS]
    first = next((k for k, kind in enumerate(_REST_OF) if kind.search(run[-4:])), -1)
    tried = dict.fromkeys((rests[first], rests[-1]))
    for rule in rules:
        for rest, n in itertools.product(tried, range(1, _REST_CHARS + 1)):
            starts = [s for s, e in find_spans(read + rest[:n], (rule,))
                      if s <= cut - _MIN_CUT_CHARS and cut < e]
            # Found by what the run holds: not with the rest read from there on; and
            # a start as generated keys have one (a digit, or both cases), not a word
            # after a prefix (``sk-learning``).
            starts = [s for s in starts if _keylike(read[s:cut]) and not any(
                cut < e for other in rests
                for _, e in find_spans(read[:s] + other[:cut - s + n], (rule,)))]
            if starts:
                return [(start + min(starts), start + cut)]
    return []


def _starts(run: str, hint: str) -> bool:
    """Whether ``hint`` is in ``run`` where a token may start (a boundary-led rule's
    prefix): at its start or after a character that is no letter or digit; a hint that
    opens with one (``_live_``, ``.atlasv1.``) anywhere."""
    if not hint[0].isalnum():
        return hint in run
    at = run.find(hint)
    while at >= 0:
        if at == 0 or not run[at - 1].isalnum():
            return True
        at = run.find(hint, at + 1)
    return False


def _keylike(piece: str) -> bool:
    digit, upper, lower, _ = classes(piece)
    return digit or (upper and lower)
