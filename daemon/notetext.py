"""The text of a note's bytes, however the editor that saved it encoded it.

Notes are UTF-8 by convention, but an older editor or a Windows tool may have saved one in
Windows-1252 (Latin-1 and its superset), or, on a Chinese or Japanese Windows, in GBK
(GB18030), Big5 or Shift_JIS: read as UTF-8, every letter of it past ASCII became U+FFFD,
so ``café`` or ``乌龙茶`` was found by no query, shown as ``caf�``, and an edit wrote the
replacement characters back over the letters. :func:`decode_note` reads UTF-8 (and UTF-16
or UTF-32 with a byte order mark, as Windows saves "Unicode" text). Bytes that are not
UTF-8, hold no UTF-8 sequence at all and look like Western text (no run of three bytes
past ASCII: accented letters stand between plain ones, where GBK, Big5, Shift JIS or
Windows-1251 write whole words of such bytes) are read as Windows-1252. Others are tried,
strictly, as GB18030, Big5 and Shift_JIS (their Windows code pages), in that order, and
read so when the text that makes is plainly that language's: no control character, no
private-use character, and four in five of its characters past ASCII among the common
ones of that encoding (GB2312's first level and signs; Big5's common characters and
signs; JIS X 0208's signs, kana and first-level kanji). Text in another encoding read
as one of these is made mostly of its rare characters (or does not decode at all), so
it stays out. Anything else stays UTF-8, its stray bytes U+FFFD (a file mixing
encodings, a cut through the last character of a prefix, Windows-1251): the memory jobs
do not write back what reads so, since what a person wrote would be lost, and none of
them writes a note that is not UTF-8 at all. Line breaks are the same bytes in all of
them, so line numbers do not move. UTF-8 costs nothing more: the rest is tried only
once it failed. Index, server chunks, reads and edits all read notes through here.
"""

from __future__ import annotations

import codecs
import functools
import re
from typing import Final

__all__ = ["UNDECODED", "decode_as", "decode_note", "note_text"]

#: The encoding :func:`decode_note` names for bytes it read as UTF-8 with U+FFFD.
UNDECODED: Final = "unknown"
_BOMS: Final = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# A character UTF-8 decoding produced from a multi-byte sequence (not a replacement).
_DECODED: Final = re.compile("[^\x00-\x7f\ufffd]")
# Three bytes past ASCII in a row: not Western text in a one-byte encoding.
_RUN: Final = re.compile(rb"[\x80-\xff]{3}")
# What no note's text holds: controls (other than tab, line breaks and form feed), and
# private-use characters, where these encodings put byte pairs no standard defines.
_ODD: Final = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ue000-\uf8ff]")
_PAST_ASCII: Final = re.compile("[^\x00-\x7f]+")
# How many characters past ASCII tell the share (a large note costs no more than this).
_SAMPLE_CHARS: Final = 1 << 16
# (name reported, codec, the byte pairs (lead range, trail ranges) of its common characters)
_Rows = tuple[tuple[tuple[int, int], tuple[tuple[int, int], ...]], ...]
_CJK: Final[tuple[tuple[str, str, _Rows], ...]] = (
    ("gb18030", "gb18030", (((0xA1, 0xA9), ((0xA1, 0xFE),)),
                            ((0xB0, 0xD7), ((0xA1, 0xFE),)))),
    ("big5", "cp950", (((0xA1, 0xC6), ((0x40, 0x7E), (0xA1, 0xFE))),)),
    ("shift_jis", "cp932", (((0x81, 0x84), ((0x40, 0x7E), (0x80, 0xFC))),
                            ((0x88, 0x98), ((0x40, 0x7E), (0x80, 0xFC))))),
)
# The encodings whose line breaks are ASCII's, by the names decode_note gives them.
_CODECS: Final = {"windows-1252": "cp1252", "latin-1": "latin-1",
                  **{name: codec for name, codec, _ in _CJK}}
# Of the characters past ASCII, the share that must be common ones.
_COMMON_SHARE: Final = 0.8


def note_text(data: bytes, *, prefix: bool = False) -> str:
    """``data`` decoded as the module docstring says; never raises. ``prefix``: ``data``
    is the head of a longer file, which may end inside a character."""
    return decode_note(data, prefix=prefix)[0]


def decode_note(data: bytes, *, prefix: bool = False) -> tuple[str, str]:
    """:func:`note_text`, and the encoding it read ``data`` in: "" for UTF-8, else
    ``windows-1252``, ``latin-1``, ``utf-16``, ``utf-32``, ``gb18030``, ``big5``,
    ``shift_jis``, or :data:`UNDECODED` (UTF-8 with U+FFFD for what it is not)."""
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        if prefix and exc.reason == "unexpected end of data" and exc.end == len(data):
            return data.decode("utf-8", errors="replace"), ""
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), None)
    if encoding is not None:
        return data.decode(encoding, errors="replace"), encoding
    text = data.decode("utf-8", errors="replace")
    if _DECODED.search(text) is None and _RUN.search(data) is None:
        try:
            return data.decode("cp1252"), "windows-1252"
        except UnicodeDecodeError:  # the five bytes Windows-1252 leaves undefined
            return data.decode("latin-1"), "latin-1"
    for name, codec, rows in _CJK:
        found = _strict(data, codec, prefix=prefix)
        if found is not None and _plain(found, _common(codec, rows)):
            return found, name
    return text, UNDECODED  # UTF-8 with stray bytes, or another encoding: not guessed


def decode_as(data: bytes, encoding: str, *, prefix: bool = False) -> str:
    """``data``, a part of a note that begins where a line does (``prefix``: it may end
    inside a character), read in the ``encoding`` :func:`decode_note` found for the whole
    note: a few lines alone may look like another. Never raises. UTF-16 and UTF-32 (whose
    line breaks are other bytes) and the rest are read as :func:`note_text` reads them."""
    codec = _CODECS.get(encoding)
    if codec is None:
        return note_text(data, prefix=prefix)
    return codecs.getincrementaldecoder(codec)(errors="replace").decode(data, final=not prefix)


def _strict(data: bytes, codec: str, *, prefix: bool) -> str | None:
    """``data`` decoded strictly (a prefix may end inside a character); None if not."""
    decoder = codecs.getincrementaldecoder(codec)()
    try:
        return decoder.decode(data, final=not prefix)
    except UnicodeDecodeError:
        return None


def _plain(text: str, common: re.Pattern[str]) -> bool:
    if _ODD.search(text) is not None:
        return False
    runs: list[str] = []
    past = 0
    for run in _PAST_ASCII.finditer(text):
        runs.append(run[0])
        past += len(run[0])
        if past >= _SAMPLE_CHARS:
            break
    return past > 0 and len(common.findall("".join(runs))) >= _COMMON_SHARE * past


@functools.cache
def _common(codec: str, rows: _Rows) -> re.Pattern[str]:
    """A character class of the common characters of ``codec`` (made once, when a note
    first needs it)."""
    found: set[str] = set()
    for (first, last), trails in rows:
        for lead in range(first, last + 1):
            for low, high in trails:
                for trail in range(low, high + 1):
                    try:
                        found.add(bytes((lead, trail)).decode(codec))
                    except UnicodeDecodeError:  # a hole in the table
                        continue
    return re.compile("[" + "".join(re.escape(c) for c in sorted(found)) + "]")
