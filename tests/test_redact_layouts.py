"""Secrets redaction, credentials in layouts the other rules did not read: a Telegram bot
token glued to ``bot`` as its API URLs write it."""

from __future__ import annotations

import random
import string

import pytest

from recalld.daemon.memory.redact import MASK, redact

RNG = random.Random(20261205)
B62 = string.ascii_letters + string.digits


def _r(n: int, alphabet: str = B62) -> str:
    while True:
        s = "".join(RNG.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in s) and any(c.isupper() for c in s):
            return s


TELEGRAM = f"{RNG.randrange(10**9, 10**10)}:AA{_r(33, B62 + '_-')}"


@pytest.mark.parametrize("template", [
    "https://api.telegram.org/bot{s}/sendMessage?chat_id=42",
    "curl -s api.telegram.org/bot{s}/getUpdates", "TG_URL=https://api.telegram.org/bot{s}",
    "the alert bot is bot{s}", "Bot{s}",
])
def test_a_telegram_token_glued_to_bot_is_masked(template: str) -> None:
    out = redact(template.format(s=TELEGRAM))
    assert TELEGRAM.split(":")[1] not in out and MASK in out, out
    assert "bot" in out.lower()  # only the token goes

