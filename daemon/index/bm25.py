"""BM25 keyword index over numpy arrays, with live-document bitmaps and self-compaction.

Owns one in-memory inverted index; no I/O, no threads, no locks. The caller (the per-workspace
index service) serializes writers and readers, typically by running every call in one worker
thread at a time, and persists it through ``to_arrays``/``meta`` and ``from_arrays``.

Layout. A *main* segment in CSR form: term ids (``dict[str, int]``, strings kept in term id
order), ``indptr`` (int64, one slot per term + 1), ``rows`` (int32, postings sorted by row per
term) and ``tfs`` (float32), plus per-row ``doclen``, ``row_keys`` (the caller's uint32 doc key)
and ``alive``. New documents go to a small Python *delta* (term -> {key: tf}). A delete clears a
bit (``alive`` or the delta entry) in O(1); dead rows stay in the postings and are masked at query
time until the next merge.

Compaction is part of ``add``/``remove``: the delta is merged into main once it holds more than an
eighth of the live main documents (at least ``DELTA_MIN_DOCS``, at most ``DELTA_MAX_DOCS``), and
main is rewritten once a quarter of its rows are dead. Below the cap the thresholds grow
geometrically with the index, so the total merge work over n adds is O(n) (each merge is linear:
a stable sort over one sorted run plus the small delta); the cap bounds the delta's Python memory
and its per-query cost on very large indexes. ``add_many`` builds large batches straight into
numpy slabs, which is how a cold build should feed the index.

Scoring: BM25 Okapi with Lucene's non-negative IDF ``log(1 + (N - df + 0.5) / (df + 0.5))``,
where N, df and avgdl count live documents only, so scores do not depend on merge timing. A
repeated query term counts once per repetition. Ties are broken by ascending doc key.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

__all__ = ["BM25Index"]

FORMAT: Final = "recalld-bm25"
VERSION: Final = 1
DELTA_MIN_DOCS: Final = 1024
DELTA_MAX_DOCS: Final = 8192
DEAD_MIN_ROWS: Final = 1024
DEAD_FRACTION: Final = 0.25
SLAB_DOCS: Final = 8192
_MAX_KEY: Final = 2**32 - 1

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]


def _empty_i32() -> I32:
    return np.zeros(0, dtype=np.int32)


class BM25Index:
    """An incremental BM25 index keyed by caller-chosen uint32 document keys."""

    def __init__(self, *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        self._terms: list[str] = []
        self._term_ids: dict[str, int] = {}
        self._indptr: I64 = np.zeros(1, dtype=np.int64)
        self._rows: I32 = _empty_i32()
        self._tfs: F32 = np.zeros(0, dtype=np.float32)
        self._doclen: F32 = np.zeros(0, dtype=np.float32)
        self._row_keys: npt.NDArray[np.uint32] = np.zeros(0, dtype=np.uint32)
        self._alive: npt.NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)
        self._key_row: dict[int, int] = {}
        self._n_dead = 0
        self._delta_docs: dict[int, tuple[dict[str, int], int]] = {}
        self._delta_post: dict[str, dict[int, int]] = {}
        self._live = BitMap()
        self._total_len = 0
        self.merges = 0

    # ----------------------------------------------------------------- introspection
    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and 0 <= key <= _MAX_KEY and key in self._live

    @property
    def live(self) -> BitMap:
        """The live document keys (a copy: callers may combine it freely)."""
        return BitMap(self._live)

    def stats(self) -> dict[str, int]:
        return {
            "docs": len(self._live), "main_rows": len(self._row_keys), "dead_rows": self._n_dead,
            "delta_docs": len(self._delta_docs), "terms": len(self._terms),
            "postings": len(self._rows), "merges": self.merges,
        }

    # ----------------------------------------------------------------- writes
    def add(self, doc_key: int, tokens: list[str]) -> None:
        """Index ``tokens`` under ``doc_key``, replacing any earlier version of that key."""
        _check_key(doc_key)
        if doc_key in self._live:
            self._remove(doc_key)
        counts = dict(Counter(tokens))
        self._delta_docs[doc_key] = (counts, len(tokens))
        for term, tf in counts.items():
            post = self._delta_post.get(term)
            if post is None:
                self._delta_post[term] = {doc_key: tf}
            else:
                post[doc_key] = tf
        self._live.add(doc_key)
        self._total_len += len(tokens)
        self._maybe_compact()

    def add_many(self, docs: Iterable[tuple[int, list[str]]]) -> None:
        """Index many documents; large batches skip the delta and build numpy slabs directly."""
        slab = _Slab()
        for key, tokens in docs:
            _check_key(key)
            if key in slab.keys:
                self._merge(slab)
                slab = _Slab()
            if key in self._live:
                self._remove(key)
            counts = Counter(tokens)
            ids = self._term_ids
            for term, tf in counts.items():
                tid = ids.get(term)
                if tid is None:
                    tid = ids[term] = len(self._terms)
                    self._terms.append(term)
                slab.tids.append(tid)
                slab.tfs.append(tf)
            slab.keys[key] = len(slab.lens)
            slab.lens.append(len(tokens))
            slab.doc_nterms.append(len(counts))
            self._live.add(key)
            self._total_len += len(tokens)
            if len(slab.lens) >= SLAB_DOCS:
                self._merge(slab)
                slab = _Slab()
        if slab.lens:
            self._merge(slab)
        self._maybe_compact()

    def remove(self, doc_key: int) -> bool:
        """Delete ``doc_key``; returns whether it was indexed. O(1) apart from compaction."""
        if doc_key not in self:
            return False
        self._remove(doc_key)
        self._maybe_compact()
        return True

    def compact(self) -> None:
        """Merge the delta and drop dead rows now (normally automatic)."""
        if self._delta_docs or self._n_dead:
            self._merge(None)

    def _remove(self, key: int) -> None:
        entry = self._delta_docs.pop(key, None)
        if entry is not None:
            counts, length = entry
            for term in counts:
                post = self._delta_post[term]
                del post[key]
                if not post:
                    del self._delta_post[term]
            self._total_len -= length
        else:
            row = self._key_row.pop(key)
            self._alive[row] = False
            self._n_dead += 1
            self._total_len -= int(self._doclen[row])
        self._live.discard(key)

    def _maybe_compact(self) -> None:
        main_live = len(self._row_keys) - self._n_dead
        delta_limit = min(DELTA_MAX_DOCS, max(DELTA_MIN_DOCS, main_live // 8))
        if len(self._delta_docs) > delta_limit or (
            self._n_dead >= DEAD_MIN_ROWS and self._n_dead > DEAD_FRACTION * len(self._row_keys)
        ):
            self._merge(None)

    def _merge(self, slab: _Slab | None) -> None:
        """Rewrite main from its live rows, the delta and ``slab``: linear apart from the sort."""
        self.merges += 1
        n_terms_main = len(self._indptr) - 1
        counts_main = np.diff(self._indptr)
        tids_main = np.repeat(np.arange(n_terms_main, dtype=np.int32), counts_main)
        rows_main, tfs_main = self._rows, self._tfs
        alive_rows = np.flatnonzero(self._alive)
        if self._n_dead:
            remap = np.full(len(self._alive), -1, dtype=np.int32)
            remap[alive_rows] = np.arange(len(alive_rows), dtype=np.int32)
            keep = self._alive[rows_main]
            tids_main, tfs_main = tids_main[keep], tfs_main[keep]
            rows_main = remap[rows_main[keep]]
        parts_t: list[npt.NDArray[Any]] = [tids_main]
        parts_r: list[npt.NDArray[Any]] = [rows_main]
        parts_f: list[npt.NDArray[Any]] = [tfs_main]
        lens: list[npt.NDArray[Any]] = [self._doclen[alive_rows]]
        keys: list[npt.NDArray[Any]] = [self._row_keys[alive_rows]]
        next_row = len(alive_rows)
        if self._delta_docs:
            delta = _Slab()
            for key in sorted(self._delta_docs):
                counts, length = self._delta_docs[key]
                for term, tf in counts.items():
                    tid = self._term_ids.get(term)
                    if tid is None:
                        tid = self._term_ids[term] = len(self._terms)
                        self._terms.append(term)
                    delta.tids.append(tid)
                    delta.tfs.append(tf)
                delta.keys[key] = len(delta.lens)
                delta.lens.append(length)
                delta.doc_nterms.append(len(counts))
            next_row = delta.append_to(parts_t, parts_r, parts_f, lens, keys, next_row)
            self._delta_docs.clear()
            self._delta_post.clear()
        if slab is not None:
            slab.append_to(parts_t, parts_r, parts_f, lens, keys, next_row)
        tids = np.concatenate(parts_t).astype(np.int32, copy=False)
        order = np.argsort(tids, kind="stable")
        tids = tids[order]
        per_term = np.bincount(tids, minlength=len(self._terms))
        if per_term.size and not per_term.all():
            # Drop terms without postings so the dictionary does not grow forever.
            used = np.flatnonzero(per_term)
            tid_map = np.full(len(self._terms), -1, dtype=np.int32)
            tid_map[used] = np.arange(len(used), dtype=np.int32)
            self._terms = [self._terms[i] for i in used.tolist()]
            self._term_ids = {t: i for i, t in enumerate(self._terms)}
            per_term = per_term[used]
        indptr = np.zeros(len(self._terms) + 1, dtype=np.int64)
        np.cumsum(per_term, out=indptr[1:])
        self._indptr = indptr
        self._rows = np.concatenate(parts_r).astype(np.int32, copy=False)[order]
        self._tfs = np.concatenate(parts_f).astype(np.float32, copy=False)[order]
        self._doclen = np.concatenate(lens).astype(np.float32, copy=False)
        self._row_keys = np.concatenate(keys).astype(np.uint32, copy=False)
        self._alive = np.ones(len(self._row_keys), dtype=np.bool_)
        self._key_row = dict(zip(self._row_keys.tolist(), range(len(self._row_keys)), strict=True))
        self._n_dead = 0

    # ----------------------------------------------------------------- search
    def search(
        self, query_tokens: list[str], limit: int, *, allowed: BitMap | None = None
    ) -> list[tuple[int, float]]:
        """Top ``limit`` (doc key, score) pairs, best first; only keys in ``allowed`` if given.

        Corpus statistics always cover every live document: a filter narrows the results, it
        does not change the scores.
        """
        n_docs = len(self._live)
        if n_docs == 0 or limit <= 0 or not query_tokens:
            return []
        k1, b = self.k1, self.b
        avgdl = self._total_len / n_docs if self._total_len else 1.0
        n_terms_main = len(self._indptr) - 1
        row_parts: list[I32] = []
        weight_parts: list[npt.NDArray[np.float64]] = []
        delta_scores: dict[int, float] = {}
        for term, qf in Counter(query_tokens).items():
            tid = self._term_ids.get(term)
            rows = tfs = None
            df = 0
            if tid is not None and tid < n_terms_main:
                start, end = int(self._indptr[tid]), int(self._indptr[tid + 1])
                rows, tfs = self._rows[start:end], self._tfs[start:end]
                if self._n_dead:
                    keep = self._alive[rows]
                    rows, tfs = rows[keep], tfs[keep]
                df = len(rows)
            dpost = self._delta_post.get(term)
            if dpost:
                df += len(dpost)
            if df == 0:
                continue
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)) * qf
            if rows is not None and len(rows):
                tf64 = tfs.astype(np.float64)  # type: ignore[union-attr]
                norm = k1 * (1.0 - b + b * (self._doclen[rows].astype(np.float64) / avgdl))
                row_parts.append(rows)
                weight_parts.append(idf * (k1 + 1.0) * tf64 / (tf64 + norm))
            if dpost:
                docs = self._delta_docs
                for key, tf in dpost.items():
                    norm_d = k1 * (1.0 - b + b * (docs[key][1] / avgdl))
                    delta_scores[key] = (
                        delta_scores.get(key, 0.0) + idf * (k1 + 1.0) * tf / (tf + norm_d)
                    )
        cand_keys, cand_scores = self._main_candidates(row_parts, weight_parts, allowed)
        if delta_scores:
            items = sorted(delta_scores.items())
            if allowed is not None:
                items = [kv for kv in items if kv[0] in allowed]
            if items:
                dk = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
                ds = np.fromiter((s for _, s in items), dtype=np.float64, count=len(items))
                cand_keys = np.concatenate([cand_keys, dk])
                cand_scores = np.concatenate([cand_scores, ds])
        return _top_k(cand_keys, cand_scores, limit)

    def _main_candidates(
        self,
        row_parts: list[I32],
        weight_parts: list[npt.NDArray[np.float64]],
        allowed: BitMap | None,
    ) -> tuple[I64, npt.NDArray[np.float64]]:
        if not row_parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        if len(row_parts) == 1:
            cand, scores = row_parts[0], weight_parts[0]
        else:
            acc: npt.NDArray[np.float64] = np.bincount(
                np.concatenate(row_parts), weights=np.concatenate(weight_parts),
                minlength=len(self._row_keys),
            ).astype(np.float64, copy=False)
            cand = np.flatnonzero(acc).astype(np.int32)
            scores = acc[cand]
        keys = self._row_keys[cand].astype(np.int64)
        if allowed is not None:
            allowed_arr = np.frombuffer(allowed.to_array(), dtype=np.uint32).astype(np.int64)
            if len(allowed_arr) == 0:
                return keys[:0], scores[:0]
            pos = np.minimum(np.searchsorted(allowed_arr, keys), len(allowed_arr) - 1)
            ok = allowed_arr[pos] == keys
            keys, scores = keys[ok], scores[ok]
        return keys, scores

    # ----------------------------------------------------------------- persistence
    def meta(self) -> dict[str, Any]:
        """JSON-able parameters and counters that go with ``to_arrays``."""
        return {
            "format": FORMAT, "version": VERSION, "k1": self.k1, "b": self.b,
            "docs": len(self._live), "total_len": self._total_len, "terms": len(self._terms),
        }

    def to_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The whole index as plain numeric arrays (no objects, safe without pickle).

        Main arrays are returned without copying; treat them as read-only. The delta is
        exported as its own small doc-major CSR so persisting does not force a merge.
        """
        delta_keys = sorted(self._delta_docs)
        d_indptr = [0]
        d_tids: list[int] = []
        d_tfs: list[int] = []
        d_lens: list[int] = []
        for key in delta_keys:
            counts, length = self._delta_docs[key]
            for term, tf in counts.items():
                tid = self._term_ids.get(term)
                if tid is None:
                    tid = self._term_ids[term] = len(self._terms)
                    self._terms.append(term)
                d_tids.append(tid)
                d_tfs.append(tf)
            d_indptr.append(len(d_tids))
            d_lens.append(length)
        encoded = [t.encode("utf-8") for t in self._terms]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return {
            "terms_blob": np.frombuffer(b"".join(encoded), dtype=np.uint8),
            "terms_offsets": offsets,
            "indptr": self._indptr, "rows": self._rows, "tfs": self._tfs,
            "doclen": self._doclen, "row_keys": self._row_keys,
            "alive": self._alive.astype(np.uint8),
            "delta_keys": np.asarray(delta_keys, dtype=np.uint32),
            "delta_indptr": np.asarray(d_indptr, dtype=np.int64),
            "delta_tids": np.asarray(d_tids, dtype=np.int32),
            "delta_tfs": np.asarray(d_tfs, dtype=np.float32),
            "delta_lens": np.asarray(d_lens, dtype=np.int64),
        }

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, npt.NDArray[Any]], meta: Mapping[str, Any]
    ) -> BM25Index:
        """Rebuild an index saved by ``to_arrays``; raises ValueError on any inconsistency."""
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(
                f"unsupported keyword index {meta.get('format')}/{meta.get('version')}"
            )
        index = cls(k1=float(meta["k1"]), b=float(meta["b"]))
        _load_into(index, arrays)
        if len(index) != meta.get("docs") or index._total_len != meta.get("total_len"):
            raise ValueError("keyword index counters do not match its arrays")
        return index


class _Slab:
    """Documents encoded as term ids, waiting to become part of main."""

    __slots__ = ("doc_nterms", "keys", "lens", "tfs", "tids")

    def __init__(self) -> None:
        self.tids: list[int] = []
        self.tfs: list[int] = []
        self.lens: list[int] = []
        self.doc_nterms: list[int] = []
        self.keys: dict[int, int] = {}

    def append_to(
        self,
        parts_t: list[npt.NDArray[Any]],
        parts_r: list[npt.NDArray[Any]],
        parts_f: list[npt.NDArray[Any]],
        lens: list[npt.NDArray[Any]],
        keys: list[npt.NDArray[Any]],
        first_row: int,
    ) -> int:
        n = len(self.lens)
        parts_t.append(np.asarray(self.tids, dtype=np.int32))
        rows = np.arange(first_row, first_row + n, dtype=np.int32)
        parts_r.append(np.repeat(rows, np.asarray(self.doc_nterms, dtype=np.int64)))
        parts_f.append(np.asarray(self.tfs, dtype=np.float32))
        lens.append(np.asarray(self.lens, dtype=np.float32))
        keys.append(np.fromiter(self.keys, dtype=np.uint32, count=n))
        return first_row + n


def _load_into(index: BM25Index, arrays: Mapping[str, npt.NDArray[Any]]) -> None:
    def get(name: str, dtype: type[np.generic]) -> npt.NDArray[Any]:
        arr = arrays.get(name)
        if arr is None or arr.ndim != 1 or arr.dtype != np.dtype(dtype):
            raise ValueError(f"keyword index array {name!r} missing or malformed")
        return arr

    blob = get("terms_blob", np.uint8).tobytes()
    offsets = get("terms_offsets", np.int64)
    indptr, rows = get("indptr", np.int64), get("rows", np.int32)
    tfs, doclen = get("tfs", np.float32), get("doclen", np.float32)
    row_keys, alive = get("row_keys", np.uint32), get("alive", np.uint8).astype(np.bool_)
    n_rows, n_terms = len(row_keys), len(offsets) - 1
    if (
        n_terms < 0 or offsets[0] != 0 or offsets[-1] != len(blob)
        or np.any(np.diff(offsets) < 0) or len(indptr) < 1 or len(indptr) - 1 > n_terms
        or indptr[0] != 0 or indptr[-1] != len(rows) or np.any(np.diff(indptr) < 0)
        or len(tfs) != len(rows) or len(doclen) != n_rows or len(alive) != n_rows
        or (len(rows) and (rows.min() < 0 or rows.max() >= n_rows))
    ):
        raise ValueError("keyword index arrays are inconsistent")
    try:
        bounds_t = offsets.tolist()
        terms = [blob[bounds_t[i] : bounds_t[i + 1]].decode("utf-8") for i in range(n_terms)]
    except UnicodeDecodeError as exc:
        raise ValueError("keyword index term dictionary is not UTF-8") from exc
    index._terms = terms
    index._term_ids = {t: i for i, t in enumerate(terms)}
    if len(index._term_ids) != len(terms):
        raise ValueError("keyword index term dictionary has duplicates")
    index._indptr, index._rows, index._tfs = indptr, rows, tfs
    index._doclen, index._row_keys, index._alive = doclen, row_keys, alive
    live_rows = np.flatnonzero(alive)
    index._key_row = dict(zip(row_keys[live_rows].tolist(), live_rows.tolist(), strict=True))
    if len(index._key_row) != len(live_rows):
        raise ValueError("keyword index has duplicate live keys")
    index._n_dead = n_rows - len(live_rows)
    index._live = BitMap(index._key_row)
    index._total_len = int(doclen[live_rows].astype(np.int64).sum())
    d_keys, d_indptr = get("delta_keys", np.uint32), get("delta_indptr", np.int64)
    d_tids, d_tfs = get("delta_tids", np.int32), get("delta_tfs", np.float32)
    d_lens = get("delta_lens", np.int64)
    if (
        len(d_indptr) != len(d_keys) + 1 or len(d_lens) != len(d_keys) or d_indptr[0] != 0
        or d_indptr[-1] != len(d_tids) or len(d_tfs) != len(d_tids)
        or np.any(np.diff(d_indptr) < 0)
        or (len(d_tids) and (d_tids.min() < 0 or d_tids.max() >= n_terms))
    ):
        raise ValueError("keyword index delta arrays are inconsistent")
    bounds = d_indptr.tolist()
    tids_l, tfs_l = d_tids.tolist(), d_tfs.astype(np.int64).tolist()
    for i, (key, length) in enumerate(zip(d_keys.tolist(), d_lens.tolist(), strict=True)):
        if key in index._live:
            raise ValueError("keyword index delta repeats a live key")
        lo, hi = bounds[i], bounds[i + 1]
        counts = {terms[t]: f for t, f in zip(tids_l[lo:hi], tfs_l[lo:hi], strict=True)}
        index._delta_docs[key] = (counts, int(length))
        for term, tf in counts.items():
            index._delta_post.setdefault(term, {})[key] = tf
        index._live.add(key)
        index._total_len += int(length)


def _check_key(key: int) -> None:
    if not isinstance(key, int) or not 0 <= key <= _MAX_KEY:
        raise ValueError(f"document keys are uint32, got {key!r}")


def _top_k(keys: I64, scores: npt.NDArray[np.float64], limit: int) -> list[tuple[int, float]]:
    """Best ``limit`` by score, ties by ascending key, without sorting every candidate."""
    if len(keys) > limit:
        kth = np.partition(scores, len(scores) - limit)[len(scores) - limit]
        sel = scores >= kth
        keys, scores = keys[sel], scores[sel]
    order = np.lexsort((keys, -scores))[:limit]
    return [(int(k), float(s)) for k, s in zip(keys[order], scores[order], strict=True)]
