"""RPC methods for upkeep: checking and compacting a workspace's index, releasing a shared
workspace's held deletions, removing a shared workspace from its server, the metrics."""

from __future__ import annotations

import time

from recalld.daemon import metrics
from recalld.daemon.config import RemoteConfig
from recalld.daemon.maintenance import compact, verify
from recalld.daemon.rpc.dispatch import CallContext, JsonObject, Methods, Params
from recalld.daemon.verifyreport import VerifyReport
from recalld.ipc.answers import IndexCompacted
from recalld.ipc.errors import InvalidParams

METHODS = Methods()


@METHODS.add("index.verify", positional=("agent_id",))
async def index_verify(ctx: CallContext, params: JsonObject) -> VerifyReport:
    p = Params(params)
    agent_id = p.agent_id()
    p.done()
    ws = ctx.workspace(agent_id)
    return await verify(ws, ws.services.index, ctx.services.cpu, ws.services.health)


@METHODS.add("index.compact", positional=("agent_id",))
async def index_compact(ctx: CallContext, params: JsonObject) -> IndexCompacted:
    p = Params(params)
    agent_id = p.agent_id()
    p.done()
    # It commits a generation of the index a restore replaces: it waits for a restore,
    # and a restore waits for it, as writes do.
    async with ctx.writable(agent_id) as ws:
        return await compact(ws, ws.services.index)


@METHODS.add("remote.release", positional=("agent_id", "action"))
async def remote_release(ctx: CallContext, params: JsonObject) -> JsonObject:
    """End the hold of a shared workspace's deletions the guard held back:
    ``action`` ``"upload"`` sends them, ``"restore"`` writes the notes back."""
    p = Params(params)
    agent_id = p.agent_id()
    action = p.text("action")
    p.done()
    if action not in ("upload", "restore"):
        raise InvalidParams(f"action must be 'upload' or 'restore', not {action!r}")
    async with ctx.writable(agent_id) as ws:
        replica = ws.services.remote.replica
        if replica is None:
            raise InvalidParams(f"workspace {agent_id} is not shared (it has no remote)")
        released = await replica.release_held(action)
    return {"agent_id": agent_id, "action": action, "released": released}


@METHODS.add("remote.forget", positional=("name", "dsn"))
async def remote_forget(ctx: CallContext, params: JsonObject) -> JsonObject:
    """Remove shared workspace ``name`` from the PostgreSQL server ``dsn`` for good (its
    rows in every table), unless a daemon is connected to it."""
    p = Params(params)
    remote = RemoteConfig(dsn=p.text("dsn"), name=p.text("name"),
                          passfile=p.text("passfile", ""))
    p.done()
    try:
        from recalld.daemon.remote.forget import forget  # loads the PostgreSQL driver
    except ImportError as exc:
        raise InvalidParams(f"the PostgreSQL driver is not installed (pip install "
                            f"'recalld[postgres]'): {exc}") from None
    return await forget(remote)


@METHODS.add("daemon.metrics")
async def daemon_metrics(ctx: CallContext, params: JsonObject) -> JsonObject:
    Params(params).done()
    return {"time": time.time(), "families": metrics.REGISTRY.snapshot() + _gauges(ctx)}


def _gauges(ctx: CallContext) -> list[metrics.Family]:
    state = ctx.state
    files, chunks, pending, health = [], [], [], []
    for ws in state.registry.list():
        label = {"agent_id": ws.agent_id}
        info = ws.status()
        idx = info.get("index") or {}
        if isinstance(idx.get("files"), int):
            files.append((label, float(idx["files"])))
            chunks.append((label, float(idx.get("chunks", 0))))
            pending.append((label, float(idx.get("pending_changes", 0))))
        # A workspace that could not be opened has no health of its own: it is "failed".
        current = "failed" if ws.state == "failed" else (info.get("health") or {}).get("state")
        for name in ("clean", "pending", "degraded", "failed"):
            health.append(({**label, "state": name}, 1.0 if current == name else 0.0))
    queues = []
    for name, provider in state.stats.items():
        for key, value in dict(provider()).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                queues.append(({"queue": name, "field": key}, float(value)))
    return [
        metrics.gauge("recalld_uptime_seconds", "seconds since the daemon started",
                      [({}, time.monotonic() - state.started_monotonic)]),
        metrics.gauge("recalld_workspace_files", "files indexed per workspace", files),
        metrics.gauge("recalld_workspace_chunks", "chunks indexed per workspace", chunks),
        metrics.gauge("recalld_workspace_pending_changes", "changes waiting per workspace",
                      pending),
        metrics.gauge("recalld_workspace_health", "1 for the current health state", health),
        metrics.gauge("recalld_queue", "daemon queue statistics", queues),
    ]
