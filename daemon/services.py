"""The daemon's composition: which services exist, how they are wired, in which order
they start.

:class:`DaemonServices` holds the daemon-wide services and :class:`WorkspaceServices`
those of one open workspace. Both are built here and only here
(:func:`build_daemon_services`, :func:`build_workspace_services`). The field order of
each record is its start order: the supervisor starts the daemon's fields and
:func:`start_workspace` a workspace's fields with ``await nursery.start(field.run)``,
one after the other, each only once the one before can serve; cancellation stops them
in reverse. Fields without a ``run`` (the running configuration, limiters, the event
bus, locks, caches) need no start and sit before the first service that uses them.

A workspace starts in two stages: the fields a search needs (:data:`SEARCH_STAGE`, the
first fields of :class:`WorkspaceServices`), then the others. While the daemon starts
(:class:`DaemonStart`), the workspaces it opens start their second stage only once the
RPC server serves, so a search is answered from the loaded index while the sessions,
the inbox, the dream cron and the resource catalog still start; other calls wait for
the whole start. A workspace opened later starts both stages at once.

Nothing here imports the RPC layer: handlers reach these records through their call
context, feature code through the workspace (``ws.services``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from recalld.daemon import statefiles
from recalld.daemon.config import DaemonConfig
from recalld.daemon.events import EventBus
from recalld.daemon.index.embedder import BackfillConfig, VectorWorker
from recalld.daemon.index.procpool import PreparePool, cpu_count
from recalld.daemon.index.service import Rebuilt, WorkspaceIndex
from recalld.daemon.index.spaces import VectorSpaces
from recalld.daemon.jobparams import params_of
from recalld.daemon.jobrecords import JobContext
from recalld.daemon.jobs import JobManager
from recalld.daemon.keyedlocks import KeyedLocks
from recalld.daemon.maintenance import Health
from recalld.daemon.memory.capture import AUTO_MEMORY_PARAMS, SessionFlusher
from recalld.daemon.memory.consolidation import Consolidation, ResourceService
from recalld.daemon.memory.inbox import Inbox, inbox_path
from recalld.daemon.memory.llm import ChatClients
from recalld.daemon.memory.sessions import SessionStore
from recalld.daemon.memory.topics import MemoryFile
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat_lines import ChatLines
from recalld.daemon.providers.local import PassageLane
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.remote.hook import RemoteService
from recalld.daemon.scheduler import CronScheduler, SchedulerConfig
from recalld.daemon.systemd import StartProgress
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import ShuttingDown

if TYPE_CHECKING:
    from recalld.daemon.memory.auto_memory import CaptureResult

log = logging.getLogger(__name__)

StatsProvider = Callable[[], Mapping[str, object]]


class Service(Protocol):
    """What the start loops need of a field: ``run`` in the shape of every service."""

    def run(self, *, task_status: trio.TaskStatus[None] = ...) -> Awaitable[None]: ...


class LiveConfig:
    """The running configuration: a frozen :class:`DaemonConfig` that a reload replaces."""

    def __init__(self, config: DaemonConfig) -> None:
        self._config = config
        #: The config file's secrets a restore left out and it does not set yet
        #: (``config_left_out.py``).
        self.left_out: list[str] = []

    @property
    def current(self) -> DaemonConfig:
        return self._config

    def replace(self, config: DaemonConfig) -> None:
        self._config = config


class DaemonStart:
    """The stages of the daemon's start, as the supervisor runs them.

    :meth:`begin` names the workspaces opened at start; each reports :meth:`reached`
    once it serves searches (or stopped opening); the supervisor waits for all of them
    (:meth:`wait_searchable`), starts the RPC server and calls :meth:`serve`, which lets
    those workspaces start their other services; :meth:`finish` once every one of them
    is open (or failed). Work that nobody waits for and that would compete with the first
    answers (the index's checksums, watch and startup reconcile, the vector backfill) waits for
    :meth:`wait_released`; calls that need the whole start wait for :meth:`wait_started`.
    :meth:`stop` (a stop during the second stage) releases both: those calls fail with
    ShuttingDown. Without :meth:`begin` (a daemon assembled by hand) nothing waits.
    """

    def __init__(self) -> None:
        self._opening: set[str] = set()
        self._held: frozenset[str] = frozenset()
        self._under_way = False
        self._searchable = trio.Event()
        self._serving = trio.Event()
        self._started = trio.Event()
        self._released = trio.Event()  # calls waiting for the start go on: finished or stopping
        #: The steps the start makes, which systemd hears of until READY=1.
        self.progress = StartProgress()

    def begin(self, agent_ids: Iterable[str]) -> None:
        self._under_way = True
        self._held = frozenset(agent_ids)
        self._opening = set(self._held)
        if not self._opening:
            self._searchable.set()

    def reached(self, agent_id: str) -> None:
        """``agent_id``'s workspace serves searches, or its opening ended."""
        self._opening.discard(agent_id)
        if not self._opening:
            self._searchable.set()

    async def wait_searchable(self) -> None:
        """Every workspace opened at start serves searches or stopped opening."""
        await self._searchable.wait()

    def serve(self) -> None:
        """The RPC server accepts calls."""
        self._serving.set()

    @property
    def serving(self) -> bool:
        """The RPC server accepts calls (from the end of the start's first stage)."""
        return self._serving.is_set()

    async def wait_serving(self, agent_id: str) -> None:
        """Until the RPC server serves, if ``agent_id`` is opened by the start."""
        if agent_id in self._held:
            await self._serving.wait()

    def finish(self) -> None:
        """Every workspace opened at start is open or failed."""
        self._started.set()
        self._released.set()

    def stop(self) -> None:
        """The daemon stops before its start ended: calls waiting for it fail."""
        self._released.set()

    @property
    def done(self) -> bool:
        """No start under way: calls need not wait."""
        return not self._under_way or self._started.is_set()

    async def wait_released(self) -> None:
        """Until the start under way (if any) finished, or the daemon stops before."""
        if not self.done:
            await self._released.wait()

    async def wait_started(self) -> None:
        """Until calls that need the whole start may run: the start under way (if any)
        finished. ShuttingDown if the daemon stops before."""
        if not self.done:
            await self._released.wait()
            if not self._started.is_set():
                raise ShuttingDown("the daemon is stopping (before its start ended)")


def _in_order(record: DaemonServices | WorkspaceServices) -> Iterator[tuple[str, Service]]:
    """``(name, service)`` for each field of ``record`` that has a ``run``, in field order."""
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is not None and callable(getattr(value, "run", None)):
            yield f.name, value


@dataclass(frozen=True, slots=True)
class FileLocks:
    """The locks of one agent's writes: ``write`` serializes those through the file
    operations, ``note`` ``memory.add_note``'s appends (each reads the note and writes
    it back)."""

    write: trio.Lock
    note: trio.Lock


class AgentLocks:
    """Each agent's :class:`FileLocks`, kept across closing and opening its workspace: a
    call that waited on them while a restore closed the workspace and opened it again
    still excludes the reopened workspace's writers (with locks of their own, both would
    read a note and the second write drop the first's words). Kept while in use (a
    workspace's services or a call hold them), not for every agent that ever opened."""

    def __init__(self) -> None:
        self._write = KeyedLocks()
        self._note = KeyedLocks()

    def of(self, agent_id: str) -> FileLocks:
        return FileLocks(self._write.of(agent_id), self._note.of(agent_id))


@dataclass(frozen=True, slots=True)
class DaemonServices:
    """The daemon-wide services, in start order."""

    config: LiveConfig
    #: Where the daemon's start is; calls and background work wait on it.
    start: DaemonStart
    #: One limiter for every CPU-heavy step of every workspace: one agent's rebuild must
    #: leave room for another's search.
    cpu: trio.CapacityLimiter
    #: Taken before a CPU token by work nobody waits for (startup checksums, reconcile
    #: and health scans): it has all but one of ``cpu``'s tokens, so however much of that
    #: work is queued, a search finds a token free.
    background: trio.CapacityLimiter
    events: EventBus
    #: Each agent's write locks, handed to its workspace whenever it opens.
    file_locks: AgentLocks
    #: All outbound HTTP (embedding and chat providers).
    providers: ProviderBridge
    #: Embedding clients and caches per vector space, shared by the workspaces using one.
    vector_spaces: VectorSpaces
    #: The chat breakers and Retry-After waits per endpoint and key, shared likewise.
    chat_lines: ChatLines
    jobs: JobManager
    #: Worker processes for big indexing passes of every workspace (none on one core).
    prepare_pool: PreparePool | None
    scheduler: CronScheduler
    consolidation: Consolidation
    registry: WorkspaceRegistry

    def in_start_order(self) -> Iterator[tuple[str, Service]]:
        return _in_order(self)

    def statistics(self) -> dict[str, StatsProvider]:
        """Named statistics for ``daemon.status`` ``queues``."""
        stats: dict[str, StatsProvider] = {
            "events": lambda: dataclasses.asdict(self.events.statistics()),
            "vector_spaces": self.vector_spaces.statistics,
            "jobs": self.jobs.statistics,
            "state_files": lambda: statefiles.statistics(
                [self.registry.write_failure, self.jobs.write_failure,
                 self.scheduler.write_failure]),
        }
        if self.prepare_pool is not None:
            stats["prepare_pool"] = self.prepare_pool.status
        return stats


#: The first fields of :class:`WorkspaceServices`: what a search of the workspace needs.
SEARCH_STAGE = ("index", "vectors")


@dataclass(frozen=True, slots=True)
class WorkspaceServices:
    """One open workspace's services, in start order (:data:`SEARCH_STAGE` first)."""

    #: Keyword index, link graph, watcher and persistence.
    index: WorkspaceIndex
    #: Vector backfill and the hnswlib graph (idle without an embedding model).
    vectors: VectorWorker
    #: Disk scans for a truthful ``health`` in the status.
    health: Health
    #: Pending conversation turns of ``memory.add_turns``.
    sessions: SessionStore
    #: When pending turns go to auto_memory: interval, flush, idle time, graceful stop.
    capture: SessionFlusher
    #: Items pushed by memory jobs.
    inbox: Inbox
    #: The dream cron entry and the resource catalog with its watcher.
    resource: ResourceService
    #: A shared workspace's replica through PostgreSQL (returns at once for a local one).
    remote: RemoteService
    #: The workspace's chat client, made on first use.
    chat: ChatClients
    #: ``<digest_dir>/MEMORY.md``, the index of the topic files, kept current.
    memory_file: MemoryFile
    #: Serializes writes through the workspace file operations (the agent's: the
    #: same lock in every workspace opened for it, :class:`AgentLocks`).
    write_lock: trio.Lock
    #: Serializes ``memory.add_note`` appends (each reads the note and writes it back;
    #: the agent's too).
    note_lock: trio.Lock

    def in_start_order(self) -> Iterator[tuple[str, Service]]:
        return _in_order(self)


def build_daemon_services(config: DaemonConfig) -> DaemonServices:
    """Every daemon-wide service, wired and not started."""
    live = LiveConfig(config)
    daemon_start = DaemonStart()
    cpu = trio.CapacityLimiter(max(1, config.cpu_threads))
    background = trio.CapacityLimiter(max(1, config.cpu_threads - 1))
    events = EventBus()
    bridge = ProviderBridge()
    spaces = VectorSpaces(config.state_dir / "embeddings", bridge, local_limiter=cpu,
                          passage_lane=PassageLane(config.backfill_threads,
                                                   config.backfill_nice))
    cores = cpu_count()
    pool = PreparePool(min(cores, max(1, config.cpu_threads))) if cores > 1 else None

    def start(ws: Workspace, nursery: trio.Nursery) -> Awaitable[None]:
        return start_workspace(ws, nursery, services)

    jobs = JobManager(journal_path=config.state_dir / "jobs.journal",
                      publish=events.publish, cpu_limiter=cpu,
                      agent_exists=lambda agent_id: registry.exists(agent_id),
                      folder_of=lambda agent_id: registry.folder_of(agent_id),
                      hold_recovered=True)  # until each workspace opens (registry.open)
    registry = WorkspaceRegistry(lambda: live.current, events, start,
                                 remembered_path=config.state_dir / "workspaces.json",
                                 jobs=jobs)
    scheduler = CronScheduler(jobs.submit, state_path=config.state_dir / "scheduler.json",
                              config=SchedulerConfig(jitter_max_s=config.schedule_jitter_s))
    consolidation = Consolidation(jobs, scheduler, registry.get, registry.wait_changed)
    services = DaemonServices(
        config=live, start=daemon_start, cpu=cpu, background=background, events=events,
        file_locks=AgentLocks(), providers=bridge, vector_spaces=spaces,
        chat_lines=ChatLines(), jobs=jobs,
        prepare_pool=pool, scheduler=scheduler, consolidation=consolidation, registry=registry,
    )
    jobs.register("reindex", reindex_job(registry.get), exclusive=True, cpu_heavy=False,
                  check_params=params_of("reindex", {}))
    jobs.register("auto_memory", auto_memory_job(registry.get, registry.wait_changed),
                  resumable=True, check_params=AUTO_MEMORY_PARAMS)
    consolidation.register_jobs()
    return services


def build_workspace_services(ws: Workspace, daemon: DaemonServices) -> WorkspaceServices:
    """Every service of ``ws``, wired and not started."""
    index = WorkspaceIndex(ws, daemon.config.current, cpu=daemon.cpu,
                           background=daemon.background,
                           publish=daemon.events.publish, pool=daemon.prepare_pool,
                           # Opened by the daemon's start: its watch, checksums, startup
                           # reconcile and vector backfill come after the start, or its stop
                           # (a sync waiting for the watch then ends as the server drains;
                           # opened later: at once).
                           hold=None if daemon.start.done else daemon.start.wait_released)
    vectors = VectorWorker(index, daemon.vector_spaces, ws.settings.embedding_model_config,
                           backfill=BackfillConfig(
                               backoff_base_s=daemon.config.current.backfill_backoff_s))
    sessions = SessionStore(
        ws.root / ws.settings.metadata_dir / "sessions" / "pending.jsonl", ws.agent_id,
        cpu=daemon.cpu)
    capture = SessionFlusher(ws, sessions, daemon.jobs,
                             lambda: chat.client_or_none() is not None,
                             lambda: client.line.retry_wait_s()
                             if (client := chat.client_or_none()) else 0.0)
    chat = ChatClients(ws, daemon.providers, daemon.chat_lines, capture.provider_back)
    locks = daemon.file_locks.of(ws.agent_id)
    return WorkspaceServices(
        index=index,
        vectors=vectors,
        health=Health(ws, index, daemon.cpu, vectors, capture=capture.waiting_reason,
                      background=daemon.background),
        sessions=sessions,
        capture=capture,
        inbox=Inbox(inbox_path(ws), ws.agent_id, publish=daemon.events.publish,
                    push_enabled=lambda: ws.settings.inbox_push_enabled),
        resource=daemon.consolidation.resource_service(ws, chat, daemon.cpu,
                                                       daemon.background),
        remote=RemoteService(ws, chunk_max_chars=daemon.config.current.chunk_max_chars,
                             cpu=daemon.cpu),
        chat=chat,
        memory_file=MemoryFile(ws, index),
        write_lock=locks.write,
        note_lock=locks.note,
    )


async def start_workspace(ws: Workspace, nursery: trio.Nursery,
                          daemon: DaemonServices) -> None:
    """Build ``ws``'s services, then start them in ``nursery`` in field order: the
    search stage, then (once the daemon serves, while it starts) the others."""
    services = build_workspace_services(ws, daemon)
    ws.provide(services)
    ws.add_status("index", services.index.status)
    ws.add_status("vectors", services.vectors.status)
    ws.add_status("health", services.health.status)
    ws.add_status("sessions", services.sessions.status)
    ws.add_status("capture", services.capture.status)
    ws.add_status("inbox", services.inbox.status)
    ws.add_status("dream", services.resource.dream_status)
    ws.add_status("resource", services.resource.status)
    searching = True
    for name, service in services.in_start_order():
        if searching and name not in SEARCH_STAGE:
            searching = False
            # A workspace that searches in its server needs its replica for that.
            remote = ws.settings.remote
            ws.search_ready = remote is None or remote.search_mode != "server"
            daemon.start.reached(ws.agent_id)
            await daemon.start.wait_serving(ws.agent_id)
        log.debug("starting %s for workspace %s", name, ws.agent_id)
        daemon.start.progress.step(f"opening workspace {ws.agent_id}: {name}")
        await nursery.start(service.run)
        ws.changed()  # a job waiting for this service (its inbox, say) looks again


def auto_memory_job(get_workspace: Callable[[str], Workspace],
                    wait_changed: Callable[[], Awaitable[None]],
                    ) -> Callable[[JobContext], Awaitable[CaptureResult]]:
    """The ``auto_memory`` job; the capture pipeline (the chat client, the redaction
    rules, the note tools) is imported when the first one runs."""

    async def run(job: JobContext) -> CaptureResult:
        from recalld.daemon.memory import auto_memory

        return await auto_memory.auto_memory_job(get_workspace, wait_changed)(job)

    return run


def reindex_job(get_workspace: Callable[[str], Workspace]
                ) -> Callable[[JobContext], Awaitable[Rebuilt]]:
    """The ``reindex`` job: rebuild one workspace's index with progress."""

    async def run(job: JobContext) -> Rebuilt:
        return await get_workspace(job.agent_id).services.index.rebuild(job.set_progress)

    return run
