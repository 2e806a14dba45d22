"""Many agents on one daemon: sharing rules, fair scheduling, clients surviving restarts.

All against real daemons: workspaces configured in a real config file, real Markdown,
the real socket; the reindex that must not stall other agents is a real job over a few
thousand generated notes.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import sys
import time
from pathlib import Path

import pytest
import trio
from conftest import DaemonFactory, DaemonHandle
from waits import wait_for, wait_job

from recalld.ipc import errors
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
import synth

CONFIG = """
[workspaces.alice]
shared_with = ["bob"]

[workspaces.bob]

[workspaces.carol]
memory_isolation = false

[workspaces.dave]

[workspaces.eve]
shared_with = ["*"]
"""

FACTS = {
    "alice": "Alice keeps the release signing key in the hardware token labelled oxbow.",
    "bob": "Bob deploys the oxbow service with the blue-green script on Fridays.",
    "carol": "Carol wrote the oxbow runbook and the on-call rota.",
    "dave": "Dave's private diary mentions oxbow salaries.",
    "eve": "Eve publishes the oxbow changelog every sprint.",
}
NOTE = "memory/2026-07-03/facts.md"


@pytest.fixture
def agents(daemon_factory: DaemonFactory) -> DaemonHandle:
    daemon = daemon_factory(CONFIG)
    with Client(daemon.socket_path) as c:
        for agent, fact in FACTS.items():
            root = Path(c.workspace_open(agent)["path"])
            (root / NOTE).parent.mkdir(parents=True, exist_ok=True)
            (root / NOTE).write_text(f"# Facts\n\n{fact}\n", encoding="utf-8")
            (root / "digest/wiki").mkdir(parents=True, exist_ok=True)
            (root / "digest/wiki/oxbow.md").write_text(
                f"---\nname: oxbow\ndescription: {agent}'s page on oxbow\n---\nabout oxbow\n",
                encoding="utf-8")
            c.index_sync(agent)
    return daemon


def test_own_workspace_only_by_default(agents: DaemonHandle) -> None:
    with Client(agents.socket_path) as c:
        hits = c.search("bob", "oxbow", max_results=20)
        assert {h.path for h in hits} >= {NOTE}
        assert all("agent_id" not in h.extra for h in hits)
        assert all("Alice" not in h.text for h in hits), "no other workspace without asking"


def test_owner_decides_who_may_search(agents: DaemonHandle) -> None:
    with Client(agents.socket_path) as c:
        # bob may read alice (shared with him), carol (isolation off), eve (everyone).
        hits = c.search("bob", "oxbow", agents=["bob", "alice", "carol", "eve"],
                        max_results=50)
        owners = {h.extra["agent_id"] for h in hits}
        assert owners == {"bob", "alice", "carol", "eve"}
        for h in hits:
            assert h.rendered.startswith(f"========== [{h.extra['agent_id']}] ")
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert len(c.search("bob", "oxbow", agents=["alice", "carol"], max_results=1)) == 1

        with pytest.raises(errors.NotAllowed) as refused:
            c.search("bob", "oxbow", agents=["alice", "dave"])
        assert "dave" in refused.value.message and "shared_with" in refused.value.message
        # alice shares with bob only: dave may not, whatever he asks for.
        with pytest.raises(errors.NotAllowed):
            c.search("dave", "oxbow", agents=["alice"])
        assert {h.extra["agent_id"] for h in c.search("dave", "oxbow", agents=["eve"])} == {
            "eve"}

        # An empty selection is refused as backups refuse one, never taken for bob's own.
        with pytest.raises(errors.InvalidParams, match="'agents' is empty"):
            c.search("bob", "oxbow", agents=[])
        with pytest.raises(errors.UnknownWorkspace):
            c.search("bob", "oxbow", agents=["nobody"])


def test_reads_follow_the_same_rules(agents: DaemonHandle) -> None:
    with Client(agents.socket_path) as c:
        assert FACTS["alice"] in c.read("alice", NOTE, as_agent="bob")["text"]
        assert FACTS["carol"] in c.read("carol", NOTE, as_agent="dave")["text"]
        assert FACTS["dave"] in c.read("dave", NOTE)["text"], "the owner reads its own"
        for reader, owner in (("bob", "dave"), ("dave", "alice"), ("alice", "bob")):
            with pytest.raises(errors.NotAllowed):
                c.read(owner, NOTE, as_agent=reader)
            with pytest.raises(errors.NotAllowed):
                c.memory_list(owner, as_agent=reader)
            with pytest.raises(errors.NotAllowed):
                c.memory_index(owner, as_agent=reader)
        # A secret typed into a note by hand: the owner reads the file as it is, another
        # agent reads it masked, as search serves it, on the same lines.
        root = Path(c.workspace_open("alice")["path"])
        key = "ghp_" + "Zx81kQv2LmN5pRt7WyA3cD6fH9jB0sE4uG2i"
        (root / "memory/2026-07-04/vault.md").parent.mkdir(parents=True)
        (root / "memory/2026-07-04/vault.md").write_text(
            f"# Vault\n\nci token: {key}\nrotate monthly\n", encoding="utf-8")
        assert key in c.read("alice", "memory/2026-07-04/vault.md")["text"]
        shared = c.read("alice", "memory/2026-07-04/vault.md", as_agent="bob")
        assert key not in shared["text"] and key[:12] not in shared["text"]
        assert shared["text"].splitlines()[3:] == ["rotate monthly"]
        (root / "memory/2026-07-04/vault.md").unlink()
        c.index_sync("alice")
        files = c.memory_list("alice", as_agent="bob")
        assert [f["path"] for f in files] == ["digest/wiki/oxbow.md", NOTE]
        index = c.memory_index("eve", as_agent="dave")
        assert index["entries"] == [{"path": "digest/wiki/oxbow.md", "name": "oxbow",
                                     "description": "eve's page on oxbow", "bucket": "wiki"}]
        assert "- [oxbow](digest/wiki/oxbow.md) — eve's page on oxbow" in index["rendered"]
        assert [f["path"] for f in c.memory_list("bob", prefix="digest/")] == [
            "digest/wiki/oxbow.md"]
        # Shared are the notes, not the pending turns, source conversations or state:
        # those are the owner's alone.
        c.add_turns("alice", "chat-9", [{"role": "user", "content": "my PIN hint is Oxbow"}])
        pending = "mem_metadata/sessions/pending.jsonl"
        assert "Oxbow" in c.read("alice", pending)["text"]
        for path in (pending, "mem_metadata/recalld.lock", "mem_session/dialog/chat-9.jsonl",
                     "memory", "digest", "memoryx/a.md", "./mem_metadata/../" + pending):
            with pytest.raises((errors.NotAllowed, errors.PathOutsideWorkspace)):
                c.read("alice", path, as_agent="bob")
        assert FACTS["alice"] in c.read("alice", "./" + NOTE, as_agent="bob")["text"]
        # In the note folders too, only notes: what search and memory.list show, not an
        # editor's swap file, a version control folder or a file of another kind.
        others = {"memory/2026-07-03/.facts.md.swp": "draft: the oxbow PIN is 4471",
                  "memory/.git/config": "[remote]\n\turl = ssh://git@host/alice-notes",
                  "digest/.trash/old.md": "a node alice threw away",
                  "memory/2026-07-03/scan.txt": "passport number X1234567",
                  "memory/mem_metadata/kept.md": "in a folder the index passes by"}
        for path, text in others.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text, encoding="utf-8")
            assert c.read("alice", path)["text"] == text, "the owner reads its own"
            with pytest.raises(errors.NotAllowed):
                c.read("alice", path, as_agent="bob")
        assert [f["path"] for f in c.memory_list("alice", as_agent="bob")] == [
            "digest/wiki/oxbow.md", NOTE]


def test_a_reload_changes_who_may_read_at_once(agents: DaemonHandle) -> None:
    # Who may read a workspace is checked on every use: a reload that took a reader off
    # shared_with let it search, read and follow the workspace's jobs until the workspace
    # was opened again or the daemon restarted.
    subscriber = Client(agents.socket_path)
    subscriber.subscribe(["job.*"], "bob")
    with Client(agents.socket_path) as c:
        assert c.search("bob", "oxbow", agents=["alice"])
        agents.config_path.write_text(
            CONFIG.replace('shared_with = ["bob"]', 'shared_with = ["dave"]')
            .replace("[workspaces.dave]\n", '[workspaces.dave]\nmemory_isolation = false\n'),
            encoding="utf-8")
        agents.signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in agents.log(), "the reload")
        with pytest.raises(errors.NotAllowed):
            c.search("bob", "oxbow", agents=["alice"])
        with pytest.raises(errors.NotAllowed):
            c.read("alice", NOTE, as_agent="bob")
        with pytest.raises(errors.NotAllowed):
            c.memory_list("alice", as_agent="bob")
        assert FACTS["alice"] in c.read("alice", NOTE, as_agent="dave")["text"]
        assert {h.extra["agent_id"] for h in c.search("bob", "oxbow", agents=["dave"])} == {
            "dave"}
        # Alice's job, done before dave's starts: none of its events reach bob.
        wait_job(agents, c.jobs_submit("alice", "reindex")["job_id"], agent="alice")
        assert "alice" not in {j["agent_id"] for j in c.call("jobs.list", {"agent_id": "bob"})[
            "jobs"]}
        dave_job = c.jobs_submit("dave", "reindex")["job_id"]
        seen = []
        for event in subscriber.events(timeout_s=60):
            seen.append(event.data.get("agent_id"))
            if event.topic == "job.state" and event.data.get("job_id") == dave_job and (
                    event.data.get("state") == "succeeded"):
                break
        assert set(seen) == {"dave"}
    subscriber.close()
    # Only sharing changed: no workspace waits for its next open.
    assert "changed the settings or path" not in agents.log()


def test_add_note_appends_to_the_session_note(agents: DaemonHandle) -> None:
    with Client(agents.socket_path) as c:
        first = c.add_note("bob", "Bob's laptop is a framework 13.", session_id="s1")
        second = c.add_note("bob", "password=hunter2hunter2 is the wifi key", session_id="s1")
        other = c.add_note("bob", "Another session's fact about pelicans.", session_id="s2")
        assert first["path"] == second["path"] and first["created"] and not second["created"]
        assert other["path"] != first["path"], "another session never writes into s1's note"
        text = c.read("bob", first["path"])["text"]
        assert "framework 13" in text and "wifi key" in text and "hunter2hunter2" not in text
        assert [h.path for h in c.search("bob", "pelicans")] == [other["path"]]
        with pytest.raises(errors.InvalidParams):
            c.add_note("bob", "   ")
        # A note near the largest write is continued in the next one: every later call
        # of the day was refused as "content too large", however short its content.
        day = Path(first["path"]).parent / "day.md"
        (Path(c.workspace_open("bob")["path"]) / day).write_text(
            "---\nname: day\nsession_id: s9\n---\n" + "- a busy day of notes\n" * 47_658,
            encoding="utf-8")
        more = c.add_note("bob", "The kiln fires on Tuesdays.", session_id="s9", name="day")
        assert more["created"] and more["path"] == str(day.with_name("day-2.md")), more
        again = c.add_note("bob", "The kiln fires on Tuesdays.", session_id="s9", name="day")
        assert (again["path"], again["changed"]) == (more["path"], False), again
        assert [h.path for h in c.search("bob", "kiln")] == [more["path"]]


# ------------------------------------------------------------------ fair scheduling

BIG_NOTES = 400  # a reindex of these outlasts hundreds of searches (3 are required)
SEARCH_BOUND_S = 1.0  # generous: the benchmark holds the real number (p99 < 20 ms)


@pytest.mark.slow
def test_reindex_in_one_workspace_does_not_stall_search_in_another(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    big = tmp_path / "big"
    synth.generate(big, notes=BIG_NOTES, seed=7)
    daemon = daemon_factory(f'[workspaces.big]\npath = "{big}"\n[workspaces.small]\n')
    with Client(daemon.socket_path, timeout_s=120) as c:
        root = Path(c.workspace_open("small")["path"])
        (root / NOTE).parent.mkdir(parents=True, exist_ok=True)
        (root / NOTE).write_text("# Facts\n\nThe kettle descales on Sundays.\n",
                                 encoding="utf-8")
        c.index_sync("small")
        c.index_sync("big")
        job = c.jobs_submit("big", "reindex")["job_id"]
        latencies: list[float] = []
        during = 0
        while True:
            state = c.jobs_get("big", job)["state"]
            if state in ("succeeded", "failed", "cancelled"):
                break
            t0 = time.perf_counter()
            hits = c.search("small", "kettle descales")
            latencies.append(time.perf_counter() - t0)
            during += 1
            assert [h.path for h in hits] == [NOTE]
        assert state == "succeeded"
    assert during >= 3, "the reindex finished before searches could overlap it"
    assert max(latencies) < SEARCH_BOUND_S, (max(latencies), statistics.median(latencies))


# ------------------------------------------------------------------ restarts


def _restart(factory: DaemonFactory, old: DaemonHandle) -> DaemonHandle:
    """Stop ``old`` and start a daemon on the same socket, data and config."""
    assert old.stop() == 0
    keep = {k: old.env[k] for k in ("HOME", "XDG_RUNTIME_DIR", "XDG_DATA_HOME",
                                    "XDG_CONFIG_HOME")}
    new = factory(**keep)
    assert new.socket_path == old.socket_path and new.pid != old.pid
    return new


def test_sync_and_asyncio_clients_survive_a_restart(agents: DaemonHandle,
                                                    daemon_factory: DaemonFactory) -> None:
    client = Client(agents.socket_path)
    before = client.status()["pid"]
    assert [h.path for h in client.search("bob", "blue-green")] == [NOTE]

    async def with_asyncio() -> tuple[int, int]:
        async with AsyncClient(agents.socket_path) as ac:
            first = (await ac.status())["pid"]
            await asyncio.to_thread(_restart, daemon_factory, agents)
            hits = await ac.search("bob", "blue-green", sync=True)
            assert [h.path for h in hits] == [NOTE]
            return first, (await ac.status())["pid"]

    first, second = asyncio.run(with_asyncio())
    assert first == before and second != before
    # The same blocking client object, untouched since the restart, just works.
    assert client.status()["pid"] == second
    assert [h.path for h in client.search("bob", "blue-green")] == [NOTE]
    client.close()


async def test_trio_client_survives_a_restart(agents: DaemonHandle,
                                              daemon_factory: DaemonFactory) -> None:
    async with AsyncClient(agents.socket_path) as client:
        before = (await client.status())["pid"]
        await trio.to_thread.run_sync(_restart, daemon_factory, agents)
        after = (await client.status())["pid"]
        assert after != before
        hits = await client.search("alice", "signing key", sync=True)
        assert [h.path for h in hits] == [NOTE]



def test_topics_subscribed_one_call_at_a_time_all_survive_a_restart(
        agents: DaemonHandle, daemon_factory: DaemonFactory) -> None:
    subscriber = Client(agents.socket_path)
    subscriber.subscribe(["workspace.closed"], "bob")
    assert subscriber.subscribe(["workspace.opened"], "bob")["subscribed"] == [
        "workspace.closed", "workspace.opened"]
    reopened = "workspace.opened:bob"  # in order: anything closed arrives before it

    async def with_trio() -> list[str]:
        async with AsyncClient(agents.socket_path) as ac:
            await ac.subscribe(["workspace.closed"], "bob")
            await ac.subscribe(["workspace.opened"], "bob")
            daemon = await trio.to_thread.run_sync(_restart, daemon_factory, agents)
            await ac.ping()  # both reconnect and subscribe again
            await trio.to_thread.run_sync(subscriber.ping)
            with pytest.raises(errors.ConnectionLost):
                await ac.next_event()  # the restart, said once
            with Client(daemon.socket_path) as c:
                c.workspace_close("bob")
                c.workspace_open("bob")
            seen: list[str] = []
            while reopened not in seen:
                event = await ac.next_event()
                assert event is not None
                seen.append(f"{event.topic}:{event.data.get('agent_id')}")
            return seen

    assert trio.run(with_trio) == ["workspace.closed:bob", reopened]
    with pytest.raises(errors.ConnectionLost):
        next(subscriber.events())  # the restart, said once here too
    seen: list[str] = []
    for event in subscriber.events():
        seen.append(f"{event.topic}:{event.data.get('agent_id')}")
        if reopened in seen:
            break
    assert seen == ["workspace.closed:bob", reopened]
    subscriber.close()
