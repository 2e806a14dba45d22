"""The keyword index's saved form, read back: the term dictionary as one UTF-8 blob with
offsets (:func:`terms_to_arrays`, :func:`load_terms`), term lookups over it without a
string per term (:class:`SortedTerms`), and checked reads of the saved arrays
(:func:`array`, :func:`load_segment`). Pure functions and a read-only lookup; the keyword
index (``bm25.py``, ``bm25_saved.py``) and ``chunktable.py`` call them for their persistence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt

from recalld.daemon.index.postings import I64, Segment

_S = TypeVar("_S", bound=np.generic)


def terms_to_arrays(terms: list[str]) -> tuple[npt.NDArray[np.uint8], I64]:
    """The term dictionary as one UTF-8 blob plus offsets (term i is blob[off[i]:off[i+1]]).

    Encoded joined, so that saving a dictionary of tens of thousands of terms makes two
    large buffers instead of one small bytes object per term: small objects fill the
    interpreter's arenas, which stay resident while any object in them lives, and a
    commit at the end of a first build is when the heap is fullest.
    """
    if not terms:
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    joined = np.frombuffer("\n".join(terms).encode("utf-8"), dtype=np.uint8)
    # In UTF-8 the byte 10 is a line break and nothing else.
    breaks = np.flatnonzero(joined == 10)
    if len(breaks) == len(terms) - 1:
        offsets = np.empty(len(terms) + 1, dtype=np.int64)
        offsets[0] = 0
        offsets[1:-1] = breaks - np.arange(len(breaks))
        offsets[-1] = joined.size - len(breaks)
        keep = np.ones(joined.size, dtype=np.bool_)
        keep[breaks] = False
        return joined[keep], offsets
    # A string holds a line break of its own (a path may): one at a time.
    encoded = [t.encode("utf-8") for t in terms]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def array(arrays: Mapping[str, npt.NDArray[np.generic]], name: str,
          dtype: type[_S]) -> npt.NDArray[_S]:
    """``arrays[name]`` if it is one-dimensional of ``dtype``, else ValueError."""
    arr = arrays.get(name)
    if arr is None or arr.ndim != 1 or arr.dtype != np.dtype(dtype):
        raise ValueError(f"keyword index array {name!r} missing or malformed")
    return cast("npt.NDArray[_S]", arr)  # its dtype was just checked


def load_terms(
    arrays: Mapping[str, npt.NDArray[np.generic]], *, unique: bool = True,
    prefix: str = "terms_"
) -> list[str]:
    """The strings saved by :func:`terms_to_arrays` as ``{prefix}blob``/``{prefix}offsets``."""
    blob = array(arrays, f"{prefix}blob", np.uint8).tobytes()
    offsets = array(arrays, f"{prefix}offsets", np.int64)
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(blob) or np.any(
        np.diff(offsets) < 0
    ):
        raise ValueError("keyword index term offsets are inconsistent")
    raw = np.frombuffer(blob, dtype=np.uint8)
    starts = offsets[:-1][offsets[:-1] < len(blob)]
    if ((raw[starts] & 0xC0) == 0x80).any():
        raise ValueError("keyword index term offsets split a character")
    try:
        text, char_at = _decoded(raw)
    except UnicodeDecodeError as exc:
        raise ValueError("keyword index term dictionary is not UTF-8") from exc
    bounds = char_at[offsets].tolist()
    terms = [text[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
    if unique and len(set(terms)) != len(terms):
        raise ValueError("keyword index term dictionary has duplicates")
    return terms


def _decoded(raw: npt.NDArray[np.uint8]) -> tuple[str, I64]:
    """UTF-8 bytes decoded in one call, and each byte offset's character offset: a
    character's index is its byte's index less the continuation bytes before it."""
    text = raw.tobytes().decode("utf-8")
    char_at = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum((raw & 0xC0) != 0x80, out=char_at[1:])
    return text, char_at


class SortedTerms:
    """Read-only term -> id lookup over a saved term dictionary (the UTF-8 blob and
    offsets of :func:`terms_to_arrays`) without a Python string per term.

    Terms of up to :attr:`WIDTH` bytes sit in one sorted fixed-width byte array searched
    by bisection, longer ones (identifiers, a few percent) in a small dict. Building it
    checks what :func:`load_terms` checks (offsets, UTF-8, no duplicates) with array
    operations, so a loaded index is checked and searchable at once, in a fraction of the
    memory (about 1.5 MB against 13 MB for 50k terms) and time of the full dictionary,
    which only a write needs.
    """

    WIDTH = 24
    # Recent lookups, so the terms of repeated queries cost one dict lookup.
    RECENT_MAX = 4096

    __slots__ = ("_blob", "_ids", "_long", "_offsets", "_recent", "_sorted", "n_terms")

    def __init__(self, blob: npt.NDArray[np.uint8], offsets: I64) -> None:
        width = self.WIDTH
        n = len(offsets) - 1
        if n < 0 or offsets[0] != 0 or offsets[-1] != len(blob) or np.any(np.diff(offsets) < 0):
            raise ValueError("keyword index term offsets are inconsistent")
        raw = blob.tobytes()
        cont = (blob & 0xC0) == 0x80
        starts = offsets[:-1][offsets[:-1] < len(blob)]
        if cont[starts].any():
            raise ValueError("keyword index term offsets split a character")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError("keyword index term dictionary is not UTF-8") from exc
        lens = np.diff(offsets)
        short = lens <= width
        # A fixed-width bytes array drops trailing NULs: such terms go to the dict.
        nul = np.flatnonzero(blob == 0)
        if len(nul):
            short[np.searchsorted(offsets, nul, side="right") - 1] = False
        ids = np.flatnonzero(short)
        # Each short term's bytes and what follows, one row per term, then the bytes past
        # its end zeroed.
        padded = np.concatenate([blob, np.zeros(width, dtype=np.uint8)])
        mat = np.lib.stride_tricks.sliding_window_view(padded, width)[offsets[:-1][ids]]
        mat *= np.arange(width) < lens[ids][:, None]  # (the fancy index made a copy)
        keys = mat.view(f"S{width}").ravel()
        # Sorted as three big-endian words per key: the same order as the bytes (a
        # key's padding is zeros), and faster than sorting the byte strings.
        words = mat.view(">u8")
        order = np.lexsort(words.T[::-1])
        self._sorted = keys[order]
        self._ids = ids[order].astype(np.int32)
        if len(self._sorted) > 1 and bool(np.any(self._sorted[1:] == self._sorted[:-1])):
            raise ValueError("keyword index term dictionary has duplicates")
        long_ids = np.flatnonzero(~short).tolist()
        bounds = offsets.tolist()
        self._long = {raw[bounds[i]:bounds[i + 1]].decode("utf-8"): i for i in long_ids}
        if len(self._long) != len(long_ids):
            raise ValueError("keyword index term dictionary has duplicates")
        self._recent: dict[str, int | None] = {}
        self._blob, self._offsets = blob, offsets
        self.n_terms = n

    def __len__(self) -> int:
        return self.n_terms

    def __getitem__(self, tid: int) -> str:
        """The term with id ``tid``."""
        a, b = int(self._offsets[tid]), int(self._offsets[tid + 1])
        return self._blob[a:b].tobytes().decode("utf-8")

    def many(self, tids: list[int]) -> list[str]:
        """The terms with ids ``tids``: one decode of the dictionary, then slices (for
        thousands of ids, a tenth of the time of one :meth:`__getitem__` each)."""
        text, char_at = _decoded(self._blob)
        ids = np.asarray(tids, dtype=np.int64)
        starts = char_at[self._offsets[ids]].tolist()
        ends = char_at[self._offsets[ids + 1]].tolist()
        return [text[a:b] for a, b in zip(starts, ends, strict=True)]

    def get(self, term: str) -> int | None:
        """The id of ``term``, None if the dictionary does not hold it."""
        try:
            return self._recent[term]
        except KeyError:
            pass
        tid = self._find(term)
        if len(self._recent) >= self.RECENT_MAX:
            self._recent.clear()
        self._recent[term] = tid
        return tid

    def _find(self, term: str) -> int | None:
        try:
            key = term.encode("utf-8")
        except UnicodeEncodeError:
            return None
        if len(key) > self.WIDTH or b"\0" in key:
            return self._long.get(term)
        i = int(np.searchsorted(self._sorted, key))
        if i < len(self._sorted) and self._sorted[i] == key:
            return int(self._ids[i])
        return None


def load_segment(arrays: Mapping[str, npt.NDArray[np.generic]], n_terms: int, *,
                 check_values: bool = True) -> Segment:
    """The segment saved in ``arrays``; ValueError when they are inconsistent.

    ``check_values=False`` checks shapes and bounds of the small arrays only, not every
    posting: for arrays known to be what the index itself just wrote (reading every
    posting of a mapped file would bring all its pages in at once)."""
    seg = Segment(
        array(arrays, "indptr", np.int64), array(arrays, "rows", np.int32),
        array(arrays, "tfs", np.float32), array(arrays, "doclen", np.float32),
        array(arrays, "row_keys", np.uint32),
    )
    n_rows = len(seg.row_keys)
    if (
        len(seg.indptr) < 1 or len(seg.indptr) - 1 > n_terms or seg.indptr[0] != 0
        or seg.indptr[-1] != len(seg.rows) or np.any(np.diff(seg.indptr) < 0)
        or len(seg.tfs) != len(seg.rows) or len(seg.doclen) != n_rows
        or (check_values and len(seg.rows) and (seg.rows.min() < 0 or seg.rows.max() >= n_rows))
        or (check_values and len(seg.tfs) and seg.tfs.min() < 1)
        or (n_rows and seg.doclen.min() < 0)
    ):
        raise ValueError("keyword index arrays are inconsistent")
    return seg
