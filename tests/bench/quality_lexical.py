"""Lexical retrieval quality: recalld's tokenizer + chunker + BM25 against bm25s and SQLite FTS5.

Runs on ../shared/data (SciFact, CMRC 2018, LoCoMo dev) and prints one JSON document:
nDCG@10, recall@5/@10, MRR, ctx_chars@5, queries/s and build time per system and set. Baselines
index the very same documents (for LoCoMo: the chunks recalld's chunker produces), so ranking is
compared with chunking held fixed; ``--sizes`` compares chunk sizes with the ranker held fixed.

    .venv/bin/python tests/bench/quality_lexical.py [--data ../shared/data] [--sizes 1000,2000,4000]

bm25s is optional (the ``bench`` extra); systems that cannot be imported are reported as skipped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS, Chunk, chunk_markdown
from recalld.daemon.index.tokenizer import tokenize, tokenize_query

ROOT = Path(__file__).resolve().parents[2]
# A ranker: (documents, queries, k) -> per query the ranked document indexes.
Ranker = Callable[[Sequence[str], Sequence[str], int], tuple[list[list[int]], float, float]]


# ------------------------------------------------------------------ rankers
def rank_recalld(docs: Sequence[str], queries: Sequence[str], k: int) -> tuple[Any, float, float]:
    t0 = time.perf_counter()
    index = BM25Index()
    index.add_many((i, tokenize(d)) for i, d in enumerate(docs))
    t1 = time.perf_counter()
    out = [[key for key, _ in index.search(tokenize_query(q), k)] for q in queries]
    return out, t1 - t0, len(queries) / max(time.perf_counter() - t1, 1e-9)


def _bm25s_ranker(own_tokens: bool) -> Ranker | None:
    try:
        import bm25s  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None

    def rank(docs: Sequence[str], queries: Sequence[str], k: int) -> tuple[Any, float, float]:
        t0 = time.perf_counter()
        if own_tokens:
            corpus_tok: Any = [tokenize(d) for d in docs]
        else:
            corpus_tok = bm25s.tokenize(list(docs), stopwords="en", show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(corpus_tok, show_progress=False)
        t1 = time.perf_counter()
        out: list[list[int]] = []
        vocab = set(retriever.vocab_dict)
        for q in queries:
            if own_tokens:
                qt = [t for t in tokenize_query(q) if t in vocab]
            else:
                qt = [t for t in bm25s.tokenize(q, stopwords="en", return_ids=False,
                                                show_progress=False)[0] if t in vocab]
            if not qt:
                out.append([])
                continue
            kk = min(k, len(docs))
            res, scores = retriever.retrieve([qt], k=kk, show_progress=False, n_threads=1)
            out.append([int(d) for d, s in zip(res[0], scores[0], strict=True) if s > 0])
        return out, t1 - t0, len(queries) / max(time.perf_counter() - t1, 1e-9)

    return rank


def rank_fts5(docs: Sequence[str], queries: Sequence[str], k: int) -> tuple[Any, float, float]:
    t0 = time.perf_counter()
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE d USING fts5(body)")
    db.executemany("INSERT INTO d(rowid, body) VALUES (?, ?)", enumerate(docs))
    t1 = time.perf_counter()
    out: list[list[int]] = []
    for q in queries:
        words = re.findall(r"\w+", q.lower())
        if not words:
            out.append([])
            continue
        match = " OR ".join('"' + w + '"' for w in words)
        rows = db.execute(
            "SELECT rowid FROM d WHERE d MATCH ? ORDER BY bm25(d) LIMIT ?", (match, k)
        ).fetchall()
        out.append([r[0] for r in rows])
    return out, t1 - t0, len(queries) / max(time.perf_counter() - t1, 1e-9)


def rankers() -> dict[str, Ranker | None]:
    return {
        "recalld": rank_recalld,
        "bm25s": _bm25s_ranker(own_tokens=False),
        "bm25s+recalld_tokens": _bm25s_ranker(own_tokens=True),
        "sqlite_fts5": rank_fts5,
    }


# ------------------------------------------------------------------ metrics
def _dcg(flags: Sequence[bool], k: int) -> float:
    return sum(1.0 / math.log2(i + 2) for i, f in enumerate(flags[:k]) if f)


def beir_metrics(
    ranked: list[list[int]], rel: list[set[int]], docs: Sequence[str]
) -> dict[str, float]:
    n = len(ranked)
    acc = {"ndcg@10": 0.0, "recall@5": 0.0, "recall@10": 0.0, "mrr": 0.0, "ctx_chars@5": 0.0}
    for got, want in zip(ranked, rel, strict=True):
        flags = [d in want for d in got]
        acc["ndcg@10"] += _dcg(flags, 10) / _dcg([True] * len(want), 10)
        acc["recall@5"] += len(want & set(got[:5])) / len(want)
        acc["recall@10"] += len(want & set(got[:10])) / len(want)
        acc["mrr"] += next((1.0 / (i + 1) for i, f in enumerate(flags) if f), 0.0)
        acc["ctx_chars@5"] += sum(len(docs[d]) for d in got[:5])
    return {key: round(v / n, 4) for key, v in acc.items()}


def load_beir(path: Path, split: str) -> tuple[list[str], list[str], list[set[int]]]:
    corpus = [json.loads(line) for line in (path / "corpus.jsonl").open(encoding="utf-8")]
    pos = {d["_id"]: i for i, d in enumerate(corpus)}
    docs = [(d.get("title", "") + "\n" + d["text"]).strip() for d in corpus]
    qtext = {}
    for line in (path / "queries.jsonl").open(encoding="utf-8"):
        q = json.loads(line)
        qtext[q["_id"]] = q["text"]
    rel: dict[str, set[int]] = {}
    with (path / "qrels" / f"{split}.tsv").open(encoding="utf-8") as f:
        next(f)
        for line in f:
            qid, did, score = line.rstrip("\n").split("\t")
            if int(score) > 0 and did in pos:
                rel.setdefault(qid, set()).add(pos[did])
    qids = [q for q in rel if q in qtext]
    return docs, [qtext[q] for q in qids], [rel[q] for q in qids]


def eval_beir(path: Path, split: str) -> dict[str, Any]:
    docs, queries, rel = load_beir(path, split)
    out: dict[str, Any] = {"docs": len(docs), "queries": len(queries)}
    for name, ranker in rankers().items():
        if ranker is None:
            out[name] = "skipped: not installed"
            continue
        ranked, build_s, qps = ranker(docs, queries, 10)
        out[name] = {**beir_metrics(ranked, rel, docs), "build_s": round(build_s, 3),
                     "queries_per_s": round(qps, 1)}
    return out


# ------------------------------------------------------------------ LoCoMo
_DIA_RE = re.compile(r"D:?(\d+):0*(\d+)")


def _session_date(raw: str) -> str:
    try:
        return dt.datetime.strptime(raw.split(" on ", 1)[1].strip(), "%d %B, %Y").date().isoformat()
    except (IndexError, ValueError):
        return "1970-01-01"


def locomo_notes(
    conv: dict[str, Any], sample: str
) -> tuple[dict[str, str], dict[str, tuple[str, int]]]:
    """Each session as a daily note, one line per turn; dia_id -> (path, 1-based line)."""
    notes: dict[str, str] = {}
    where: dict[str, tuple[str, int]] = {}
    n = 1
    while f"session_{n}" in conv:
        when = conv.get(f"session_{n}_date_time", "")
        path = f"memory/{_session_date(when)}/{sample}-session{n}.md"
        lines = [f"# {sample} session {n} ({when})"]
        for turn in conv[f"session_{n}"]:
            text = turn.get("text", "")
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            lines.append(f"{turn['speaker']}: {text}".replace("\n", " "))
            m = _DIA_RE.fullmatch(turn["dia_id"])
            if m:
                where[f"D{int(m[1])}:{int(m[2])}"] = (path, len(lines))
        notes[path] = "\n".join(lines) + "\n"
        n += 1
    return notes, where


def _inside(chunk: Chunk, evidence: tuple[str, int]) -> bool:
    return chunk.path == evidence[0] and chunk.start_line <= evidence[1] <= chunk.end_line


def eval_locomo(path: Path, max_chars: int, systems: dict[str, Ranker | None]) -> dict[str, Any]:
    data = json.loads((path / "locomo-dev.json").read_text(encoding="utf-8"))
    per: dict[str, dict[str, list[float]]] = {}
    per_cat: dict[str, dict[int, list[float]]] = {}
    n_chunks = 0
    for item in data:
        notes, where = locomo_notes(item["conversation"], item["sample_id"])
        chunks: list[Chunk] = [
            c for p, t in sorted(notes.items()) for c in chunk_markdown(p, t, max_chars=max_chars)
        ]
        n_chunks += len(chunks)
        qs: list[tuple[str, list[tuple[str, int]], int]] = []
        for qa in item["qa"]:
            ev = []
            for raw in qa.get("evidence") or []:
                for m in _DIA_RE.finditer(str(raw)):
                    loc = where.get(f"D{int(m[1])}:{int(m[2])}")
                    if loc is not None:
                        ev.append(loc)
            if ev and qa.get("category") != 5:
                qs.append((qa["question"], ev, int(qa["category"])))
        docs = [c.index_text for c in chunks]
        for name, ranker in systems.items():
            if ranker is None:
                continue
            ranked, _, _ = ranker(docs, [q for q, _, _ in qs], 10)
            for (_, ev, cat), got in zip(qs, ranked, strict=True):
                relevant = {i for i, c in enumerate(chunks) for e in ev
                            if c.path == e[0] and c.start_line <= e[1] <= c.end_line}
                flags = [ci in relevant for ci in got]
                found5 = sum(any(_inside(chunks[ci], e) for ci in got[:5]) for e in ev)
                found10 = sum(any(_inside(chunks[ci], e) for ci in got[:10]) for e in ev)
                row = {
                    "recall@5": found5 / len(ev),
                    "recall@10": found10 / len(ev),
                    "mrr": next((1.0 / (i + 1) for i, f in enumerate(flags) if f), 0.0),
                    "ndcg@10": _dcg(flags, 10) / _dcg([True] * len(relevant), 10),
                    "ctx_chars@5": float(sum(len(chunks[ci].text) for ci in got[:5])),
                }
                for key, v in row.items():
                    per.setdefault(name, {}).setdefault(key, []).append(v)
                per_cat.setdefault(name, {}).setdefault(cat, []).append(row["recall@5"])
    out: dict[str, Any] = {"max_chars": max_chars, "chunks": n_chunks}
    for name, metrics in per.items():
        out[name] = {k: round(sum(v) / len(v), 4) for k, v in metrics.items()}
        out[name]["questions"] = len(metrics["mrr"])
        out[name]["recall@5_by_category"] = {
            str(c): round(sum(v) / len(v), 4) for c, v in sorted(per_cat[name].items())
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sizes", default=f"1000,{DEFAULT_MAX_CHARS},4000",
                    help="chunk sizes (max_chars) compared on LoCoMo with recalld's ranker")
    ap.add_argument("--sets", default="scifact,cmrc2018,locomo")
    args = ap.parse_args(argv)
    sets = set(args.sets.split(","))
    report: dict[str, Any] = {}
    if "scifact" in sets:
        report["scifact"] = eval_beir(args.data / "scifact", "test")
    if "cmrc2018" in sets:
        report["cmrc2018"] = eval_beir(args.data / "cmrc2018", "dev")
    if "locomo" in sets:
        report["locomo"] = eval_locomo(args.data / "locomo", DEFAULT_MAX_CHARS, rankers())
        report["locomo_chunk_sizes"] = [
            eval_locomo(args.data / "locomo", int(s), {"recalld": rank_recalld})
            for s in args.sizes.split(",")
        ]
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
