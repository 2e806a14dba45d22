"""Keys in compatibility forms of ASCII (full-width, mathematical, small forms) with a
character that shows nothing inside: read through as the ASCII key is, and the table of
such forms covers every character that NFKC makes one ASCII character."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.memory.redact import redact, redact_parts, seam_spans
from recalld.daemon.memory.secret_forms import as_ascii, ascii_forms, read_forms
from recalld.daemon.memory.secret_names import mask_name
from recalld.daemon.memory.secret_rules import INVISIBLE as SHOWS_NOTHING

GITHUB = "ghp_" + "Wd3Rk8Tq1Zm6Yv9Xb2Nc5Lf7Hj4Gp0Sa8Ke1"
AWS_ID = "AKIA" + "J7QX2M5RB9TZ4WNC"
OPENAI = "sk-proj-" + "Hf6Jd9Ks2Lq5Wm8Xn1Zb4Vc7Gt0Yr3Pe6Ua9Io2"


def full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def math_bold(text: str) -> str:
    def bold(c: str) -> str:
        if "A" <= c <= "Z":
            return chr(0x1D400 + ord(c) - ord("A"))
        if "a" <= c <= "z":
            return chr(0x1D41A + ord(c) - ord("a"))
        if "0" <= c <= "9":
            return chr(0x1D7CE + ord(c) - ord("0"))
        return c
    return "".join(bold(c) for c in text)


FORMS = {"full-width": full_width, "mathematical bold": math_bold,
         "full-width prefix": lambda key: full_width(key[:4]) + key[4:]}
INVISIBLE = ["\u200b", "\u200c", "\u00ad", "\u2060", "\ufeff", "\u034f"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("key", [GITHUB, AWS_ID, OPENAI])
def test_a_key_in_another_form_cut_by_an_invisible_character_is_masked(form: str,
                                                                      key: str) -> None:
    shown = FORMS[form](key)
    for at, mark in zip((4, 5, 9, 13, 2, 7), INVISIBLE, strict=True):
        cut = shown[:at] + mark + shown[at:]
        for text in (cut, f"the key is {cut} for the build"):
            got = redact(text)
            assert "[REDACTED]" in got, (form, repr(cut))
            # No piece of the key that could be put back together is left.
            assert shown[at + 1:at + 8] not in got and shown[-6:] not in got, repr(got)
        assert mask_name(cut + ".md") == "[REDACTED].md", repr(cut)


def test_plain_text_in_other_forms_stays() -> None:
    for text in ("ｈｅｌｌｏ\u200bｗｏｒｌｄ", "x² + y² = r²", "ｐａｇｅ\u00adｎｕｍｂｅｒ ２",
                 "𝐓𝐡𝐞 𝐫𝐞𝐩𝐨𝐫𝐭 is due"):
        assert redact(text) == text


def test_the_forms_table_holds_every_character_nfkc_makes_one_ascii_character() -> None:
    found = {}
    for c in range(0x80, 0x30000):
        form = unicodedata.normalize("NFKC", chr(c))
        if len(form) == 1 and form.isascii() and form.isprintable():
            found[c] = ord(form)
    assert ascii_forms() == found


@pytest.mark.parametrize("form", FORMS)
def test_a_key_in_another_form_cut_between_two_messages_is_masked_in_both(form: str) -> None:
    shown = FORMS[form](GITHUB)
    for at in (6, 20, len(shown) - 6):
        for mark in ("", "\u200b"):
            before, after = "x" * 500 + " my key is " + shown[:at] + mark, shown[at:] + " ok"
            ends, starts = seam_spans(before, after)
            assert ends and starts, (form, at, repr(mark))
            assert redact_parts([before], [ends])[0].endswith("my key is [REDACTED]")
            assert redact_parts([after], [starts])[0] == "[REDACTED] ok"


def test_long_and_short_texts_read_every_form_alike() -> None:
    # Long texts are read through a table lookup, short ones by str.translate: every
    # character of the table, characters beyond it, a lone surrogate and a piece boundary
    # read the same either way.
    import random

    forms = ascii_forms()
    pool = [chr(c) for c in forms] + ["中", "文", "。", "a", " ", "\n", "\U0001f600",
                                      "\U0010fffd", "\udc80", chr(max(forms) + 1)]
    rng = random.Random(7)
    for size in (600, 70_000):
        text = "".join(rng.choice(pool) for _ in range(size))
        read = as_ascii(text)
        assert len(read) == len(text)
        assert read == text.translate(forms)
        assert as_ascii(read) == read
    plain = "中文没有别的形式。" * 100
    assert as_ascii(plain) is plain


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["，", "：", "\u3000", "ｇ", "\u00a0", "\U0001d400", "\U0001d7ce",
                                 "\u2460", "中", "😀", "\U0010fffd", "\udc80", "é", "a", " ",
                                 "\n", "\u200b", "\u00ad", "\ufeff", "\U000e0041",
                                 "中文" * 40, "，" * 30, "😀" * 20]),
                max_size=60).map("".join))
def test_a_text_with_a_few_kinds_of_forms_reads_as_translated(text: str) -> None:
    # A few kinds are replaced one by one; more kinds, or many characters beyond the BMP
    # that are no form, send the rest of the text to the table (or ``str.translate``).
    # The characters that show nothing are seen in the same pass: a text said to hold
    # none holds none.
    read, invisible = read_forms(text)
    assert read == as_ascii(text) == text.translate(ascii_forms())
    assert as_ascii(read) == read
    assert invisible or SHOWS_NOTHING.search(read) is None
