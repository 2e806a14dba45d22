"""Secrets redaction masks the secret and no more: the settings that follow it in the same
run (a query string's next parameter, a connection string's next field), the bracket a
note closes after it, and values that only name where a credential comes from (a call,
an attribute, an environment variable, a YAML tag) stay as written."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact

VALUE = "Wq7rT2mK9z"


@pytest.mark.parametrize(("text", "rest"), [
    (f"token={VALUE}&user=bob", "&user=bob"),
    (f"https://api.example.org/v1?access_token={VALUE}&page=2", "&page=2"),
    (f"Password={VALUE};Server=db01;Database=sales", ";Server=db01;Database=sales"),
    (f"Server=db01;Pwd={VALUE};Encrypt=true", ";Encrypt=true"),
    (f"password:{VALUE},user:bob", ",user:bob"),
    (f"secret={VALUE}|region=eu", "|region=eu"),
    (f"the api token is {VALUE}&env=prod", "&env=prod"),
    (f"(my password is {VALUE})", ")"),
    (f"[token {VALUE}]", "]"),
])
def test_what_follows_a_secret_in_its_run_stays(text: str, rest: str) -> None:
    out = redact(text)
    assert VALUE not in out and MASK in out, out
    assert out.endswith(MASK + rest), out


@pytest.mark.parametrize("text", [
    "see the rules [token limit]",
    "notes on passwords {pin reset}",
    "ask about the <secret handshake>",
])
def test_a_closing_bracket_after_a_credential_word_is_no_secret(text: str) -> None:
    assert redact(text) == text
