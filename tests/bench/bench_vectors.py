"""Vectors: hnswlib vs exact float16 scan, backfill throughput, hybrid vs BM25 vs vector quality.

    .venv/bin/python tests/bench/run.py vectors [-- --parts latency,backfill,quality --quick]

Parts (each with its baseline in the same run):
- ``latency``: query latency of our VectorIndex (hnswlib, cosine, ef as shipped and a few
  others) against an exact float16 numpy scan (what ReMe does), at 3k and 100k vectors, 384
  and 1024 dims, with recall@10 against the exact answer. Synthetic vectors: ``latent``
  (default; clusters in a 48-d latent space projected up, like sentence embeddings) or
  ``clustered`` (the hard case: high intrinsic dimension, neighbours nearly equidistant).
- ``backfill``: texts/s of the real backfill (VectorWorker over a WorkspaceIndex on real
  files) against a loopback FakeProvider answering each call after 50 ms; baseline: one
  text per call, sequentially.
- ``quality``: LoCoMo dev (evidence recall@5/10) and SciFact (nDCG@10, recall@10) for
  BM25 only, vector only (local embedding model) and hybrid (weighted RRF with exact-match
  protection) at several weight pairs, plus needle queries (an identifier planted in one
  note; hit@5). Corpus embeddings are cached in ``bench-results/embcache/`` (gitignored),
  so reruns are fast. ``--quick`` uses a SciFact subset (the judged documents of the first
  queries plus random others).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "tests")]

from recalld.daemon.index.bm25 import BM25Index  # noqa: E402
from recalld.daemon.index.chunker import chunk_markdown  # noqa: E402
from recalld.daemon.index.exact import exact_keys, special_terms  # noqa: E402
from recalld.daemon.index.fusion import fuse  # noqa: E402
from recalld.daemon.index.state import StoredChunk  # noqa: E402
from recalld.daemon.index.tokenizer import tokenize, tokenize_query  # noqa: E402
from recalld.daemon.index.vectors import VectorIndex, normalize  # noqa: E402

F32 = npt.NDArray[np.float32]
CACHE_DIR = ROOT / "bench-results" / "embcache"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ latency

def clustered(n: int, dim: int, rng: np.random.Generator, centers: int = 200) -> F32:
    """Hard case: Gaussian blobs whose spread is as large as the centres (high intrinsic
    dimension, neighbours nearly equidistant)."""
    c = rng.standard_normal((centers, dim)).astype(np.float32)
    which = rng.integers(0, centers, n)
    out: F32 = (c[which] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32))
    return normalize(out)


def latent(n: int, dim: int, rng: np.random.Generator, rank: int = 48) -> F32:
    """Embedding-like: clusters in a low-dimensional latent space, projected up, plus a
    little isotropic noise (sentence embeddings have an intrinsic dimension of tens)."""
    centers = rng.standard_normal((200, rank)).astype(np.float32)
    z = centers[rng.integers(0, 200, n)] + 0.5 * rng.standard_normal((n, rank)).astype(
        np.float32)
    proj = rng.standard_normal((rank, dim)).astype(np.float32) / math.sqrt(rank)
    out: F32 = z @ proj + 0.05 * rng.standard_normal((n, dim)).astype(np.float32)
    return normalize(out)


def bench_latency(sizes: list[int], dims: list[int], queries: int, kind: str,
                  efs: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"data": kind}
    make = latent if kind == "latent" else clustered
    for dim in dims:
        for n in sizes:
            rng = np.random.default_rng(n + dim)
            data = make(n, dim, rng)
            noise = 0.3 if kind != "latent" else 0.05
            qs = normalize(data[rng.integers(0, n, queries)]
                           + noise * rng.standard_normal((queries, dim)).astype(np.float32))
            data16 = data.astype(np.float16)
            t = time.perf_counter()
            index = VectorIndex(dim, initial_capacity=n, num_threads=2)
            index.add(range(n), data)
            build_s = time.perf_counter() - t
            index._threads = 1
            ex_t, exact_sets = [], []
            for q in qs:
                t = time.perf_counter()
                sims = data16 @ q.astype(np.float16)
                top = np.argpartition(-sims, 10)[:10]
                exact = top[np.argsort(-sims[top])]
                ex_t.append(time.perf_counter() - t)
                exact_sets.append(set(exact.tolist()))
            ep50 = float(np.median(ex_t)) * 1000
            row: dict[str, Any] = {"f16_scan_p50_ms": round(ep50, 3),
                                   "build_s": round(build_s, 2)}
            for ef in [index.ef_search, *[e for e in efs if e != index.ef_search]]:
                index.ef_search = ef
                hn_t, recalls = [], []
                for q, want in zip(qs, exact_sets, strict=True):
                    t = time.perf_counter()
                    got = index.search(q, 10)
                    hn_t.append(time.perf_counter() - t)
                    recalls.append(len({k for k, _ in got} & want) / 10)
                hp50 = float(np.median(hn_t)) * 1000
                row[f"ef{ef}"] = {
                    "hnswlib_p50_ms": round(hp50, 3),
                    "hnswlib_p95_ms": round(float(np.percentile(hn_t, 95)) * 1000, 3),
                    "speedup": round(ep50 / hp50, 1),
                    "recall@10": round(float(np.mean(recalls)), 4),
                }
            out[f"{n}x{dim}"] = row
            log(f"latency {n}x{dim}: {out[f'{n}x{dim}']}")
    return out


# ------------------------------------------------------------------ backfill

def bench_backfill(notes: int, delay_s: float) -> dict[str, Any]:
    import trio
    from fakes.provider_server import FakeProvider, Reply

    from recalld.daemon.config import DaemonConfig, EmbeddingModelConfig, WorkspaceSettings
    from recalld.daemon.index.embedder import VectorWorker
    from recalld.daemon.index.service import WorkspaceIndex
    from recalld.daemon.index.spaces import VectorSpaces
    from recalld.daemon.providers.bridge import ProviderBridge
    from recalld.daemon.workspaces import Workspace

    result: dict[str, Any] = {"notes": notes, "provider_delay_ms": delay_s * 1000}
    with tempfile.TemporaryDirectory(prefix="bench-vec-") as tmp, FakeProvider(dims=384) as fake:
        root = Path(tmp) / "ws"
        for i in range(notes):
            p = root / "memory" / f"2026-07-{1 + i % 28:02d}" / f"n{i}.md"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"# Note {i}\n\nSomething happened on day {i} with item {i * 7}.\n")
        fake.script(*[Reply(delay_s=delay_s)] * (notes * 3))

        async def main() -> None:
            bridge = ProviderBridge()
            async with trio.open_nursery() as nursery:
                await nursery.start(bridge.run)
                cfg = DaemonConfig(socket_path=Path(tmp) / "s", data_dir=Path(tmp) / "d",
                                   config_path=Path(tmp) / "c")
                emb = EmbeddingModelConfig(backend="openai", base_url=fake.url + "/v1",
                                           api_key="k", model_name="m", dimensions=384)
                spaces = VectorSpaces(cfg.state_dir / "emb", bridge, environ={})
                ws = Workspace("w", root, WorkspaceSettings(embedding_model_config=emb))
                index = WorkspaceIndex(ws, cfg, cpu=trio.CapacityLimiter(2))
                await nursery.start(index.run)
                worker = VectorWorker(index, spaces, emb)
                t = time.perf_counter()
                await nursery.start(worker.run)
                while not (worker.total and worker.embedded == worker.total):
                    await trio.sleep(0.01)
                took = time.perf_counter() - t
                result["recalld_texts_per_s"] = round(worker.total / took, 1)
                result["recalld_s"] = round(took, 2)
                result["batch_size"] = emb.max_batch_size
                # Baseline: one text per call, one call at a time.
                texts = [c.text for c in index.state.chunks.values()][:50]
                t = time.perf_counter()
                for text in texts:
                    await spaces.space(emb).client.embed([text + " "])
                result["one_per_call_texts_per_s"] = round(len(texts) / (time.perf_counter() - t),
                                                           1)
                result["speedup"] = round(result["recalld_texts_per_s"]
                                          / result["one_per_call_texts_per_s"], 1)
                nursery.cancel_scope.cancel()

        trio.run(main)
    log(f"backfill: {result}")
    return result


# ------------------------------------------------------------------ quality

class Embedder:
    """The local model with an on-disk cache per (model, kind, text)."""

    def __init__(self, model: str) -> None:
        from recalld.daemon.providers.local import load_encoder

        self.model = model
        self.encoder = load_encoder(model)
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        self.path = CACHE_DIR / f"{model}.jsonl"
        self.cache: dict[str, list[float]] = {}
        if self.path.exists():
            for line in self.path.open(encoding="utf-8"):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self.cache[rec["h"]] = rec["v"]

    def embed(self, texts: Sequence[str], *, is_query: bool) -> F32:
        kind = "q" if is_query else "p"
        keys = [hashlib.blake2b(f"{kind}\n{t}".encode(), digest_size=16).hexdigest()
                for t in texts]
        todo = [i for i, k in enumerate(keys) if k not in self.cache]
        started = time.perf_counter()
        with self.path.open("a", encoding="utf-8") as fh:
            for s in range(0, len(todo), 16):
                part = todo[s:s + 16]
                rows = self.encoder.encode([texts[i] for i in part], is_query=is_query)
                for i, row in zip(part, rows, strict=True):
                    vec = [round(float(x), 5) for x in row]
                    self.cache[keys[i]] = vec
                    fh.write(json.dumps({"h": keys[i], "v": vec}) + "\n")
                if s and s % 256 == 0:
                    rate = s / (time.perf_counter() - started)
                    log(f"  embedded {s}/{len(todo)} ({rate:.1f}/s)")
        return normalize(np.array([self.cache[k] for k in keys], dtype=np.float32))


Ranking = list[list[int]]


RRF_K = 60


def rank_all(docs: Sequence[str], queries: Sequence[str], dvec: F32, qvec: F32, k: int,
             weights: list[tuple[float, float]], pool: int) -> dict[str, Ranking]:
    bm = BM25Index()
    bm.add_many((i + 1, tokenize(d)) for i, d in enumerate(docs))
    chunks = {i + 1: StoredChunk(i + 1, str(i), "x", 1, 1, d, "", {}) for i, d in enumerate(docs)}
    out: dict[str, Ranking] = {"bm25": [], "vector": []}
    for vw, kw in weights:
        out[f"hybrid_{vw}_{kw}"] = []
        out[f"hybrid_{vw}_{kw}_noexact"] = []
    for qi, q in enumerate(queries):
        kh = bm.search(tokenize_query(q), pool)
        sims = dvec @ qvec[qi]
        top = np.argpartition(-sims, min(pool, len(docs) - 1))[:pool]
        top = top[np.argsort(-sims[top])]
        vh = [(int(i) + 1, float(sims[i])) for i in top]
        out["bm25"].append([key - 1 for key, _ in kh[:k]])
        out["vector"].append([key - 1 for key, _ in vh[:k]])
        exact = exact_keys(special_terms(q, bm), kh, chunks)
        for vw, kw in weights:
            f = fuse(kh, vh, keyword_weight=kw, vector_weight=vw, k=RRF_K, exact=exact)
            out[f"hybrid_{vw}_{kw}"].append([x.key - 1 for x in f[:k]])
            f = fuse(kh, vh, keyword_weight=kw, vector_weight=vw, k=RRF_K)
            out[f"hybrid_{vw}_{kw}_noexact"].append([x.key - 1 for x in f[:k]])
    return out


def ndcg(got: list[int], want: set[int], k: int = 10) -> float:
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(got[:k]) if d in want)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(len(want), k)))
    return dcg / ideal


def eval_scifact(data: Path, emb: Embedder, weights: list[tuple[float, float]],
                 quick: int) -> dict[str, Any]:
    from quality_lexical import load_beir

    docs, queries, rel = load_beir(data / "scifact", "test")
    if quick:
        rng = random.Random(7)
        queries, rel = queries[:quick], rel[:quick]
        keep = sorted({d for r in rel for d in r} | set(rng.sample(range(len(docs)), quick * 4)))
        remap = {d: i for i, d in enumerate(keep)}
        docs = [docs[d] for d in keep]
        rel = [{remap[d] for d in r} for r in rel]
    log(f"scifact: {len(docs)} docs, {len(queries)} queries")
    dvec = emb.embed(docs, is_query=False)
    qvec = emb.embed(queries, is_query=True)
    ranked = rank_all(docs, queries, dvec, qvec, 10, weights, 30)
    out: dict[str, Any] = {"docs": len(docs), "queries": len(queries), "quick": bool(quick)}
    for name, lists in ranked.items():
        out[name] = {
            "ndcg@10": round(float(np.mean([ndcg(g, w) for g, w in zip(lists, rel,
                                                                       strict=True)])), 4),
            "recall@10": round(float(np.mean([len(set(g[:10]) & w) / len(w)
                                              for g, w in zip(lists, rel, strict=True)])), 4),
        }
    return out


def eval_locomo(data: Path, emb: Embedder, weights: list[tuple[float, float]],
                max_chars: int, conversations: int) -> dict[str, Any]:
    from quality_lexical import _DIA_RE, locomo_notes

    items = json.loads((data / "locomo" / "locomo-dev.json").read_text(encoding="utf-8"))
    if conversations:
        items = items[:conversations]
    acc: dict[str, dict[str, list[float]]] = {}
    needles: dict[str, list[float]] = {}
    n_chunks = 0
    for item in items:
        notes, where = locomo_notes(item["conversation"], item["sample_id"])
        # Needles: an identifier planted in one note each.
        rng = random.Random(item["sample_id"])
        planted: list[tuple[str, str]] = []
        for path in sorted(notes)[:: max(1, len(notes) // 5)]:
            ident = f"ERR_{rng.randrange(10**6):06d}X"
            notes[path] += f"Note: the backup failed with {ident} again.\n"
            planted.append((f"what does {ident} mean", path))
        chunks = [c for p, t in sorted(notes.items())
                  for c in chunk_markdown(p, t, max_chars=max_chars)]
        n_chunks += len(chunks)
        docs = [c.index_text for c in chunks]
        qs, evs = [], []
        for qa in item["qa"]:
            ev = []
            for raw in qa.get("evidence") or []:
                for m in _DIA_RE.finditer(str(raw)):
                    loc = where.get(f"D{int(m[1])}:{int(m[2])}")
                    if loc is not None:
                        ev.append(loc)
            if ev and qa.get("category") != 5:
                qs.append(qa["question"])
                evs.append(ev)
        log(f"locomo {item['sample_id']}: {len(chunks)} chunks, {len(qs)} questions")
        dvec = emb.embed([c.text for c in chunks], is_query=False)
        qvec = emb.embed(qs + [q for q, _ in planted], is_query=True)
        ranked = rank_all(docs, qs + [q for q, _ in planted], dvec, qvec, 10, weights, 30)
        for name, lists in ranked.items():
            for got, ev in zip(lists[:len(qs)], evs, strict=True):
                for cut in (5, 10):
                    found = sum(any(chunks[ci].path == e[0]
                                    and chunks[ci].start_line <= e[1] <= chunks[ci].end_line
                                    for ci in got[:cut]) for e in ev)
                    acc.setdefault(name, {}).setdefault(f"recall@{cut}", []).append(
                        found / len(ev))
            for got, (_, path) in zip(lists[len(qs):], planted, strict=True):
                needles.setdefault(name, []).append(
                    float(any(chunks[ci].path == path for ci in got[:5])))
    out: dict[str, Any] = {"conversations": len(items), "chunks": n_chunks,
                           "max_chars": max_chars}
    for name, metrics in acc.items():
        out[name] = {k: round(float(np.mean(v)), 4) for k, v in metrics.items()}
        out[name]["needle_hit@5"] = round(float(np.mean(needles[name])), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", default="latency,backfill,quality")
    ap.add_argument("--sizes", default="3000,100000")
    ap.add_argument("--dims", default="384,1024")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--data-kind", default="latent", choices=("latent", "clustered"))
    ap.add_argument("--efs", default="64,256",
                    help="extra ef values measured besides the shipped one")
    ap.add_argument("--notes", type=int, default=400)
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--quick", type=int, default=0,
                    help="SciFact subset: this many queries (0 = full set)")
    ap.add_argument("--sets", default="locomo,scifact")
    ap.add_argument("--locomo-conversations", type=int, default=0)
    ap.add_argument("--max-chars", type=int, default=1600)
    ap.add_argument("--weights", default="0.7:0.3,0.5:0.5,0.35:0.65,0.2:0.8")
    ap.add_argument("--rrf-k", type=int, default=60)
    args = ap.parse_args(argv)
    global RRF_K
    RRF_K = args.rrf_k
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {}
    if "latency" in parts:
        report["latency"] = bench_latency(
            [int(s) for s in args.sizes.split(",")], [int(d) for d in args.dims.split(",")],
            args.queries, args.data_kind, [int(e) for e in args.efs.split(",") if e])
    if "backfill" in parts:
        report["backfill"] = bench_backfill(args.notes, 0.05)
    if "quality" in parts:
        weights = [(float(a), float(b)) for a, b in
                   (w.split(":") for w in args.weights.split(","))]
        emb = Embedder(args.model)
        report["quality"] = {"model": args.model}
        sets = args.sets.split(",")
        if "locomo" in sets:
            report["quality"]["locomo"] = eval_locomo(args.data, emb, weights, args.max_chars,
                                                      args.locomo_conversations)
        if "scifact" in sets:
            report["quality"]["scifact"] = eval_scifact(args.data, emb, weights, args.quick)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
