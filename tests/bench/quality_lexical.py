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
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from recalld.daemon.config import DaemonConfig, SearchConfig
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS, Chunk, chunk_markdown
from recalld.daemon.index.exact import exact_first
from recalld.daemon.index.postings import Slab, term_table
from recalld.daemon.index.state import StoredChunk
from recalld.daemon.index.tokenizer import tokenize, tokenize_query, tokenize_split

ROOT = Path(__file__).resolve().parents[2]
#: The chunk size the daemon runs with (its config default), so chunks here match its own.
DAEMON_MAX_CHARS: int = DaemonConfig.__dataclass_fields__["chunk_max_chars"].default
#: The daemon's keyword candidate pool per result (its config default), which exact-term
#: promotion reorders.
POOL_MULTIPLIER: int = SearchConfig().candidate_multiplier
# A ranker: (documents, queries, k) -> per query the ranked document indexes.
Ranker = Callable[[Sequence[str], Sequence[str], int], tuple[list[list[int]], float, float]]


# ------------------------------------------------------------------ rankers
def recalld_ranker(*, exact: bool = True,
                   cjk_length: Callable[[list[str]], int] | None = None) -> Ranker:
    """Our tokenizer + BM25 in process, as the daemon ranks a keyword-only search: with
    exact-term promotion (``exact``) and the daemon's document lengths, or a document's
    length from its CJK runs by ``cjk_length`` (to compare how CJK text is counted)."""

    def rank(docs: Sequence[str], queries: Sequence[str], k: int) -> tuple[Any, float, float]:
        t0 = time.perf_counter()
        index = BM25Index()
        if cjk_length is None:
            index.add_many((i, tokenize(d)) for i, d in enumerate(docs))
        else:
            counted: dict[int, tuple[dict[str, int], int]] = {}
            for i, d in enumerate(docs):
                words, runs = tokenize_split(d)
                counted[i] = (dict(Counter(tokenize(d))), len(words) + cjk_length(runs))
            table = term_table()
            slab = Slab.from_counts(counted, table)  # fills the table
            index.add_encoded([(list(table), slab)])
        chunks = {i: StoredChunk(i, str(i), "", 0, 0, d, "", {}) for i, d in enumerate(docs)}
        t1 = time.perf_counter()
        out = []
        pool = k * POOL_MULTIPLIER
        for q in queries:
            hits = index.search(tokenize_query(q), pool if exact else k)
            if exact:
                hits = exact_first(q, index, hits, chunks, limit=pool)[0]
            out.append([key for key, _ in hits[:k]])
        return out, t1 - t0, len(queries) / max(time.perf_counter() - t1, 1e-9)

    return rank


rank_recalld: Ranker = recalld_ranker()
#: How a document's CJK runs could count in its BM25 length (measured side by side).
CJK_LENGTHS: dict[str, Callable[[list[str]], int]] = {
    "chars+pairs": lambda runs: sum(2 * len(r) - 1 for r in runs),
    "chars": lambda runs: sum(len(r) for r in runs),
    "chars/2": lambda runs: -(-sum(len(r) for r in runs) // 2),
    "chars/3": lambda runs: -(-sum(len(r) for r in runs) // 3),
}
#: The keyword ranking before exact-term promotion and CJK lengths by characters.
rank_recalld_before: Ranker = recalld_ranker(exact=False, cjk_length=CJK_LENGTHS["chars+pairs"])


def _bm25s_ranker(own_tokens: bool) -> Ranker | None:
    try:
        import bm25s  # type: ignore[import-not-found,import-untyped,unused-ignore]
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
#: A returned result: (path, start_line, end_line, chars handed back).
Hit = tuple[str, int, int, int]
#: What a query must find: a file (line None: any chunk of it) or one line of a file.
Target = tuple[str, int | None]


def _dcg(flags: Sequence[bool], k: int) -> float:
    return sum(1.0 / math.log2(i + 2) for i, f in enumerate(flags[:k]) if f)


def covers(hit: Hit, target: Target) -> bool:
    return hit[0] == target[0] and (target[1] is None or hit[1] <= target[1] <= hit[2])


def hit_metrics(hits: Sequence[Hit], targets: Sequence[Target]) -> dict[str, float]:
    """hit@1, recall@5/@10, MRR, nDCG@10 and ctx_chars@5 of one query's ranked results.

    Works on returned chunks, whatever their size: recall@k is the share of targets inside
    the top k results; a result earns nDCG gain only for targets no earlier result covered
    (two chunks of one relevant document count once); MRR is 1/rank of the first result
    that covers any target (0 beyond rank 10); ctx_chars@5 is what the top 5 hand back.
    """
    covered: set[int] = set()
    gains: list[bool] = []
    first: int | None = None
    found5: set[int] = set()
    for i, hit in enumerate(hits[:10]):
        got = {j for j, t in enumerate(targets) if covers(hit, t)}
        if got and first is None:
            first = i
        gains.append(bool(got - covered))
        covered |= got
        if i == 4:
            found5 = set(covered)
    if len(hits) < 5:
        found5 = covered
    n = len(targets)
    return {
        "hit@1": 1.0 if first == 0 else 0.0,
        "recall@5": len(found5) / n,
        "recall@10": len(covered) / n,
        "mrr": 0.0 if first is None else 1.0 / (first + 1),
        "ndcg@10": _dcg(gains, 10) / _dcg([True] * min(n, 10), 10),
        "ctx_chars@5": float(sum(h[3] for h in hits[:5])),
    }


def mean_metrics(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = rows[0].keys() if rows else ()
    return {k: round(sum(r[k] for r in rows) / len(rows), 4) for k in keys}


def beir_metrics(
    ranked: list[list[int]], rel: list[set[int]], docs: Sequence[str]
) -> dict[str, float]:
    """Document-level metrics: each ranked item is a whole document."""
    rows = [hit_metrics([(str(d), 0, 0, len(docs[d])) for d in got],
                       [(str(d), None) for d in sorted(want)])
            for got, want in zip(ranked, rel, strict=True)]
    return mean_metrics(rows)


def read_beir(path: Path, split: str) -> tuple[list[dict[str, str]], list[tuple[str, str]],
                                                dict[str, set[str]]]:
    """BEIR files: corpus records, judged (query id, text) pairs, query id -> relevant ids."""
    corpus = [json.loads(line) for line in (path / "corpus.jsonl").open(encoding="utf-8")]
    ids = {d["_id"] for d in corpus}
    qtext = {}
    for line in (path / "queries.jsonl").open(encoding="utf-8"):
        q = json.loads(line)
        qtext[q["_id"]] = q["text"]
    rel: dict[str, set[str]] = {}
    with (path / "qrels" / f"{split}.tsv").open(encoding="utf-8") as f:
        next(f)
        for line in f:
            qid, did, score = line.rstrip("\n").split("\t")
            if int(score) > 0 and did in ids:
                rel.setdefault(qid, set()).add(did)
    return corpus, [(q, qtext[q]) for q in rel if q in qtext], rel


def load_beir(path: Path, split: str) -> tuple[list[str], list[str], list[set[int]]]:
    corpus, queries, rel = read_beir(path, split)
    pos = {d["_id"]: i for i, d in enumerate(corpus)}
    docs = [(d.get("title", "") + "\n" + d["text"]).strip() for d in corpus]
    return docs, [t for _, t in queries], [{pos[d] for d in rel[q]} for q, _ in queries]


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


def locomo_questions(
    qa_list: Sequence[dict[str, Any]], where: dict[str, tuple[str, int]], stats: dict[str, int]
) -> list[tuple[str, list[Target], int]]:
    """Answerable questions as (question, evidence lines, category); counts the rest.

    Evidence strings are normalised (``"D8:6; D9:17"`` is two ids, ``"D:11:26"`` and
    ``"D30:05"`` are ``D11:26`` and ``D30:5``); ids of turns that do not exist are dropped.
    Category 5 (adversarial: nothing to find) and questions left without evidence are
    excluded; ``stats`` counts each case.
    """
    out: list[tuple[str, list[Target], int]] = []
    for qa in qa_list:
        stats["questions"] = stats.get("questions", 0) + 1
        cat = int(qa.get("category", 0))
        if cat == 5:
            stats["excluded_category_5"] = stats.get("excluded_category_5", 0) + 1
            continue
        ev: list[Target] = []
        for raw in qa.get("evidence") or []:
            for m in _DIA_RE.finditer(str(raw)):
                loc = where.get(f"D{int(m[1])}:{int(m[2])}")
                if loc is None:
                    stats["evidence_ids_missing_turn"] = (
                        stats.get("evidence_ids_missing_turn", 0) + 1)
                elif loc not in ev:
                    ev.append(loc)
        if not ev:
            stats["excluded_no_evidence"] = stats.get("excluded_no_evidence", 0) + 1
            continue
        out.append((str(qa["question"]), ev, cat))
    return out


def eval_locomo(path: Path, max_chars: int, systems: dict[str, Ranker | None]) -> dict[str, Any]:
    data = json.loads((path / "locomo-dev.json").read_text(encoding="utf-8"))
    per: dict[str, list[dict[str, float]]] = {}
    per_cat: dict[str, dict[int, list[float]]] = {}
    n_chunks = 0
    stats: dict[str, int] = {}
    for item in data:
        notes, where = locomo_notes(item["conversation"], item["sample_id"])
        chunks: list[Chunk] = [
            c for p, t in sorted(notes.items()) for c in chunk_markdown(p, t, max_chars=max_chars)
        ]
        n_chunks += len(chunks)
        qs = locomo_questions(item["qa"], where, stats)
        docs = [c.index_text for c in chunks]
        for name, ranker in systems.items():
            if ranker is None:
                continue
            ranked, _, _ = ranker(docs, [q for q, _, _ in qs], 10)
            for (_, ev, cat), got in zip(qs, ranked, strict=True):
                hits = [(chunks[i].path, chunks[i].start_line, chunks[i].end_line,
                         len(chunks[i].text)) for i in got]
                row = hit_metrics(hits, ev)
                per.setdefault(name, []).append(row)
                per_cat.setdefault(name, {}).setdefault(cat, []).append(row["recall@5"])
    out: dict[str, Any] = {"max_chars": max_chars, "chunks": n_chunks, "question_counts": stats}
    for name, rows in per.items():
        out[name] = mean_metrics(rows)
        out[name]["questions"] = len(rows)
        out[name]["recall@5_by_category"] = {
            str(c): round(sum(v) / len(v), 4) for c, v in sorted(per_cat[name].items())
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--sizes", default=f"1000,{DAEMON_MAX_CHARS},{DEFAULT_MAX_CHARS},4000",
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
        report["locomo"] = eval_locomo(args.data / "locomo", DAEMON_MAX_CHARS, rankers())
        report["locomo_chunk_sizes"] = [
            eval_locomo(args.data / "locomo", int(s), {"recalld": rank_recalld})
            for s in args.sizes.split(",")
        ]
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
