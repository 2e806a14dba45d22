"""Every workspace the daemon served is looked after again after a restart, with no client.

Workspaces are opened by RPC, by the AgentScope middleware and by the MCP bridge; the
daemon restarts; files written after the restart (before any client opens anything)
are searchable after ``index.sync``, and a dream due after the restart fires.
"""

from __future__ import annotations

import asyncio
import sys
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")
pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonHandle
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from test_cli import recalld
from waits import wait_for

from recalld.daemon import remembered
from recalld.ipc.agentscope import RecalldMemoryMiddleware
from recalld.ipc.errors import UnknownWorkspace


def open_by_middleware(daemon: DaemonHandle, agent: str) -> None:
    async def main() -> None:
        mw = RecalldMemoryMiddleware(agent_id=agent, socket_path=daemon.socket_path)
        try:
            await mw.search(agent, "anything")  # opens the workspace
        finally:
            await mw.close()

    asyncio.run(main())


def open_by_mcp(daemon: DaemonHandle, agent: str) -> None:
    async def main() -> None:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "recalld.ipc.mcp", "--agent", agent, "--socket",
                  str(daemon.socket_path)], env=daemon.env)
        with open(daemon.home / f"mcp-{agent}.log", "w", encoding="utf-8") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool("memory_search", {"query": "anything"})
                assert not result.is_error

    asyncio.run(main())


def paths(daemon: DaemonHandle) -> dict[str, Path]:
    listed = daemon.call("workspace.list")["workspaces"]
    return {w["agent_id"]: Path(w["path"]) for w in listed}


def test_restart_reopens_every_workspace_served_before(daemon_factory: Any,
                                                       tmp_path: Path) -> None:
    d = daemon_factory()
    custom = tmp_path / "elsewhere"
    d.call("workspace.open", {"agent_id": "by-rpc", "path": str(custom),
                              "config": {"auto_memory_interval": 3}})
    open_by_middleware(d, "by-middleware")
    open_by_mcp(d, "by-mcp")
    d.call("workspace.open", {"agent_id": "closed-kept"})
    d.call("workspace.open", {"agent_id": "forgotten"})
    assert d.call("workspace.close", {"agent_id": "closed-kept"})["closed"] is True
    assert d.call("workspace.close", {"agent_id": "forgotten", "forget": True}) == {
        "agent_id": "forgotten", "closed": True, "forgotten": True, "configured": False}
    listed = {w["agent_id"]: w for w in d.call("workspace.list")["workspaces"]}
    assert listed["closed-kept"]["state"] == "closed" and listed["closed-kept"]["registered"]
    # An open workspace that is recorded says since when, as a closed one does.
    assert listed["by-rpc"]["registered"] and listed["by-rpc"]["registered_at"] > 0
    assert "forgotten" not in listed
    with pytest.raises(UnknownWorkspace, match="'forgotten' is neither open nor recorded"):
        d.call("workspace.close", {"agent_id": "forgotten", "forget": True})
    roots = paths(d)
    assert roots["by-rpc"] == custom.resolve()
    assert d.stop() == 0

    record = remembered.load(d.data_dir / "state" / "workspaces.json")
    assert set(record) == {"default", "by-rpc", "by-middleware", "by-mcp", "closed-kept"}
    # The dream's history goes with it: opened again under its id, it starts from then
    # rather than make up at once for a night it did not exist (a closed one keeps it).
    dreams = orjson.loads((d.data_dir / "state" / "scheduler.json").read_bytes())["entries"]
    assert "forgotten/auto_dream" not in dreams and "closed-kept/auto_dream" in dreams
    assert record["by-rpc"]["config"] == {"auto_memory_interval": 3}

    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    # Written after the restart, before any client opened anything.
    agents = ["by-rpc", "by-middleware", "by-mcp", "closed-kept"]
    for agent in agents:
        note = roots[agent] / "memory" / "2026-05-05" / "after.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"The {agent} lighthouse keeper is named Orla.\n", encoding="utf-8")
    for agent in agents:
        d2.call("index.sync", {"agent_id": agent}, timeout=60)
        hits = d2.call("memory.search", {"agent_id": agent, "query": "lighthouse Orla"})
        assert hits["results"][0]["path"] == "memory/2026-05-05/after.md", agent
    status = {w["agent_id"]: w for w in d2.call("daemon.status")["workspaces"]}
    assert status["by-rpc"]["state"] == "ready"
    settings = {w["agent_id"]: w.get("settings") for w in
                d2.call("workspace.list")["workspaces"]}
    assert settings["by-rpc"]["auto_memory_interval"] == 3  # opened as it was
    with pytest.raises(UnknownWorkspace):
        d2.call("index.sync", {"agent_id": "forgotten"})
    # A recorded workspace that is not open can be forgotten too.
    assert d2.call("workspace.close", {"agent_id": "closed-kept", "forget": True})[
        "forgotten"] is True


def test_a_record_that_does_not_verify_is_set_aside(daemon_factory: Any) -> None:
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "kept"})
    assert d.stop() == 0
    state = d.data_dir / "state" / "workspaces.json"
    doc = orjson.loads(state.read_bytes())
    doc["workspaces"]["kept"]["path"] = "/somewhere/else"  # the checksum no longer matches
    state.write_bytes(orjson.dumps(doc))
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert [w["agent_id"] for w in d2.call("workspace.list")["workspaces"]] == ["default"]
    assert (state.parent / "workspaces.json.corrupt").exists()
    assert "does not verify" in d2.log()
    # Said where the user looks, not in the log alone, until the copy is removed.
    files = d2.call("daemon.status")["queues"]["state_files"]
    assert files["set_aside"] == [f"{state}.corrupt"]
    shown = recalld("status", env=d2.env)
    assert f"{state}.corrupt is a copy of a state file that did not verify" in shown.stdout


@pytest.mark.slow
def test_dream_due_after_the_restart_fires_with_no_client(daemon_factory: Any) -> None:
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "dreamer",
                              "config": {"dream_cron": "* * * * *"}})
    schedule = Path(d.call("daemon.status")["data_dir"]) / "state" / "scheduler.json"
    assert d.stop() == 0
    # As if down for an hour: an occurrence is due at once at the restart (not only at
    # the next minute boundary, which would add up to a minute to this test).
    saved = orjson.loads(schedule.read_bytes())
    entry = saved["entries"]["dreamer/auto_dream"]
    entry["last_fired"] = (datetime.fromisoformat(entry["last_fired"])
                           - timedelta(hours=1)).isoformat()
    # Saved with its checksum, as the scheduler saves it (a file that does not verify is
    # set aside and the entry starts afresh, from the next minute).
    entries = orjson.dumps(saved["entries"], option=orjson.OPT_SORT_KEYS)
    saved["crc32"] = f"{zlib.crc32(entries):08x}"
    schedule.write_bytes(orjson.dumps(saved))
    # The missed occurrence fires once, after the scheduler's jitter (0-60 s by default,
    # a few seconds here).
    started = datetime.now(UTC)
    d2 = daemon_factory("[daemon]\nschedule_jitter_s = 3\n",
                        XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    fired = wait_for(lambda: [j for j in d2.call("jobs.list", {"agent_id": "dreamer"})["jobs"]
                              if j["kind"] == "auto_dream"],
                     "a dream after the restart", deadline_s=120)
    assert fired[0]["params"].get("trigger") == "cron"
    # The occurrence missed while down, not the first one after the start.
    assert datetime.fromisoformat(fired[0]["params"]["occurrence"]) <= started, fired[0]
    assert not list(schedule.parent.glob("scheduler.json.corrupt*"))


def test_a_bare_open_keeps_the_settings_a_workspace_was_recorded_with(
        daemon_factory: Any, tmp_path: Path) -> None:
    ws = tmp_path / "kept"
    configured = tmp_path / "configured"
    d = daemon_factory(f'[workspaces.filed]\npath = "{configured}"\n')
    d.call("workspace.open", {"agent_id": "rec", "path": str(ws),
                              "config": {"auto_memory_interval": 7}})
    # Open already (configured): reopened with settings of its own.
    assert d.call("workspace.close", {"agent_id": "filed"})["closed"] is True
    d.call("workspace.open", {"agent_id": "filed", "config": {"dream_cron": "5 4 * * *"}})

    def settings(daemon: DaemonHandle, agent: str) -> dict[str, Any]:
        listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
        return dict(listed[agent]["settings"])

    default_interval = settings(d, "default")["auto_memory_interval"]
    assert default_interval != 7
    assert d.call("workspace.close", {"agent_id": "rec"})["closed"] is True
    # Opened again by a client that names no settings (a bridge, a middleware): as recorded.
    again = d.call("workspace.open", {"agent_id": "rec", "path": str(ws)})
    assert again["settings"]["auto_memory_interval"] == 7
    assert d.stop() == 0
    record = remembered.load(d.data_dir / "state" / "workspaces.json")
    assert record["rec"]["config"] == {"auto_memory_interval": 7}
    assert record["filed"]["config"] == {"dream_cron": "5 4 * * *"}

    # A configured workspace recorded at its configured path starts with its overrides too.
    d2 = daemon_factory(f'[workspaces.filed]\npath = "{configured}"\n',
                        XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert settings(d2, "filed")["dream_cron"] == "5 4 * * *"
    assert settings(d2, "rec")["auto_memory_interval"] == 7
    # An empty config asks for the config file's settings alone, and is recorded so.
    assert d2.call("workspace.close", {"agent_id": "rec"})["closed"] is True
    plain = d2.call("workspace.open", {"agent_id": "rec", "path": str(ws), "config": {}})
    assert plain["settings"]["auto_memory_interval"] == default_interval
    # Elsewhere is another workspace: the record of the old path does not follow it.
    assert d2.call("workspace.close", {"agent_id": "rec"})["closed"] is True
    moved = d2.call("workspace.open", {"agent_id": "rec", "path": str(tmp_path / "moved")})
    assert moved["settings"]["auto_memory_interval"] == default_interval
    assert d2.stop() == 0
    record = remembered.load(d2.data_dir / "state" / "workspaces.json")
    assert record["rec"] == {**record["rec"], "path": str((tmp_path / "moved").resolve()),
                             "config": None}


def test_workspaces_opened_at_once_are_all_recorded(daemon_factory: Any) -> None:
    # Opens of different agents save workspaces.json each under its own lock: saves that
    # finished out of order wrote an older list last, and a workspace went unrecorded
    # (at the next start, its folder moved away, it was made again empty).
    import threading

    from recalld.ipc.client import Client

    d = daemon_factory()
    agents = [f"agent-{i:02d}" for i in range(40)]
    start = threading.Barrier(len(agents))

    def open_one(agent: str) -> None:
        with Client(d.socket_path) as client:
            start.wait()
            client.call("workspace.open", {"agent_id": agent})

    threads = [threading.Thread(target=open_one, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(agents) <= set(paths(d))
    assert d.stop() == 0
    record = remembered.load(d.data_dir / "state" / "workspaces.json")
    assert set(agents) <= set(record), sorted(set(agents) - set(record))
