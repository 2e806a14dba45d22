"""The workspace inbox: persistence, since/ack, events; and through a real daemon."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import trio
import waits
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call

from recalld.daemon.memory.inbox import INBOX_TOPIC, Inbox
from recalld.daemon.store.errors import StorageError
from recalld.ipc.errors import InvalidParams, UnknownWorkspace


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def new_inbox(path: Path, events: list[tuple[str, dict[str, Any]]] | None = None,
              enabled: bool = True, max_items: int = 1000, clock: Clock | None = None) -> Inbox:
    return Inbox(path, "a", publish=(lambda t, p: events.append((t, p))) if events is not None
                 else None, push_enabled=lambda: enabled, max_items=max_items,
                 wall=clock or Clock())


async def test_push_list_ack_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "mem_metadata/inbox/inbox.jsonl"
    events: list[tuple[str, dict[str, Any]]] = []
    clock = Clock()
    inbox = new_inbox(path, events, clock=clock)
    with pytest.raises(UnknownWorkspace):
        await inbox.push("auto_memory", "x", ["a.md"])
    await inbox.open()
    one = await inbox.push("auto_memory", "first", ["memory/d/a.md", "memory/d/a.md"],
                           job_id="j1", details={"session_id": "s"})
    two = await inbox.push("auto_dream", "second", ["digest/wiki/x.md"])
    assert one["changes"] == ["memory/d/a.md"] and one["acked"] is False
    assert one["id"] < two["id"]
    assert events == [(INBOX_TOPIC, {"agent_id": "a", "item": one}),
                      (INBOX_TOPIC, {"agent_id": "a", "item": two})]
    with pytest.raises(ValueError, match="changed path"):
        await inbox.push("auto_memory", "nothing", [])
    with pytest.raises(ValueError, match="kind"):
        await inbox.push("reindex", "x", ["a.md"])
    assert [i["id"] for i in inbox.list()] == [one["id"], two["id"]]
    assert [i["id"] for i in inbox.list(since=one["id"])] == [two["id"]]
    when = dt.datetime.fromtimestamp(one["time"], dt.UTC).isoformat()
    assert [i["id"] for i in inbox.list(since=when)] == [two["id"]]
    for bad in ("yesterday", "²", "١"):  # digits of other scripts are no item id
        with pytest.raises(InvalidParams):
            inbox.list(since=bad)
    assert await inbox.ack([one["id"], "nope"]) == {"acked": [one["id"]], "unknown": ["nope"]}
    assert await inbox.ack([one["id"]]) == {"acked": [one["id"]], "unknown": []}
    assert [i["id"] for i in inbox.list()] == [two["id"]]
    assert inbox.status() == {"items": 2, "unacked": 1}
    inbox.close()

    again = new_inbox(path, clock=clock)
    await again.open()
    items = again.list(include_acked=True)
    assert [(i["id"], i["acked"]) for i in items] == [(one["id"], True), (two["id"], False)]
    three = await again.push("auto_resource", "third", ["memory/d/r.md"])
    assert three["id"] > two["id"]  # ids keep growing after a restart
    again.close()


async def test_torn_tail_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / "inbox.jsonl"
    inbox = new_inbox(path)
    await inbox.open()
    item = await inbox.push("auto_memory", "ok", ["a.md"])
    inbox.close()
    with path.open("ab") as f:
        f.write(b'0badc0de {"op": "push", "item": {"id": "99')
    again = new_inbox(path)
    await again.open()
    assert [i["id"] for i in again.list()] == [item["id"]]
    again.close()


async def test_push_disabled_and_trim_and_compaction(tmp_path: Path) -> None:
    path = tmp_path / "inbox.jsonl"
    events: list[tuple[str, dict[str, Any]]] = []
    off = new_inbox(tmp_path / "off.jsonl", events, enabled=False)
    await off.open()
    assert await off.push("auto_memory", "n", ["a.md"]) is None
    assert events == [] and off.list() == []  # inbox_push_enabled off: nothing recorded
    off.close()
    assert (tmp_path / "off.jsonl").read_bytes() == b""
    inbox = new_inbox(path, events, max_items=3)
    await inbox.open()
    ids = []
    for i in range(120):
        item = await inbox.push("auto_memory", f"n{i}", [f"{i}.md"])
        assert item is not None
        ids.append(item["id"])
    assert len(events) == 120
    assert [i["id"] for i in inbox.list()] == ids[-3:]
    inbox.close()
    assert len(path.read_bytes().splitlines()) < 120  # compacted
    again = new_inbox(path, max_items=3)
    await again.open()
    assert [i["id"] for i in again.list()] == ids[-3:]
    again.close()


async def test_a_push_or_ack_that_gets_no_write_in_time_says_so(
        tmp_path: Path, autojump_clock: object) -> None:
    """Every worker thread busy past the write deadline: the push and the ack raise
    (nothing is published, nothing is taken for recorded), never answer as if written."""
    path = tmp_path / "inbox.jsonl"
    events: list[tuple[str, dict[str, Any]]] = []
    inbox = new_inbox(path, events)
    await inbox.open()
    first = await inbox.push("auto_memory", "ok", ["a.md"])
    assert first is not None
    limiter = trio.to_thread.current_default_thread_limiter()
    tokens = limiter.total_tokens
    limiter.total_tokens = 1
    try:
        async with limiter:  # the only worker thread: no append can start
            with pytest.raises(StorageError, match="nothing was saved"):
                await inbox.push("auto_dream", "lost?", ["b.md"])
            with pytest.raises(StorageError, match="nothing was saved"):
                await inbox.ack([first["id"]])
    finally:
        limiter.total_tokens = tokens
    assert [i["summary"] for i in inbox.list()] == ["ok"]
    assert len(events) == 1
    inbox.close()
    again = new_inbox(path)
    await again.open()
    assert [(i["summary"], i["acked"]) for i in again.list(include_acked=True)] == [
        ("ok", False)]
    again.close()


# -- through the daemon --------------------------------------------------------------------


def wait_job(d: Any, job_id: str) -> dict[str, Any]:
    return waits.wait_job(d, job_id, deadline_s=30.0)


def test_inbox_event_list_and_ack_over_the_socket(daemon_factory: Any, fake: FakeProvider,
                                                  tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(
        f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
        f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "m"}}\n')
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "pets", "description": "pets", "content": "- Has a dog named Rex"})])),
        Reply(json=chat_answer("saved")))
    with d.connect() as listener:
        assert listener.call("events.subscribe", {"topics": ["inbox.*"],
                                                    "agent_id": "w"})["subscribed"] == [
            "inbox.*"]
        r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "flush": True,
                                        "messages": [{"role": "user", "content": "My dog Rex"}]})
        event = listener.recv()
        assert event["method"] == "event"
        params = event["params"]
        assert params["topic"] == "inbox.item" and params["agent_id"] == "w"
        item = params["item"]
        assert item["kind"] == "auto_memory" and item["job_id"] == r["job_id"]
        assert any(c.endswith("/pets.md") for c in item["changes"])
    assert wait_job(d, r["job_id"])["state"] == "succeeded"
    listed = d.call("inbox.list", {"agent_id": "w"})
    assert listed["items"] == [item]
    assert d.call("inbox.ack", {"agent_id": "w", "ids": [item["id"]]})["acked"] == [item["id"]]
    assert d.call("inbox.list", {"agent_id": "w"})["items"] == []
    assert d.call("inbox.list", {"agent_id": "w", "include_acked": True})["items"][0]["acked"]
    assert d.call("inbox.list", {"agent_id": "w", "since": item["id"],
                                 "include_acked": True})["items"] == []
    with pytest.raises(InvalidParams):
        d.call("inbox.ack", {"agent_id": "w", "ids": "x"})
    with pytest.raises(UnknownWorkspace):
        d.call("inbox.list", {"agent_id": "nobody"})


def test_an_ack_after_the_inbox_log_was_saved_over_survives_a_restart(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """``sed -i`` on the inbox log (a copy renamed over it) left the open log appending to
    the unlinked file: an item acknowledged from then on was unacknowledged again after a
    restart."""
    root = tmp_path / "ws"
    config = (f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
              f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "m"}}\n')
    d = daemon_factory(config)
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "tea", "description": "tea", "content": "- Drinks oolong"})])),
        Reply(json=chat_answer("saved")))
    r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "flush": True,
                                    "messages": [{"role": "user", "content": "Oolong"}]})
    assert wait_job(d, r["job_id"])["state"] == "succeeded"
    [item] = d.call("inbox.list", {"agent_id": "w"})["items"]
    log_path = root / "mem_metadata" / "inbox" / "inbox.jsonl"
    temp = log_path.with_name("sedXk3v9Q")
    temp.write_bytes(log_path.read_bytes())
    temp.rename(log_path)
    assert d.call("inbox.ack", {"agent_id": "w", "ids": [item["id"]]})["acked"] == [item["id"]]
    d.kill()
    again = daemon_factory(config)
    assert again.call("inbox.list", {"agent_id": "w"})["items"] == []
    listed = again.call("inbox.list", {"agent_id": "w", "include_acked": True})["items"]
    assert [(i["id"], i["acked"]) for i in listed] == [(item["id"], True)]
