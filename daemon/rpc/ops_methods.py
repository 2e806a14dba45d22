"""RPC methods for backups: create, list, verify, restore and rollback.

``backup.create`` writes a zip (see :mod:`recalld.daemon.backup`) into
``<data_dir>/backups/`` unless told where. ``backup.restore`` validates the whole archive,
plans every write, takes a snapshot of the affected workspaces (recorded in
``backups/rollback.json`` so ``backup.rollback`` undoes the restore in one call), writes the
files atomically and then makes each open workspace's index catch up (sync, then a
reconcile) before answering, so a search right after sees the restored memory. A
workspace that was not open is opened after its files are in place. One restore or
rollback runs at a time. A journal recorded before the first file changes lets the next
start finish (or roll back) a restore the daemon did not live through
(:mod:`restore_journal`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import trio

from recalld.daemon import backup as bk
from recalld.daemon import config_left_out, metrics
from recalld.daemon.backup_check import CheckedBackup, list_backups, open_checked
from recalld.daemon.backup_restore import (
    Restored,
    RestorePlan,
    apply_restore,
    plan_restore,
    plan_summary,
)
from recalld.daemon.backup_secrets import emptied_in
from recalld.daemon.config import ConfigError, DaemonConfig, RemoteConfig
from recalld.daemon.config_left_out import left_out_warning
from recalld.daemon.remembered import Remembered
from recalld.daemon.remote.state import STATE_LOG, replica_dir
from recalld.daemon.restore_folders import remove_leftovers
from recalld.daemon.rpc.backup_create import (
    create_backup,
    dirs_of,
    source_of,
    stamp,
    unique_path,
    write_backup,
)
from recalld.daemon.rpc.call_progress import CallProgress, check_token
from recalld.daemon.rpc.dispatch import CallContext, DaemonState, JsonObject, Methods, Params
from recalld.daemon.rpc.echo import echoed, echoed_path
from recalld.daemon.rpc.restore_config import (
    closed_home,
    closed_settings,
    config_to_restore,
    drop_config,
    incoming_config,
    moved_by,
    recorded_in,
    restore_config,
)
from recalld.daemon.rpc.restore_journal import drop_journal, restore_ended, write_journal
from recalld.daemon.rpc.restore_record import (
    backups_dir,
    drop_record,
    prune_snapshots,
    put_back,
    read_record,
    snapshot_failed,
    write_record,
)
from recalld.daemon.store import errors as store_errors
from recalld.daemon.workspace_places import resolved
from recalld.daemon.workspaces import Workspace, check_agent_id
from recalld.ipc.errors import DiskFull, InvalidParams, NotAllowed, NotFound
from recalld.ipc.paths import expand_param

log = logging.getLogger(__name__)

def _resolve_file(state: DaemonState, name: str) -> Path:
    """A backup named by the client: an absolute path, or a file in the backups dir."""
    if "\x00" in name or not name.strip():
        raise InvalidParams("param 'file' must be a path")
    path = expand_param(name, "file")
    if not path.is_absolute():
        if "/" in name:
            raise InvalidParams("param 'file' must be absolute or a name in the backups dir")
        path = backups_dir(state) / name
    return path


async def _reopen_after_failure(state: DaemonState, plan: RestorePlan,
                                overrides: Mapping[str, object] | None) -> None:
    """Open again the workspace a failed restore closed (it wrote nothing); a failure to
    open is logged, not raised over the restore's own error."""
    try:
        await state.registry.open(plan.agent_id, plan.root, overrides)
    except Exception:
        log.exception("workspace %s could not be opened again after a failed restore",
                      plan.agent_id)


def _resumes(plan: RestorePlan) -> bool:
    """True if ``plan`` writes or removes session, inbox or dream-run state."""
    state = tuple(f"{top}/" for top in plan.state)
    return bool(plan.private) or any(rel.startswith(state) for rel in plan.removes)


async def _incoming(state: DaemonState, checked: CheckedBackup, chosen: list[str],
                    open_ws: Mapping[str, Workspace], rolling_back: bool,
                    ) -> tuple[DaemonConfig, bytes | None, str | None, str | None]:
    """What a restore of ``chosen`` from ``checked`` does with the backup's config file:
    the configuration the workspaces that are not open open with, the file it puts in
    place (None: this machine's is kept), why it is kept where it says so, and why the
    backup's was refused."""
    config_data, config_kept = await trio.to_thread.run_sync(
        config_to_restore, state, checked, None if rolling_back else chosen)
    cfg = state.config
    config_error: str | None = None
    if config_data is not None:
        try:
            cfg = await trio.to_thread.run_sync(incoming_config, state, config_data)
        except ConfigError as exc:  # kept out: it would stop the next start
            config_error, config_data = str(exc), None
    if config_data is not None and not rolling_back:
        moved = await trio.to_thread.run_sync(moved_by, cfg, state.config, open_ws)
        if moved:  # it would open there from the next start, without what is restored
            config_data, cfg = None, state.config
            config_kept = (
                "kept this machine's config file: the backup's places "
                + ", ".join(f"{a} at {where}" for a, where in moved)
                + ", open here elsewhere, where the restore puts its files (copy what "
                "you need from the backup's daemon/config.toml)")
    return cfg, config_data, config_kept, config_error


async def _homes(cfg: DaemonConfig, checked: CheckedBackup, chosen: list[str],
                 known: Mapping[str, Remembered],
                 ) -> dict[str, tuple[Path, dict[str, object] | None]]:
    """Where and how each of ``chosen`` opens after the restore if it is not open (its
    files go there)."""
    recorded = await trio.to_thread.run_sync(recorded_in, checked)
    return {agent_id: closed_home(cfg, agent_id, known.get(agent_id), recorded.get(agent_id))
            for agent_id in chosen}


def _shared(agent_id: str, remote: RemoteConfig | None) -> list[JsonObject]:
    """``agent_id`` and the shared workspace it is a replica of, if it is one."""
    return [] if remote is None else [{"agent_id": agent_id, "shared_workspace": remote.name}]


def _shared_warning(shared: list[JsonObject]) -> str:
    """What restoring the replicas ``shared`` does to the other hosts, said for a person."""
    names = ", ".join(f"{s['agent_id']} (shared workspace {s['shared_workspace']})"
                      for s in shared)
    return (f"{names} {'is' if len(shared) == 1 else 'are'} shared with other hosts: a "
            "restore is sent to every host like any other change, so the notes written on "
            "any host since the backup are deleted everywhere (unless so many go at once "
            "that they are held back, as `recalld status` then shows) and the edits made "
            "since are replaced by the backup's versions")


def _shared_answer(shared: list[JsonObject]) -> JsonObject:
    """The ``shared`` and ``shared_warning`` fields of a restore's answer."""
    return {"shared": list(shared), "shared_warning": _shared_warning(shared) if shared
            else None}


def _selection(p: Params) -> list[str] | None:
    """``agents``: None when left out (every agent); an empty list is refused."""
    return p.selection("agents", "every agent")


def _progress(ctx: CallContext, p: Params, method: str) -> CallProgress:
    """The call's progress reporter: to its connection if it passed ``progress_token``."""
    token = check_token(p.text("progress_token", None))
    return CallProgress(ctx.connection.notify, token, method)


async def restore(state: DaemonState, path: Path, agents: list[str] | None,
                  snapshot: bool, dry_run: bool = False,
                  progress: bk.ProgressSink | None = None,
                  rolling_back: bool = False,
                  overwrite_shared: bool = False, resuming: bool = False) -> JsonObject:
    """Restore ``agents`` (every one when None) from the archive at ``path`` (see the
    module). Before it changes anything it records a journal (:mod:`restore_journal`),
    dropped as it ends: a start that finds it finishes or rolls back the restore, which
    it does through here with ``resuming`` (the journal and rollback point kept as
    they are)."""
    cpu = state.services.cpu
    sink: bk.ProgressSink = progress if progress is not None else bk.NO_PROGRESS
    checked = await trio.to_thread.run_sync(
        lambda: open_checked(path, progress=sink), limiter=cpu)
    chosen = list(dict.fromkeys(agents)) if agents else checked.agents
    if not chosen:  # a restore of nothing would still replace the rollback point
        raise InvalidParams(f"backup {path.name} holds no workspace: nothing to restore")
    for agent_id in chosen:
        check_agent_id(agent_id)
        if agent_id not in checked.meta["agents"]:
            raise InvalidParams(f"agent {agent_id!r} is not in backup {path.name} "
                                f"(it has {', '.join(checked.agents) or 'none'})")
    open_ws = {w.agent_id: w for w in state.registry.list() if w.state == "ready"}
    cfg, config_data, config_kept, config_error = await _incoming(
        state, checked, chosen, open_ws, rolling_back)
    known = state.registry.remembered()
    homes = await _homes(cfg, checked, chosen, known)
    targets: list[bk.AgentSource] = []
    shared: list[JsonObject] = []
    for agent_id in chosen:
        ws = open_ws.get(agent_id)
        if ws is not None:
            targets.append(source_of(ws))
            shared += _shared(agent_id, ws.settings.remote)
            continue
        where, overrides = homes[agent_id]
        root = await trio.to_thread.run_sync(resolved, where)
        try:  # it opens there after the restore: nothing is written where it cannot
            await state.registry.check_place(agent_id, root)
        except InvalidParams as exc:
            raise InvalidParams(f"cannot restore workspace {agent_id!r} to {root}: "
                                f"{exc.message}") from None
        settings = closed_settings(cfg, path, agent_id, agent_id in known, overrides)
        targets.append(bk.AgentSource(agent_id, root, dirs_of(settings)))
        # A replica this host never ran (a new machine) starts over when it opens:
        # every restored file goes up as a change based on nothing, a conflict copy
        # where the server holds other bytes; nothing of the other hosts is undone.
        state_log = replica_dir(root, settings.metadata_dir) / STATE_LOG
        if await trio.to_thread.run_sync(state_log.exists):
            shared += _shared(agent_id, settings.remote)
    if shared and not dry_run and not overwrite_shared:
        raise NotAllowed(_shared_warning(shared) + ": nothing was restored. Restore "
                         "with overwrite_shared (--overwrite-shared) to do so anyway",
                         {"shared": shared})
    sink.phase("planning", total=len(targets))

    # Another agent's workspace inside one restored (shared both ways) is its own.
    others = {t.agent_id: {*state.registry.places_inside(t.agent_id, t.root),
                           *(o.root.relative_to(t.root).as_posix() for o in targets
                             if o.root != t.root and o.root.is_relative_to(t.root))}
              for t in targets}

    def plan_of(t: bk.AgentSource) -> RestorePlan:
        return plan_restore(checked, t.agent_id, t.root, t.dirs, others[t.agent_id])

    def plan_all() -> list[RestorePlan]:
        out = []
        for t in targets:
            out.append(plan_of(t))
            sink.advance()
        return out

    plans = await trio.to_thread.run_sync(plan_all, limiter=cpu)
    if dry_run:  # each target read, as the restore reads it to leave it in place
        summaries = await trio.to_thread.run_sync(
            lambda: [plan_summary(checked, plan) for plan in plans], limiter=cpu)
        return {"file": echoed_path(str(path)), "dry_run": True, "plans": summaries,
                **_shared_answer(shared)}
    # A write of the daemon's to an open workspace after the snapshot and before its
    # files are restored would be in neither, and a note appended to as it was before
    # would undo the restore of that note: such writes wait until the restore ends.
    # Jobs under way (a dream, auto_memory) would write what they read before it: they
    # stop first and run again after it, on the restored files. Calls that write
    # (notes, turns, topic files) end first, and those that come wait until the
    # restored workspaces are open again (writegate), also ones it closed.
    async with contextlib.AsyncExitStack() as writes_held:
        for plan in plans:
            await writes_held.enter_async_context(
                state.services.jobs.paused(plan.agent_id, "restoring from a backup"))
        for plan in plans:
            await writes_held.enter_async_context(
                state.registry.writes.closed(plan.agent_id))
        for plan in plans:
            if (held := open_ws.get(plan.agent_id)) is not None:
                for lock in (held.services.note_lock, held.services.write_lock):
                    await writes_held.enter_async_context(lock)
        # Planned again now that the daemon's writes wait: one that landed since the
        # plan above (a note, a job's node) is in the snapshot, so the restore removes
        # it like any other file the backup lacks, rather than leave a workspace that
        # is not the backup's. The plan above refused what it could before any job
        # was stopped.
        plans = await trio.to_thread.run_sync(lambda: [plan_of(t) for t in targets],
                                              limiter=cpu)
        if resuming:  # the temp files of the restore the daemon was killed in
            for plan in plans:
                await trio.to_thread.run_sync(remove_leftovers, plan.root,
                                              plan.writes.values())
        previous = await trio.to_thread.run_sync(read_record, state)
        snap: JsonObject | None = None
        if snapshot:
            out = unique_path(backups_dir(state) / f"pre-restore-{stamp()}.zip")
            # A config file this restore replaces goes into the snapshot whole, secrets
            # and all, for the rollback to put back as it was.
            replacing = config_data is not None
            try:
                snap = await write_backup(state, targets, out, False,
                                          "pre-restore snapshot", include_secrets=replacing,
                                          progress=sink, phase="writing the snapshot",
                                          whole=True)
            except InvalidParams as exc:  # too large to restore: no rollback could
                raise InvalidParams(f"no pre-restore snapshot can be taken: {exc.message}"
                                    " (or restore without one: --no-snapshot)") from None
            except store_errors.StorageIOError as exc:  # nothing restored: say both ways on
                raise snapshot_failed(exc, out.parent) from None
            had_config = "config.toml" in snap["daemon"]
            record = {"snapshot": snap["file"], "agents": chosen, "created": time.time(),
                      "restored_from": echoed_path(str(path)),
                      "config": ("kept" if not replacing else
                                 "replaced" if had_config else "added")}
            await trio.to_thread.run_sync(lambda: write_record(state, record))
            await trio.to_thread.run_sync(prune_snapshots, out.parent, out)
        elif not (rolling_back or resuming):
            # No way back from this restore: the recorded snapshot of an earlier one
            # would now throw away everything since, this restore included.
            await trio.to_thread.run_sync(drop_record, state)
        if not resuming:  # from here on files change: a start after a kill finishes it
            try:
                await trio.to_thread.run_sync(
                    write_journal, state, path, chosen,
                    None if snap is None else str(snap["file"]), rolling_back)
            except store_errors.DiskFull as exc:  # a restore needs its journal's bytes
                raise DiskFull(f"no room for the restore's journal: {exc.message}; nothing "
                               f"was restored: free space in {backups_dir(state)}",
                               exc.data) from None
        config_left: list[str] = []
        if config_data is not None:
            await trio.to_thread.run_sync(restore_config, state, config_data)
            state.services.config.replace(cfg)  # workspaces opened from here on use it
            # What the backup left out of it is missing until it is set again.
            named = checked.meta.get("config_secrets_left_out")
            if named is None and not checked.meta.get("secrets"):  # an archive of old
                named = emptied_in(config_data.decode("utf-8", "replace"))
            await trio.to_thread.run_sync(config_left_out.note, state.services.config,
                                          named or [])
            config_left = state.services.config.left_out
        results: list[Restored] = []
        for plan in plans:
            ws = open_ws.get(plan.agent_id)
            was_open = ws is not None
            _, overrides = homes[plan.agent_id]
            # Model keys the backup left out are missing only where this daemon had none.
            missing = [] if plan.agent_id in known else [
                str(k) for k in (checked.meta.get("secrets_left_out") or {}).get(
                    plan.agent_id, [])]
            try:
                # Nobody opens it until its files are in place (an agent reopening it
                # meanwhile would serve, and append to, the logs being replaced).
                async with state.registry.held(plan.agent_id):
                    if ws is not None and _resumes(plan):
                        # Its session and inbox logs are about to be replaced: serve them
                        # afresh.
                        await state.registry.close(plan.agent_id)
                        ws = None
                    done = await trio.to_thread.run_sync(apply_restore, checked, plan, sink,
                                                         limiter=cpu)
            except Exception:
                if was_open and ws is None:  # nothing was written: serve it again as it was
                    await _reopen_after_failure(state, plan, overrides)
                if not resuming:  # said to the caller: not for a start to finish
                    await trio.to_thread.run_sync(drop_journal, state)
                if not results and config_data is None and not (rolling_back or resuming):
                    # Nothing changed: a rollback still undoes the restore before this one.
                    await trio.to_thread.run_sync(
                        put_back, state, previous, None if snap is None else str(snap["file"]))
                raise
            if ws is None:
                ws = await state.registry.open(plan.agent_id, plan.root, overrides)
                done["opened"] = not was_open
            if missing:
                await state.registry.note_left_out(plan.agent_id, missing)
                done["secrets_left_out"] = missing
                done["warning"] = (
                    f"{', '.join(missing)} of workspace {plan.agent_id} was left out of the "
                    "backup (made without --include-secrets): hand it over again (the "
                    "agent's middleware does when it opens the workspace) or set it in "
                    "the config file")
            if was_open:  # answered once the index has caught up with the restored files
                sink.phase(f"indexing {plan.agent_id}")
                services = ws.services
                await services.index.sync()
                found = await services.index.watcher.reconcile("after restore")
                done["reconcile"] = found.as_dict()
                await services.health.scan()
            results.append(done)
        if not resuming:
            await trio.to_thread.run_sync(restore_ended, state, chosen)
        metrics.count("recalld_restores_total")
        result: JsonObject = {
            "file": echoed_path(str(path)), "restored": results,
            "config_restored": config_data is not None, "config_error": config_error,
            "config_kept": config_kept, "snapshot": None if snap is None else snap["file"],
            **_shared_answer(shared)}
        if config_left:
            result["config_secrets_left_out"] = config_left
            result["config_warning"] = left_out_warning(state.config.config_path,
                                                        config_left)
        return result


async def drop_added_config(state: DaemonState, record: JsonObject) -> bool:
    """Remove the config file the restore rolled back (``record``: its rollback point)
    put where there was none; whether it did."""
    if record.get("config") != "added":
        return False
    cfg = await trio.to_thread.run_sync(drop_config, state)
    state.services.config.replace(cfg)
    await trio.to_thread.run_sync(config_left_out.note, state.services.config, [])
    return True


def ops_methods() -> Methods:
    """The operations methods (one restore or rollback at a time per table); the
    daemon's CPU limiter bounds compression and checksum work."""
    methods = Methods()
    restore_lock = trio.Lock()

    @methods.add("backup.create")
    async def backup_create(ctx: CallContext, params: JsonObject) -> JsonObject:
        p = Params(params)
        agents = _selection(p)
        out: str | None = p.text("out", None)
        include_derived: bool = p.boolean("include_derived", False)
        include_secrets: bool = p.boolean("include_secrets", False)
        progress = _progress(ctx, p, "backup.create")
        p.done()
        async with restore_lock:  # never of a workspace half restored, or closed for that
            return await create_backup(ctx, agents, out, include_derived, include_secrets, progress)

    @methods.add("backup.list")
    async def backup_list(ctx: CallContext, params: JsonObject) -> JsonObject:
        Params(params).done()
        folder = backups_dir(ctx.state)
        items = await trio.to_thread.run_sync(list_backups, folder) if folder.is_dir() else []
        for item in items:  # a name the caller gave an archive there, shown as it is shown
            item["file"], item["name"] = echoed_path(str(item["file"])), echoed(str(item["name"]))
            if isinstance(item.get("note"), str):  # an archive's own, made elsewhere perhaps
                item["note"] = echoed(str(item["note"]))
        return {"dir": str(folder), "backups": items, "rollback": read_record(ctx.state)}

    @methods.add("backup.verify", positional=("file",))
    async def backup_verify(ctx: CallContext, params: JsonObject) -> JsonObject:
        p = Params(params)
        path = _resolve_file(ctx.state, p.text("file"))
        progress = _progress(ctx, p, "backup.verify")
        p.done()
        async with progress.pumping():
            checked = await trio.to_thread.run_sync(
                lambda: open_checked(path, progress=progress), limiter=ctx.services.cpu)
        # And the settings a restore of it all here opens its workspaces with (the open
        # ones keep theirs): refused, the restore would refuse the archive.
        state = ctx.state
        open_ws = {w.agent_id: w for w in state.registry.list() if w.state == "ready"}
        cfg, *_ = await _incoming(state, checked, checked.agents, open_ws, False)
        known = state.registry.remembered()
        homes = await _homes(cfg, checked, checked.agents, known)
        for agent_id, (_, overrides) in homes.items():
            if agent_id not in open_ws:
                closed_settings(cfg, path, agent_id, agent_id in known, overrides)
        return {"ok": True, **checked.summary(), "file": echoed_path(str(path))}

    @methods.add("backup.restore", positional=("file",))
    async def backup_restore(ctx: CallContext, params: JsonObject) -> JsonObject:
        p = Params(params)
        path = _resolve_file(ctx.state, p.text("file"))
        agents = _selection(p)
        snapshot: bool = p.boolean("snapshot", True)
        dry_run: bool = p.boolean("dry_run", False)
        overwrite_shared: bool = p.boolean("overwrite_shared", False)
        progress = _progress(ctx, p, "backup.restore")
        p.done()
        async with restore_lock, progress.pumping():
            return await restore(ctx.state, path, agents, snapshot, dry_run, progress,
                                 overwrite_shared=overwrite_shared)

    @methods.add("backup.rollback")
    async def backup_rollback(ctx: CallContext, params: JsonObject) -> JsonObject:
        p = Params(params)
        overwrite_shared: bool = p.boolean("overwrite_shared", False)
        progress = _progress(ctx, p, "backup.rollback")
        p.done()
        record = read_record(ctx.state)
        if record is None:
            raise NotFound("no restore to roll back (no pre-restore snapshot recorded)")
        async with restore_lock, progress.pumping():
            result = await restore(ctx.state, Path(record["snapshot"]),
                                   list(record["agents"]), snapshot=False, progress=progress,
                                   rolling_back=True, overwrite_shared=overwrite_shared)
            if await drop_added_config(ctx.state, record):
                result["config_restored"] = True
            # Undone: a second rollback would put the snapshot back over everything done
            # since. The snapshot stays in the backups folder, restorable by name.
            await trio.to_thread.run_sync(drop_record, ctx.state)
        return {**result, "rolled_back": record}

    return methods
