"""The keyword index's (:class:`~.bm25.BM25Index`) saved form: its format and meta
(:class:`BM25Meta`), the whole index as plain numeric arrays (:func:`to_arrays`) and those
arrays read back and checked (:func:`load`). Pure functions over arrays, no I/O: the index
service writes and maps the files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NamedTuple, TypedDict

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from recalld.daemon.index import saved
from recalld.daemon.index.delta import Delta, SavedDelta
from recalld.daemon.index.postings import I64, Segment, Slab
from recalld.daemon.jsontypes import JsonObject

FORMAT: Final = "recalld-bm25"
# 2: CJK text counts by characters in document lengths (tokenizer.doc_length).
# 3: frontmatter values written with escapes are indexed as they read (chunker.index_text).
# 4: a chunk that shows no word has no terms but its pictographs (chunker.index_text).
VERSION: Final = 4


class BM25Meta(TypedDict):
    """The parameters and counters saved beside :meth:`BM25Index.to_arrays`."""

    format: str
    version: int
    k1: float
    b: float
    docs: int
    total_len: int
    terms: int


class OutdatedFormat(ValueError):
    """Saved arrays of another format or version: rebuild, nothing is damaged."""


def check_format(meta: JsonObject) -> None:
    """OutdatedFormat unless ``meta`` is of this format and version."""
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise OutdatedFormat(
            f"unsupported keyword index {meta.get('format')}/{meta.get('version')}"
        )


def to_arrays(terms: tuple[npt.NDArray[np.uint8], I64], main: Segment,
              alive: npt.NDArray[np.bool_], delta: Slab) -> dict[str, npt.NDArray[np.generic]]:
    """The saved arrays of an index with the term dictionary ``terms`` (blob, offsets),
    ``main`` with its ``alive`` bits and the delta encoded as ``delta``, which is saved
    as its own small doc-major CSR. Main's arrays are returned without copying."""
    blob, offsets = terms
    d_indptr = np.zeros(len(delta.lens) + 1, dtype=np.int64)
    np.cumsum(delta.nterms, out=d_indptr[1:])
    return {
        "terms_blob": blob, "terms_offsets": offsets,
        "indptr": main.indptr, "rows": main.rows, "tfs": main.tfs,
        "doclen": main.doclen, "row_keys": main.row_keys,
        "alive": alive.astype(np.uint8),
        "delta_keys": np.asarray(delta.keys, dtype=np.uint32), "delta_indptr": d_indptr,
        "delta_tids": delta.tids, "delta_tfs": delta.tfs,
        "delta_lens": np.asarray(delta.lens, dtype=np.int64),
    }


class Loaded(NamedTuple):
    """An index read back by :func:`load`: the term dictionary as saved and its sorted
    lookup, main with its alive bits and live rows, the live keys with their summed
    lengths, and the delta (its documents and postings)."""

    terms_blob: npt.NDArray[np.uint8]
    terms_offsets: I64
    terms: saved.SortedTerms
    main: Segment
    alive: npt.NDArray[np.bool_]
    live_rows: npt.NDArray[np.int64]
    live: BitMap
    total_len: int
    delta: Delta


def load(arrays: Mapping[str, npt.NDArray[np.generic]], *, check_values: bool) -> Loaded:
    """Read back what :func:`to_arrays` saved; ValueError on any inconsistency
    (``check_values``: see ``saved.load_segment``)."""
    # Checked now (offsets, UTF-8, no duplicates) and searchable as it is: the term
    # strings are made only when a write needs the table.
    blob = saved.array(arrays, "terms_blob", np.uint8)
    offsets = saved.array(arrays, "terms_offsets", np.int64)
    terms = saved.SortedTerms(blob, offsets)
    seg = saved.load_segment(arrays, len(terms), check_values=check_values)
    alive = saved.array(arrays, "alive", np.uint8).astype(np.bool_)
    if len(alive) != len(seg.row_keys):
        raise ValueError("keyword index alive bits do not match its rows")
    live_rows = np.flatnonzero(alive)
    live_keys = seg.row_keys[live_rows]
    # Keys are handed out in ascending order, so a sorted check usually suffices.
    ascending = len(live_keys) < 2 or bool(np.all(live_keys[1:] > live_keys[:-1]))
    if not ascending and len(np.unique(live_keys)) != len(live_rows):
        raise ValueError("keyword index has duplicate live keys")
    live = BitMap(live_keys.tolist())
    total_len = int(seg.doclen[live_rows].astype(np.int64).sum())
    d_keys = saved.array(arrays, "delta_keys", np.uint32)
    d_indptr = saved.array(arrays, "delta_indptr", np.int64)
    d_tids = saved.array(arrays, "delta_tids", np.int32)
    d_tfs = saved.array(arrays, "delta_tfs", np.float32)
    d_lens = saved.array(arrays, "delta_lens", np.int64)
    if (
        len(d_indptr) != len(d_keys) + 1 or len(d_lens) != len(d_keys) or d_indptr[0] != 0
        or d_indptr[-1] != len(d_tids) or len(d_tfs) != len(d_tids)
        or np.any(np.diff(d_indptr) < 0) or (len(d_lens) and d_lens.min() < 0)
        or (len(d_tids) and (d_tids.min() < 0 or d_tids.max() >= len(terms)))
        # Counts as a save writes them (a merge of the arrays keeps them as they are).
        or (len(d_tfs) and bool(np.any(~(d_tfs >= 1)) or np.any(d_tfs != np.trunc(d_tfs))))
    ):
        raise ValueError("keyword index delta arrays are inconsistent")
    delta = Delta()
    if len(d_keys):
        keys, lens = d_keys.tolist(), d_lens.tolist()
        if len(set(keys)) != len(keys) or any(k in live for k in keys):
            raise ValueError("keyword index delta repeats a key")
        # Kept as saved and read as it is (see delta.py).
        delta = Delta(SavedDelta(terms, d_keys, d_indptr, d_tids, d_tfs, d_lens))
        live.update(keys)
        total_len += sum(lens)
    return Loaded(blob, offsets, terms, seg, alive, live_rows, live, total_len, delta)
