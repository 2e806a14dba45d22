"""The near-word finder of the context rules of :mod:`secret_rules`: high-entropy strings
shortly after (or just before) a credential word ("the token is ... x9Y..."), a value right
after one ("passwd GMClz2"), and a password after a user and a slash ("credentials: admin /
Winter2025!"). Whether a value found is a secret is judged by :mod:`secret_values`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from recalld.daemon.memory.secret_context import CRED, name_kind, pinned_version, strip_end
from recalld.daemon.memory.secret_values import (
    HEX,
    looks_random,
    looks_secret,
    plain_password,
    prose_compound,
)

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Span

_NEAR = re.compile(r"(?i)\b" + CRED + r"\b")
_CANDIDATE = re.compile(r"(?<![\w/+=\-.])[A-Za-z0-9/+=_\-.~]{12,}(?![\w/+=\-])")
_NEAR_CHARS = 80
_BEFORE_CHARS = 40
#: A credential word followed directly by a value: "passwd GMClz2", "token: x9Y...".
_BARE_VALUE = re.compile(
    r"(?i)\b(?:pass(?:word|phrase|code|wd)?|pwd?|pins?|tokens?|secrets?|otp)[ \t]+"
    r"(?P<value>[!#-&*-+\--~]{6,200})")
_SWITCH = re.compile(r"--?[A-Za-z][A-Za-z\-]*")
_FILE_NAME = re.compile(r"(?i)[a-z][a-z_\-]*\.(?:md|markdown|txt|jsonl?|csv|ya?ml|html?|pdf"
                        r"|docx?|xlsx?|pptx?|png|jpe?g|log)")
#: "credentials: admin / Winter2025!": a user and a password after a credential word (not
#: "key", and not a path: "the object key is uploads/2024/05/photo.jpg").
_PAIR = re.compile(r"[ \t]*(?:[:=]|is|are)?[ \t]*[\w.@\-]{1,64}[ \t]*/[ \t]*"
                   r"(?P<value>[^\s,;/]{4,100})(?![^\s,;])")


#: What ends the words between a credential word and a hex value stated as it: "token:
#: 3f78...", "the secret for CI is 3f78...", "token (hex) = 3f78...".
_STATED_AS = re.compile(r"(?i)(?:^|\b(?:is|was|are|were|be|to|as)|[:=>(\-—\"'`])[\s\"'`]*$")


#: A digest's algorithm written before it: a public key's fingerprint ("key fingerprint:
#: SHA256:nThbg6k..."), a pin of a certificate's key ("pin-sha256=..."), a package's
#: integrity ("sha512-...").
_DIGEST_LABEL = r"(?:sha-?(?:1|224|256|384|512)|sha3-\d{3}|md5|blake2[bs]?)(?:[:=\-]|//)"
_DIGEST_BEFORE = re.compile(rf"(?i){_DIGEST_LABEL}[\"']?$")
_DIGEST_START = re.compile(rf"(?i){_DIGEST_LABEL}")


def _near_value(value: str, word: str, between: str) -> bool:
    if _DIGEST_BEFORE.search(between) or _DIGEST_START.match(value):
        return False  # a digest, named by its algorithm: a fingerprint, no credential
    if looks_random(value, 12):
        return True
    # Hex stated as a password, token or secret (not a bare "key": "key commit 3f78...")
    # is one; hex after other words is what they name ("the token bucket holds 3f78...").
    return (bool(HEX.match(value)) and len(value) >= 24 and word.lower() not in ("key", "keys")
            and _STATED_AS.search(between) is not None)


#: A piece of a credential given in parts after its word: "token part 1: Zx9kL2mQ part 2:
#: 7pR4tV8w", "(part 2 of 2) = ...", "first half: ...".
_PART = re.compile(r"(?i)(?<![\w-])(?:part|piece|chunk|(?:first|second|third|last|other)"
                   r"[ \t]+(?:half|part|piece))[ \t]*#?(?:\d{1,2}(?:[ \t]*(?:of|/)[ \t]*\d{1,2})?)?"
                   r"\)?[ \t]*[:=][ \t]*(?P<value>[^\s,;]{3,200})")
_PARTS_CHARS = 300


def _parts(text: str, word: str, end: int) -> Iterable[Span]:
    """The pieces of a credential given in parts after its ``word`` (ending at ``end``)."""
    stop = text.find("\n\n", end, end + _PARTS_CHARS)
    password = name_kind(word.replace(" ", "_")) == "password"
    for p in _PART.finditer(text, end, end + _PARTS_CHARS if stop < 0 else stop):
        value = strip_end(p.group("value"))
        if looks_secret(value) or (password and plain_password(value)):
            yield p.start("value"), p.start("value") + len(value)


def find_near_credential_words(text: str, starts: Sequence[int]) -> Iterable[Span]:
    """High-entropy strings shortly after (or just before) a credential word, and values
    right after one ("passwd GMClz2")."""
    for a in starts:
        m = _NEAR.match(text, a)
        if m is not None:
            pair = _PAIR.match(text, m.end()) if m.group(0)[:3].lower() != "key" else None
            if pair is not None and looks_secret(strip_end(pair.group("value"))) and not (
                    pinned_version(m.group(0), strip_end(pair.group(0).lstrip(" \t:=")))):
                yield pair.start("value"), pair.start("value") + len(
                    strip_end(pair.group("value")))
            window_end = m.end() + _NEAR_CHARS
            nl = text.find("\n\n", m.end(), window_end)
            for c in _CANDIDATE.finditer(text, m.end(), window_end if nl < 0 else nl):
                value = strip_end(c.group(0))
                if _near_value(value, m.group(0), text[m.end():c.start()]):
                    yield c.start(), c.start() + len(value)
            yield from _parts(text, m.group(0), m.end())
            for c in _CANDIDATE.finditer(text, max(0, m.start() - _BEFORE_CHARS), m.start()):
                value = strip_end(c.group(0))
                if looks_random(value, 16):
                    yield c.start(), c.start() + len(value)
        m = _BARE_VALUE.match(text, a)
        if m is not None:
            value = strip_end(m.group("value"))
            if (value.endswith("=") or _FILE_NAME.fullmatch(value) or prose_compound(value)
                    or _SWITCH.fullmatch(value)):
                # The name of the next setting ("<password value=...") or of a file, a
                # command's switch ("$env:PW -AsPlainText"), a word and its suffix
                # ("password policy.md", "pin codes.txt"), or words joined into one
                # ("the token passing-scheme-for-rings", "secret santa-list-2026"):
                # looks_secret takes their joins for symbols.
                continue
            if looks_secret(value) and any(not c.isalpha() for c in value):
                yield m.start("value"), m.start("value") + len(value)
