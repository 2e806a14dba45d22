"""Redaction of text made of long token-like words (random letters, base64, hashes,
minified code): the token patterns are tried where a token can start in each word, not
at each of its characters (which cost 10-20 times what prose does; speed is not timed
in tests, only the tries counted); and those places are the ones their definition
names."""

from __future__ import annotations

import random
import re
import string
from dataclasses import replace
from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.memory import token_starts as starts_module
from recalld.daemon.memory.secret_rules import rules_token_prefilter, token_runs


def _words(size: int, length: int, alphabet: str, seed: int) -> str:
    rng = random.Random(seed)
    words = ["".join(rng.choices(alphabet, k=length)) for _ in range(size // (length + 1) + 1)]
    return " ".join(words)[:size]


class _Tries:
    """A pattern's ``match`` and ``search``, counted."""

    def __init__(self, rx: re.Pattern[str]) -> None:
        self.rx = rx
        self.matched = 0
        self.searched = 0

    def match(self, text: str, pos: int, endpos: int) -> re.Match[str] | None:
        self.matched += 1
        return self.rx.match(text, pos, endpos)

    def search(self, text: str, pos: int, endpos: int) -> re.Match[str] | None:
        self.searched += 1
        return self.rx.search(text, pos, endpos)


def test_a_short_token_run_is_tried_at_its_token_starts_only() -> None:
    prefilter = rules_token_prefilter()
    assert prefilter is not None and prefilter.led is not None
    tries = _Tries(prefilter.led)
    counted = replace(prefilter, led=cast(re.Pattern[str], tries))
    for length, alphabet in ((20, string.ascii_lowercase), (50, string.ascii_letters),
                             (200, string.hexdigits.lower()), (64, string.digits)):
        text = _words(4_000, length, alphabet, seed=length)
        tries.matched = tries.searched = 0
        runs = token_runs(text)
        assert runs
        for pos, endpos in runs:
            assert counted.search(text, pos, endpos) == prefilter.search(text, pos, endpos)
        # Each word has one token start (its first character): one try each, never a
        # search trying the alternation at every character of it.
        assert (tries.searched, tries.matched) == (0, len(runs))


def _reference_starts(text: str, pos: int, endpos: int) -> list[int]:
    """``token_starts`` by its definition: ``pos``, each place after a character that is
    no ASCII letter or digit, each end of each escape form matched where it starts."""
    found = {pos}
    for at in range(max(0, pos - 6), endpos):
        if not (text[at].isascii() and text[at].isalnum()) and pos <= at + 1 < endpos:
            found.add(at + 1)
        for form in starts_module._ESCAPE_FORMS:
            m = re.compile(form).match(text, at, endpos)
            if m is not None and pos <= m.end() < endpos:
                found.add(m.end())
    return sorted(found)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="aZ3%=\\25uxDf0-_.n é", min_size=1, max_size=40), st.data())
def test_token_starts_are_those_of_the_definition(text: str, data: st.DataObject) -> None:
    # One scan finds the escapes' ends (``%253D`` ends two: ``%25`` and ``%253D``).
    pos = data.draw(st.integers(0, len(text) - 1))
    endpos = data.draw(st.integers(pos + 1, len(text)))
    assert starts_module.token_starts(text, pos, endpos) == _reference_starts(text, pos, endpos)
