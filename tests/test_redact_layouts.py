"""Secrets redaction, credentials in layouts the other rules did not read: a Telegram bot
token glued to ``bot`` as its API URLs write it, and a password stated with the verb last
(Hindi, Persian, Japanese, Korean); their look-alikes stay."""

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


PASSWORD = "Tq7" + _r(6)


@pytest.mark.parametrize(("text", "secret"), [
    (f"मेरा पासवर्ड {PASSWORD} है", PASSWORD),
    (f"जीमेल का पासवर्ड {PASSWORD} है।", PASSWORD),
    ("वाईफ़ाई का पासवर्ड lighthouse है", "lighthouse"),
    (f"पासवर्ड तो \"{PASSWORD}\" था", PASSWORD),
    (f"رمز عبور من {PASSWORD} است", PASSWORD),
    (f"パスワード {PASSWORD} です", PASSWORD),
    (f"비밀번호 {PASSWORD}입니다", PASSWORD),
])
def test_a_password_stated_with_the_verb_last_is_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "पासवर्ड weak है", "पासवर्ड reset करना है", "मेरा पासवर्ड बहुत लंबा है", "पासवर्ड OTP है",
    "पासवर्ड expired है", "मेरा पासवर्ड secure नहीं है", "पासवर्ड 8 characters का होना चाहिए",
    "رمز عبور من قوی است", "パスワード 忘れた です",
])
def test_talk_about_a_password_with_the_verb_last_stays(text: str) -> None:
    assert redact(text) == text

