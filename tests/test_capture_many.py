"""No turn is lost across many workspaces and sessions, in any script, through a kill -9.

The acceptance cases of capture with more than one of everything: workspaces opened by
RPC with agent ids of every allowed shape, several sessions each, turns in Chinese,
Japanese, Arabic, emoji and English, the daemon killed after the acknowledgements and
restarted with no client connecting. The chat model is a scripted OpenAI-compatible
server that answers each request from its own content (the sessions' jobs run
concurrently), so every note can be checked against its own conversation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes.provider_server import FakeProvider, chat_answer, tool_call
from waits import ACTIVE, wait_for, wait_value

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.ipc.errors import InvalidParams

AGENTS = ("a", "Coder_2.v-9", "x" * 64)
TURNS = {
    "family:1": "我妹妹安娜住在格拉茨，她是护士。",
    "trip@phone": "来週の火曜日に大阪へ出張します。",
    "s.3": "أحب القهوة العربية بالهيل 🌿 and I bike to work",
}


def scripted_model(body: dict[str, Any]) -> dict[str, Any]:
    """daily_write of the conversation's user turns as bullets; then "saved"."""
    messages = body["messages"]
    if any(m.get("role") == "tool" for m in messages):
        return chat_answer("saved")
    prompt = messages[-1]["content"]
    said = re.findall(r"^user: (.+)$", prompt, flags=re.MULTILINE)
    return chat_answer(None, [tool_call("daily_write", {
        "name": "conversation", "description": "what was said",
        "content": "\n".join(f"- {line}" for line in said)})])


@pytest.fixture
def fake() -> Any:
    with FakeProvider() as provider:
        provider.chat_default = scripted_model
        yield provider


def config(fake: FakeProvider) -> str:
    return ("[workspace_defaults]\nauto_memory_interval = 0\nauto_memory_idle_s = 2\n"
            "[workspace_defaults.chat_model_config]\n"
            f'base_url = "{fake.url}/v1"\napi_key = "k"\nmodel_name = "m"\n')


def session_notes(root: Path, session: str) -> list[Path]:
    return [p for p in (root / "memory").rglob("*.md") if p.name != "index.md"
            and parse_frontmatter(p.read_text(encoding="utf-8"))[0].get("session_id")
            == session]


@pytest.mark.slow
def test_many_workspaces_and_sessions_survive_a_kill(daemon_factory: Any, fake: FakeProvider,
                                                     tmp_path: Path) -> None:
    cfg = config(fake)
    d = daemon_factory(cfg)
    roots = {agent: tmp_path / f"ws-{i}" for i, agent in enumerate(AGENTS)}
    for agent, root in roots.items():
        d.call("workspace.open", {"agent_id": agent, "path": str(root)})
    for bad in ("研究员", "a b", "../x", "x" * 65, ""):
        with pytest.raises(InvalidParams):
            d.call("workspace.open", {"agent_id": bad})
    for agent in AGENTS:
        for session, text in TURNS.items():
            r = d.call("memory.add_turns", {"agent_id": agent, "session_id": session,
                                             "messages": [{"role": "user", "content": text},
                                                          {"role": "assistant",
                                                           "content": "好的 / OK"}]})
            assert r["pending_turns"] == 1, r
    d.kill()

    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])  # nobody connects
    for agent, root in roots.items():
        for session in TURNS:
            wait_for(lambda r=root, s=session: session_notes(r, s),
                     deadline_s=180, what=f"the note of {agent}/{session}")
    for agent, root in roots.items():
        wait_for(lambda a=agent: all(
            d2.call("memory.add_turns", {"agent_id": a, "session_id": s})["pending_turns"] == 0
            for s in TURNS), deadline_s=120, what=f"{agent}'s turns committed")
        for session, text in TURNS.items():
            (note,) = session_notes(root, session)  # one note per session: exactly once
            assert note.read_text(encoding="utf-8").count(text) == 1, (agent, session)
            dialog = root / "mem_session" / "dialog" / f"{session}.jsonl"
            said = [orjson.loads(line)["content"] for line in dialog.read_text().splitlines()]
            assert said.count(text) == 1, (agent, session, said)
        hits = d2.call("memory.search", {"agent_id": agent, "query": "格拉茨", "sync": True})
        assert any("格拉茨" in h["text"] for h in hits["results"]), (agent, hits)
    # A job commits its turns before its inbox item: wait for the jobs to end.
    jobs = wait_value(
        lambda: [j for a in AGENTS for j in d2.call("jobs.list", {"agent_id": a})["jobs"]
                 if j["kind"] == "auto_memory"],
        lambda jobs: all(j["state"] not in ACTIVE for j in jobs), "the jobs to end")
    assert all(j["state"] == "succeeded" for j in jobs), jobs
    assert d2.stop() == 0
