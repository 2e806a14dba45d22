"""Where a token may start in a long run of token characters, so that the token rules are
tried there and not at every character.

Most token rules open with a boundary (``secret_rules._P``, ``_B``, the AWS secret's): no
letter or digit right before the token, unless an escape ends there (``%3D``, ``%253D``,
``=3D``, ``\\n``, ``\\u0022``, ``\\x3d``). Searched for, such a pattern tests its boundary
(seven lookbehinds) at every character, and the prefilter of all token rules tests ~60
of them: a run of a million letters or digits (a base64 blob, a minified line, a pasted
dump) took seconds a pass, and a note is read by several passes. The places where such a
boundary can hold are few, and one scan finds them: the run's start, each character
after one that is no letter or digit, each end of an escape. A pattern is matched at
those places only; a pattern that opens otherwise is searched as before. A rule's own
pattern searches a short run (most of them) as before: there the scan would cost more
than it saves. The alternation of them all (:class:`Prefilter`, run on every run of a
text) is matched at the token starts of short runs too: tried whole at every character,
it cost some 6 us a character of a text of long words (random letters, hashes, base64
lines), 20 times what prose costs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

__all__ = ["ESCAPED", "LONG_RUN", "Prefilter", "boundary_led", "led_alternation", "matches",
           "token_starts"]

#: Runs at least this long are matched at their token starts (shorter ones searched).
LONG_RUN: Final = 512

_NOT_ALNUM: Final = re.compile(r"[^A-Za-z0-9]")
#: The escapes after which a token may start, though they end in a letter or digit:
#: percent-encoding, once or twice (``?next=%2Fcb%3Ftoken%3Dghp_...``, ``%253D``),
#: quoted-printable (``token=3Dghp_...``), and a backslash escape of a JSON or C string
#: (``"line\\nghp_..."``, ``\\u0022ghp_...``, ``\\x3dghp_...``).
_ESCAPE_FORMS: Final = (r"%[0-9A-Fa-f]{2}", r"%25[0-9A-Fa-f]{2}", r"=[0-9A-F]{2}",
                        r"\\[abfnrtv0]", r"\\u[0-9A-Fa-f]{4}", r"\\x[0-9A-Fa-f]{2}")
#: The alternatives of a token rule's boundary group that let a token start right after
#: one of them (``secret_rules._P``, ``_B``): one lookbehind each.
ESCAPED: Final = "".join(f"|(?<={form})" for form in _ESCAPE_FORMS)
#: Any of them, longest first. None starts inside another, and at a place one starts at
#: most, but where ``%25XX`` does ``%25`` does too: one scan finds every end.
_ESCAPE: Final = re.compile("|".join(sorted(_ESCAPE_FORMS, key=len, reverse=True)))
_LONGEST_ESCAPE: Final = 6
#: The characters every escape begins with.
_ESCAPE_HEAD: Final = re.compile(r"[%=\\]")


def _boundary(source: str) -> str | None:
    """The boundary group a pattern's ``source`` opens with (see :func:`boundary_led`)."""
    head = re.match(r"\(\?:\(\?<!\[A-Za-z0-9[^\]]*\]\)", source)
    if head is None or not source.startswith(ESCAPED + ")", head.end()):
        return None
    return source[:head.end() + len(ESCAPED) + 1]


def boundary_led(source: str) -> bool:
    """Whether a pattern's ``source`` opens with a boundary group that forbids a letter or
    digit before it (a lookbehind class holding ``A-Za-z0-9``) except after the escapes
    (:data:`ESCAPED`, the group's other alternatives): such a pattern matches only at
    :func:`token_starts`."""
    return _boundary(source) is not None


def led_alternation(sources: list[str]) -> re.Pattern[str]:
    """The alternation of boundary-led patterns' ``sources``, each boundary group written
    once before the rest of the patterns that open with it: the same matches, but a place
    is tested for a boundary once, not once for each pattern (seven lookbehinds each)."""
    heads: dict[str, list[str]] = {}
    for source in sources:
        head = _boundary(source)
        assert head is not None, source
        heads.setdefault(head, []).append(f"(?:{source[len(head):]})")
    return re.compile("|".join(f"(?:{head}(?:{'|'.join(rests)}))"
                               for head, rests in heads.items()))


def token_starts(text: str, pos: int, endpos: int) -> list[int]:
    """The places in ``text[pos:endpos]`` where a boundary-led pattern may match, in order:
    ``pos``, each place after a character that is no ASCII letter or digit, each end of
    an escape (which may begin before ``pos``: a lookbehind reads it there)."""
    if pos >= endpos:
        return []
    # The places after such characters come in order, each once, none before ``pos``
    # (the scan starts one character before it) nor at ``endpos``.
    starts = [m.end() for m in _NOT_ALNUM.finditer(text, max(0, pos - 1), endpos - 1)]
    if not starts or starts[0] != pos:
        starts.insert(0, pos)
    if _ESCAPE_HEAD.search(text, max(0, pos - _LONGEST_ESCAPE), endpos) is None:
        return starts  # no escape begins near (most stretches): none ends here
    for m in _ESCAPE.finditer(text, max(0, pos - _LONGEST_ESCAPE), endpos):
        end = m.end()
        if pos <= end < endpos:
            starts.append(end)
        if end - m.start() == 5 and text.startswith("%25", m.start()):  # and ``%25``
            starts.append(m.start() + 3)
    return sorted(set(s for s in starts if pos <= s < endpos))


def matches(rx: re.Pattern[str], text: str, pos: int, endpos: int) -> Iterator[re.Match[str]]:
    """``rx.finditer(text, pos, endpos)`` for a boundary-led ``rx``: the same matches."""
    last = pos
    for start in token_starts(text, pos, endpos):
        if start < last:
            continue  # inside the match before: finditer goes on from its end
        m = rx.match(text, start, endpos)
        if m is not None:
            last = max(m.end(), start + 1)
            yield m


@dataclass(frozen=True)
class Prefilter:
    """Whether any of a set of token patterns matches in a stretch of a text: the
    alternation of the boundary-led ones (``led``, :func:`led_alternation`) matched at
    the token starts of the stretch, however short (searched, the alternation of some
    thirty patterns is tried whole at every character: a 50-character word took ~0.3 ms),
    and of the ``others`` searched."""

    led: re.Pattern[str] | None
    others: re.Pattern[str] | None

    def search(self, text: str, pos: int, endpos: int) -> bool:
        if self.others is not None and self.others.search(text, pos, endpos) is not None:
            return True
        if self.led is None:
            return False
        match = self.led.match
        return any(match(text, s, endpos) is not None for s in token_starts(text, pos, endpos))
