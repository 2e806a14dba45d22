"""Secrets wrapped in base64 (a Kubernetes Secret's ``data``, ``echo ... | base64 -d``),
for :mod:`secret_rules`: base64 that decodes to a secret one of the shape rules knows.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Finder, Rule, Span

#: What secrets known by their shape start with: wrapped in base64 (a Kubernetes Secret's
#: ``data``, ``echo ... | base64 -d``), their start is a fixed string too.
_WRAPPED_STARTS: Final = (
    "-----BEGIN", "---- BEGIN", "PuTTY-User-Key-File", "AGE-SECRET-KEY-", "ghp_", "gho_",
    "ghs_", "ghu_", "ghr_", "github_pat_", "glpat-", "xoxb-", "xoxp-", "xoxa-", "xapp-",
    "sk-", "sk_live_", "rk_live_", "AKIA", "ASIA", "AIza", "GOCSPX-", "ya29.", "eyJ", "SG.",
    "npm_", "pypi-", "hf_", "dop_v1_", "shpat_", "whsec_", "xkeysib-")


def _b64_start(start: str) -> str:
    """The base64 characters that ``start`` alone decides, at the start of a text."""
    import base64

    return base64.b64encode(start.encode()).decode()[: len(start) * 4 // 3]


WRAPPED: Final = re.compile(
    r"(?<![A-Za-z0-9+])(?:" + "|".join(sorted({re.escape(_b64_start(w))
                                                 for w in _WRAPPED_STARTS}))
    + r")[A-Za-z0-9+/\-_]{8,}(?:={1,2}(?![A-Za-z0-9+/=])|(?![A-Za-z0-9+/=\-_]))")
_JOIN: Final = re.compile(r"[-_/]+")
#: The lines that go on with base64 wrapped at a fixed width (``base64``'s 76 columns).
_WRAPPED_LINES: Final = re.compile(
    r"(?:\r?\n[ \t]*[A-Za-z0-9+/\-_]{16,}={0,2}(?![A-Za-z0-9+/=\-_]))*")


def wrapped_finder(shape_rules: Sequence[Rule]) -> Finder:
    """The finder of base64 that decodes to a secret one of ``shape_rules`` knows (its
    pattern: :data:`WRAPPED`)."""
    return functools.partial(_wrapped, shape_rules)


def _wrapped(shape_rules: Sequence[Rule], text: str, pos: int, endpos: int) -> Iterable[Span]:
    """Base64 that decodes to a secret a format rule knows (with the lines it goes on
    over, beyond the run it starts in)."""
    import binascii

    def holds_a_secret(body: str) -> bool:
        body = body.replace("-", "+").replace("_", "/")
        try:
            decoded = binascii.a2b_base64(body + "=" * (-len(body) % 4)).decode("latin-1")
        except (binascii.Error, ValueError):
            return False
        return any(next(iter(rule.find(decoded, 0, len(decoded))), None) is not None
                   for rule in shape_rules if rule.find is not None)

    for m in WRAPPED.finditer(text, pos, endpos):
        end = _WRAPPED_LINES.match(text, m.end()).end()  # type: ignore[union-attr]
        if holds_a_secret("".join(text[m.start():end].split())):
            yield m.start(), end
            continue
        # Base64 holds "/" (URL-safe: "-" and "_"), and so do a path going on after it
        # and the words a file name joins to it ("<base64>/notes", "<base64>--old.txt"):
        # it may end at one of its last few.
        joins = [j.start() for j in _JOIN.finditer(text, m.start(), m.end())][-4:]
        for cut in reversed(joins):
            if holds_a_secret(text[m.start():cut]):
                yield m.start(), cut
                break
