"""What ``backup.create`` and the pre-restore snapshot write: the sources (open or
closed workspaces), the daemon's own files with secrets left out unless asked, and the
archive's place (a client-named path checked before anything is written, or a fresh name
in the backups folder)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import time
from collections.abc import Sequence
from pathlib import Path

import trio

from recalld.daemon import backup as bk
from recalld.daemon import config as config_mod
from recalld.daemon import metrics, remembered
from recalld.daemon.backup_secrets import left_out_of, mask_secrets
from recalld.daemon.config import WorkspaceSettings
from recalld.daemon.rpc.call_progress import CallProgress
from recalld.daemon.rpc.dispatch import CallContext, DaemonState, JsonObject
from recalld.daemon.rpc.echo import echoed_path
from recalld.daemon.rpc.restore_config import closed_home
from recalld.daemon.rpc.restore_record import backups_dir
from recalld.daemon.safepath import why_not_made
from recalld.daemon.store import errors as store_errors
from recalld.daemon.workspace_places import resolved
from recalld.daemon.workspaces import Workspace, check_agent_id
from recalld.ipc.errors import DiskFull, InvalidParams
from recalld.ipc.paths import expand_param


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime()) + f"-{os.getpid() % 1000:03d}"


def dirs_of(settings: WorkspaceSettings) -> dict[str, str]:
    return {role: str(getattr(settings, role)) for role in (*bk.CONTENT_ROLES, bk.DERIVED_ROLE)}


def source_of(ws: Workspace) -> bk.AgentSource:
    return bk.AgentSource(ws.agent_id, ws.root, dirs_of(ws.settings))


def _daemon_files(state: DaemonState, include_secrets: bool,
                  ) -> tuple[dict[str, bytes], dict[str, list[str]], list[str]]:
    """The daemon's config file and workspace record, secrets left out unless asked for
    (the record's are the model keys clients handed over); what was left out of the
    record, by agent, and of the config file (dotted keys)."""
    out: dict[str, bytes] = {}
    left_out: dict[str, list[str]] = {}
    config_left: list[str] = []
    try:
        text = state.config.config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = None
    if text is not None:
        out["config.toml"] = (text if include_secrets else mask_secrets(text)).encode()
        # Keys an earlier restore left out of it are missing from this copy too.
        emptied = [] if include_secrets else left_out_of(text)
        config_left = emptied + [k for k in state.services.config.left_out if k not in emptied]
    try:
        record = (state.config.state_dir / "workspaces.json").read_bytes()
    except FileNotFoundError:
        return out, left_out, config_left
    if not include_secrets:
        record, left_out = remembered.without_secrets(record)
    out["workspaces.json"] = record
    return out, left_out, config_left


def unique_path(path: Path) -> Path:
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


async def _closed_source(state: DaemonState, agent_id: str) -> bk.AgentSource | None:
    """The workspace of ``agent_id`` where and as it opens, if it is closed (not open in
    any state, and recorded or configured); None otherwise. InvalidParams if its folder
    is gone."""
    cfg = state.config
    known = state.registry.remembered().get(agent_id)
    if state.registry.exists(agent_id) or (
            known is None and agent_id not in cfg.configured_agents()):
        return None
    where, overrides = closed_home(cfg, agent_id, known, None)
    root = await trio.to_thread.run_sync(resolved, where)
    if not await trio.to_thread.run_sync(root.is_dir):
        what = "is not a folder" if await trio.to_thread.run_sync(root.exists) else "is gone"
        raise InvalidParams(f"workspace {agent_id!r} is closed and its folder {root} "
                            f"{what}: nothing to back up")
    settings = config_mod.workspace_settings_from_params(cfg.workspace_settings(agent_id),
                                                         overrides)
    return bk.AgentSource(agent_id, root, dirs_of(settings))


async def _every_closed_source(state: DaemonState) -> tuple[list[bk.AgentSource], set[str]]:
    """Every workspace the next start opens (recorded or configured) that is closed now,
    where and as it opens: its pending turns, inbox and notes are as much to resume as an
    open one's. And the agents of those whose folder cannot be read (gone, a file)."""
    known = set(state.registry.remembered()) | set(state.config.configured_agents())
    sources: list[bk.AgentSource] = []
    unread: set[str] = set()
    for agent_id in sorted(known):
        try:
            source = await _closed_source(state, agent_id)
        except InvalidParams:
            unread.add(agent_id)
            continue
        if source is not None:
            sources.append(source)
    return sources, unread


#: What writing a client-named archive fails with when its place is wrong, not the disk.
_PLACE_ERRNOS = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                           errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP, errno.ENOENT})


def _out_refused(path: Path, exc: store_errors.StorageIOError) -> InvalidParams:
    """The error for a client-named archive ``path`` that cannot be written where it is
    (a file on its way, no permission, a read-only or too long path): the full path, and
    the file that is in the way."""
    why = why_not_made(path.parent, OSError(exc.errno, os.strerror(exc.errno or 0)))
    return InvalidParams(f"cannot write the backup to {path}: {why}")


def _inside_workspace(path: Path, real: Path, roots: Sequence[tuple[str, Path]]) -> None:
    """InvalidParams if ``real`` (``path`` resolved) lies in one of the workspaces
    ``roots`` (agent id, folder): an archive there would be read as its memory (a
    resource file, say) and go into its next backups."""
    for agent_id, root in roots:
        if real.is_relative_to(root):
            raise InvalidParams(f"{path} is inside workspace {agent_id!r} ({root}); "
                                "put the archive outside every workspace")


def _check_out_place(path: Path, named_folder: bool,
                     roots: Sequence[tuple[str, Path]]) -> None:
    """InvalidParams unless a new archive can be put at the client-named ``path``: a
    folder there (or ``named_folder``, the path ending in ``/``), anything at all there
    (a symbolic link too, dangling or not: the rename would replace it, not write where
    it leads), or a folder on its way missing (the daemon makes none of the client's).
    A folder in a workspace is refused as such, not with a file in it to name instead."""
    try:
        is_dir, is_link, exists = path.is_dir(), path.is_symlink(), os.path.lexists(path)
        parent_ok = path.parent.is_dir()
    except OSError as exc:  # a name or path longer than the system takes, a link loop
        raise InvalidParams(f"cannot write the backup to {path}: "
                            f"{why_not_made(path.parent, exc)}") from None
    if named_folder or is_dir:
        if is_dir:
            _inside_workspace(path, path.resolve(), roots)
        raise InvalidParams(f"{path} is a folder: name the archive file in it "
                            f"(e.g. {path / 'recalld-backup.zip'})")
    if is_link:
        raise InvalidParams(f"{path} exists (a symbolic link to {os.readlink(path)}); "
                            "choose another name")
    if exists:
        raise InvalidParams(f"{path} exists; choose another name")
    if not parent_ok:
        raise InvalidParams(f"cannot write the backup to {path}: {_no_folder(path.parent)}")


def _no_folder(folder: Path) -> str:
    """Why the client-named ``folder`` takes no file: the first folder on its way that is
    missing (or a symbolic link leading nowhere), a loop of links, or the file in the way."""
    try:
        os.stat(folder)
    except FileNotFoundError:
        missing = folder
        while not os.path.exists(missing.parent):
            missing = missing.parent
        if os.path.islink(missing):
            return f"{missing} is a symbolic link to nothing ({os.readlink(missing)})"
        return f"no folder {missing}: make it first"
    except OSError as exc:
        return why_not_made(folder, exc) if exc.errno != errno.ELOOP else str(exc.strerror)
    return why_not_made(folder, OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))


async def write_backup(state: DaemonState, sources: list[bk.AgentSource], out: Path,
                       include_derived: bool, note: str,
                       include_secrets: bool = False,
                       progress: bk.ProgressSink = bk.NO_PROGRESS,
                       phase: str = "writing the archive",
                       whole: bool = False) -> JsonObject:
    """Write the archive of ``sources`` (and the daemon's files) to ``out``, off the loop
    under the CPU limiter; its summary. Another agent's workspace inside one (shared
    both ways) is left to that workspace's own backup."""
    cpu = state.services.cpu
    sources = [dataclasses.replace(s, others=tuple(state.registry.places_inside(
        s.agent_id, s.root))) for s in sources]
    daemon_files, left_out, config_left = await trio.to_thread.run_sync(
        _daemon_files, state, include_secrets)
    summary: JsonObject = await trio.to_thread.run_sync(
        lambda: bk.create_backup(out, sources, include_derived=include_derived,
                                 recalld_version=state.version, note=note,
                                 daemon_files=daemon_files, secrets=include_secrets,
                                 secrets_left_out=left_out,
                                 config_secrets_left_out=config_left, progress=progress,
                                 phase=phase, whole=whole),
        limiter=cpu)
    metrics.count("recalld_backups_total", labels={"kind": note or "manual"})
    return summary


async def create_backup(ctx: CallContext, agents: list[str] | None, out: str | None,
                        include_derived: bool, include_secrets: bool,
                        progress: CallProgress) -> JsonObject:
    """``backup.create`` (the caller holds the restore lock): the named agents, open or
    closed, or every workspace the next start opens (open or closed; a failed one, or a
    closed one whose folder is gone, is named in ``not_open``), into ``out`` or a fresh
    file in the backups folder."""
    closed: list[bk.AgentSource] = []
    unread: set[str] = set()
    if agents:
        workspaces = []
        for agent_id in dict.fromkeys(agents):
            source = await _closed_source(ctx.state, check_agent_id(agent_id))
            if source is not None:
                closed.append(source)
            else:
                workspaces.append(ctx.workspace(agent_id))
    else:
        workspaces = [w for w in ctx.state.registry.list() if w.state == "ready"]
        closed, unread = await _every_closed_source(ctx.state)
    if not workspaces and not closed:
        raise InvalidParams("no workspace to back up")
    if out is not None:
        path = expand_param(out, "out")
        if "\x00" in out or not path.is_absolute():
            raise InvalidParams("param 'out' must be an absolute path")
        roots = [(w.agent_id, w.root) for w in ctx.state.registry.list()]
        await trio.to_thread.run_sync(_check_out_place, path, out.endswith("/"), roots)
        try:
            real = await trio.to_thread.run_sync(path.resolve)
        except RuntimeError:  # a loop of symbolic links (Python 3.11)
            raise InvalidParams(f"cannot write the backup to {path}: "
                                f"{os.strerror(errno.ELOOP)}") from None
        _inside_workspace(path, real, roots)
    else:
        label = "-".join(dict.fromkeys(agents)) if agents else "all"
        path = unique_path(backups_dir(ctx.state) / f"recalld-{stamp()}-{label[:60]}.zip")
    sources = sorted([*map(source_of, workspaces), *closed], key=lambda s: s.agent_id)
    async with progress.pumping(), contextlib.AsyncExitStack() as held:
        for source in closed:  # not opened (and written to) while its files are read
            await held.enter_async_context(ctx.state.registry.held(
                source.agent_id, "a backup is reading its files (it opens once written)"))
        try:
            made = await write_backup(ctx.state, sources, path, include_derived, "",
                                      include_secrets, progress)
        except store_errors.StorageIOError as exc:
            if out is not None and isinstance(exc, store_errors.DiskFull):
                # The place is the client's own: named whole (the daemon's only by name).
                raise DiskFull(f"disk full writing the backup to {path}: nothing was "
                               "written", exc.data) from None
            if exc.errno == errno.EFBIG:  # the place is the client's own: named whole
                raise store_errors.StorageIOError(
                    None if out is not None else path, exc.errno,
                    f"the backup is larger than a file at {path} may be (the file system's "
                    "or the daemon's file size limit): nothing was written; write it to "
                    "another file system, or back up fewer agents") from None
            if out is None or exc.errno not in _PLACE_ERRNOS:
                raise
            raise await trio.to_thread.run_sync(_out_refused, path, exc) from None
    if not agents:  # "every workspace": say which ones it could not be
        made["not_open"] = sorted(
            {w.agent_id for w in ctx.state.registry.list() if w.state != "ready"} | unread)
    if out is not None:  # the caller's path, sent back as it is shown
        made["file"] = echoed_path(str(made["file"]))
    return made
