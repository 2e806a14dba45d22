"""The text of a note's bytes, however the editor that saved it encoded it.

Notes are UTF-8 by convention, but an older editor or a Windows tool may have saved one in
Windows-1252 (Latin-1 and its superset), or, on a Chinese, Japanese or Korean system, in
GBK (GB18030), Big5, Shift_JIS, EUC-KR (Windows' code page 949) or EUC-JP: read as UTF-8,
every letter of it past ASCII became U+FFFD, so ``café`` or ``乌龙茶`` was found by no
query, shown as ``caf�``, and an edit wrote the replacement characters back over the
letters. :func:`decode_note` reads UTF-8 (and UTF-16 or UTF-32 with a byte order mark,
as Windows saves "Unicode" text). Bytes that are not UTF-8 are tried, strictly, in each
of the East Asian encodings; one reads so when the text that makes is plain (no control
character, no private-use character, four in five of its characters past ASCII among the
common ones of that encoding: GB2312's first level and signs; Big5's common characters
and signs; JIS X 0208's signs, kana and first-level kanji; KS X 1001's Hangul, hanja and
signs; half are enough when three in four of its letters are frequent ones, as in a
short note naming a place in a rare character) and, of those, its letters are the most
plainly its language's, at least half of them its frequent ones (notescript.py: the
same EUC bytes read as GB2312, KS X 1001 and JIS X 0208 alike). Bytes that hold no
UTF-8 sequence and look like Western text (no run of three bytes past ASCII: accented
letters stand between plain ones) are read so only when no such reading stands apart
from Latin letters; else as Windows-1252. Failing both, when a reading as GBK, Big5 or
Shift_JIS is plain, the plain reading most like its language is taken still. Text in
another encoding read as one of these is made mostly of its rare characters (or does not
decode at all), so it stays out. Anything else stays UTF-8, its stray bytes U+FFFD (a
file mixing encodings, a cut through the last character of a prefix, Windows-1251): the
memory jobs do not write back what reads so, since what a person wrote would be lost,
and none of them writes a note that is not UTF-8 at all. Line breaks are the same bytes
in all of them, so line numbers do not move. UTF-8 costs nothing more: the rest is tried
only once it failed. Index, server chunks, reads and edits all read notes through here.
"""

from __future__ import annotations

import codecs
import functools
import re
from typing import Final, NamedTuple

from recalld.daemon.notescript import CHINESE, JAPANESE, KOREAN, script_share

__all__ = ["UNDECODED", "decode_as", "decode_note", "lf_line_ends", "note_text"]

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
# How many characters past ASCII tell the share of common ones, and of the language's
# frequent ones (a large note costs no more than this).
_SAMPLE_CHARS: Final = 1 << 16
_SHARE_CHARS: Final = 1024
_Rows = tuple[tuple[tuple[int, int], tuple[tuple[int, int], ...]], ...]
_EUC: Final = ((0xA1, 0xFE),)


class _Encoding(NamedTuple):
    name: str  # as decode_note reports it
    codec: str
    language: str  # notescript's
    rows: _Rows  # the byte pairs (lead range, trail ranges) of its common characters
    extra: str = ""  # ranges of characters outside those rows it holds common too
    # Read so, when plain, though its letters are not plainly its language's: the
    # encodings read before Korean and EUC-JP ones were told apart.
    alone: bool = False


_CJK: Final = (
    _Encoding("gb18030", "gb18030", CHINESE, (((0xA1, 0xA9), _EUC), ((0xB0, 0xD7), _EUC)),
              alone=True),
    _Encoding("big5", "cp950", CHINESE, (((0xA1, 0xC6), ((0x40, 0x7E), (0xA1, 0xFE))),),
              alone=True),
    _Encoding("shift_jis", "cp932", JAPANESE, (((0x81, 0x84), ((0x40, 0x7E), (0x80, 0xFC))),
                                               ((0x88, 0x98), ((0x40, 0x7E), (0x80, 0xFC)))),
              alone=True),
    # KS X 1001's signs, jamo and kana, its Hangul and its hanja; and the Hangul syllables
    # Windows' code page adds (each is Korean, if a rare one).
    _Encoding("euc_kr", "cp949", KOREAN, (((0xA1, 0xAC), _EUC), ((0xB0, 0xC8), _EUC),
                                          ((0xCA, 0xFD), _EUC)), "\uac00-\ud7a3"),
    # JIS X 0208's signs, digits, kana and first-level kanji.
    _Encoding("euc_jp", "euc_jp", JAPANESE, (((0xA1, 0xA5), _EUC), ((0xB0, 0xCF), _EUC))),
)
# The encodings whose line breaks are ASCII's, by the names decode_note gives them.
_CODECS: Final = {"windows-1252": "cp1252", "latin-1": "latin-1",
                  **{e.name: e.codec for e in _CJK}}
# Of the characters past ASCII, the share that must be common ones.
_COMMON_SHARE: Final = 0.8
# Of the letters, the share that must be frequent ones of the language (notescript.py).
_LANGUAGE_SHARE: Final = 0.5
# Past this share of frequent letters, half the characters common ones are enough (a
# short note naming a place in a rare character: 深圳).
_FREQUENT_SHARE: Final = 0.75
_COMMON_SHARE_OF_FREQUENT: Final = 0.5
# Letters past ASCII in a word of ASCII ones (``Größe``, ``informação``, ``créé``):
# Western text read as pairs of bytes, where a CJK character stands apart from Latin
# letters (in a note mostly Western: two bytes make a run of three with one more).
_IN_WORD: Final = re.compile("[A-Za-z][^\x00-\x7f]|[^\x00-\x7f][A-Za-z]")


def lf_line_ends(text: str) -> str:
    """``text`` with its lines ended by ``\n`` alone: what recalld writes into a note
    (a Windows pipe's ``\r\n`` or an old Mac's ``\r`` would leave the note's lines
    ended two ways, and a lone ``\r`` a line break that editors see and the index does
    not)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def note_text(data: bytes, *, prefix: bool = False) -> str:
    """``data`` decoded as the module docstring says; never raises. ``prefix``: ``data``
    is the head of a longer file, which may end inside a character."""
    return decode_note(data, prefix=prefix)[0]


def decode_note(data: bytes, *, prefix: bool = False) -> tuple[str, str]:
    """:func:`note_text`, and the encoding it read ``data`` in: "" for UTF-8, else
    ``windows-1252``, ``latin-1``, ``utf-16``, ``utf-32``, ``gb18030``, ``big5``,
    ``shift_jis``, ``euc_kr``, ``euc_jp``, or :data:`UNDECODED` (UTF-8 with U+FFFD for
    what it is not)."""
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        if prefix and exc.reason == "unexpected end of data" and exc.end == len(data):
            return data.decode("utf-8", errors="replace"), ""
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), None)
    if encoding is not None:
        return data.decode(encoding, errors="replace"), encoding
    text = data.decode("utf-8", errors="replace")
    western = _DECODED.search(text) is None and _RUN.search(data) is None
    # Each reading, the most plainly its language's first (the first of a tie); the one
    # to take is the first that is plain text at all: the rest need not be looked at.
    readings = sorted(((-script_share(_past_ascii(read, _SHARE_CHARS), enc.language), i,
                        read, enc) for i, enc in enumerate(_CJK)
                       if (read := _strict(data, enc.codec, prefix=prefix)) is not None),
                      key=lambda r: r[:2])
    for minus_share, _, read, enc in readings:
        if -minus_share < _LANGUAGE_SHARE or (western and _IN_WORD.search(read) is not None):
            break
        if _plain(read, enc, _COMMON_SHARE if -minus_share < _FREQUENT_SHARE
                      else _COMMON_SHARE_OF_FREQUENT):
            return read, enc.name
    if western:
        try:
            return data.decode("cp1252"), "windows-1252"
        except UnicodeDecodeError:  # the five bytes Windows-1252 leaves undefined
            return data.decode("latin-1"), "latin-1"
    # None plainly a language's, yet plain GBK, Big5 or Shift_JIS: as these were read
    # before EUC-KR and EUC-JP were known, but the reading most like its language.
    plain = [(read, enc) for _, _, read, enc in readings if _plain(read, enc)]
    if any(enc.alone for _, enc in plain):
        return plain[0][0], plain[0][1].name
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


def _past_ascii(text: str, limit: int) -> str:
    """The characters past ASCII of ``text``, the first ``limit`` or so of them."""
    runs: list[str] = []
    past = 0
    for run in _PAST_ASCII.finditer(text):
        runs.append(run[0])
        past += len(run[0])
        if past >= limit:
            break
    return "".join(runs)


def _plain(text: str, enc: _Encoding, common_share: float = _COMMON_SHARE) -> bool:
    """Does ``text`` read as plain text of ``enc`` (the module docstring)?"""
    if _ODD.search(text) is not None:
        return False
    sample = _past_ascii(text, _SAMPLE_CHARS)
    common = _common(enc.codec, enc.rows, enc.extra)
    return bool(sample) and common.subn("", sample)[1] >= common_share * len(sample)


@functools.cache
def _common(codec: str, rows: _Rows, extra: str) -> re.Pattern[str]:
    """A character class of the common characters of ``codec`` and the ``extra`` ranges
    (made once, when a note first needs it)."""
    found: set[str] = set()
    for (first, last), trails in rows:
        for lead in range(first, last + 1):
            for low, high in trails:
                for trail in range(low, high + 1):
                    try:
                        found.add(bytes((lead, trail)).decode(codec))
                    except UnicodeDecodeError:  # a hole in the table
                        continue
    return re.compile("[" + "".join(re.escape(c) for c in sorted(found)) + extra + "]")
