"""``nfkc.normalize`` is NFKC: its tables against ``unicodedata``, the function against
``unicodedata.normalize`` on generated text."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.index import nfkc


def _ranges(cps: list[int]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for cp in cps:
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return tuple((a, z) for a, z in out)


def _tables() -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """The boundary characters (NFKD begins with a starter that composes with nothing
    before it) and those of them NFKC leaves alone, from the definitions."""
    seconds = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # Hangul V, T
    for cp in range(0x110000):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<") and len(d.split()) == 2:
            seconds.add(int(d.split()[1], 16))
    boundary: list[int] = []
    stable: list[int] = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        d0 = unicodedata.normalize("NFKD", c)[0]
        if (unicodedata.combining(c) or unicodedata.combining(d0) or cp in seconds
                or ord(d0) in seconds):
            continue
        boundary.append(cp)
        if unicodedata.normalize("NFKC", c) == c:
            stable.append(cp)
    return _ranges(boundary), _ranges(stable)


@pytest.mark.skipif(unicodedata.unidata_version != nfkc.UNICODE_VERSION,
                    reason="the tables are for another Unicode version (normalize falls "
                           "back to unicodedata there)")
def test_tables_are_computed_from_unicodedata() -> None:
    boundary, stable = _tables()
    assert nfkc.BOUNDARY == boundary, f"BOUNDARY = {boundary!r}"
    assert nfkc.STABLE == stable, f"STABLE = {stable!r}"


# Characters around every rule: full-width forms, compatibility characters, combining
# marks before and after their bases, Hangul jamo that compose with a syllable, half-width
# katakana with their voicing marks, CJK of several planes, emoji with variation
# selectors, ligatures, and ASCII.
_CHARS = st.sampled_from([
    "a", "e", "A", " ", "\n", ",", "，", "：", "（", "ＡＢ", "１", "\u3000", "。", "、", "中",
    "文", "𠀀", "가", "\u1100", "\u1161", "\u11a8", "\u0301", "\u0308", "\u0323", "é", "ﬃ",
    "…", "\u00a0", "ｶ", "ﾞ", "ﾟ", "か", "\u3099", "\u309b", "ㄱ", "①", "㍻", "Ω", "Å",
    "😀", "\ufe0f", "\u0f73", "\u0f71", "ǅ", "ß", "İ", "\u0345", "\u1e9b", "\u0338", "=",
]) | st.characters(blacklist_categories=("Cs",))


@settings(max_examples=600, deadline=None)
@given(st.lists(_CHARS, max_size=30).map("".join))
def test_normalize_is_nfkc(text: str) -> None:
    assert nfkc.normalize(text) == unicodedata.normalize("NFKC", text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["中文", "，", "记忆", "ＡＢＣ", "１２", "\u3000", "한국어",
                                 "カタカナ", " the note ", "😀"]), max_size=40).map("".join))
def test_normalize_is_nfkc_on_boundary_text(text: str) -> None:
    # Text made only of boundary characters takes the character-by-character path.
    assert nfkc.normalize(text) == unicodedata.normalize("NFKC", text)
