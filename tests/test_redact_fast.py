"""Redaction's fast paths against their straightforward definitions, on generated text.

``find_spans`` looks for token runs in the text marked byte by byte (``token_runs``), finds the
anchors of the context rules with one factored pattern (``anchors``; in a long text only where
the low bytes of four characters may start a word), and runs a token
rule's pattern before looking for its hints where the runs are a small part of the text.
Each must give what the plain definitions give: ``TOKEN_RUN.finditer``, one ``find`` loop
per anchor word, and every rule's hints checked first; and it reads a text through
the invisible characters and escapes inside its tokens, mapping each span found so back
as mapping it character by character gives. It runs the rules by kind, not in the order
of the table, the format rules over the whole text only where one of their hints is
(``secret_plan``): the order changes no span.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.memory import (
    secret_anchors,
    secret_config,
    secret_context,
    secret_rules,
)
from recalld.daemon.memory.redact import _merge, find_spans
from recalld.daemon.memory.secret_anchors import anchor_words, anchors
from recalld.daemon.memory.secret_forms import as_ascii
from recalld.daemon.memory.secret_plan import GRAMS_CHARS, hints_in, plan_of
from recalld.daemon.memory.secret_reading import token_reading
from recalld.daemon.memory.secret_rules import (
    RULES,
    TOKEN_RUN,
    Rule,
    Span,
    rules_token_prefilter,
    token_runs,
)
from recalld.daemon.memory.secret_values import classes
from recalld.daemon.memory.token_starts import LONG_RUN, boundary_led, matches

sys.path.insert(0, str(Path(__file__).parent / "bench"))

import redact_corpus

_CORPUS = redact_corpus.generate(seed=11, per_kind=2)
_SECRETS = sorted({item.secret for item in _CORPUS})
_SENTENCES = sorted({item.text for item in _CORPUS})


def reference_anchors(text: str, lower: str) -> list[int]:
    found: set[int] = set()
    for word in secret_anchors._ANCHOR_WORDS:
        i = lower.find(word)
        while i >= 0:
            found.add(i)
            start = i
            while (start > 0 and i - start < secret_anchors._NAME_REACH
                   and text[start - 1] in secret_anchors._NAME_CHARS):
                start -= 1
            found.add(start)
            i = lower.find(word, i + 1)
    return sorted(found)


def reference_find_spans(text: str, rules: Sequence[Rule] = RULES) -> list[Span]:
    """:func:`_hints_first` on the text, and on the text as it reads inside its tokens
    (``secret_reading.token_reading``), each span found there mapped back character by
    character: each character kept to itself, each character an escape spells to the
    whole escape (compatibility forms of ASCII characters read as those first)."""
    text = as_ascii(text)
    reading = token_reading(text)
    if reading is None:
        return _hints_first(text, rules)
    origin: list[Span] = []  # where each character of the reading came from
    pos = 0
    for source, length, read in zip(reading.source, reading.source_len, reading.read,
                                    strict=True):
        origin.extend((i, i + 1) for i in range(pos, source))
        origin.extend([(source, source + length)] * read)
        pos = source + length
    origin.extend((i, i + 1) for i in range(pos, len(text)))
    assert len(origin) == len(reading.text)
    assert "".join(text[a:b] if b - a == 1 else reading.text[i]
                   for i, (a, b) in enumerate(origin)) == reading.text
    return _merge(_hints_first(text, rules) + [
        (origin[s][0], origin[e - 1][1]) for s, e in _hints_first(reading.text, rules)])


def _hints_first(text: str, rules: Sequence[Rule]) -> list[Span]:
    """Every rule's hints checked first, each rule's pattern run where they are (on the
    text as the rules read it)."""
    if not text:
        return []
    lower = text.lower()
    if len(lower) != len(text):
        lower = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    spans: list[Span] = []
    runs = [m.span() for m in TOKEN_RUN.finditer(text)]
    for rule in rules:
        if rule.hints and not any(h in lower for h in rule.hints):
            continue
        if rule.anchored is not None:
            spans.extend(rule.anchored(text, reference_anchors(text, lower)))
        elif rule.find is not None and rule.token:
            for pos, endpos in runs:
                spans.extend(rule.find(text, pos, endpos))
        elif rule.find is not None:
            spans.extend(rule.find(text, 0, len(text)))
    return _merge([s for s in spans if s[1] > s[0]])


# Pieces of notes: prose, credential words glued to names, token characters in runs of
# every length around the 16 a run needs, CJK, emoji, line breaks, and whole secrets.
_PIECE = st.sampled_from([
    " ", "\n", "\n\n", ". ", ", ", ": ", "=", "-", "_", "/", "the note says ", "password",
    "Password", "PASS", "pw", "apin", "appat", "token", "api_key", "dbPassword", "DB_",
    "--token ", "sig=", "://", "user:", "@host", "Bearer ", "key-", "sk-", "ghp_", "AKIA",
    "akia", "eyJ", "\u200b", "\u00ad", "\ufeff", "%5F", "%2D", "%2570", "\\x70",
    "\\u0070", "=5F", "=\n", "=\r\n", "&#95;", "&#x2d;", "%2F", "%20",
    "密码是", "口令：", "记忆", "中文", "😀", "🔑", "é", "İ", "ß", "ﬃ",
    "a" * 15, "b" * 16, "c" * 17, "x9Y" * 7, "0123456789abcdef" * 3, "-" * 16, "Q~",
])
_TEXT = st.lists(_PIECE | st.sampled_from(_SECRETS) | st.sampled_from(_SENTENCES),
                 max_size=24).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab9_-.:/+=~ \n中😀é\x00\x7f\xff?\udc80"), max_size=80)
       | _TEXT)
def test_token_runs_are_the_pattern_matches(text: str) -> None:
    assert token_runs(text) == [m.span() for m in TOKEN_RUN.finditer(text)]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("aZ9_-/+=~ Ééß中٣Ⅷǅ\u0345"), max_size=40)
       | st.text(max_size=40))
def test_the_classes_of_a_value_are_those_of_its_characters(value: str) -> None:
    assert classes(value) == (any(c.isdigit() for c in value),
                              any(c.isupper() for c in value),
                              any(c.islower() for c in value),
                              any(not c.isalnum() for c in value))


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_anchors_are_every_occurrence_of_every_word(text: str) -> None:
    lower = text.lower()
    if len(lower) == len(text):
        assert anchors(text, lower) == reference_anchors(text, lower)
        # A hint that is an anchor word is in the text exactly where an anchor word
        # starts with it (find_spans decides the context rules' hints so).
        words = anchor_words(lower)
        for hint in secret_anchors.ANCHOR_WORDS:
            assert (hint in lower) == any(lower.startswith(hint, i) for i in words)


def test_anchor_words_beyond_ascii_are_found_in_text_mostly_ascii() -> None:
    # A text with no character of the words beyond ASCII is searched for the others
    # only: a curly quote or an emoji is no such character, each word's own is.
    ascii_prose = "the bot\u2019s path to the app \U0001f600 has no pin, " * 3
    for word in secret_anchors._ANCHOR_WORDS:
        for text in (ascii_prose + word + ": x", word.upper() + " " + ascii_prose):
            lower = text.lower()
            if len(lower) == len(text):
                assert anchor_words(lower) == sorted(
                    {i for w in secret_anchors._ANCHOR_WORDS for i in range(len(lower))
                     if lower.startswith(w, i)}), text


def _word_starts(lower: str) -> list[int]:
    return sorted({i for w in secret_anchors._ANCHOR_WORDS for i in range(len(lower))
                   if lower.startswith(w, i)})


@settings(max_examples=200, deadline=None)
@given(_TEXT, st.sampled_from(["x", "\u00e9", "\u2019", "\u4e2d", "\U0001f600", "\ud800",
                               "\u043f", "\u0161"]))
def test_anchor_words_in_long_texts_are_every_word_start(text: str, filler: str) -> None:
    # A long text is looked over by the low bytes of its characters first: characters of
    # every width, and the words at its very end, are found as a search finds them.
    long_text = filler * secret_anchors.LONG_TEXT + text
    lower = long_text.lower()
    if len(lower) == len(long_text):
        assert anchor_words(lower) == _word_starts(lower)


def test_every_anchor_word_is_found_at_and_before_the_end_of_a_long_text() -> None:
    for word in secret_anchors._ANCHOR_WORDS:
        for filler in ("a", "\u0161", "\u4e2d", "\U0001f600"):
            for lower in (filler * secret_anchors.LONG_TEXT + word,
                          filler * secret_anchors.LONG_TEXT + word + filler):
                assert anchor_words(lower) == _word_starts(lower), (word, filler)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["value", "VALUE", "vAlUe", "valu", "alue", "v", "V", ":", "|",
                                  ">", "-", "\"", "'", " ", "\t", "=", "\n", "x", "\u212a",
                                  "default", "DEFAULT", "dEfAuLt", "efault", "defaul", "d"]),
                max_size=12).map("".join))
def test_a_configuration_layout_is_found_as_its_definition_finds_it(text: str) -> None:
    definition = re.compile(r"(?i):[ \t]*[|>]|(?:value|default)[\"']?[ \t]*[:=]")
    for each in (text, "token: >-", "token:|", "Value =", "vALUE':", "value\t:", "v: x",
                 "default: x", "Default=", "DEFAULT\":"):
        assert ((secret_config._LAYOUT.search(each) is None)
                == (definition.search(each) is None)), each
        # The layout gates the value fields: a text holding one holds a layout.
        if secret_config._VALUE_FIELD.search(each) is not None:
            assert secret_config._LAYOUT.search(each) is not None, each


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["set", "SET", "\u017fet", "reset", "Change", "changed",
                                  "UPDATES", "updated", "rotate", "Rotated", " ", "\t", "x",
                                  "_", "\u00e9", "1", "-", "\n", "s", "r", "\ufb05"]),
                max_size=10).map("".join), st.integers(0, 40), st.integers(0, 40))
def test_a_setting_verb_is_found_as_its_definition_finds_it(text: str, pos: int,
                                                            endpos: int) -> None:
    # From a position inside the text too: the word boundary reads the character before.
    definition = re.compile(r"(?i)\b(?:set|change[ds]?|reset|update[ds]?|rotated?)[ \t]")
    for each, a, b in ((text, pos, endpos), (text, 0, len(text)), ("xset reset ", 1, 11),
                       ("\u017fet x", 0, 9), ("_Reset\t\u00e9set ", 0, 12),
                       ("so, rotated it", 0, 14), ("1update ", 0, 8)):
        assert ([m.span() for m in secret_context._SET_VERB.finditer(each, a, b)]
                == [m.span() for m in definition.finditer(each, a, b)]), each


def test_the_context_rules_hints_are_anchor_words() -> None:
    # Else find_spans looks for them with a scan each (still right, only slower).
    context = [rule for rule in RULES if rule.anchored is not None]
    assert context and all(secret_anchors.ANCHOR_WORDS.issuperset(r.hints) for r in context)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_find_spans_matches_hints_first(text: str) -> None:
    assert find_spans(text) == reference_find_spans(text)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_the_token_prefilter_matches_where_a_token_rule_does(text: str) -> None:
    # find_spans gives token rules only the runs where the prefilter matches.
    token = [rule for rule in RULES if rule.find is not None and rule.token]
    prefilter = rules_token_prefilter()
    assert prefilter is not None and all(rule.pattern is not None for rule in token)
    for pos, endpos in token_runs(text):
        some_rule = any(rule.pattern.search(text, pos, endpos) is not None
                        for rule in token if rule.pattern is not None)
        assert prefilter.search(text, pos, endpos) == some_rule
    # A rule list of its own (not RULES itself) gets its own prefilter, same spans.
    assert find_spans(text, list(RULES)) == find_spans(text)


# Long runs (a blob, a minified line) are matched at their token starts only: the pieces
# above joined with runs longer than LONG_RUN of letters, digits, base64 or escapes.
_LONG = st.sampled_from(["a" * LONG_RUN, "Zq7" * (LONG_RUN // 3 + 1), "b/9+" * (LONG_RUN // 4),
                         "%3D" * (LONG_RUN // 3), "x\\u0022" * (LONG_RUN // 7 + 1)])
_LONG_TEXT = st.lists(_LONG | _PIECE | st.sampled_from(_SECRETS), max_size=12).map("".join)


@settings(max_examples=100, deadline=None)
@given(_LONG_TEXT)
def test_long_runs_are_matched_where_finditer_matches(text: str) -> None:
    token = [r.pattern for r in RULES if r.find is not None and r.token and r.pattern]
    led = [p for p in token if boundary_led(p.pattern)]
    assert len(led) >= len(token) - 3  # all but the AGE key and the two wrapped blobs
    prefilter = rules_token_prefilter()
    assert prefilter is not None
    for pos, endpos in token_runs(text):
        for rx in led:
            assert ([m.span() for m in matches(rx, text, pos, endpos)]
                    == [m.span() for m in rx.finditer(text, pos, endpos)])
        assert prefilter.search(text, pos, endpos) == any(
            rx.search(text, pos, endpos) is not None for rx in token)
    assert find_spans(text) == reference_find_spans(text)


def test_find_spans_matches_hints_first_on_the_corpus() -> None:
    # Each labelled sentence alone (runs are most of it: hints first) and inside prose
    # long enough that the patterns of token rules go first.
    prose = "an ordinary line of a note, with nothing secret in it at all\n" * 8
    found = 0
    for item in _CORPUS:
        for text in (item.text, prose + item.text + prose, item.text + "。" * 400):
            spans = find_spans(text)
            assert spans == reference_find_spans(text)
            found += bool(spans)
    assert found >= len(_CORPUS)  # the sentences hold secrets: spans were found


def test_the_format_rules_share_the_rules_token_prefilter() -> None:
    # find_spans gives FORMAT_RULES RULES' compiled prefilter.
    format_token = [r for r in secret_rules.FORMAT_RULES if r.find is not None and r.token]
    rules_token = [r for r in RULES if r.find is not None and r.token]
    assert format_token == rules_token
    assert secret_rules.token_prefilter(secret_rules.FORMAT_RULES) == rules_token_prefilter()


@settings(max_examples=200, deadline=None)
@given(_TEXT)
def test_the_order_of_the_rules_changes_no_span(text: str) -> None:
    # find_spans runs the rules by kind (secret_plan), not in the order of the table.
    assert find_spans(text, list(reversed(RULES))) == find_spans(text)


def test_each_format_rule_over_the_text_runs_where_one_of_its_hints_is() -> None:
    plan = plan_of(RULES)
    assert plan_of(RULES) is plan  # planned once
    plain = [r for r in RULES if r.anchored is None and r.find is not None and not r.token]
    assert [id(f) for f in plan.plain] == [id(r.find) for r in plain]
    for i, rule in enumerate(plain):
        assert all(i in plan.plain_by_hint[h] for h in rule.hints)
        assert (i in plan.plain_always) == (not rule.hints)
    assert set(plan.plain_hints) == {h for r in plain for h in r.hints}


_HINTS = plan_of(RULES).plain_hints
# Hints whole and cut in two, with characters between the pieces that are no ASCII (left
# out when the runs of characters are read), in texts long enough to be read so.
_HINT_PIECE = st.sampled_from([*_HINTS, *(h[:len(h) // 2] for h in _HINTS),
                               *(h[len(h) // 2:] for h in _HINTS),
                               "中", "é", "😀", "İ", " ", "\n", "Az", "SET"])
_HINT_TEXT = st.tuples(st.lists(_HINT_PIECE, max_size=40).map("".join),
                       st.sampled_from(["中", "a", " ", "é😀"])).map(
    lambda t: t[0] + t[1] * GRAMS_CHARS)


@settings(max_examples=300, deadline=None)
@given(_HINT_TEXT | _TEXT)
def test_the_hints_found_are_those_the_text_holds(text: str) -> None:
    lower = text.lower()
    assert hints_in(plan_of(RULES), lower) == [h for h in _HINTS if h in lower]
