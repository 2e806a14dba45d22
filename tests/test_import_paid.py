"""The import report's vector counts tell what the provider was paid for since the
workspace opened from what was there before: the backfill runs beside the report, and a
text it paid for is neither "embedded before" nor "in the cache"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clirun import run_recalld
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from reme_fixture_util import passage_texts
from test_vectors import NOTES, Harness, full, wait_for, write
from waits import wait_value

from recalld.daemon.providers.bridge import ProviderBridge

AGENT = "paw-paid"


def _workspace(root: Path, fake: FakeProvider) -> Path:
    # A QwenPaw workspace ReMe never embedded (no chunk store, no cache files).
    for day in range(1, 4):
        folder = root / "memory" / f"2026-04-0{day}"
        folder.mkdir(parents=True)
        for n in range(3):
            (folder / f"walk-{n}.md").write_text(
                f"# Walk {day}.{n}\n\n- the heron at pond {day} stood on stone {n}\n\n"
                f"## Later\n\nRain over the {n}th bridge, day {day}.\n", "utf-8")
    emb = {"backend": "openai", "base_url": fake.url, "api_key": "k", "model_name": "m",
           "dimensions": 8, "max_batch_size": 2, "use_dimensions": False}
    (root / "agent.json").write_text(json.dumps(
        {"id": AGENT, "running": {"reme_light_memory_config": {
            "embedding_model_config": emb, "dream_cron_enabled": False}}}), "utf-8")
    return root


def _report(daemon: DaemonHandle, root: Path) -> dict[str, Any]:
    config = json.loads((root / "agent.json").read_text("utf-8"))
    answer = daemon.call("workspace.open", {"agent_id": AGENT, "path": str(root),
                                            "config": config, "import_report": True})
    vectors: dict[str, Any] = answer["import"]["vectors"]
    return {**vectors, "chunks": answer["import"]["chunks"]["total"]}


def _idle(daemon: DaemonHandle) -> None:
    wait_value(lambda: daemon.call("daemon.status")["workspaces"],
               lambda wss: any(w["agent_id"] == AGENT and w["index"]["vectors"]["state"]
                               == "idle" and w["index"]["vectors"]["coverage"] == 1.0
                               for w in wss), "every vector")


def test_texts_paid_since_the_open_are_not_reported_as_there_before(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = _workspace(tmp_path / "paw", fake)
    first = _report(daemon, root)
    # However far the backfill got beside it, nothing was there before this open.
    assert first["embedded_before"] == 0 and first["in_cache"] == 0, first
    assert first["reused_from_reme"] == 0
    # The backfill is done before the next report is taken: all of it was paid since
    # the workspace opened, the provider's texts counted as the fake saw them.
    _idle(daemon)
    sent = passage_texts(fake)
    again = _report(daemon, root)
    assert again["embedded_before"] == 0 and again["in_cache"] == 0, again
    assert again["embedded_since_open"] == again["chunks"] > 0, again
    assert again["provider_texts_since_open"] == len(sent) == len(set(sent)), again
    assert again["to_embed"] == 0 and again["estimated_provider_calls"] == 0, again
    proc = run_recalld(["--socket", str(daemon.socket_path), "import-qwenpaw", str(root)],
                       env=daemon.env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (f"vectors:  0 reused from ReMe, 0 embedded before, {again['chunks']} embedded "
            f"since the open ({len(sent)} texts sent to the provider), 0 in the cache, 0 to "
            "embed (about 0 provider calls of up to 2)") in proc.stdout, proc.stdout

    # Opened anew, the vectors were made before this open, and nothing is paid again.
    daemon.call("workspace.close", {"agent_id": AGENT})
    reopened = _report(daemon, root)
    assert reopened["embedded_before"] == reopened["chunks"], reopened
    assert (reopened["embedded_since_open"], reopened["provider_texts_since_open"],
            reopened["in_cache"], reopened["to_embed"]) == (0, 0, 0, 0), reopened
    assert passage_texts(fake) == sent


async def test_the_paid_texts_kept_are_bounded_by_the_live_ones(
        tmp_path: Path, bridge: ProviderBridge) -> None:
    # What the import report reads lives as long as the workspace: past the cache's
    # bound, the keys of texts no chunk holds any more (edited, deleted) are dropped.
    h = Harness(tmp_path, bridge)
    for rel, text in NOTES.items():
        write(h.root, rel, text)
    with FakeProvider(dims=8) as fake:
        async with h.open(h.emb(fake)) as (_, worker):
            await full(worker)
            live = set(worker.calls.paid)
            assert len(live) == len(NOTES)
            worker.calls.paid |= {f"{n:032x}" for n in range(2100)}  # long gone
            # The next idle spell after a change looks at them.
            write(h.root, "memory/2026-07-23/rain.md", "# Rain\n\nUmbrella by the door.\n")
            await wait_for(lambda: len(worker.calls.paid) == len(NOTES) + 1)
            assert live < worker.calls.paid


def test_chunks_that_show_no_word_are_not_reported_to_embed(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # They get no vector: "to embed" would count them for ever.
    root = _workspace(tmp_path / "paw", fake)
    (root / "memory" / "2026-04-01" / "rules.md").write_text("---\n---\n", "utf-8")
    (root / "memory" / "2026-04-02" / "tasks.md").write_text("- [x]\n\n\u200b\n", "utf-8")
    _report(daemon, root)
    _idle(daemon)
    daemon.call("workspace.close", {"agent_id": AGENT})
    reopened = _report(daemon, root)
    assert reopened["embedded_before"] == reopened["chunks"] - 2 > 0, reopened
    assert (reopened["to_embed"], reopened["estimated_provider_calls"]) == (0, 0), reopened
