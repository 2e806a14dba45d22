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


def _text_groups() -> str:
    """A group of four base64 characters (either alphabet) that three bytes of ASCII text
    (printable, tabs, line breaks) encode to: one character class each."""
    import string

    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits
    text = [b for b in range(128) if 32 <= b < 127 or b in (9, 10, 13)]
    sixes = ({b >> 2 for b in text}, {(a & 3) << 4 | b >> 4 for a in text for b in text},
             {(a & 15) << 2 | b >> 6 for a in text for b in text}, {b & 63 for b in text})
    classes = []
    for values in sixes:
        chars = "".join(alphabet[v] if v < 62 else ("+-", "/_")[v - 62] for v in sorted(values))
        classes.append("[" + re.escape(chars) + "]")
    return "".join(classes)


#: Base64 long enough to hold a secret with the text around it (a ``.env`` file, a
#: ``data:text/plain;base64,...`` URL, ``echo "token: ghp_..." | base64``), wherever in it
#: the secret starts (not only at its start, as :data:`WRAPPED` finds), that starts as
#: ASCII text does: its first 18 bytes are text. Base64 of an image or of random bytes
#: does not start so (about one in two million), so no token rule reads a long one for
#: this rule's sake (``secret_rules.token_prefilter`` passes the runs a pattern matches).
BLOB: Final = re.compile(
    rf"(?<![A-Za-z0-9+/\-_])(?:{_text_groups()}){{6}}[A-Za-z0-9+/\-_]*"
    r"(?:={1,2}(?![A-Za-z0-9+/=])|(?![A-Za-z0-9+/=\-_]))")
#: What no text holds: control characters other than tabs and line breaks.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def blob_text(text: str, pos: int, endpos: int) -> Iterable[Span]:
    """Base64 (with the lines it goes on over) that decodes to a text (UTF-8, no control
    characters: an image, an archive or a hash decodes to none) in which the rules find
    a secret, anywhere: the whole base64 is masked, its text cannot be cut in place."""
    import binascii

    from recalld.daemon.memory.redact import find_spans  # the rules of every kind

    for m in BLOB.finditer(text, pos, endpos):
        if _goes_on(text, m.start()):
            continue  # read with the lines above it, from where they start
        try:
            # Its first bytes tell a binary file (an image) before the rest is read.
            head = _standard(text[m.start():min(m.end(), m.start() + _HEAD)])
            if _CONTROL.search(binascii.a2b_base64(head[:len(head) // 4 * 4] or "AA==")
                               .decode(errors="replace")):
                continue
            end = _WRAPPED_LINES.match(text, m.end()).end()  # type: ignore[union-attr]
            body = _standard("".join(text[m.start():end].split()))
            decoded = binascii.a2b_base64(body + "=" * (-len(body) % 4)).decode()
        except (binascii.Error, ValueError):
            continue
        if _CONTROL.search(decoded) is None and find_spans(decoded):
            yield m.start(), end


def _standard(body: str) -> str:
    """URL-safe base64 written in the standard alphabet."""
    return body.replace("-", "+").replace("_", "/")


#: Base64 characters decoded first, to turn binary files away.
_HEAD: Final = 1024
_LINE_END: Final = re.compile(r"[A-Za-z0-9+/\-_]{24}\r?")


def _goes_on(text: str, start: int) -> bool:
    """Whether base64 at ``start`` begins its line (after spaces) below a line ending in
    base64 without padding: a line of a block wrapped at a fixed width, which the match
    at the block's first line reads whole (one by one, the block would be decoded again
    from each line on)."""
    line = text.rfind("\n", 0, start)
    if line < 24 or text[line + 1:start].strip(" \t"):
        return False
    return _LINE_END.fullmatch(text, line - 24 - (text[line - 1] == "\r"), line) is not None
