"""Passwords holding the characters that end a value in a URL's query or a parenthesis
(``( ) [ ] { } < > & ; , | '``): the patterns stopped there, so only the part before was
masked, and a password whose first part was too short to judge (``Ab3(xY9)z``) was left
whole. What surrounds a value (a closing parenthesis, a full stop) stays."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact

DJANGO = "django-insecure-5y#2a@k!x8z$w0^p%q&r*t(u)v-b=n+m"


@pytest.mark.parametrize(("text", "secret"), [
    (f"SECRET_KEY={DJANGO}", DJANGO),
    (f"export SECRET_KEY={DJANGO}\nDEBUG=1", DJANGO),
    ("the password is Ab3(xY9)z!", "Ab3(xY9)z"),
    ("my password is Ab3&xY9)z", "Ab3&xY9)z"),
    ("password: Qw7<er>Ty9", "Qw7<er>Ty9"),
    ("password=Ab3;xY9|z,Q1", "Ab3;xY9|z,Q1"),
    ("export DB_PASSWORD=Zx9[k]Lm{2}Qp", "Zx9[k]Lm{2}Qp"),
    ("set the password to Pz4'Lm9(q", "Pz4'Lm9(q"),
    ("服务器的 password：Ab3(xY9)z", "Ab3(xY9)z"),
])
def test_the_whole_password_is_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert MASK in out, out
    # No piece of it after the character the patterns stopped at survives.
    for cut in range(3, len(secret) - 2):
        assert secret[cut:] not in out, (secret[cut:], out)


@pytest.mark.parametrize(("text", "kept"), [
    ("(password=Ab3xY9z7) and more", ") and more"),
    ("note (the password is Ab3xY9z7), then", "), then"),
    ("the password is Ab3xY9z7.", "."),
])
def test_what_follows_the_password_stays(text: str, kept: str) -> None:
    out = redact(text)
    assert MASK in out and out.endswith(kept), out


@pytest.mark.parametrize("text", [
    "the password is stored(encrypted).",
    "the key is in the vault (ask ops)",
    "the password is stored(encrypted) and rotated(monthly)",
])
def test_words_with_brackets_are_left_alone(text: str) -> None:
    assert redact(text) == text
