"""Calls under way when their workspace fails or closes: nothing lands elsewhere, and
the call is told why.

A workspace guards its folder while it is open (:mod:`confine`) and gives the guard up as
it stops (failed: a link took its folder's place; or closed). A call handed the workspace
before (past the write gate, or reading it) went on writing by path through the link into
the other agent's folder: now the call keeps the folder guarded until it ends, as a job
does. An index compacted by such a call after the workspace opened again wrote into the
new index's folder; a log append that waited while the workspace closed met a closed log
(an internal error).

The daemon runs in process (its supervisor, services and socket), with methods more that
take the workspace as the real ones do and write once the test lets them, or with the
lock a real write waits for held by the test: the test decides when the call writes.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_server_in_process import LineClient

from recalld.daemon.config import DaemonConfig
from recalld.daemon.maintenance import compact
from recalld.daemon.rpc.dispatch import CallContext, Methods
from recalld.daemon.rpc.methods import all_methods
from recalld.daemon.services import build_daemon_services
from recalld.daemon.store.fsio import REAL, atomic_write
from recalld.daemon.supervisor import Supervisor
from recalld.ipc import errors


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry below ``root``: its size and mtime, to tell any write."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


class Held:
    """``test.write_later``: takes bob's workspace as ``how`` says, then waits for
    :attr:`go` and saves a state file below its folder."""

    def __init__(self) -> None:
        self.entered, self.go = trio.Event(), trio.Event()
        self.methods = Methods()

        @self.methods.add("test.compact_later")
        async def compact_later(ctx: CallContext, params: dict[str, Any]) -> Any:
            ws = ctx.workspace("bob")  # as index.compact takes it
            self.entered.set()
            await self.go.wait()
            return await compact(ws, ws.services.index)

        @self.methods.add("test.write_later")
        async def write_later(ctx: CallContext, params: dict[str, Any]) -> Any:
            if params["how"] == "writable":
                async with ctx.writable("bob") as ws:
                    return await self._write(ws.root)
            return await self._write(ctx.workspace("bob").root)

    async def _write(self, root: Path) -> str:
        self.entered.set()
        await self.go.wait()
        await trio.to_thread.run_sync(atomic_write, REAL, root / "mem_metadata" / "x.json",
                                      b"bob's")
        return "written"


@asynccontextmanager
async def serving(short: Path, extra: Methods) -> AsyncIterator[tuple[Supervisor, LineClient]]:
    """A daemon in process (with ``extra`` methods) and a connection to it."""
    cfg = DaemonConfig(socket_path=short / "s.sock", data_dir=short / "data",
                       config_path=short / "none.toml")
    daemon = Supervisor(build_daemon_services(cfg), all_methods().include(extra))
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        client = LineClient(await trio.open_unix_socket(str(cfg.socket_path)))
        try:
            yield daemon, client
        finally:
            await client.aclose()
            daemon.request_stop()


async def call(client: LineClient, method: str, params: dict[str, Any]) -> Any:
    await client.send({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return await client.recv()


@pytest.mark.parametrize("how", ["writable", "workspace"])
async def test_a_call_under_way_when_its_folder_became_a_link_writes_nothing_there(
        short_dir: Path, how: str) -> None:
    alice, bob = short_dir / "alice", short_dir / "bob"
    held = Held()
    async with serving(short_dir, held.methods) as (daemon, client):
        for agent, root in (("alice", alice), ("bob", bob)):
            opened = await call(client, "workspace.open", {"agent_id": agent,
                                                           "path": str(root)})
            assert "result" in opened, opened
        ws = daemon.registry.get("bob")
        before = tree(alice)
        async with trio.open_nursery() as nursery:
            replies: list[Any] = []

            async def write() -> None:
                replies.append(await call(client, "test.write_later", {"how": how}))

            nursery.start_soon(write)
            await held.entered.wait()
            os.rename(bob, short_dir / "bob.old")
            os.symlink(alice, bob)
            with pytest.raises(errors.UnknownWorkspace, match="now leads to"):
                daemon.registry.get("bob")  # a use finds the link: bob stops
            with trio.fail_after(10):
                await ws.wait_closed()  # and has let its folder go
            held.go.set()
        [reply] = replies
        assert tree(alice) == before, "bob's write landed in alice's folder"
        assert reply["error"]["code"] == errors.PATH_OUTSIDE_WORKSPACE, reply
        assert f"now leads to {alice}" in reply["error"]["message"], reply


async def test_an_index_compacted_after_its_workspace_was_opened_again_saves_nothing(
        short_dir: Path) -> None:
    # The call held the workspace closed meanwhile and opened again: its index committed
    # a generation of the state it had into the folder the new one's index now writes
    # (one writer per generation store), and answered as if compacted.
    bob = short_dir / "bob"
    held = Held()
    async with serving(short_dir, held.methods) as (daemon, client):
        opened = await call(client, "workspace.open", {"agent_id": "bob", "path": str(bob)})
        assert "result" in opened, opened
        async with trio.open_nursery() as nursery:
            replies: list[Any] = []

            async def compact_it() -> None:
                replies.append(await call(client, "test.compact_later", {}))

            nursery.start_soon(compact_it)
            await held.entered.wait()
            await daemon.registry.close("bob")
            await daemon.registry.open("bob", bob)
            before = tree(bob / "mem_metadata" / "index")
            held.go.set()
        [reply] = replies
        assert reply.get("error", {}).get("code") == errors.UNKNOWN_WORKSPACE, reply
        assert "closed" in reply["error"]["message"], reply
        assert tree(bob / "mem_metadata" / "index") == before


@pytest.mark.parametrize("what", ["turns", "inbox"])
async def test_a_log_write_under_way_when_the_workspace_closes_is_told_nothing_was_saved(
        short_dir: Path, what: str) -> None:
    # The close closed the pending-turns log (the inbox's) while the call's append waited
    # for the log's write lock (another append, a compaction): the append then met a
    # closed log, an internal error (-32603), or with the descriptor's number taken by
    # another file meanwhile, wrote there. Now the close waits for the write under way,
    # and the append that waited is refused saying nothing was saved.
    bob = short_dir / "bob"
    async with serving(short_dir, Methods()) as (daemon, client):
        opened = await call(client, "workspace.open", {"agent_id": "bob", "path": str(bob)})
        assert "result" in opened, opened
        services = daemon.registry.get("bob").services
        if what == "turns":
            lock = services.sessions._write_lock
            request = ("memory.add_turns", {"agent_id": "bob", "session_id": "s1",
                                            "messages": [{"role": "user", "content": "tea"}]})
        else:
            item = await services.inbox.push("auto_memory", "bob likes tea", ["memory/t.md"])
            assert item is not None
            lock = services.inbox._lock
            request = ("inbox.ack", {"agent_id": "bob", "ids": [item["id"]]})
        async with trio.open_nursery() as nursery:
            replies: list[Any] = []

            async def write() -> None:
                replies.append(await call(client, *request))

            async with lock:  # another write under way
                nursery.start_soon(write)
                with trio.fail_after(10):
                    while not lock.statistics().tasks_waiting:
                        await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(daemon.registry.close, "bob")
                await trio.testing.wait_all_tasks_blocked()
        [reply] = replies
        assert reply.get("error", {}).get("code") == errors.UNKNOWN_WORKSPACE, reply
        assert "nothing was saved" in reply["error"]["message"], reply
