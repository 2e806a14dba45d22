"""The agent's own models handed to the daemon by the AgentScope middlewares, and the
chat model's selection of topic files before a reply.

A real daemon with no model configured, real AgentScope 2.x agents whose chat model is
AgentScope's ``OpenAIChatModel`` talking to the scripted provider on 127.0.0.1 (which
refuses any other key than the agent's): the daemon's auto_memory job and
``memory.select`` can only reach that server through the model the middleware handed
over.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.embedding import OpenAIEmbeddingModel
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, chat_answer, tool_call
from waits import ACTIVE, wait_value

from recalld.daemon.config_rules import mask_url
from recalld.ipc.agentscope import (
    RecalldMem0Middleware,
    RecalldMemoryMiddleware,
    model_overrides,
)
from recalld.ipc.client import Client

KEY = "sk-agent-" + "Vq7Hc2Lp9Xw4Rt6Zm1Bn8"
SELECT_MARK = "You pick the long-term memory files"


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        provider.api_key = KEY  # only the agent's key is answered
        yield provider


def _model(fake: FakeProvider) -> OpenAIChatModel:
    return OpenAIChatModel(credential=OpenAICredential(api_key=KEY, base_url=fake.url + "/v1"),
                           model="agent-model", stream=False, max_retries=0)


def _tools(body: Any) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


def _system(body: Any) -> str:
    return "".join(str(m.get("content")) for m in body["messages"] if m["role"] == "system")


def _chat(fake: FakeProvider) -> list[dict[str, Any]]:
    return [r.json for r in fake.requests if r.path.endswith("/chat/completions")]


def _answer(select: list[str] | None = None) -> Any:
    """The agent's replies, the daemon's auto_memory loop (one daily_write, then done) and
    memory.select (``select`` paths) all talk to the one scripted server."""

    def answer(body: Any) -> dict[str, Any]:
        if SELECT_MARK in _system(body):
            return chat_answer(json.dumps({"paths": select or []}))
        if "daily_write" in _tools(body):
            if any(m["role"] == "tool" for m in body["messages"]):
                return chat_answer("saved")
            return chat_answer(None, [tool_call("daily_write", {
                "name": "Ferry", "description": "how the user travels",
                "content": "- Takes the ferry called Marrowind to work"})])
        return chat_answer("plain answer")

    return answer


async def _reply(mw: Any, model: OpenAIChatModel, text: str, session: str = "s1") -> Agent:
    agent = Agent(name="traveller", system_prompt="You are helpful.", model=model,
                  toolkit=Toolkit(tools=await mw.list_tools()), middlewares=[mw])
    agent.state.session_id = session
    await agent.reply(UserMsg(name="user", content=text))
    return agent


def _wait_auto_memory(daemon: DaemonHandle, agent: str) -> dict[str, Any]:
    jobs = wait_value(lambda: [j for j in daemon.call("jobs.list", {"agent_id": agent})["jobs"]
                               if j["kind"] == "auto_memory"],
                      lambda jobs: jobs and jobs[0]["state"] not in ACTIVE,
                      f"auto_memory of {agent}")
    return dict(jobs[0])


def _settings(daemon: DaemonHandle, agent: str) -> dict[str, Any]:
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    return dict(listed[agent]["settings"])


def test_the_agents_chat_model_serves_the_daemons_auto_memory(daemon: DaemonHandle,
                                                              fake: FakeProvider) -> None:
    fake.chat_default = _answer()

    async def main() -> None:
        model = _model(fake)
        mw = RecalldMemoryMiddleware(agent_id="traveller", mode="static_control",
                                     socket_path=daemon.socket_path, chat_model=model)
        try:
            await _reply(mw, model, "I take the ferry Marrowind to work every morning.")
        finally:
            await mw.close()  # ends the conversation: its turns go to auto_memory
            await model.client.close()

    asyncio.run(main())
    job = _wait_auto_memory(daemon, "traveller")
    assert job["state"] == "succeeded", job
    assert "daily_write" in job["result"]["tool_calls"]
    note = daemon.data_dir / "workspaces" / "traveller" / job["result"]["note"]
    assert "Marrowind" in note.read_text(encoding="utf-8")
    daemon_calls = [r for r in fake.requests if "daily_write" in _tools(r.json or {})]
    assert daemon_calls, "the daemon never called the agent's model"
    for request in daemon_calls:
        assert request.json["model"] == "agent-model"
        assert request.headers["authorization"] == f"Bearer {KEY}"

    chat = _settings(daemon, "traveller")["chat_model_config"]
    assert chat["api_key"] == "***" and chat["model_name"] == "agent-model"
    assert chat["base_url"] == fake.url + "/v1"
    assert KEY not in json.dumps(daemon.call("workspace.list"))
    assert KEY not in daemon.log()
    # No model in the daemon's own configuration: another workspace has none.
    daemon.call("workspace.open", {"agent_id": "plain"})
    assert _settings(daemon, "plain")["chat_model_config"] is None


def test_the_mem0_middleware_hands_over_its_models(daemon: DaemonHandle,
                                                   fake: FakeProvider) -> None:
    fake.chat_default = _answer()
    embedding = OpenAIEmbeddingModel(
        credential=OpenAICredential(api_key=KEY, base_url=fake.url + "/v1"),
        model="agent-embed", dimensions=8)

    async def main() -> None:
        model = _model(fake)
        mw = RecalldMem0Middleware(user_id="alice", agent_id="coder", mode="static_control",
                                   chat_model=model, embedding_model=embedding,
                                   socket_path=daemon.socket_path)
        try:
            await _reply(mw, model, "Remember that my ferry leaves at 7:10.")
        finally:
            await mw.close()
            await model.client.close()

    asyncio.run(main())
    settings = _settings(daemon, "alice")
    assert settings["chat_model_config"]["model_name"] == "agent-model"
    assert settings["chat_model_config"]["api_key"] == "***"
    emb = settings["embedding_model_config"]
    assert (emb["model_name"], emb["dimensions"], emb["api_key"]) == ("agent-embed", 8, "***")
    assert KEY not in json.dumps(daemon.call("workspace.list")) and KEY not in daemon.log()


def test_base_url_credentials_are_masked_in_workspace_list(daemon: DaemonHandle) -> None:
    url = "http://user:pa55word@127.0.0.1:9/v1?api-key=q1w2e3&region=eu"
    daemon.call("workspace.open", {"agent_id": "masked", "config": {
        "chat_model_config": {"base_url": url, "api_key": KEY, "model_name": "m"},
        "embedding_model_config": {"base_url": url, "api_key": KEY, "model_name": "e"}}})
    settings = _settings(daemon, "masked")
    for key in ("chat_model_config", "embedding_model_config"):
        assert settings[key]["base_url"] == "http://user:***@127.0.0.1:9/v1?api-key=***&region=eu"
        assert settings[key]["api_key"] == "***"
    listed = json.dumps(daemon.call("workspace.list"))
    assert "pa55word" not in listed and "q1w2e3" not in listed and KEY not in listed
    assert mask_url("https://api.example.com/v1") == "https://api.example.com/v1"
    # Other credential names, masked alike in the settings and in what the providers
    # report (their endpoint, their errors) in workspace.list and daemon.status.
    url = "http://127.0.0.1:9/v1?access_token=z9y8x7w6&auth=a1s2d3f4&region=eu"
    daemon.call("workspace.open", {"agent_id": "masked2", "config": {
        "chat_model_config": {"base_url": url, "api_key": KEY, "model_name": "m"},
        "embedding_model_config": {"base_url": url, "api_key": KEY, "model_name": "e"}}})
    settings = _settings(daemon, "masked2")
    assert settings["chat_model_config"]["base_url"] == (
        "http://127.0.0.1:9/v1?access_token=***&auth=***&region=eu")
    for shown in (json.dumps(daemon.call("workspace.list")),
                  json.dumps(daemon.call("daemon.status")), daemon.log()):
        assert "z9y8x7w6" not in shown and "a1s2d3f4" not in shown and KEY not in shown
    assert mask_url("https://h/x?passport=no&bypass=1") == "https://h/x?passport=no&bypass=1"


def test_models_the_daemon_cannot_speak_to_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="wire format"):
        model_overrides(chat_model=object())
    with pytest.raises(ValueError, match="not supported"):
        model_overrides(embedding_model=object())
    with pytest.raises(ValueError, match="wire format"):
        RecalldMemoryMiddleware(chat_model=object())
    with pytest.raises(ValueError, match="not supported"):
        RecalldMem0Middleware(user_id="u", embedding_model=object())
    assert model_overrides({"model_name": "m", "api_key": "k"}) == {
        "chat_model_config": {"model_name": "m", "api_key": "k"}}
    assert model_overrides() == {}


KEY_BY_HAND = "glpat-" + "Qm4xT8vR2pL9sW6nK3jH"
TOPIC = ("digest/ferry.md", "Ferry timetable", "when the ferry leaves", "reference",
         "The Marrowind ferry leaves pier 4 at 07:10 on weekdays.")


def _write_topic(daemon: DaemonHandle, agent: str) -> None:
    path, name, description, type_, body = TOPIC
    daemon.call("memory.topic_write", {"agent_id": agent, "path": path, "name": name,
                                       "description": description, "type": type_,
                                       "body": body})


def test_select_injects_the_files_the_model_picks(daemon: DaemonHandle,
                                                  fake: FakeProvider) -> None:
    fake.chat_default = _answer(select=[TOPIC[0]])

    async def main() -> None:
        model = _model(fake)
        mw = RecalldMemoryMiddleware(agent_id="sel", mode="static_control", select=True,
                                     write_back=False, socket_path=daemon.socket_path,
                                     chat_model=model)
        try:
            await mw._ensure_open("sel")
            _write_topic(daemon, "sel")
            # A key typed into the file by hand reaches the model masked.
            with (daemon.data_dir / "workspaces" / "sel" / TOPIC[0]).open("a") as f:
                f.write(f"The ferry app logs in with {KEY_BY_HAND}.\n")
            await _reply(mw, model, "what time should I set my alarm?")
        finally:
            await mw.close()
            await model.client.close()

    asyncio.run(main())
    requests = _chat(fake)
    assert any(SELECT_MARK in _system(r) for r in requests)  # the daemon asked the model
    (reply,) = [r for r in requests if SELECT_MARK not in _system(r)]
    sent = json.dumps(reply["messages"])
    # The picked file, labelled, though the query shares no word with it.
    assert f"[{TOPIC[0]}:1-" in sent and "pier 4 at 07:10" in sent
    assert KEY_BY_HAND not in sent and "logs in with [REDACTED]" in sent, sent
    with Client(daemon.socket_path) as c:  # the search alone finds nothing for it
        assert not c.search("sel", "what time should I set my alarm?").results


def test_select_falls_back_to_the_search(daemon: DaemonHandle, fake: FakeProvider) -> None:
    fake.chat_default = _answer(select=[])  # the model picks nothing: the search serves

    async def main() -> None:
        model = _model(fake)
        mw = RecalldMemoryMiddleware(agent_id="fall", mode="static_control", select=True,
                                     write_back=False, socket_path=daemon.socket_path,
                                     chat_model=model)
        try:
            await mw._ensure_open("fall")
            _write_topic(daemon, "fall")
            with Client(daemon.socket_path) as c:
                c.index_sync("fall")
            await _reply(mw, model, "Marrowind ferry pier")
        finally:
            await mw.close()
            await model.client.close()

    asyncio.run(main())
    (reply,) = [r for r in _chat(fake) if SELECT_MARK not in _system(r)]
    assert "pier 4 at 07:10" in json.dumps(reply["messages"])
