"""Assembly: the supervisor with every capability plugged in.

The supervisor knows services, workspace services and method tables, not what they do;
this module decides which exist: the provider bridge and the job manager
(daemon-wide), the index of every workspace, and their RPC methods. Handlers reach the
daemon-wide ones through ``ctx.state.services``.
"""

from __future__ import annotations

from typing import Any

import trio

from recalld.daemon.agents_api import METHODS as AGENT_METHODS
from recalld.daemon.api import CallContext, Methods
from recalld.daemon.config import DaemonConfig
from recalld.daemon.index.embedder import vector_service
from recalld.daemon.index.methods import METHODS as INDEX_METHODS
from recalld.daemon.index.methods import index_service, reindex_job
from recalld.daemon.index.procpool import PreparePool, cpu_count
from recalld.daemon.index.spaces import VectorSpaces
from recalld.daemon.jobs import JobManager, rpc_cancel, rpc_get, rpc_list, rpc_submit
from recalld.daemon.maintenance import health_service
from recalld.daemon.memory import methods as memory_capture
from recalld.daemon.memory.consolidation_methods import install_consolidation
from recalld.daemon.ops_methods import ops_methods
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.remote.hook import remote_service
from recalld.daemon.supervisor import Reloader, Supervisor
from recalld.daemon.systemd import SystemdEnvironment


def job_methods(manager: JobManager) -> Methods:
    methods = Methods()

    @methods.add("jobs.submit")
    async def submit(ctx: CallContext, params: dict[str, Any]) -> Any:
        return await rpc_submit(manager, params)

    @methods.add("jobs.get")
    async def get(ctx: CallContext, params: dict[str, Any]) -> Any:
        return await rpc_get(manager, params)

    @methods.add("jobs.list")
    async def list_(ctx: CallContext, params: dict[str, Any]) -> Any:
        return await rpc_list(manager, params)

    @methods.add("jobs.cancel")
    async def cancel(ctx: CallContext, params: dict[str, Any]) -> Any:
        return await rpc_cancel(manager, params)

    return methods


def build_supervisor(
    cfg: DaemonConfig,
    *,
    systemd: SystemdEnvironment | None = None,
    reload: Reloader | None = None,
) -> Supervisor:
    """The daemon, ready for ``trio.run(supervisor.run)``."""
    # One limiter for every CPU-heavy step of every workspace: two cores are shared by
    # all agents, and one agent's rebuild must leave room for another's search.
    cpu = trio.CapacityLimiter(max(1, cfg.cpu_threads))
    # Big indexing passes of every workspace share one pool of processes (none when idle).
    cores = cpu_count()
    pool = PreparePool(min(cores, max(1, cfg.cpu_threads))) if cores > 1 else None
    holder: dict[str, Supervisor] = {}

    def publish(topic: str, payload: dict[str, Any]) -> None:
        holder["s"].events.publish(topic, payload)

    def agent_exists(agent_id: str) -> bool:
        return any(w.agent_id == agent_id for w in holder["s"].registry.list())

    # All outbound HTTP (embedding and chat providers) goes through this one bridge.
    bridge = ProviderBridge()
    # Embedding clients and caches per vector space, shared by the workspaces using one.
    spaces = VectorSpaces(cfg.state_dir / "embeddings", bridge, local_limiter=cpu)
    jobs = JobManager(
        journal_path=cfg.state_dir / "jobs.journal",
        publish=publish,
        cpu_limiter=cpu,
        agent_exists=agent_exists,
    )
    supervisor = Supervisor(
        cfg,
        systemd=systemd,
        reload=reload,
        extra_methods=[INDEX_METHODS, AGENT_METHODS, job_methods(jobs), ops_methods(cpu)],
        workspace_services=[("index", index_service(lambda: holder["s"].config, cpu, publish,
                                                              pool)),
                            ("vectors", vector_service(spaces)),
                            ("health", health_service(cpu))],
        services=[("providers", bridge.run), ("jobs", jobs.run),
                  *([("prepare-pool", pool.run)] if pool is not None else [])],
    )
    holder["s"] = supervisor
    supervisor.state.services.update({"jobs": jobs, "providers": bridge, "cpu": cpu,
                                      "prepare_pool": pool,
                                      "vector_spaces": spaces})
    supervisor.state.stats["vector_spaces"] = spaces.statistics
    jobs.register("reindex", reindex_job(supervisor.registry.get), exclusive=True, cpu_heavy=False)
    install_consolidation(supervisor, jobs)
    supervisor.state.stats["jobs"] = jobs.statistics
    if pool is not None:
        supervisor.state.stats["prepare_pool"] = pool.status
    memory_capture.install(supervisor)
    # Shared workspaces (settings name a remote) replicate through PostgreSQL.
    supervisor.registry.add_service("remote", remote_service())
    return supervisor
