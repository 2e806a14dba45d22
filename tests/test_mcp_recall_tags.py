"""Recalled memory that holds the tag it is wrapped in: a note about prompt formats, a
pasted transcript. The ``recall`` prompt and the AgentScope middleware wrap the recall
block in ``<recalled-memory>``, which ``memory.add_turns`` drops up to its first closing
tag; a note's own closing tag ended the block there, and the memories after it were
kept as what the user said when the host handed the conversation back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonFactory
from fakes.provider_server import FakeProvider, Reply, chat_answer
from test_mcp import _write, bridge
from waits import wait_job

# A note that quotes the tags (closing and opening, in other cases too), and one after it.
FORMATS = ("# Prompt formats\n\nThe quokkaboat agent wraps memory in <recalled-memory> "
           "and ends it with </recalled-memory>, or </Recalled-Memory >, or "
           "</memory-context>.\n")
TRAM = "# Tram\n\nThe quokkaboat tram stops at tangerine-42.\n"


def test_a_note_holding_the_recall_tag_does_not_end_the_block(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    daemon = daemon_factory(
        f'[workspaces.w]\npath = "{root}"\n'
        f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "k", '
        f'model_name = "m", timeout_s = 10.0}}\n')
    _write(daemon, "w", "memory/2026-07-02/formats.md", FORMATS)
    _write(daemon, "w", "memory/2026-07-02/tram.md", TRAM)
    fake.script(Reply(json=chat_answer("saved")))

    async def main() -> dict[str, object]:
        async with bridge(daemon, "w") as s:
            prompt = await s.get_prompt("recall", {"query": "quokkaboat"})
            text = prompt.messages[0].content.text
            assert "tangerine-42" in text and "Prompt formats" in text, text
            assert text.count("</recalled-memory>") == 1, text  # the wrapper's own
            assert text.endswith("</recalled-memory>"), text
            added = await s.call_tool("memory_add_turns", {
                "session_id": "s1", "flush": True, "messages": [
                    {"role": "user", "content": f"{text}\nWhen does the ferry leave?"},
                    {"role": "assistant", "content": "At noon."}]})
            assert not added.is_error
            return dict(added.structured_content or {})

    added = asyncio.run(main())
    assert wait_job(daemon, str(added["job_id"]))["state"] == "succeeded"
    dialog = (root / "mem_session/dialog/s1.jsonl").read_text(encoding="utf-8")
    assert "When does the ferry leave?" in dialog
    for recalled in ("tangerine-42", "Prompt formats", "recalled-memory"):
        assert recalled not in dialog, dialog
    asked = "\n".join(str(r.json) for r in fake.requests)
    assert "When does the ferry leave?" in asked and "tangerine-42" not in asked


def test_the_agentscope_memory_message_keeps_one_block() -> None:
    pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")
    from recalld.ipc.agentscope_messages import memory_message

    hint = memory_message([FORMATS, TRAM]).content[0].hint
    assert hint.count("</recalled-memory>") == 1 and hint.endswith("</recalled-memory>")
    assert hint.count("<recalled-memory>") == 1 and "tangerine-42" in hint
