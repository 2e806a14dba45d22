"""The text of a note's bytes, however the editor that saved it encoded it.

Notes are UTF-8 by convention, but an older editor or a Windows tool may have saved one in
Windows-1252 (Latin-1 and its superset): read as UTF-8, every accented letter of it became
U+FFFD, so ``café`` was found by no query, shown as ``caf�``, and an edit wrote the
replacement characters back over the letters. :func:`note_text` reads UTF-8 (and UTF-16
or UTF-32 with a byte order mark, as Windows saves "Unicode" text); bytes that are not
UTF-8, hold no UTF-8 sequence at all and look like Western text (no run of three bytes
past ASCII: accented letters stand between plain ones, where GBK, Big5, Shift JIS or
Windows-1251 write whole words of such bytes) are read as Windows-1252. Anything else
stays UTF-8, its stray bytes U+FFFD (a file mixing both, a cut through the last
character of a prefix, a note in GBK): the memory jobs do not write back what reads
so, since what a person wrote would be lost. Line breaks are the same bytes in all of
them, so line numbers do not move. Index, server chunks, reads and edits all read notes
through here.
"""

from __future__ import annotations

import codecs
import re
from typing import Final

__all__ = ["note_text"]

_BOMS: Final = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# A character UTF-8 decoding produced from a multi-byte sequence (not a replacement).
_DECODED: Final = re.compile("[^\x00-\x7f\ufffd]")
# Three bytes past ASCII in a row: not Western text in a one-byte encoding.
_RUN: Final = re.compile(rb"[\x80-\xff]{3}")


def note_text(data: bytes, *, prefix: bool = False) -> str:
    """``data`` decoded as the module docstring says; never raises. ``prefix``: ``data``
    is the head of a longer file, which may end inside a character."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if prefix and exc.reason == "unexpected end of data" and exc.end == len(data):
            return data.decode("utf-8", errors="replace")
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), None)
    if encoding is not None:
        return data.decode(encoding, errors="replace")
    text = data.decode("utf-8", errors="replace")
    if _DECODED.search(text) is not None or _RUN.search(data) is not None:
        return text  # UTF-8 with stray bytes, or another encoding: not guessed
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:  # the five bytes Windows-1252 leaves undefined
        return data.decode("latin-1")
