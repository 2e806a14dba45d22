"""The tokenizer's fast paths against the straightforward definition, on generated text.

``tokenize_split`` splits CJK runs off before finding words, looks each distinct word's
terms up in a memo, and normalizes through ``nfkc.normalize``; the reference below is
one pattern for CJK runs and words, full NFKC, and every token handled one by one.
"""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from recalld.daemon.index import tokenizer
from recalld.daemon.index.marks import MARKS
from recalld.daemon.index.tokenizer import STOPWORDS, tokenize, tokenize_query, tokenize_split

_CJK = tokenizer._CJK_RANGES
_ALNUM = rf"[^\W_{_CJK}]"
# Letters and digits go on through marks, but for those of the scripts paired as CJK
# (a Myanmar vowel sign after a Latin word starts a run of its own).
_MARK = rf"(?:(?![{_CJK}])[{MARKS}])"
_RUN = rf"{_ALNUM}+(?:{_MARK}+{_ALNUM}*)*"
# A name of three or more Latin letters with a number glued on (``node18``).
_NAME_NUMBER = re.compile("([a-zA-Z]{3,})([0-9]+)")
_TOKEN_RE = re.compile(
    rf"([{_CJK}]+)|({_RUN}(?:(?:_*[.\-/]|_+|::){_RUN})*(?:\+\+|[#+](?!{_ALNUM}))?)")


def reference_split(text: str) -> tuple[list[str], list[str]]:
    # Soft hyphens and joiners out (they join, never break), then NFKC.
    norm = unicodedata.normalize("NFKC", re.sub("[\u00ad\u200d\u2060\ufeff]", "", text))
    pairs = _TOKEN_RE.findall(norm)
    # Then the emoji, in the order of the text.
    words = [w for _, w in pairs if w] + tokenizer.emoji_terms(norm)
    runs = [c.casefold() for c, _ in pairs if c]
    # Every word case folded and folded (accents and points off), then stemmed.
    folded = [tokenizer.fold(w.casefold()) for w in words]
    out = [tokenizer._stem(f) for f in folded if f not in STOPWORDS]
    for word in words:
        if not tokenizer._is_plain(word):
            tokenizer._parts(tokenizer.fold(word), out)
        elif (named := _NAME_NUMBER.fullmatch(word)) and named[1].lower() not in STOPWORDS:
            out.append(tokenizer._stem(named[1].lower()))  # python3 is python too
    return out, runs


# Latin words and stopwords in every case, identifiers, connectors next to CJK, CJK of
# several scripts and planes, full-width forms, emoji, combining marks, and very long
# tokens (longer than any memo key seen before).
_PIECE = st.sampled_from([
    "the", "The", "IN", "iN", "memory", "Memories", "running", "ECONNREFUSED",
    "handleWebSocketReconnect", "HTTPServer", "snake_case_name", "v2.3.1", "config.toml",
    "foo-bar.md", "C++", "C#", "c+", "a.", ".b", "-", "_", "/", "+", "#", " ", "\n", ",",
    "::", ":", "__init__.py", "std::vector",
    "，", "。", "中", "文", "记忆", "𠀀", "한국어", "カタカナ", "ｶﾞ", "ＡＢＣ", "１２", "é",
    "e\u0301", "q\u0303", "कि", "\u093f", "ที่", "مُ", "ß", "İ", "ﬃ", "😀", "🔑",
    "👍🏽", "🇨🇭", "❤\ufe0f", "👨\u200d👩", "✅", "x" * 300, "\u00ad", "\u200d", "\u2060",
    "\ufeff", "Ά", "ё", "שָׁ", "Łódź",
    "Ab" * 200, "9" * 50, "python3", "BRCA1", "Windows11", "the2", "k8s", "mp3", "ÀBC1",
])
_TEXT = st.lists(_PIECE | st.text(max_size=6), max_size=30).map("".join)


@settings(max_examples=500, deadline=None)
@given(_TEXT)
@example("the\u1056")  # a Myanmar vowel sign after a Latin word
def test_tokenize_split_is_the_plain_definition(text: str) -> None:
    assert tokenize_split(text) == reference_split(text)


@settings(max_examples=200, deadline=None)
@given(_TEXT)
def test_tokenize_is_the_plain_definition(text: str) -> None:
    words, runs = reference_split(text)
    expected_index, expected_query = list(words), list(words)
    for run in runs:
        tokenizer._cjk(run, expected_index, unigrams=True)
        tokenizer._cjk(run, expected_query, unigrams=False)
    assert tokenize(text) == expected_index
    assert tokenize_query(text) == expected_query


def test_a_full_memo_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The word memos are bounded: past their size they are emptied and refilled, and
    # the terms stay the same.
    text = " ".join(f"word{i} Mixed{i}Case" for i in range(50))
    expected = reference_split(text)
    tokenizer._WHOLE.clear()
    tokenizer._PARTS.clear()
    monkeypatch.setattr(tokenizer._WHOLE, "limit", 7)
    monkeypatch.setattr(tokenizer._PARTS, "limit", 7)
    assert tokenize_split(text) == expected
    assert len(tokenizer._WHOLE) <= 7 and len(tokenizer._PARTS) <= 7
    monkeypatch.undo()
    assert tokenize_split(text) == expected


# Words glued by every connector and suffix, in runs where a backtracking pattern would
# try its alternatives: doubled connectors, `_` next to `.`, `+` before a letter or
# digit, `#` and `++` mid-token, in ASCII and in non-ASCII text.
_GLUE = st.lists(st.sampled_from([
    "a", "Zb", "9", "é", "ǅx", "٣", "_", "__", ".", "-", "/", "+", "++", "#", " ", "中",
]), max_size=40).map("".join)


@settings(max_examples=500, deadline=None)
@given(_GLUE)
def test_compound_words_are_the_plain_definition(text: str) -> None:
    assert tokenize_split(text) == reference_split(text)
