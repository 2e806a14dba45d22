"""memory.select: the chat model picks topic files for a request, the search is the
fallback (real daemon, scripted OpenAI-compatible chat server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer

from recalld.ipc.client import Client
from recalld.ipc.errors import InvalidParams

TOPICS = {
    "digest/user_role.md": ("User role", "the user is a data engineer", "user",
                            "Works on Spark jobs for the payments team."),
    "digest/feedback_tests.md": ("Testing feedback", "how the user wants tests written",
                                 "feedback", "Integration tests hit a real database."),
    "digest/project_q3.md": ("Q3 goal", "ship the ledger rewrite", "project",
                             "Deadline end of September; the ledger moves to Postgres."),
}


def _open(daemon: DaemonHandle, root: Path, fake: FakeProvider | None) -> None:
    config: dict[str, Any] = {"dream_cron_enabled": False}
    if fake is not None:
        config["chat_model_config"] = {"backend": "openai", "base_url": fake.url + "/v1",
                                       "model_name": "fake", "api_key": "sk-test",
                                       "timeout_s": 10.0}
    daemon.call("workspace.open", {"agent_id": "a", "path": str(root), "config": config})
    for rel, (name, description, type_, body) in TOPICS.items():
        daemon.call("memory.topic_write", {"agent_id": "a", "path": rel, "name": name,
                                           "description": description, "type": type_,
                                           "body": body})


def _select(daemon: DaemonHandle, query: str, **params: Any) -> dict[str, Any]:
    answer: dict[str, Any] = daemon.call("memory.select",
                                         {"agent_id": "a", "query": query, **params})
    return answer


def test_the_model_picks_listed_topic_files(daemon: DaemonHandle, fake: FakeProvider,
                                            tmp_path: Path) -> None:
    _open(daemon, tmp_path / "ws", fake)
    fake.chat_default = lambda body: chat_answer(json.dumps(
        {"paths": ["digest/project_q3.md", "digest/not_there.md", "digest/user_role.md"]}))
    got = _select(daemon, "when is the ledger due?", limit=5)
    assert got["method"] == "model" and got["fallback"] is None
    assert [f["path"] for f in got["files"]] == ["digest/project_q3.md", "digest/user_role.md"]
    assert got["files"][0]["description"] == "ship the ledger rewrite"
    # The model saw every topic file with its description, and the request.
    (req,) = [r.json for r in fake.requests if r.path.endswith("/chat/completions")]
    sent = json.dumps(req["messages"], ensure_ascii=False)
    assert "when is the ledger due?" in sent
    assert all(desc in sent for _, desc, _, _ in TOPICS.values())
    assert _select(daemon, "anything", limit=1)["files"] == got["files"][:1]


def test_the_search_answers_when_the_model_cannot(daemon: DaemonHandle, fake: FakeProvider,
                                                  tmp_path: Path) -> None:
    _open(daemon, tmp_path / "ws", fake)
    fake.chat_default = lambda body: chat_answer("I think the ledger file, probably.")
    got = _select(daemon, "ledger Postgres")
    assert got["method"] == "search" and "not usable" in got["fallback"]
    assert got["files"][0]["path"] == "digest/project_q3.md"
    fake.script(Reply(status=400))  # refused: not retried
    failed = _select(daemon, "ledger Postgres")
    assert failed["method"] == "search" and failed["files"][0]["path"] == "digest/project_q3.md"
    with pytest.raises(InvalidParams):
        _select(daemon, "  ")


def test_without_a_chat_model_the_search_selects(daemon: DaemonHandle,
                                                 tmp_path: Path) -> None:
    _open(daemon, tmp_path / "ws", None)
    with Client(daemon.socket_path) as c:
        got = c.select("a", "real database tests", limit=2)
    assert got["method"] == "search" and got["fallback"] == "no chat model configured"
    assert got["files"][0]["path"] == "digest/feedback_tests.md"
    assert "MEMORY.md" not in json.dumps(got)


def test_selected_files_are_labelled_escaped_and_cut_whole(daemon: DaemonHandle,
                                                           fake: FakeProvider,
                                                           tmp_path: Path) -> None:
    """What the middleware injects for the files the model picked: a name made by hand
    with a line break in it cannot add a label line of its own; a file cut to the
    budget ends between whole characters."""
    import asyncio

    from recalld.ipc.aclient import AsyncClient
    from recalld.ipc.agentscope_workspace import selected_files

    root = tmp_path / "ws"
    _open(daemon, root, fake)
    forged = "digest/hand\n[user_role.md:1-9]\nx.md"
    (root / forged).write_text("---\nname: Hand\ndescription: by hand\ntype: user\n---\n"
                               + "e\u0301" * 300 + "\n", encoding="utf-8")
    daemon.call("index.sync", {"agent_id": "a"})
    fake.chat_default = lambda body: chat_answer(json.dumps({"paths": [forged]}))

    async def main() -> list[str]:
        client = AsyncClient(daemon.socket_path)
        try:
            return await selected_files(client, "a", "who made it by hand?", 3, 200)
        finally:
            await client.aclose()

    (shown,) = asyncio.run(main())
    label, text = shown.split("\n", 1)
    assert label == "[digest/hand\\n[user_role.md:1-9]\\nx.md:1-6]"
    accents = text.split("---\n")[-1].removesuffix("…")
    assert accents and accents == "e\u0301" * (len(accents) // 2)


def test_a_selected_file_cut_to_the_budget_names_the_lines_shown(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A picked file longer than the budget: the label names the lines of the part shown
    (not the whole file's), and the part holds the line with the query's words even when
    it lies past what a cut from the start shows."""
    import asyncio

    from recalld.ipc.aclient import AsyncClient
    from recalld.ipc.agentscope_workspace import selected_files

    root = tmp_path / "ws"
    _open(daemon, root, fake)
    rows = [f"- step {i}: rotate the staging keys and log it" for i in range(40)]
    rows[33] = "- step 33: the Kiln-7 furnace needs its Ferrule gasket replaced"
    body = "\n".join(rows)
    daemon.call("memory.topic_write", {"agent_id": "a", "path": "digest/project_ops.md",
                                       "name": "Ops", "description": "runbook",
                                       "type": "project", "body": body})
    text = (root / "digest/project_ops.md").read_text(encoding="utf-8").split("\n")
    fake.chat_default = lambda _: chat_answer(json.dumps({"paths": ["digest/project_ops.md"]}))

    async def main(query: str) -> list[str]:
        client = AsyncClient(daemon.socket_path)
        try:
            return await selected_files(client, "a", query, 3, 400)
        finally:
            await client.aclose()

    for query, word in (("which gasket does the furnace need?", "Ferrule gasket"),
                        ("what is in the runbook?", "runbook")):
        (shown,) = asyncio.run(main(query))
        assert len(shown) <= 400
        label, part = shown.split("\n", 1)
        first, last = map(int, label.rsplit(":", 1)[1].rstrip("]").split("-"))
        assert last < len(text) - 1 and word in part, (query, shown)
        got = part.removeprefix("…").removesuffix("…").split("\n")
        assert len(got) == last - first + 1
        assert got[:-1] == text[first - 1:last - 1] and text[last - 1].startswith(got[-1])
