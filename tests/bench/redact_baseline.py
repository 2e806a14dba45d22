"""Secrets redaction: applied to conversation text before anything is written to memory.

Pure functions, no state. :func:`redact` replaces what looks like a credential with
``[REDACTED]``:

- well-known token shapes: OpenAI/Anthropic ``sk-...``, AWS access key ids
  (``AKIA``/``ASIA``), GitHub (``ghp_``, ``gho_``, ``ghs_``, ``ghu_``, ``ghr_``,
  ``github_pat_``), Slack (``xox?-``), Google API keys (``AIza``), Stripe
  (``sk_live_``...), JSON Web Tokens, and PEM private key blocks;
- ``Bearer <token>`` / ``Basic <token>`` authorization values and the password of
  ``scheme://user:password@host`` URLs;
- values assigned to key-like names (``password=...``, ``token: ...``,
  ``"api_key": "..."``, ``export FOO_SECRET=...``), when the value looks like a secret
  (quoted, or containing digits or symbols, or long and high-entropy), so prose such as
  "Token: each word" is left alone;
- "my password is X" sentences, when X looks like a password.

Deliberately *not* redacted: bare 40-hex git commit ids and other hex digests, UUIDs,
ordinary words, numbers and paths. A key-like context (``github_token=<40 hex>``) still
redacts its value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

MASK = "[REDACTED]"

_KEY_WORDS = (
    r"pass(?:word|wd|phrase|code)?|pwd|secret|token|api[_-]?key|apikey|access[_-]?key"
    r"|secret[_-]?key|private[_-]?key|client[_-]?secret|auth(?:[_-]?token)?|credentials?"
    r"|session[_-]?key|signing[_-]?key"
)

# Shapes that are secrets wherever they appear.
_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-(?:ant-|proj-|live-)?[A-Za-z0-9_\-]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{22,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|AIza[0-9A-Za-z_\-]{35}"
    r"|(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"
    r")(?![A-Za-z0-9])"
)
_PEM = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.S
)
_AUTH_HEADER = re.compile(r"(?i)\b(bearer|basic|token)(\s+)([A-Za-z0-9\-._~+/]{16,}=*)")
_URL_PASSWORD = re.compile(r"\b([a-z][a-z0-9+.\-]*://[^\s:/@]+:)([^\s@/]+)(@)")
# name = value, name: value, "name": "value", NAME_SECRET=value ...
_ASSIGN = re.compile(
    r"(?i)(?P<key>[\"']?\b[\w.\-]*(?:" + _KEY_WORDS + r")[\w.\-]*[\"']?)"
    r"(?P<sep>\s*(?::=|=>|:|=)\s*)"
    r"(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s,;}\]\"']+)"
)
_SENTENCE = re.compile(
    r"(?i)\b(password|passphrase|passcode|pin|api key|token|secret)"
    r"(\s+(?:is|was|=)\s+)([\"']?)([^\s\"']{4,})(\3)"
)
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_PLACEHOLDER = re.compile(r"(?i)^(?:\[redacted\]|\*+|x+|<[^>]*>|\$\{?[A-Za-z_][\w]*\}?|none|null|"
                          r"true|false|required|optional|string|str|env|\.\.\.)$")


def entropy_bits(text: str) -> float:
    """Shannon entropy of ``text`` in bits per character."""
    if not text:
        return 0.0
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def looks_secret(value: str) -> bool:
    """Would this assigned value plausibly be a credential (not prose, not a placeholder)?"""
    if len(value) < 4 or _PLACEHOLDER.match(value) or value.startswith(("[REDACTED", "<", "$")):
        return False
    if _UUID.match(value):
        return True  # in a key context a UUID is a token
    has_digit = any(c.isdigit() for c in value)
    has_symbol = any(not c.isalnum() for c in value)
    mixed = any(c.isupper() for c in value[1:]) and any(c.islower() for c in value)
    if len(value) >= 16 and entropy_bits(value) >= 3.0:
        return True
    if value.isalpha() and value.islower():
        return False  # a plain word: "token: each", "password: required"
    return has_digit or has_symbol or mixed


def _sub_assign(m: re.Match[str]) -> str:
    value = m.group("value")
    quoted = value[:1] in "\"'" and len(value) >= 2
    inner = value[1:-1] if quoted else value
    if inner.startswith(("[REDACTED", "<", "${", "{{")):
        return m.group(0)  # already masked, or a placeholder
    if not inner or not (looks_secret(inner) or (quoted and len(inner) >= 4
                                                  and not _PLACEHOLDER.match(inner))):
        return m.group(0)
    masked = f"{value[0]}{MASK}{value[-1]}" if quoted else MASK
    return f"{m.group('key')}{m.group('sep')}{masked}"


def _sub_sentence(m: re.Match[str]) -> str:
    if not looks_secret(m.group(4)) or (_HEX.match(m.group(4)) and len(m.group(4)) == 40):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}{m.group(5)}"


_STEPS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (_PEM, MASK),
    (_TOKENS, MASK),
    (_URL_PASSWORD, r"\1" + MASK + r"\3"),
    (_AUTH_HEADER, r"\1\2" + MASK),
    (_ASSIGN, _sub_assign),
    (_SENTENCE, _sub_sentence),
]


def redact(text: str) -> str:
    """``text`` with every secret it seems to contain replaced by ``[REDACTED]``."""
    for pattern, repl in _STEPS:
        text = pattern.sub(repl, text)
    return text


def redact_count(text: str) -> tuple[str, int]:
    """The redacted text and how many secrets were masked."""
    out = redact(text)
    return out, out.count(MASK) - text.count(MASK)


def redact_value(value: Any) -> Any:
    """Redact every string inside a JSON-like value (dicts, lists, strings)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    return value
