"""Build (and check) a workspace with the real ReMe 0.4.2, embeddings from the fake provider.

Two halves in one file, as ``reme_baseline.py``:

- the host side (``build``) runs in the project venv: it writes a small set of notes (daily
  notes with and without frontmatter, digest nodes with the old ``derived_from::`` /
  ``relates_to::`` lines), starts the loopback fake provider (OpenAI ``/embeddings``), and
  runs the driver in ReMe's venv (``reme_baseline.ensure_reme_python``);
- the driver (``--driver``) runs ReMe with its ``default`` config plus an ``openai``
  embedding store pointed at the fake: the ``index_update_loop``'s first step indexes
  ``memory/`` and ``digest/`` (chunks, vectors, graph, the ``embedding_store`` cache) and
  ReMe's own ``dream`` file catalog records the notes named in the spec as consolidated,
  the way its ``dream_finish_step`` does (``FileNode(path, st_mtime)``), then ReMe closes
  and persists. ``--check`` opens a workspace with ReMe again and reports how many chunks
  its file store loaded and whether it had to index anything again.

The generated workspace is committed under ``tests/fixtures/reme-0.4.2/`` with
``mtimes.json`` (git does not keep file times; ReMe's catalogs compare them):

    .venv/bin/python tests/bench/reme_fixture.py build [--out tests/fixtures/reme-0.4.2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "reme-0.4.2"
DIMS = 64
MODEL = "fake-embedding"
# ReMe's vector space key includes the endpoint, so the fixture is made against a fixed
# loopback port; tests start their fake provider on the same port.
FIXTURE_PORT = 48231

TOPICS = [
    ("deploy", "The deploy to staging failed with ECONNREFUSED on the database port; "
               "we rolled back and pinned the connection pool to 20."),
    ("commute", "Bike on Mondays and Thursdays, the train otherwise; the 7:42 is "
                "always late."),
    ("budget", "Quarterly budget review: cloud spend up 14 percent, mostly the GPU "
               "instances for the nightly embedding backfill."),
    ("reading", "Finished the chapter on consensus protocols; Raft's leader lease "
                "explains the stale reads we saw."),
    ("cooking", "The sourdough needs a longer bulk ferment in winter, about six hours "
                "at 21 degrees."),
    ("health", "Physio says two sets of the hip exercise every morning, no running "
               "until the knee stops clicking."),
    ("release", "Release branch v2.3.1 is cut; handleWebSocketReconnect still drops "
                "the first message after a reconnect."),
    ("travel", "Passport renewal takes six weeks; book the Lisbon hotel near the "
               "conference venue."),
]


def notes() -> dict[str, str]:
    """The fixture's Markdown: 8 days x 4 notes (half with frontmatter), 4 digest nodes."""
    out: dict[str, str] = {}
    for day in range(8):
        date = f"2026-06-{day + 10:02d}"
        for j in range(4):
            name, fact = TOPICS[(day + j) % len(TOPICS)]
            head = (f"---\nname: {name} {date}\ndescription: notes about {name}\n"
                    f"memory_tags: [{name}]\n---\n" if j % 2 == 0 else "")
            body = (f"# {name.title()} on {date}\n\n{fact}\n\n## Details\n\n"
                    f"- item {day}-{j}: follow up with the team about {name}.\n"
                    f"- decided: keep the {name} checklist in the wiki.\n")
            if j == 3:  # longer notes; the first two past ReMe's 10 KB chunk size
                sections = 14 if day < 2 else 3
                body += "".join(
                    f"\n## Section {k}\n\n" + " ".join(
                        f"Paragraph {k} sentence {s} about {name} and the plan for week {k}."
                        for s in range(12)) + "\n" for k in range(sections))
            out[f"memory/{date}/{name}-{j}.md"] = head + body
    for bucket, name in (("wiki", "deploy-runbook"), ("procedure", "release-checklist"),
                         ("personal", "commute-habits"), ("wiki", "budget-notes")):
        topic = name.split("-")[0]
        sources = [p for p in out if f"/{topic}-" in p][:2]
        out[f"digest/{bucket}/{name}.md"] = (
            f"---\nname: {name}\ndescription: what we know about {topic}\n---\n"
            f"# {name}\n\nConsolidated knowledge about {topic}.\n\n"
            + "".join(f"derived_from:: [[{s}]]\n" for s in sources)
            + "relates_to:: [[digest/wiki/deploy-runbook]]\n")
    return out


def consolidated(all_notes: dict[str, str]) -> list[str]:
    """The daily notes ReMe's dream has processed: the first five days."""
    return sorted(p for p in all_notes if p.startswith("memory/")
                  and p.split("/")[1] < "2026-06-15")


# ---------------------------------------------------------------------------- host side


def build(out: Path, *, python: Path | None = None) -> dict[str, Any]:
    """Write the notes, index them with ReMe against the fake provider, record mtimes."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    import reme_baseline
    from fakes.provider_server import FakeProvider

    py = python or reme_baseline.ensure_reme_python()
    shutil.rmtree(out, ignore_errors=True)
    all_notes = notes()
    for rel, text in all_notes.items():
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    with FakeProvider(dims=DIMS, port=FIXTURE_PORT) as fake:
        spec = {"mode": "build", "workspace": str(out.resolve()),
                "base_url": f"{fake.url}/v1", "consolidated": consolidated(all_notes)}
        result = call_driver(py, spec)
        result["provider_texts"] = sum(len(r.json["input"]) for r in fake.requests
                                       if r.path.endswith("/embeddings"))
    mtimes = {rel: os.stat(out / rel).st_mtime for rel in sorted(all_notes)}
    (out / "mtimes.json").write_text(json.dumps(mtimes, indent=1) + "\n", encoding="utf-8")
    (out / "build.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def check(workspace: Path, *, python: Path, base_url: str) -> dict[str, Any]:
    """Open ``workspace`` with ReMe: chunks loaded, and what the catch-up scan changed."""
    return call_driver(python, {"mode": "check", "workspace": str(workspace.resolve()),
                                "base_url": base_url})


def call_driver(python: Path, spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import reme_baseline

    env = reme_baseline._driver_env()
    env["EMBEDDING_API_KEY"] = "fake"
    done = subprocess.run([str(python), str(Path(__file__).resolve()), "--driver"],
                          input=json.dumps(spec), capture_output=True, text=True,
                          timeout=600, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ReMe driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# ------------------------------------------------------------------------- driver side


def _config(workspace: str, base_url: str) -> dict[str, Any]:
    from reme.config import resolve_app_config  # type: ignore[import-not-found,unused-ignore]

    cfg: dict[str, Any] = resolve_app_config(log_config=False, config="default")
    loop = cfg["jobs"]["index_update_loop"]
    cfg["jobs"] = {"index_update": {
        "backend": "base", "description": "initial scan of the index_update_loop",
        "watch_dirs": loop["watch_dirs"], "watch_suffixes": loop["watch_suffixes"],
        "parameters": {"type": "object", "properties": {}}, "steps": [loop["steps"][0]]}}
    keep = {"tokenizer", "file_graph", "file_chunker", "keyword_index", "tag_index",
            "file_store", "file_catalog"}
    comps = {k: v for k, v in cfg["components"].items() if k in keep}
    comps["as_embedding"] = {"default": {
        "backend": "openai", "model": MODEL, "dimensions": DIMS,
        "credential": {"api_key": "fake", "base_url": base_url}, "parameters": {}}}
    comps["embedding_store"] = {"default": {"backend": "local", "as_embedding": "default"}}
    comps["file_store"]["default"]["embedding_store"] = "default"
    cfg["components"] = comps
    cfg.update(workspace_dir=workspace, daily_dir="memory", digest_dir="digest",
               metadata_dir="mem_metadata", enable_logo=False, log_to_console=False,
               log_to_file=False)
    return cfg


async def _driver(spec: dict[str, Any]) -> dict[str, Any]:
    from reme.reme import ReMe  # type: ignore[import-not-found,unused-ignore]
    from reme.schema import FileNode  # type: ignore[import-not-found,unused-ignore]

    ws = Path(spec["workspace"])
    app = ReMe(**_config(str(ws), spec["base_url"]))
    await app.start()
    store = app.context.components["file_store"]["default"]
    loaded = len(store.file_chunks)
    loaded_vectors = sum(1 for c in store.file_chunks.values() if c.embedding is not None)
    graph_before = {n.path: list(n.chunk_ids) for n in await store.get_nodes()}
    await app.run_job("index_update")
    graph_after = {n.path: list(n.chunk_ids) for n in await store.get_nodes()}
    out: dict[str, Any] = {
        "loaded_chunks": loaded, "loaded_vectors": loaded_vectors,
        "chunks": len(store.file_chunks),
        "vectors": sum(1 for c in store.file_chunks.values() if c.embedding is not None),
        "files": len(graph_after),
        "reindexed_files": sorted(p for p in graph_after
                                  if graph_before.get(p) != graph_after[p]),
    }
    catalog = app.context.components["file_catalog"]["dream"]
    await catalog.load()
    if spec["mode"] == "build":
        nodes = [FileNode(path=rel, st_mtime=(ws / rel).stat().st_mtime)
                 for rel in spec["consolidated"]]
        await catalog.upsert(nodes)
        await catalog.dump()
    out["dream_catalog"] = len(await catalog.get_nodes())
    await app.close()
    return out


def _driver_main() -> int:
    spec = json.loads(sys.stdin.read())
    with contextlib.redirect_stdout(sys.stderr):
        result = asyncio.run(_driver(spec))
    sys.stdout.write(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ReMe 0.4.2 fixture workspace")
    ap.add_argument("action", choices=["build"])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    print(json.dumps(build(a.out), indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--driver"]:
        raise SystemExit(_driver_main())
    raise SystemExit(main())
