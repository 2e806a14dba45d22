"""Secrets redaction, more issuers' key shapes (Mailchimp, Brevo, Flutterwave, Contentful,
Shippo, Render, Firebase Cloud Messaging, Terraform Cloud, Dynatrace) and a token written
as the whole user part of a URL; their look-alikes stay."""

from __future__ import annotations

import random
import string

import pytest

from recalld.daemon.memory.redact import MASK, redact

RNG = random.Random(20261204)
HEX = "0123456789abcdef"
B62 = string.ascii_letters + string.digits


def _r(alphabet: str, n: int) -> str:
    while True:
        s = "".join(RNG.choice(alphabet) for _ in range(n))
        if alphabet != B62 or (any(c.isdigit() for c in s) and any(c.isupper() for c in s)):
            return s


SECRETS = {
    "mailchimp": _r(HEX, 32) + "-us" + str(RNG.randrange(1, 21)),
    "brevo": "xkeysib-" + _r(HEX, 64) + "-" + _r(B62, 16),
    "flutterwave": "FLWSECK_TEST-" + _r(HEX, 32) + "-X",
    "contentful": "CFPAT-" + _r(B62, 43),
    "shippo": "shippo_live_" + _r(HEX, 40),
    "render": "rnd_" + _r(B62, 32),
    "fcm": "AAAA" + _r(B62, 7) + ":APA91b" + _r(B62 + "_-", 134),
    "terraform": _r(string.ascii_lowercase + string.digits, 14) + ".atlasv1." + _r(B62, 67),
    "dynatrace": "dt0c01." + _r(string.ascii_uppercase + string.digits, 24) + "."
                 + _r(string.ascii_uppercase + string.digits, 64),
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
@pytest.mark.parametrize("template", ["{s}", "the {k} key is {s} ok", "use {s} for it",
                                      "- {s}\n"])
def test_more_issuers_keys_are_masked_by_their_shape(kind: str, template: str) -> None:
    secret = SECRETS[kind]
    out = redact(template.format(s=secret, k=kind))
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("host", ["github.com/acme/app.git", "git.example.org/x/y",
                                  "[::1]:8443/repo"])
def test_a_token_as_the_user_part_of_a_url_is_masked(host: str) -> None:
    token = _r(B62, 24)
    out = redact(f"git clone https://{token}@{host} now")
    assert token not in out and f"https://{MASK}@" in out, out


@pytest.mark.parametrize("text", [
    "git clone https://deploy-bot@github.com/acme/app.git",
    "ssh://git@gitlab.example.org:2222/group/project.git",
    "mail jane.doe.longname@example.org",
    "https://first.last.name.here@example.org",
    f"sha {_r(HEX, 32)}-useful",
    f"digest {_r(HEX, 32)}-us",
    "rnd_seed_for_the_experiment_runs",
])
def test_their_look_alikes_stay(text: str) -> None:
    assert redact(text) == text


KEY_BLOCK = ("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(_r(B62, 64) for _ in range(4))
             + "\n-----END OPENSSH PRIVATE KEY-----\n")


def _b64(text: str, *, lines: bool = False, urlsafe: bool = False) -> str:
    import base64

    raw = text.encode()
    if lines:
        return base64.encodebytes(raw).decode().strip()
    return (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode()


@pytest.mark.parametrize(("template", "secret"), [
    ("apiVersion: v1\nkind: Secret\ndata:\n  ssh-privatekey: {b}\n", KEY_BLOCK),
    ("echo {b} | base64 -d > ~/.ssh/id", KEY_BLOCK),
    ("echo {b} | base64 -d", SECRETS["brevo"]),
    ("GH={b}", "ghp_" + _r(B62, 36)),
    ("the blob {b} is what CI gets", "AKIA" + _r(string.ascii_uppercase + string.digits, 16)),
])
@pytest.mark.parametrize("form", ["plain", "lines", "urlsafe"])
def test_a_secret_wrapped_in_base64_is_masked(template: str, secret: str, form: str) -> None:
    wrapped = _b64(secret, lines=form == "lines", urlsafe=form == "urlsafe")
    out = redact(template.format(b=wrapped))
    assert not any(line in out for line in wrapped.split()), out
    assert MASK in out


@pytest.mark.parametrize("plain", ["skipping the meeting today, sorry",
                                   "sk-learn pipelines and numpy arrays",
                                   "-----BEGIN CERTIFICATE-----\nMIIB" + "A" * 60])
def test_base64_of_ordinary_text_stays(plain: str) -> None:
    text = f"echo {_b64(plain)} | base64 -d"
    assert redact(text) == text


SLACK_SESSION = {
    # A browser session's client token and its ``d`` cookie (URL-encoded base64).
    "xoxc": f"xoxc-{_r(string.digits, 12)}-{_r(string.digits, 12)}-{_r(string.digits, 13)}-"
            + _r(HEX, 64),
    "xoxd": "xoxd-" + _r(B62, 60) + "%2B" + _r(B62, 20) + "%2F" + _r(B62, 8) + "%3D",
}


@pytest.mark.parametrize("kind", sorted(SLACK_SESSION))
@pytest.mark.parametrize("template", ["{s}", "Cookie: d={s}; d-s=1712345678", "use {s} ok"])
def test_slack_session_tokens_are_masked(kind: str, template: str) -> None:
    secret = SLACK_SESSION[kind]
    out = redact(template.format(s=secret))
    # Every piece between escapes is masked (a "%3D" of base64's padding may stay).
    pieces = [p[2:] if i else p for i, p in enumerate(secret[5:].split("%"))]
    assert MASK in out and not any(p in out for p in pieces if p), out


@pytest.mark.parametrize("text", ["the xoxb-token-format doc", "see xoxd-cookie-format.md",
                                  "xoxc-client-token-explained"])
def test_slack_prefixes_before_words_stay(text: str) -> None:
    assert redact(text) == text


MORE_SECRETS = {
    "airtable": "pat" + _r(B62, 14) + "." + _r(HEX, 64),
    "tencent_cloud": "AKID" + _r(B62, 32),
    "baidu_qianfan": "bce-v3/ALTAK-" + _r(B62, 21) + "/" + _r(HEX, 40),
    "zhipu": _r(HEX, 32) + "." + _r(B62, 16),
}


@pytest.mark.parametrize("kind", sorted(MORE_SECRETS))
@pytest.mark.parametrize("template", ["{s}", "the {k} key is {s} ok", "用 {s} 调用", "- {s}\n"])
def test_cloud_and_model_vendor_keys_are_masked_by_their_shape(kind: str,
                                                               template: str) -> None:
    secret = MORE_SECRETS[kind]
    out = redact(template.format(s=secret, k=kind))
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    f"cache/{_r(HEX, 32)}.jpg",
    f"the upload {_r(HEX, 32)}.partial_download failed",
    f"see {_r(HEX, 32)}.markdownrendered",
    "AKIDs and patterns in the IAM docs",
    "patient.records_for_review_2026 are due",
])
def test_look_alikes_of_those_vendor_keys_stay(text: str) -> None:
    assert redact(text) == text
