"""Dream runs once they ran: listing them and undoing one (see :mod:`changelog`), and the
runs going on in this daemon, which neither may touch. No task; nothing to stop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import trio

from recalld.daemon.memory import changelog, dreaminbox, dreamlinks, dreamundo, runjournal
from recalld.daemon.memory.catalog import catalog_path, forced_changes
from recalld.daemon.memory.fileops import fileops_for
from recalld.daemon.remote.hook import SharedCatalog, one_host_at_a_time
from recalld.daemon.workspaces import Workspace
from recalld.ipc.answers import DreamRun, DreamUndone
from recalld.ipc.errors import (
    AlreadyRunning,
    ProviderUnavailable,
    RecalldError,
    UnknownWorkspace,
)

log = logging.getLogger(__name__)

INTERESTS_FILE: Final = "interests.yaml"
DREAM_KIND: Final = "auto_dream"  # the job kind, as the shared workspace lock names it
#: The runs going on in this daemon (their ids are unique): a run's record is written when
#: it ends, over an undo made before, so none is undone while it runs.
RUNNING: set[str] = set()
#: The workspaces (by folder) a dream job is at work in: it holds their dream catalog in
#: memory from its start and saves it over what an undo would put back.
DREAMING: set[Path] = set()


@contextlib.contextmanager
def dreaming(root: Path) -> Iterator[None]:
    """A dream job is at work in the workspace at ``root`` inside (no undo meanwhile)."""
    DREAMING.add(root)
    try:
        yield
    finally:
        DREAMING.discard(root)


async def undo(ws: Workspace, run_id: str, *, force: bool) -> DreamUndone:
    """Undo one dream run (see :func:`dreamundo.undo_run`) and what it did to the dream
    catalog (:func:`catalog.undo_changes`: its notes are read again by the next run; in
    a shared workspace, by every host's), then re-index what it touched. In a shared
    workspace, AlreadyRunning while another host dreams; one that cannot reach its server
    puts the shared catalog back at its next dream. An undo that put files back pushes an
    inbox item (:func:`dreaminbox.push_undone`)."""
    if run_id in RUNNING:
        raise AlreadyRunning(f"dream run {run_id} is still running: cancel its job or "
                             "let it finish, then undo it")
    if ws.root in DREAMING:
        raise AlreadyRunning(f"a dream of workspace {ws.agent_id!r} is running: undo run "
                             f"{run_id} once it ended (or cancel its job)")
    settings = ws.settings
    files = fileops_for(ws)
    directory = changelog.runs_dir(ws.root, settings.metadata_dir)
    await dreaminbox.recover_journals(ws, directory, RUNNING)

    def undo_run() -> DreamUndone:
        return dreamundo.undo_run(
            ws.root, directory, run_id, digest_dir=settings.digest_dir, force=force,
            now=datetime.now(UTC).isoformat(),
            derived=frozenset({f"{settings.digest_dir}/{INTERESTS_FILE}"}),
            catalog=catalog_path(ws.root, settings.metadata_dir, "dream"),
            shared=settings.remote is not None)

    async with contextlib.AsyncExitStack() as stack:
        shared = None
        if settings.remote is not None:
            try:  # as a dream does: no other host dreams meanwhile
                shared = await stack.enter_async_context(one_host_at_a_time(ws, DREAM_KIND))
            except ProviderUnavailable as exc:
                log.warning("%s: undo of dream run %s: %s", ws.agent_id, run_id, exc.message)
        async with files.lock:  # an undo a kill cut short is finished here, the asked one too
            result = await trio.to_thread.run_sync(undo_run)
            await finish_undos(ws, shared)  # this run's shared catalog too
    # What it put back may name renamed nodes again (a link, a History archive).
    dreamlinks.forget_seen(ws)
    try:
        index = ws.services.index
    except UnknownWorkspace:
        index = None
    if index is not None:
        await index.sync()  # searchable as put back before the agents are told
    await dreaminbox.push_undone(ws, result)
    return result


async def finish_undos(ws: Workspace, shared: SharedCatalog | None) -> None:
    """Finish the undos of the workspace's runs that a kill cut short (see
    :func:`dreamundo.finish_pending`; an undo of a shared workspace is one until its
    shared catalog is put back): before a dream reads its catalog, when runs are listed or
    undone. With ``shared`` (the hosts' catalog of a shared workspace, held by this host)
    their records are put back there too; a
    server that fails leaves that to the next time. The caller holds the workspace's
    writes. Raises NotAllowed when one cannot be finished (a folder where it puts a file
    back): no dream runs before it is."""
    from recalld.daemon.memory.dream import CATALOG_JOB

    settings = ws.settings
    directory = changelog.runs_dir(ws.root, settings.metadata_dir)
    done = await trio.to_thread.run_sync(lambda: dreamundo.finish_pending(
        ws.root, directory, digest_dir=settings.digest_dir,
        catalog=catalog_path(ws.root, settings.metadata_dir, "dream")))
    if done:
        dreamlinks.forget_seen(ws)
    for data in done:
        pending, changes = data.get("undo_pending"), data.get("catalog")
        if shared is None or not isinstance(pending, dict) or not pending.get("shared"):
            continue
        try:
            await shared.put_back(CATALOG_JOB, {
                **(changes if isinstance(changes, dict) else {}), **forced_changes(data)})
        except ProviderUnavailable as exc:
            log.warning("%s: %s (put back at the next dream)", ws.agent_id, exc.message)
            continue
        await trio.to_thread.run_sync(dreamundo.close, directory, data)


async def runs(ws: Workspace, limit: int = 50) -> list[DreamRun]:
    """The runs, newest first: those going on (as far as they got) and those ended (a run
    a crash cut short included, recovered from its journal)."""
    directory = changelog.runs_dir(ws.root, ws.settings.metadata_dir)
    going = set(RUNNING)  # read here: runs start and end in this thread

    await dreaminbox.recover_journals(ws, directory, RUNNING)
    if ws.root not in DREAMING:  # else the dream finished them as it started
        try:
            async with fileops_for(ws).lock:
                await finish_undos(ws, None)
        except RecalldError as exc:  # the listing still answers; the next dream fails so
            log.warning("%s: %s", ws.agent_id, exc.message)

    def listed() -> list[DreamRun]:
        now = [changelog.dream_summary(dict(r.to_json()))
               for r in runjournal.running_runs(directory, going)]
        return (now + changelog.list_runs(directory, limit))[:limit]

    return await trio.to_thread.run_sync(listed)
