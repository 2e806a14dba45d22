"""A persistent embedding cache for the benchmarks: each distinct text embedded once.

    bench-results/embstore/<model>/shard-<n>.npy   float16 rows, unit length
    bench-results/embstore/<model>/shard-<n>.json  {"keys": [...]} (blake2b of kind + text)

A shard is written whole (``.npy`` first, then its ``.json`` by rename), so a run killed
mid-way loses at most the batch it was embedding, and two runs may fill one store at
once (they only ever add shards). Loading reads every shard whose ``.json`` exists.
Nothing is pickled (``np.load(allow_pickle=False)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
STORE_DIR = ROOT / "bench-results" / "embstore"
F32 = npt.NDArray[np.float32]
SHARD_ROWS = 64


def key_of(text: str, *, is_query: bool) -> str:
    kind = "q" if is_query else "p"
    return hashlib.blake2b(f"{kind}\n{text}".encode("utf-8", "surrogatepass"),
                           digest_size=16).hexdigest()


def shard_name() -> str:
    return f"shard-{time.time_ns():020d}-{secrets.token_hex(3)}"


def publish(folder: Path, name: str, keys: list[str], seen: set[str]) -> None:
    """Write shard ``name``'s key list by rename, after its data: a reader takes only
    shards whose list exists (``new_shards``)."""
    tmp = folder / f".{name}.json.tmp"
    tmp.write_text(json.dumps({"keys": keys}), encoding="utf-8")
    os.replace(tmp, folder / f"{name}.json")
    seen.add(f"{name}.json")


def new_shards(folder: Path, seen: set[str]) -> Iterator[tuple[Path, list[str]]]:
    """Each published shard not in ``seen`` (its key list's path and keys), oldest
    first; each is added to ``seen``."""
    for meta in sorted(folder.glob("shard-*.json")):
        if meta.name not in seen:
            yield meta, json.loads(meta.read_text(encoding="utf-8"))["keys"]
            seen.add(meta.name)


class VectorStore:
    """Vectors of one model by text; ``embed`` computes only what no shard holds."""

    def __init__(self, model: str, root: Path = STORE_DIR) -> None:
        self.model = model
        self.dir = root / model
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows: dict[str, npt.NDArray[np.float16]] = {}
        self._seen: set[str] = set()
        self._encoder: object | None = None
        self.embedded_texts = 0
        self.embedded_chars = 0
        self.embed_s = 0.0
        self.refresh()

    def refresh(self) -> None:
        """Read shards written since the last look (by this or another process)."""
        for meta, keys in new_shards(self.dir, self._seen):
            arr = np.load(meta.with_suffix(".npy"), allow_pickle=False)
            for k, row in zip(keys, arr, strict=True):
                self.rows[k] = row

    def has(self, texts: Sequence[str], *, is_query: bool, share: float = 1.0) -> bool:
        """Whether at least ``share`` of ``texts`` are stored (re-reading new shards)."""
        self.refresh()
        have = sum(key_of(t, is_query=is_query) in self.rows for t in texts)
        return have >= share * len(texts)

    def _encode(self, texts: list[str], is_query: bool) -> F32:
        if self._encoder is None:
            from recalld.daemon.providers.local import load_encoder

            self._encoder = load_encoder(self.model)
        out: F32 = self._encoder.encode(texts, is_query=is_query)  # type: ignore[attr-defined]
        return out

    def _write(self, keys: list[str], rows: F32) -> None:
        name = shard_name()
        np.save(self.dir / f"{name}.npy", rows.astype(np.float16), allow_pickle=False)
        publish(self.dir, name, keys, self._seen)

    def embed(self, texts: Sequence[str], *, is_query: bool, log_every_s: float = 60.0) -> F32:
        """Unit vectors for ``texts`` (rows in order); missing ones are embedded and saved,
        shortest first (the engine pads a call to its longest text)."""
        keys = [key_of(t, is_query=is_query) for t in texts]
        todo_map: dict[str, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in self.rows:
                todo_map.setdefault(k, t)
        todo = sorted(todo_map.items(), key=lambda kv: len(kv[1]))
        started = last = time.perf_counter()
        batch = 16
        pend_keys: list[str] = []
        pend_rows: list[F32] = []
        done_chars = 0
        for s in range(0, len(todo), batch):
            part = todo[s:s + batch]
            rows = self._encode([t for _, t in part], is_query)
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.where(norms == 0, 1.0, norms)
            for (k, t), row in zip(part, rows, strict=True):
                self.rows[k] = row.astype(np.float16)
                done_chars += len(t)
            pend_keys.extend(k for k, _ in part)
            pend_rows.append(rows)
            if len(pend_keys) >= SHARD_ROWS:
                self._write(pend_keys, np.concatenate(pend_rows))
                pend_keys, pend_rows = [], []
            now = time.perf_counter()
            if now - last >= log_every_s:
                last = now
                print(f"  {self.model}: {s + len(part)}/{len(todo)} texts, "
                      f"{done_chars / (now - started):.0f} chars/s, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
        if pend_keys:
            self._write(pend_keys, np.concatenate(pend_rows))
        self.embedded_texts += len(todo)
        self.embedded_chars += done_chars
        self.embed_s += time.perf_counter() - started
        out = np.stack([self.rows[k] for k in keys]).astype(np.float32) if keys else (
            np.zeros((0, 384), dtype=np.float32))
        return out
