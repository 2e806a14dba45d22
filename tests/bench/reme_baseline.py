"""ReMe 0.4.2 (the reference implementation) as the baseline, run offline in its own venv.

Two halves in one file:

- the host side (``ensure_reme_python``, ``run_reme``, ``reme_search``, ``main``) runs in
  the project venv, never imports ReMe, creates ``bench-results/.reme-venv`` with
  ``pip install "reme-ai[as]==0.4.2.0"`` on first use, and starts the driver as a subprocess;
- the driver (``python reme_baseline.py --driver`` with the venv's interpreter) imports
  ReMe, reads a JSON spec on stdin and writes one JSON object on stdout (everything ReMe
  prints goes to stderr).

ReMe is configured as QwenPaw's file memory runs it, with nothing that needs a network:
its own ``default`` config reduced to the keyword path (``file_store: local`` with
``embedding_store: ""``, BM25 ``keyword_index`` with the ``regex`` tokenizer, the markdown
chunker, file graph and tag index), ``daily_dir=memory``, ``digest_dir=digest``,
``metadata_dir=mem_metadata``, and two jobs copied from that config: the
``index_update_loop`` background watcher (watchfiles, forced polling every 5 s) and
``search``. Cold build and warm restart run the loop's own first step
(``init_changes_step`` dispatching ``update_index_step``) as a callable job, as ReMe's
``benchmark`` preset does, so their end is exact instead of guessed from logs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REME_REQUIREMENT = "reme-ai[as]==0.4.2.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / "bench-results" / ".reme-venv"
DEFAULT_METADATA_DIR = "mem_metadata"
# ReMe's watcher polls every 5 s; each edit costs about that much, so keep this small.
DEFAULT_EDITS = 10


# ---------------------------------------------------------------------------- host side


def ensure_reme_python(venv: Path = DEFAULT_VENV, *, install: bool = True) -> Path:
    """The interpreter of a venv with ReMe 0.4.2 installed; created on first use."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import reme, sys; sys.stdout.write(reme.__version__)"]
    if python.exists():
        done = subprocess.run(probe, capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip() == "0.4.2.0":
            return python
    if not install:
        raise RuntimeError(f"ReMe is not installed in {venv}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", REME_REQUIREMENT], check=True)
    done = subprocess.run(probe, capture_output=True, text=True, check=True)
    if done.stdout.strip() != "0.4.2.0":
        raise RuntimeError(f"unexpected ReMe version {done.stdout!r}")
    return python


def _driver_env() -> dict[str, str]:
    env = dict(os.environ)
    # Offline and quiet: no provider keys, no telemetry, one BLAS thread like the daemon.
    for key in ("LLM_API_KEY", "EMBEDDING_API_KEY", "OPENAI_API_KEY", "DASHSCOPE_API_KEY"):
        env.pop(key, None)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               HF_HUB_OFFLINE="1", NO_PROXY="*")
    return env


def _call_driver(spec: dict[str, Any], *, python: Path | None, timeout_s: float) -> dict[str, Any]:
    from procmem import TreeMemory  # this folder; the driver side never needs it

    py = python or ensure_reme_python()
    proc = subprocess.Popen(
        [str(py), str(Path(__file__).resolve()), "--driver"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_driver_env())
    # The driver's memory (and any process it starts), sampled over its whole run.
    with TreeMemory(proc.pid) as mem:
        try:
            stdout, stderr = proc.communicate(json.dumps(spec), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    if proc.returncode != 0:
        tail = stderr[-4000:]
        raise RuntimeError(f"ReMe driver failed ({proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(stdout)
    result["memory"] = mem.result()
    return result


def run_reme(workspace: Path, *, queries: Sequence[str] = (),
             result_queries: Sequence[str] = (), max_results: int = 5,
             edits: int = DEFAULT_EDITS, warm_runs: int = 3, search_samples: int = 300,
             concurrency: int = 16, metadata_dir: str = DEFAULT_METADATA_DIR,
             fresh: bool = True, with_text: bool = False, python: Path | None = None,
             timeout_s: float = 1800.0) -> dict[str, Any]:
    """Measure ReMe on ``workspace`` (its ``memory/`` and ``digest/``) and return a dict.

    Keys: ``cold_build_s``, ``close_persist_s``, ``warm_restart_s`` (median of
    ``warm_runs``), ``warm_restart_runs_s``, ``files``, ``chunks``, ``search`` (p50/p99 ms of
    ``search`` jobs over ``queries``, serial and with ``concurrency`` asyncio tasks in the
    one process), ``write_to_searchable`` (p50/p95 s over ``edits`` appended tokens, found
    by polling ``search``), ``results`` (per ``result_queries``: the top ``max_results`` as
    path/start_line/end_line/score[/text]) and ``peak_rss_mb``. ``fresh`` deletes ReMe's
    ``metadata_dir`` first so the build is cold. Edits append to files in the workspace.
    """
    spec = {
        "mode": "bench", "workspace": str(Path(workspace).resolve()),
        "queries": list(queries), "result_queries": list(result_queries),
        "max_results": max_results, "edits": edits, "warm_runs": warm_runs,
        "search_samples": search_samples, "concurrency": concurrency,
        "metadata_dir": metadata_dir, "fresh": fresh, "with_text": with_text,
    }
    return _call_driver(spec, python=python, timeout_s=timeout_s)


class RemeRounds:
    """ReMe kept open on an indexed workspace, timing rounds of searches on request.

    For latency comparisons interleaved in time with another system: the host alternates
    ``round()`` calls between the two, so drifts of a shared machine hit both alike.
    ``start()`` opens ReMe on ``workspace`` (its existing index, updated by one scan).
    """

    def __init__(self, workspace: Path, queries: Sequence[str], *, max_results: int = 5,
                 metadata_dir: str = DEFAULT_METADATA_DIR, python: Path | None = None) -> None:
        self._spec = {"mode": "rounds", "workspace": str(Path(workspace).resolve()),
                      "queries": list(queries), "max_results": max_results,
                      "metadata_dir": metadata_dir, "fresh": False}
        self._python = python
        self._proc: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float = 600.0) -> None:
        py = self._python or ensure_reme_python()
        self._proc = subprocess.Popen(
            [str(py), str(Path(__file__).resolve()), "--rounds"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_driver_env())
        self._ask(json.dumps(self._spec), timeout_s)

    @property
    def pid(self) -> int | None:
        """The driver process's id while it runs."""
        return None if self._proc is None else self._proc.pid

    def round(self, samples: int, offset: int = 0) -> list[float]:
        """Latencies (ms) of ``samples`` searches, queries taken from ``offset`` on."""
        reply = self._ask(json.dumps({"samples": samples, "offset": offset}), 600.0)
        lat: list[float] = reply["lat_ms"]
        return lat

    def _ask(self, line: str, timeout_s: float) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("ReMe rounds driver is not running")
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        answer = proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"ReMe rounds driver exited ({proc.wait(timeout_s)})")
        reply: dict[str, Any] = json.loads(answer)
        return reply

    def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError):
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def reme_search(workspace: Path, queries: Sequence[str], *, max_results: int = 10,
                with_text: bool = True, metadata_dir: str = DEFAULT_METADATA_DIR,
                fresh: bool = True, python: Path | None = None,
                timeout_s: float = 1800.0) -> list[list[dict[str, Any]]]:
    """ReMe's keyword search results for each query, for quality comparisons.

    Builds (or reuses, with ``fresh=False``) ReMe's index of ``workspace`` and returns, per
    query, up to ``max_results`` dicts with path, start_line, end_line, score and text.
    """
    spec = {
        "mode": "search", "workspace": str(Path(workspace).resolve()),
        "result_queries": list(queries), "max_results": max_results,
        "metadata_dir": metadata_dir, "fresh": fresh, "with_text": with_text,
    }
    results: list[list[dict[str, Any]]] = _call_driver(
        spec, python=python, timeout_s=timeout_s)["results"]
    return results


def main(argv: list[str] | None = None) -> int:
    """Generate (or take) a workspace, run the ReMe baseline on it, write JSON."""
    ap = argparse.ArgumentParser(description="ReMe 0.4.2 baseline on a synthetic workspace")
    ap.add_argument("--workspace", type=Path, help="existing workspace (default: generate)")
    ap.add_argument("--notes", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--edits", type=int, default=DEFAULT_EDITS)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import synth

    ws = a.workspace
    if ws is None:
        ws = REPO_ROOT / "bench-results" / f"ws-reme-{a.notes}-{a.seed}"
        shutil.rmtree(ws, ignore_errors=True)
        synth.generate(ws, notes=a.notes, seed=a.seed)
    queries = default_queries(a.seed)
    out = run_reme(ws, queries=queries, result_queries=[q for q, _ in synth.needles(a.seed)],
                   edits=a.edits)
    needles = synth.needles(a.seed)
    out["needle_hit_at_5"] = sum(
        any(r["path"] == path for r in res[:5]) for (_, path), res in zip(needles, out["results"],
                                                                          strict=True)
    ) / max(1, len(needles))
    text = json.dumps(out, indent=2, ensure_ascii=False)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def default_queries(seed: int = 0) -> list[str]:
    """A fixed mix of query shapes: common words, identifiers, Chinese, needles."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import synth

    base = [
        "deploy rollback after the migration", "ECONNREFUSED", "handleWebSocketReconnect",
        "v2.3.1", "memory leak in the worker queue", "coffee with a friend on the weekend",
        "数据库 迁移", "服务器 超时 重试", "部署 失败 回滚", "kubernetes cluster node",
        "budget invoice tax", "tokenizer embedding vector search", "flight hotel passport",
        "性能 优化 瓶颈", "what did we decide about the release branch",
    ]
    return base + [q for q, _ in synth.needles(seed)]


# ------------------------------------------------------------------------- driver side
# Runs inside the ReMe venv only; ReMe is imported lazily so the host never needs it.


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def _reme_config(workspace: str, metadata_dir: str, *, watcher: bool) -> dict[str, Any]:
    from reme.config import resolve_app_config  # type: ignore[import-not-found,unused-ignore]

    cfg: dict[str, Any] = resolve_app_config(log_config=False, config="default")
    loop = cfg["jobs"]["index_update_loop"]
    jobs: dict[str, Any] = {"search": cfg["jobs"]["search"]}
    if watcher:
        jobs["index_update_loop"] = loop
    else:
        jobs["index_update"] = {
            "backend": "base", "description": "initial scan of the index_update_loop",
            "watch_dirs": loop["watch_dirs"], "watch_suffixes": loop["watch_suffixes"],
            "parameters": {"type": "object", "properties": {}},
            "steps": [loop["steps"][0]],
        }
    keep = {"tokenizer", "file_graph", "file_chunker", "keyword_index", "tag_index",
            "file_store"}
    cfg["components"] = {k: v for k, v in cfg["components"].items() if k in keep}
    if cfg["components"]["file_store"]["default"].get("embedding_store"):
        raise RuntimeError("expected ReMe's default file_store without an embedding store")
    cfg["jobs"] = jobs
    cfg.update(workspace_dir=workspace, daily_dir="memory", digest_dir="digest",
               metadata_dir=metadata_dir, enable_logo=False, log_to_console=False,
               log_to_file=False)
    return cfg


def _hits(resp: Any, with_text: bool) -> list[dict[str, Any]]:
    out = []
    for r in resp.metadata.get("results", []):
        d = {"path": r["path"], "start_line": r["start_line"], "end_line": r["end_line"],
             "score": r.get("scores", {}).get("score"), "chars": len(r.get("text", ""))}
        if with_text:
            d["text"] = r.get("text", "")
        out.append(d)
    return out


def _count_watched(workspace: Path) -> int:
    return sum(1 for d in ("memory", "digest") for _ in (workspace / d).rglob("*.md"))


def _peak_rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _driver(spec: dict[str, Any]) -> dict[str, Any]:
    t_import = time.perf_counter()
    from reme.reme import ReMe  # type: ignore[import-not-found,unused-ignore]

    # Importing ReMe is part of starting it; recalld's cold build includes its process
    # start, so the like-for-like comparison adds this to ReMe's (bench_index.compare).
    import_s = time.perf_counter() - t_import
    ws = Path(spec["workspace"])
    meta = spec["metadata_dir"]
    k = int(spec.get("max_results", 5))
    with_text = bool(spec.get("with_text", False))
    out: dict[str, Any] = {"reme_version": "0.4.2.0", "files": _count_watched(ws),
                           "import_s": import_s}
    if spec.get("fresh", True):
        shutil.rmtree(ws / meta, ignore_errors=True)

    # Cold build: construct, start, run the initial scan job (chunks, BM25, persist).
    t0 = time.perf_counter()
    app = ReMe(**_reme_config(str(ws), meta, watcher=False))
    await app.start()
    await app.run_job("index_update")
    out["cold_build_s"] = time.perf_counter() - t0
    store = app.context.components["file_store"]["default"]
    out["indexed_files"] = len(await store.get_nodes())
    out["chunks"] = len(store.file_chunks)
    t0 = time.perf_counter()
    await app.close()
    out["close_persist_s"] = time.perf_counter() - t0

    async def search(a: Any, q: str) -> Any:
        return await a.run_job("search", query=q, limit=k)

    # Warm restart: construct, load persisted state, rescan (nothing changed), first answer.
    warm: list[float] = []
    probe = (spec.get("queries") or spec.get("result_queries") or ["memory"])[0]
    for i in range(int(spec.get("warm_runs", 1))):  # the last app stays open
        t0 = time.perf_counter()
        app = ReMe(**_reme_config(str(ws), meta, watcher=False))
        await app.start()
        await app.run_job("index_update")
        await search(app, probe)
        warm.append(time.perf_counter() - t0)
        if i + 1 < int(spec.get("warm_runs", 1)):
            await app.close()
    if not warm:  # search-only mode: reopen without timing
        app = ReMe(**_reme_config(str(ws), meta, watcher=False))
        await app.start()
        await app.run_job("index_update")
    else:
        out["warm_restart_runs_s"] = warm
        out["warm_restart_s"] = statistics.median(warm)

    queries: list[str] = list(spec.get("queries", []))
    if queries:
        n = max(len(queries), int(spec.get("search_samples", 300)))
        lat: list[float] = []
        for j in range(n):
            t0 = time.perf_counter()
            await search(app, queries[j % len(queries)])
            lat.append((time.perf_counter() - t0) * 1e3)
        conc = int(spec.get("concurrency", 16))
        clat: list[float] = []

        async def client(c: int) -> None:
            for j in range(max(1, n // conc)):
                t1 = time.perf_counter()
                await search(app, queries[(c + j) % len(queries)])
                clat.append((time.perf_counter() - t1) * 1e3)

        await asyncio.gather(*(client(c) for c in range(conc)))
        out["search"] = {
            "samples": len(lat), "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99),
            "concurrency": conc, "concurrent_samples": len(clat),
            "concurrent_p50_ms": _pct(clat, 50), "concurrent_p99_ms": _pct(clat, 99),
            "note": "in-process search jobs (no HTTP); concurrent = asyncio tasks, one process",
        }
    out["results"] = [_hits(await search(app, q), with_text)
                      for q in spec.get("result_queries", [])]
    await app.close()

    edits = int(spec.get("edits", 0))
    if edits > 0 and spec.get("mode") == "bench":
        out["write_to_searchable"] = await _write_to_searchable(ws, meta, edits, k)
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


async def _write_to_searchable(ws: Path, meta: str, edits: int, k: int) -> dict[str, Any]:
    """Append a token to a note, poll ``search`` every 20 ms until it is found."""
    from reme.reme import ReMe  # type: ignore[import-not-found,unused-ignore]

    app = ReMe(**_reme_config(str(ws), meta, watcher=True))
    await app.start()
    rng = random.Random(0)
    notes = sorted(p for p in (ws / "memory").rglob("*.md"))
    timeout_s = 30.0

    async def one(i: int) -> float | None:
        path = notes[rng.randrange(len(notes))]
        # Letters only, so ReMe's tokenizer keeps the token whole.
        token = "qzreme" + "".join(chr(97 + int(c)) for c in str(i + 1)) + "x" + "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
        rel = path.relative_to(ws).as_posix()
        with path.open("a", encoding="utf-8") as f:
            f.write(f"\nFollow-up: {token} confirmed during the review.\n")
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            resp = await app.run_job("search", query=token, limit=k)
            if any(r["path"] == rel for r in resp.metadata.get("results", [])):
                return time.perf_counter() - t0
            await asyncio.sleep(0.02)
        return None

    # The watcher's first cycle runs a catch-up scan; wait for it with an uncounted edit.
    warmup = await one(-1)
    lat: list[float] = []
    missed = 0
    for i in range(edits):
        got = await one(i)
        if got is None:
            missed += 1
        else:
            lat.append(got)
        await asyncio.sleep(rng.uniform(0.0, 1.0))  # spread edits over the poll phase
    await app.close()
    return {"edits": edits, "missed": missed, "warmup_s": warmup,
            "p50_s": _pct(lat, 50), "p95_s": _pct(lat, 95), "max_s": max(lat, default=None),
            "samples_s": lat,
            "note": "watchfiles forced polling, poll_delay 5 s (ReMe defaults); search polled "
                    "every 20 ms"}


async def _rounds(spec: dict[str, Any], out: Any) -> None:
    """Open ReMe on the indexed workspace, answer ready, then time one round of searches
    per request line (``{samples, offset}``) until stdin closes."""
    from reme.reme import ReMe  # type: ignore[import-not-found,unused-ignore]

    ws, meta = str(Path(spec["workspace"])), spec["metadata_dir"]
    queries: list[str] = list(spec["queries"])
    k = int(spec.get("max_results", 5))
    app = ReMe(**_reme_config(ws, meta, watcher=False))
    await app.start()
    await app.run_job("index_update")
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        ask = json.loads(line)
        lat: list[float] = []
        for j in range(int(ask["samples"])):
            q = queries[(int(ask.get("offset", 0)) + j) % len(queries)]
            t0 = time.perf_counter()
            await app.run_job("search", query=q, limit=k)
            lat.append((time.perf_counter() - t0) * 1e3)
        out.write(json.dumps({"lat_ms": lat}) + "\n")
        out.flush()
    await app.close()


def _rounds_main() -> int:
    spec = json.loads(sys.stdin.readline())
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        asyncio.run(_rounds(spec, out))
    return 0


def _driver_main() -> int:
    spec = json.loads(sys.stdin.read())
    with contextlib.redirect_stdout(sys.stderr):
        if spec.get("mode") == "search":
            spec.update(queries=[], warm_runs=0, edits=0)
        result = asyncio.run(_driver(spec))
    sys.stdout.write(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:
        raise SystemExit(_driver_main())
    if sys.argv[1:2] == ["--rounds"]:
        raise SystemExit(_rounds_main())
    raise SystemExit(main())
