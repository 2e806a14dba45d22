"""The persistent, text-keyed embedding cache of one vector space.

One cache per vector space (backend, model, dimensions, endpoint: the provider client's
``vector_space_key()``), shared by every workspace that embeds into that space, stored as an
append log ``<state_dir>/embeddings/<space>.log`` of ``{"h": <blake2b-16 of the exact input
text, as sent: cut to the client's input budget (``VectorSpace.cache_key``)>, "v": <float16
little-endian, base64>}`` records (the vector encoding QwenPaw uses for
``_embedding_f16_b64``). A rebuilt index, a second workspace with the same notes, or a
restart in the middle of a backfill finds its vectors here instead of paying the provider
again.

Size rule: the cache must hold at least every vector a live chunk of an open workspace uses
(otherwise a rebuild would pay twice). ``compact(live)`` keeps those plus the most recently
added ``max_cache_size`` others (QwenPaw's ``max_cache_size``, 10,000 by default) and drops
the rest; the backfill calls it when the log has grown past twice that bound. Memory: the
vectors are kept in RAM as float16 bytes (2 x dims bytes each; 3,000 chunks at 1,024
dimensions are 6 MB).

Blocking I/O under a thread lock: call it from worker threads. Nothing here starts a task.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from recalld.daemon.arraytypes import F32
from recalld.daemon.store.applog import AppendLog
from recalld.daemon.store.errors import StorageError
from recalld.daemon.store.fsio import FS, REAL

log = logging.getLogger(__name__)



def text_hash(text: str) -> str:
    """The cache key of one input text (hex blake2b, 16 bytes)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def encode_f16(vector: npt.ArrayLike) -> str:
    """QwenPaw's ``_embedding_f16_b64``: float16 little-endian bytes, base64."""
    return base64.b64encode(np.asarray(vector, dtype="<f2").tobytes()).decode("ascii")


def decode_f16(value: str) -> F32:
    """A ``_embedding_f16_b64`` value back to float32; ValueError when malformed, not
    finite or all zeros."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"bad base64 vector: {exc}") from None
    if not raw or len(raw) % 2:
        raise ValueError(f"vector bytes of odd length {len(raw)}")
    out: F32 = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if not np.all(np.isfinite(out)):
        raise ValueError("vector has non-finite values")
    if not out.any():  # no direction: it would score alike against every query
        raise ValueError("vector of zeros")
    return out


class EmbeddingCache:
    """``text hash -> float16 vector`` for one vector space, persisted in an append log."""

    def __init__(self, path: Path, dims: int, *, max_cache_size: int = 10000,
                 fs: FS = REAL) -> None:
        self.path = path
        self.dims = dims
        self.max_cache_size = max(0, max_cache_size)
        self._log = AppendLog(path, fs)
        self._lock = threading.Lock()
        # Insertion order is age order: compaction keeps the newest entries.
        self._entries: dict[str, bytes] = {}
        self._lines = 0
        self.hits = 0
        self.misses = 0
        self.stored = 0
        self.damaged = 0
        #: Failed writes of the log, and the last one's error (None once one works again).
        self.write_errors = 0
        self.write_error: str | None = None
        self._opened = False

    def open(self) -> None:
        """Replay the log (cutting a torn tail); entries of the wrong size are skipped. A
        log that cannot be opened leaves the cache in memory only (it saves paying the
        provider twice, nothing more: never worth stopping a workspace for)."""
        with self._lock:
            try:
                records, report = self._log.open()
            except StorageError as exc:
                self._write_failed(exc)
                return
            self._opened = True
            self.damaged = len(report.bad_lines)
            want = 2 * self.dims
            for rec in records:
                h, v = rec.get("h"), rec.get("v")
                if not isinstance(h, str) or not isinstance(v, str):
                    self.damaged += 1
                    continue
                try:
                    raw = base64.b64decode(v, validate=True)
                except ValueError:
                    self.damaged += 1
                    continue
                if len(raw) != want:
                    self.damaged += 1
                    continue
                self._entries.pop(h, None)
                self._entries[h] = raw
            self._lines = len(records)
            if self.damaged:
                log.warning("embedding cache %s: skipped %d damaged record(s)",
                            self.path.name, self.damaged)

    def close(self) -> None:
        with self._lock:
            self._log.close()

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, hashes: Sequence[str]) -> list[F32 | None]:
        """The cached vector (float32) of each hash, None where missing."""
        out: list[F32 | None] = []
        with self._lock:
            for h in hashes:
                raw = self._entries.get(h)
                if raw is None:
                    self.misses += 1
                    out.append(None)
                else:
                    self.hits += 1
                    out.append(np.frombuffer(raw, dtype="<f2").astype(np.float32))
        return out

    def holds(self, hashes: Iterable[str]) -> bool:
        """Whether every one of ``hashes`` has a vector here (not counted as lookups)."""
        with self._lock:
            return all(h in self._entries for h in hashes)

    def put_many(self, items: Iterable[tuple[str, npt.ArrayLike]]) -> int:
        """Store vectors (one fsynced append); returns how many were new."""
        records: list[dict[str, str]] = []
        with self._lock:
            for h, vec in items:
                raw = np.asarray(vec, dtype="<f2").tobytes()
                if len(raw) != 2 * self.dims or self._entries.get(h) == raw:
                    continue
                self._entries.pop(h, None)
                self._entries[h] = raw
                records.append({"h": h, "v": base64.b64encode(raw).decode("ascii")})
            if records and self._persist(lambda: self._log.append(records)):
                self._lines += len(records)
                self.stored += len(records)
        return len(records)

    def _persist(self, write: Callable[[], None]) -> bool:
        """Run a write of the log; a failure (a full disk) is logged once until a write
        works again, and the entries stay in memory. Whether it was written."""
        if not self._opened:
            return False
        try:
            write()
        except StorageError as exc:
            self._write_failed(exc)
            return False
        if self.write_error is not None:
            log.info("embedding cache %s: written again", self.path.name)
            self.write_error = None
        return True

    def _write_failed(self, exc: StorageError) -> None:
        self.write_errors += 1
        if self.write_error is None:
            log.warning("embedding cache %s: %s; new vectors are kept in memory only until "
                        "it can be written", self.path.name, exc)
        self.write_error = str(exc)

    def needs_compaction(self, live: int) -> bool:
        return self._lines > 2 * max(self.max_cache_size + live, 1000)

    def compact(self, live: set[str]) -> int:
        """Keep ``live`` hashes plus the newest ``max_cache_size`` others; returns dropped."""
        with self._lock:
            others = [h for h in self._entries if h not in live]
            keep_others = set(others[len(others) - self.max_cache_size:]) if (
                self.max_cache_size) else set()
            kept = {h: raw for h, raw in self._entries.items() if h in live or h in keep_others}
            dropped = len(self._entries) - len(kept)
            if not self._persist(lambda: self._log.rewrite(
                    {"h": h, "v": base64.b64encode(raw).decode("ascii")}
                    for h, raw in kept.items())):
                return 0
            self._entries = kept
            self._lines = len(kept)
            return dropped

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "hits": self.hits, "misses": self.misses,
                "stored": self.stored, "damaged": self.damaged,
                "write_errors": self.write_errors}


__all__ = ["EmbeddingCache", "decode_f16", "encode_f16", "text_hash"]
