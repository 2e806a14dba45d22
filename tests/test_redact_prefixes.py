"""Secrets redaction: tokens known by a vendor's prefix, standing alone (a note of one
line, a file name) or joined to a name; HTTP Basic credentials told from the word
"basic" in prose; joined words with numbers left alone near a credential word."""

from __future__ import annotations

import base64
import random
import string

import pytest

from recalld.daemon.memory.redact import MASK, redact
from recalld.daemon.memory.secret_names import mask_name

_RNG = random.Random(17)
_B62 = string.ascii_letters + string.digits
_URL = _B62 + "-_"
_HEX = "0123456789abcdef"
_UPNUM = string.ascii_uppercase + string.digits


def _r(alphabet: str, n: int) -> str:
    """``n`` random characters of ``alphabet``, with a digit and a letter among them if
    it has both."""
    value = [_RNG.choice(alphabet) for _ in range(n)]
    for at, kind in zip(_RNG.sample(range(n), 2), (str.isdigit, str.isalpha), strict=True):
        some = [c for c in alphabet if kind(c)]
        if some:
            value[at] = _RNG.choice(some)
    return "".join(value)


#: Generated in each vendor's shape (none is a real token).
PREFIXED = {
    "huggingface": "hf_" + _r(string.ascii_letters, 34),
    "huggingface_org": "api_org_" + _r(string.ascii_letters, 34),
    "mailgun": "key-" + _r(_HEX, 32),
    "twilio_sk": "SK" + _r(_HEX, 32),
    "twilio_ac": "AC" + _r(_HEX, 32),
    "discord_bot": "M" + _r(_URL, 25) + "." + _r(_URL, 6) + "." + _r(_URL, 38),
    "azure_client_secret": _r(_B62, 3) + "8Q~" + _r(_B62 + "_~.-", 34),
    "mailchimp": _r(_HEX, 32) + "-us12",
    "grafana": "glsa_" + _r(_B62, 32) + "_" + _r(_HEX, 8),
    "postman": "PMAK-" + _r(_HEX, 24) + "-" + _r(_HEX, 34),
    "new_relic": "NRAK-" + _r(_UPNUM, 27),
    "databricks": "dapi" + _r(_HEX, 32),
    "artifactory": "AKCp" + _r(_B62, 69),
    "nuget": "oy2" + _r(string.ascii_lowercase + string.digits, 43),
    "atlassian": "ATATT3xFfGF0" + _r(_URL, 180),
    "bitbucket": "ATBB" + _r(_B62, 32),
    "easypost": "EZAK" + _r(_B62, 54),
    "dropbox": "sl." + _r(_URL, 135),
    "onepassword_secret_key": "A3-" + "-".join(_r(_UPNUM, n) for n in (6, 6, 5, 5, 5, 5)),
    "clickup": "pk_" + _r(string.digits, 8) + "_" + _r(_UPNUM, 32),
    "harness": "pat." + _r(_URL, 22) + "." + _r(_HEX, 24) + "." + _r(_URL, 20),
    "circleci": "CCIPAT_" + _r(_B62, 22) + "_" + _r(_HEX, 40),
    "frameio": "fio-u-" + _r(_URL, 64),
    "prefect": "pnu_" + _r(_B62, 36),
}


@pytest.mark.parametrize("kind", sorted(PREFIXED))
def test_a_prefixed_token_alone_or_joined_to_a_name_is_masked(kind: str) -> None:
    token = PREFIXED[kind]
    assert redact(token) == MASK, kind
    assert redact(f"notes\n{token}\nmore") == f"notes\n{MASK}\nmore", kind
    assert mask_name(f"{token}.md") == f"{MASK}.md", kind
    if kind not in ("prefect",):  # a short prefix: only standing apart
        for name in (f"deploy-{token}.txt", f"old_{token}.md"):
            assert token not in mask_name(name), (kind, name)


@pytest.mark.parametrize("text", [
    "load_hf_AutoModelForSequenceClassification", "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",
    "use-hf_transformersPipelineForTextGeneration", "api-key-rotationprocedureforproductions",
    "ssh-key-abcdefghijklmnopqrstuvwxyzabcdef", "TASK0123456789abcdef0123456789abcdef",
    "my_dapi_client_configuration_v2_settings", "dapiClientConfigurationV2Settings",
    "oy2abcdefghijklmnopqrstuvwxyzabcdefghijklmnopq", "sl.SomethingLongFileName2024",
    "the EAA and EAAB groups", "A3-section and AKCpart", "lightgbm_glsa_estimator",
    "run test_key-rotation_policy", "Mailgun uses key-based auth",
])
def test_identifiers_and_words_like_those_prefixes_are_left_alone(text: str) -> None:
    assert redact(text) == text


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


@pytest.mark.parametrize("text", [
    "Summary: the token handling moved.\n- a basic Python3-compatible-wrapper",
    "the token refresh uses a Web2-style-interface now",
    "auth token docs: see the programme2021-rollout-notes page",
])
def test_words_with_numbers_joined_near_a_credential_word_are_left_alone(text: str) -> None:
    """Joined words with a number after one ("Python3-compatible-wrapper") are a name,
    not a random-looking value, even near "token"."""
    assert redact(text) == text


#: Tokens whose alphabet holds "-" or "_", and base64 (URL-safe too) wrapping one.
JOINABLE = {
    **{kind: PREFIXED[kind] for kind in ("discord_bot", "azure_client_secret", "frameio",
                                         "atlassian", "dropbox", "harness")},
    "telegram_bot": "61" + _r(string.digits, 8) + ":AA" + _r(_URL, 33),
    "wrapped_padded": base64.b64encode(("ghp_" + _r(_B62, 37)).encode()).decode(),
    "wrapped_urlsafe": base64.urlsafe_b64encode(("glpat-" + _r(_URL, 24)).encode())
    .decode().rstrip("="),
}


@pytest.mark.parametrize("name", ["old_{t}-2.md", "{t}--old.txt", "x-{t}-backup",
                                  "{t}_v2.md", "key {t}-"])
@pytest.mark.parametrize("kind", sorted(JOINABLE))
def test_a_token_followed_by_a_join_to_a_word_is_masked(kind: str, name: str) -> None:
    """A "-" or "_" right after a token whose own alphabet holds it joins a word to it in
    a file name: the token ends there (or takes the join with it), it is still found."""
    token = JOINABLE[kind]
    assert MASK in redact(token), kind
    text = name.format(t=token)
    for out in (redact(text), mask_name(text)):
        assert not any(token[i:i + 12] in out for i in range(0, len(token) - 11, 6)), out


def test_base64_wrapping_a_token_is_masked_after_a_slash() -> None:
    """A path names it (a node's link, a file name): "/" is base64's own character, but
    what decodes to a token from there on is one."""
    wrapped = JOINABLE["wrapped_padded"]
    for text in (f"digest/procedure/{wrapped}.md", f"see memory/{wrapped.rstrip('=')}/x"):
        out = redact(text)
        assert wrapped[:20] not in out and MASK in out, out
