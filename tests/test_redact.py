"""Secrets redaction: many credential shapes masked, ordinary text left alone."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, entropy_bits, redact, redact_count, redact_value

OPENAI = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1w"
ANTHROPIC = "sk-ant-api03-" + "x7Yz" * 8
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0" + "x" * 30
SLACK = "xoxb-" + "1234567890-0987654321-" + "AbCdEfGhIjKlMnOp"
GOOGLE = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
       "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234567890abcdef\n"
       "bm90IGEgcmVhbCBrZXk=\n-----END RSA PRIVATE KEY-----")


@pytest.mark.parametrize("secret", [OPENAI, ANTHROPIC, AWS_ID, GITHUB, GITHUB_PAT, SLACK,
                                    GOOGLE, STRIPE, JWT])
def test_token_shapes_are_masked_anywhere(secret: str) -> None:
    for text in (secret, f"use {secret} please", f"({secret})", f'"{secret}"',
                 f"key={secret}\n", f"汉字{secret}汉字"):
        out = redact(text)
        assert secret not in out, text
        assert MASK in out


def test_private_key_block() -> None:
    text = f"here is my key:\n{PEM}\nthanks"
    out = redact(text)
    assert "MIIEow" not in out and "bm90IGEg" not in out
    assert out.startswith("here is my key:\n") and out.endswith("\nthanks")
    # A block cut off at the end of a message is masked to the end.
    cut = redact("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA")
    assert "b3Blbn" not in cut


@pytest.mark.parametrize(("text", "kept", "gone"), [
    ("password=hunter22", "password=", "hunter22"),
    ("PASSWORD: Tr0ub4dor&3", "PASSWORD: ", "Tr0ub4dor&3"),
    ('{"api_key": "abc123def456"}', '"api_key": "', "abc123def456"),
    ("export OPENAI_API_KEY=someLongValue123", "OPENAI_API_KEY=", "someLongValue123"),
    (f"aws_secret_access_key = {AWS_SECRET}", "aws_secret_access_key = ", AWS_SECRET),
    ("db_pass := 'correct horse battery'", "db_pass := '", "correct horse battery"),
    ("client_secret: 9f8e7d6c5b4a3f2e1d0c", "client_secret: ", "9f8e7d6c5b4a3f2e1d0c"),
    ("github_token=" + "a" * 8 + "0123456789abcdef0123456789abcdef", "github_token=",
     "0123456789abcdef0123456789abcdef"),
    ("Authorization: Bearer abcdefghijklmnop1234", "Bearer ", "abcdefghijklmnop1234"),
    ("curl -H 'Authorization: token 0123456789abcdefABCDEF'", "token ",
     "0123456789abcdefABCDEF"),
    ("postgres://admin:s3cr3tP4ss@db.local:5432/app", "postgres://admin:", "s3cr3tP4ss"),
    ("my wifi password is Tr0ub4dor&3 ok", "password is ", "Tr0ub4dor&3"),
    ("the PIN was 'x9y8z7'", "PIN was '", "x9y8z7"),
    ("session_key=5f0c2a1e-7b3d-4c9a-8e2f-1a2b3c4d5e6f", "session_key=",
     "5f0c2a1e-7b3d-4c9a-8e2f-1a2b3c4d5e6f"),
])
def test_assignments_and_contexts(text: str, kept: str, gone: str) -> None:
    out = redact(text)
    assert gone not in out, out
    assert kept in out, out
    assert MASK in out


@pytest.mark.parametrize("text", [
    "I commute by bike every morning and prefer window seats.",
    "Fixed in commit 3f786850e387550fdab836ed7e6dc881de23001b, see the log.",
    "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b4c0b822cd15d6c15b0f00a08",
    "request id 123e4567-e89b-12d3-a456-426614174000 failed",
    "Token: each word becomes a token in BM25.",
    "The password field is required; the token is refreshed hourly.",
    "password: required",
    "api_key: ${OPENAI_API_KEY}",
    "token = <your token here>",
    "set password=******** in the form",
    "Our meeting is at 10:30, room B2; budget is 4500 EUR.",
    "Use handleWebSocketReconnect() when ECONNREFUSED happens.",
    "See https://example.com/path?q=1 and /home/user/.config/app.toml",
    "我喜欢骑自行车上班，密码学很有意思。",
    "The skeleton key problem: sk-ills and ask-me-later flows.",
    "bearer of bad news",
    "passwords should be long; tokens expire.",
])
def test_no_false_positives(text: str) -> None:
    assert redact(text) == text


def test_count_and_nested_values() -> None:
    out, n = redact_count(f"a {OPENAI} b password=hunter22 c")
    assert n == 2 and OPENAI not in out and "hunter22" not in out
    assert redact_count("nothing here")[1] == 0
    value = {"role": "user", "content": [{"type": "text", "text": f"key {GITHUB}"}],
             "n": 3, "ok": True}
    red = redact_value(value)
    assert GITHUB not in str(red)
    assert red["n"] == 3 and red["ok"] is True and red["role"] == "user"


def test_idempotent() -> None:
    text = f"password=hunter22 and {OPENAI} and Bearer abcdefghijklmnop1234"
    once = redact(text)
    assert redact(once) == once


def test_entropy() -> None:
    assert entropy_bits("") == 0.0
    assert entropy_bits("aaaa") == 0.0
    assert entropy_bits("abcd") == pytest.approx(2.0)
