"""Secrets redaction: HTTP Basic credentials told from the word "basic" in prose."""

from __future__ import annotations

import base64

import pytest

from recalld.daemon.memory.redact import MASK, redact


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize("text", [
    "a basic Python3-compatible-wrapper for the old API",
    "the basic HLH/bZIP-containing-factors bind DNA",
    "we built a basic 3-dimensional-structure1 model",
    "Basic x86_64-linux-gnu-toolchain2 setup, then the rest",
    "basic Web2.0-style-interfaces are back",
    "a basic COVID19-vaccination-programme2021 rollout",
    "the basic k8s-cluster-setup-guide-v2 page",
])
def test_the_word_basic_before_a_compound_is_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", [
    "Authorization: Basic {s}",
    "curl -H 'Authorization: Basic {s}' https://api.example.com",
    "use basic {s} for the staging proxy",
    "basic {s}",
])
@pytest.mark.parametrize("user,password", [("admin", "hunter2"), ("deploy", "Xk9#mQ2v!L"),
                                           ("ci", "pw")])
def test_basic_credentials_are_masked(text: str, user: str, password: str) -> None:
    secret = _basic(user, password)
    out = redact(text.format(s=secret))
    assert secret not in out and MASK in out, out


def test_a_random_value_in_a_basic_authorization_header_is_masked() -> None:
    """Not base64 of user:password, but where a credential must be."""
    value = "Ab3-dEf6_hIj9kLm2nOp5qRs8tUv"
    assert value not in redact(f"Authorization: Basic {value}")
