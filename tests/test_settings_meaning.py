"""Settings do what their QwenPaw names say, through a real daemon.

``inbox_push_enabled = false`` records no inbox item; ``enable_cache = false`` neither
reads nor writes the embedding cache (every text goes to the provider).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_for, wait_job, workspace_status


def test_inbox_push_disabled_records_nothing(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    with FakeProvider() as fake:
        d = daemon_factory(
            f'[workspaces.w]\npath = "{root}"\ninbox_push_enabled = false\n'
            f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "k", '
            f'model_name = "m"}}\n')
        fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
            "name": "tea", "description": "drinks", "content": "- Drinks green tea"})])),
            Reply(json=chat_answer("saved")))
        r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "flush": True,
                                        "messages": [{"role": "user", "content": "Green tea."},
                                                     {"role": "assistant", "content": "ok"}]})
        job = wait_job(d, r["job_id"])
        assert job["state"] == "succeeded" and job["result"]["changed"], job
        assert job["result"]["inbox_item"] is None
        assert d.call("inbox.list", {"agent_id": "w", "include_acked": True})["items"] == []
        inbox_log = root / "mem_metadata" / "inbox" / "inbox.jsonl"
        assert not inbox_log.exists() or inbox_log.read_bytes() == b""


def embedded(fake: FakeProvider, needle: str) -> int:
    """How many texts containing ``needle`` were sent to the embedding provider."""
    return sum(1 for r in fake.requests if r.path.endswith("/embeddings")
               for text in r.json["input"] if needle in text)


def test_enable_cache_false_bypasses_the_embedding_cache(daemon_factory: Any,
                                                         tmp_path: Path) -> None:
    root = tmp_path / "ws"
    text = "# Commute\n\nThe 7:40 train to Zurich.\n"
    note = root / "memory/2026-07-23/commute.md"
    note.parent.mkdir(parents=True)
    note.write_text(text, encoding="utf-8")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(
            f'[workspaces.w]\npath = "{root}"\n'
            f'embedding_model_config = {{backend = "openai", base_url = "{fake.url}/v1", '
            f'api_key = "k", model_name = "m", dimensions = 8, enable_cache = false}}\n')

        def covered(total: int) -> bool:
            v = (workspace_status(d, "w") or {"index": {"vectors": {}}})["index"]["vectors"]
            return bool(v.get("total") == total and v.get("coverage", 0) >= 1.0)

        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: covered(1), "the first file embedded")
        assert embedded(fake, "7:40 train") == 1
        # The same text in a second file: with the cache it would not be sent again.
        (note.parent / "copy.md").write_text(text, encoding="utf-8")
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: covered(2), "the copy embedded")
        assert embedded(fake, "7:40 train") == 2
        assert d.stop() == 0
    caches = list((d.data_dir / "state" / "embeddings").glob("*.log"))
    assert all(c.read_bytes() == b"" for c in caches), "nothing was written to the cache"
