"""Restoring a checked backup (``backup_check.py``): plan where each member of an agent
goes in a workspace, then apply the plan.

An agent's files are first written beside their targets under temp names (fsynced,
checksums checked); only when every one is written are they renamed into place, so a
restore that fails while writing (disk full, a member that changed) leaves the workspace
as it was.

Everything here blocks on the file system; the RPC layer runs it in worker threads.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import stat
import zipfile
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from recalld.daemon import safepath
from recalld.daemon.backup import (
    CONTENT_ROLES,
    COPY_CHUNK,
    DERIVED_ROLE,
    JOB_RECORDS,
    NO_PROGRESS,
    PATH_MAX_BYTES,
    RESUMABLE,
    TEMP_NAME_EXTRA,
    ProgressSink,
    restorable_path,
    state_folders,
    walk_files,
)
from recalld.daemon.backup_check import CheckedBackup, file_in_the_way, refuse
from recalld.daemon.backup_meta import Member
from recalld.daemon.restore_folders import (
    in_folder,
    open_folder,
    quietly,
    remove_entry,
    rmdir_at,
    unlink_at,
)
from recalld.daemon.store import confine
from recalld.daemon.store.errors import translate_os_error
from recalld.daemon.store.fsio import NOTE_MODE, PRIVATE_MODE, REAL, temp_name
from recalld.daemon.watchrecords import ReconcileRecord
from recalld.ipc.errors import InvalidParams, NotAllowed, NotFound, PathOutsideWorkspace

log = logging.getLogger(__name__)


class PlanSummary(TypedDict):
    """What restoring one agent would do (a dry run)."""

    agent_id: str
    root: str
    write: int  # files written (not those that hold the backup's bytes already)
    overwrite: int  # of them, those that exist now
    unchanged: int  # hold the backup's bytes already: left in place
    remove: int
    removes: list[str]  # the first few
    skipped_derived: int


class Restored(TypedDict):
    """One agent restored (``backup.restore`` adds what happened around the copy)."""

    agent_id: str
    written: int
    unchanged: int  # held the backup's bytes already: not written again
    removed: int
    skipped_derived: int
    opened: NotRequired[bool]  # the workspace was opened for the restore
    secrets_left_out: NotRequired[list[str]]
    warning: NotRequired[str]
    reconcile: NotRequired[ReconcileRecord]  # the rescan after the restore


@dataclass(slots=True)
class RestorePlan:
    """What restoring one agent does: members to write where, files to remove."""

    agent_id: str
    root: Path
    writes: dict[str, str]  # zip member -> workspace-relative target
    removes: list[str]
    skipped_derived: int
    #: What stands where a written file or its folder goes (a folder where the backup
    #: has a file, a file where it has a folder): moved out of the way first.
    clears: list[str]
    #: The content and state folders: a folder the removes leave empty goes too, up to these.
    tops: tuple[str, ...] = ()
    #: The targets that are state files (of ``metadata_dir``): written private
    #: (PRIVATE_MODE); the others are notes, written as notes are (:func:`_stage`).
    private: frozenset[str] = frozenset()
    #: The folders of the jobs' records (:data:`JOB_RECORDS`), made equal to the backup's.
    state: tuple[str, ...] = ()


def plan_restore(backup: CheckedBackup, agent_id: str, root: Path,
                 dirs: Mapping[str, str], others: Collection[str] = ()) -> RestorePlan:
    """Map ``agent_id``'s members onto the workspace at ``root`` with settings ``dirs``
    (directory names may differ from the backed-up workspace: they map by role).

    Files now in the content directories that the backup lacks are removed, so the
    workspace ends equal to the backup. Of ``metadata_dir`` only :data:`RESUMABLE` state is
    written (the rest is rebuilt), and if the backup holds it, the jobs' records it lacks
    (:data:`JOB_RECORDS`) are removed too: those of the jobs run since speak of files the
    restore takes back. ``others`` are the folders (relative to ``root``) of other agents'
    workspaces inside this one: nothing is written or removed in them.
    Raises PathOutsideWorkspace if a target would pass through a symlink, NotAllowed if
    something in a target's way holds more than files the restore removes, InvalidParams
    if a target's absolute path would be past PATH_MAX (``root`` is deeper than the
    backed-up workspace's).
    """
    saved_dirs: dict[str, str] = backup.meta["agents"][agent_id]["dirs"]
    roles = sorted(((r, d.strip("/")) for r, d in saved_dirs.items()
                    if r in (*CONTENT_ROLES, DERIVED_ROLE) and d.strip("/")),
                   key=lambda rd: -len(rd[1]))
    prefix = f"agents/{agent_id}/"
    writes: dict[str, str] = {}
    private: set[str] = set()
    too_deep: list[str] = []
    skipped = 0
    def theirs(rel: str) -> bool:
        return any(rel.startswith(f"{folder}/") for folder in others)

    for name in backup.by_agent.get(agent_id, []):
        rel = name[len(prefix):]
        role = next((r for r, d in roles if rel.startswith(d + "/")), None)
        if role is None:
            raise refuse(backup.path, f"member {name!r} is outside the agent's directories")
        if role == DERIVED_ROLE and not rel[len(dict(roles)[role]) + 1:].startswith(RESUMABLE):
            skipped += 1
            continue
        target_dir = dirs.get(role, "").strip("/")
        if not target_dir:
            raise refuse(backup.path, f"the target workspace has no {role} for {name!r}")
        rest = rel[len(dict(roles)[role]) + 1:]
        target = f"{target_dir}/{rest}"
        safepath.split_relative(target)
        if theirs(target):  # restored with the workspace it belongs to, if at all
            continue
        if not restorable_path(root / target):  # no call could reach it by its path
            too_deep.append(target)
            continue
        _check_no_symlink(root, target)
        writes[name] = target
        if role == DERIVED_ROLE:
            private.add(target)
    if too_deep:
        raise _too_deep(agent_id, root, too_deep)
    clash = file_in_the_way(writes.values())
    if clash is not None:
        file, other = clash
        raise refuse(backup.path, f"two members of {agent_id} restore to {file!r}"
                     if file == other else f"a member of {agent_id} restores to {file!r} "
                     f"as a file where another restores to {other!r}, which needs a folder")
    wanted = set(writes.values())
    removes = []
    tops = tuple(t for t in (dirs.get(role, "").strip("/") for role in CONTENT_ROLES) if t)
    meta = dirs.get(DERIVED_ROLE, "").strip("/")
    state = (state_folders(meta, JOB_RECORDS)
             if meta and saved_dirs.get(DERIVED_ROLE, "").strip("/") else ())
    for top in (*tops, *state):
        removes += [rel for rel in walk_files(root, top)
                    if rel not in wanted and not theirs(rel)]
    removes = sorted(set(removes))
    clears = _in_the_way(root, writes.values(), set(removes))
    return RestorePlan(agent_id, root, writes, removes, skipped, clears, (*tops, *state),
                       frozenset(private), state)


def _too_deep(agent_id: str, root: Path, targets: list[str]) -> InvalidParams:
    """The refusal of a restore whose ``targets`` lie past PATH_MAX below ``root``: how
    long the workspace's folder path may be for the deepest to fit."""
    deepest = max(targets, key=lambda t: len(os.fsencode(t)))
    # root + "/" + target + the temp name's extra bytes + the NUL stay within PATH_MAX.
    room = PATH_MAX_BYTES - TEMP_NAME_EXTRA - 2 - len(os.fsencode(deepest))
    fix = (f"restore it into a workspace whose folder path has at most {room} bytes "
           f"(this one has {len(os.fsencode(root))})" if room > 0 else
           "no workspace folder is short enough to hold it")
    shown = safepath.shown(deepest)
    return InvalidParams(
        f"cannot restore workspace {agent_id!r} to {root}: {len(targets)} of its files "
        f"would lie past the longest path the system takes ({PATH_MAX_BYTES} bytes), the "
        f"deepest {shown[:60]}...{shown[-40:]}: {fix}",
        {"root": str(root), "too_deep": len(targets), "max_root_bytes": max(room, 0)})


def _in_the_way(root: Path, targets: Iterable[str], removes: set[str]) -> list[str]:
    """Workspace-relative paths standing where ``targets`` go: a file where a target's
    folder goes, a folder where a target file goes. NotAllowed unless all each holds is
    among ``removes`` (so the pre-restore snapshot has it)."""
    found: set[str] = set()
    for rel in targets:
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            sub = "/".join(parts[:depth])
            try:
                st = os.lstat(root / sub)
            except (FileNotFoundError, NotADirectoryError):
                break
            last = depth == len(parts)
            is_dir = stat.S_ISDIR(st.st_mode)
            if is_dir and not last:
                continue  # a folder on the way
            if last and not is_dir:
                break  # a file the backup's replaces
            if sub not in found:
                _check_clearable(root, sub, is_dir, removes)
                found.add(sub)
            break
    return sorted(found)


def _check_clearable(root: Path, sub: str, is_dir: bool, removes: set[str]) -> None:
    def refuse_clearing(why: str) -> NotAllowed:
        return NotAllowed(f"the backup has a {'file' if is_dir else 'folder'} where "
                          f"{root / sub} is, which {why}: move it away and restore again")

    if not is_dir:
        if sub not in removes:
            raise refuse_clearing("the restore would not otherwise remove")
        return

    def unreadable(exc: OSError) -> None:
        raise refuse_clearing(f"cannot be read through ({exc.strerror})")

    for folder, dirs, files in os.walk(root / sub, onerror=unreadable):
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        for name in (*files, *links):
            rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
            if rel not in removes:
                raise refuse_clearing(f"holds {safepath.shown(rel)}, which the backup "
                                      "does not cover")


def plan_summary(backup: CheckedBackup, plan: RestorePlan, listed: int = 20) -> PlanSummary:
    """What ``plan`` would do, for a dry run, counted as the restore counts what it did:
    a file that holds its member's bytes already is ``unchanged`` (left in place, not
    written); ``write`` counts the others, ``overwrite`` those of them that exist now.
    Also the first files it removes. Reads the existing targets through
    :func:`open_folder` (never through a link); blocks."""
    write = overwrite = unchanged = 0
    for member, rel in plan.writes.items():
        folder, name = rel.rpartition("/")[::2]
        try:
            fd = open_folder(plan.root, folder, rel)
        except NotFound:  # its folder is made by the restore
            write += 1
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            write += 1
            continue
        else:
            if _holds_member(fd, name, st, backup.members[member]):
                unchanged += 1
            else:
                write += 1
                overwrite += 1
        finally:
            os.close(fd)
    return {"agent_id": plan.agent_id, "root": str(plan.root), "write": write,
            "overwrite": overwrite, "unchanged": unchanged, "remove": len(plan.removes),
            "removes": [safepath.shown_masked(rel) for rel in plan.removes[:listed]],
            "skipped_derived": plan.skipped_derived}


def _check_no_symlink(root: Path, rel: str) -> None:
    current = root
    for part in rel.split("/"):
        current = current / part
        try:
            st = current.lstat()
        except (FileNotFoundError, NotADirectoryError):  # the rest is made by the restore
            return
        if stat.S_ISLNK(st.st_mode):
            raise PathOutsideWorkspace(f"restore target {rel} passes through a symlink")


def apply_restore(backup: CheckedBackup, plan: RestorePlan,
                  progress: ProgressSink = NO_PROGRESS) -> Restored:
    """:func:`_apply`, with the workspace folder guarded (:mod:`confine`) meanwhile: a
    link put in the place of a folder of it while the restore runs takes no write, nor
    removal, out of it."""
    confine.guard(plan.root)
    try:
        return _apply(backup, plan, progress)
    finally:
        confine.release(plan.root)


def _apply(backup: CheckedBackup, plan: RestorePlan, progress: ProgressSink) -> Restored:
    """Write ``plan``'s files (checksums verified again while copying), then remove the
    files the backup lacks. Returns counts. A file that holds its member's bytes already
    (size and SHA-256 as the archive records them) is not written again: only its
    modification time is set back, once every other file is in place. All files are
    written under temp names first and renamed into place only once every one is
    written: on an error while writing
    (DiskFull, a refused member) the temp files and the folders made for them are removed
    and the workspace is unchanged. What stands in the way of a written file
    (``plan.clears``) is first moved aside under a hidden temp name, put back on such an
    error and removed with the files the backup lacks. Every change is made in a folder
    opened from ``plan.root`` one folder at a time without following a link
    (:mod:`restore_folders`): a link put on the way meanwhile is refused, never followed.
    ``progress``: a ``restoring <agent>`` phase counting files written and removed."""
    progress.phase(f"restoring {plan.agent_id}", total=len(plan.writes) + len(plan.removes),
                   bytes_total=sum(backup.members[n]["size"] for n in plan.writes))
    root = plan.root
    staged: list[tuple[str, str]] = []  # (target, its temp file's name)
    unchanged: list[tuple[str, int | None]] = []  # (target, its member's mtime_ns)
    made_dirs: list[str] = []
    aside: list[tuple[str, str]] = []  # (moved from, to the name)
    done = False
    try:
        for rel in plan.clears:
            folder, name = rel.rpartition("/")[::2]
            away = temp_name(name)
            in_folder(root, folder, rel, REAL.replace_at, name, away)
            aside.append((rel, away))
        with zipfile.ZipFile(backup.path) as zf:
            for member, rel in sorted(plan.writes.items()):
                folder, name = rel.rpartition("/")[::2]
                tmp = temp_name(name)
                fd = open_folder(root, folder, rel, made_dirs)
                try:
                    staged.append((rel, tmp))
                    if not _stage(zf, member, backup, fd, (name, tmp), root / rel,
                                  rel in plan.private):
                        staged.pop()
                        unchanged.append((rel, backup.members[member].get("mtime_ns")))
                finally:
                    os.close(fd)
                progress.advance(1, backup.members[member]["size"])
        while staged:
            rel, tmp = staged[-1]
            folder, name = rel.rpartition("/")[::2]
            in_folder(root, folder, rel, REAL.replace_at, tmp, name)
            staged.pop()
        done = True
    finally:
        for rel, tmp in staged:
            quietly(root, rel.rpartition("/")[0], unlink_at, tmp)
        if not done:
            for folder in sorted(made_dirs, key=lambda f: f.count("/"), reverse=True):
                parent, name = folder.rpartition("/")[::2]
                quietly(root, parent, rmdir_at, name)
            for rel, away in reversed(aside):
                folder, name = rel.rpartition("/")[::2]
                quietly(root, folder, REAL.replace_at, away, name)
    for rel, mtime_ns in unchanged:
        if mtime_ns is None:
            continue
        folder, name = rel.rpartition("/")[::2]
        try:
            in_folder(root, folder, rel, functools.partial(_set_mtime, mtime_ns=mtime_ns),
                      name, translate=False)
        except (OSError, NotFound) as exc:  # its bytes are the backup's, only its time not
            log.warning("restore of %s: could not set the modification time of %s: %s",
                        plan.agent_id, safepath.masked(str(root / rel)),
                        getattr(exc, "strerror", None) or exc)
    written = len(plan.writes) - len(unchanged)
    for folder in sorted({rel.rpartition("/")[0] for rel in plan.writes.values()}):
        in_folder(root, folder, folder or ".", REAL.fsync)
    for rel, away in aside:
        try:
            in_folder(root, rel.rpartition("/")[0], rel, remove_entry, away,
                      translate=False)
        except (OSError, PathOutsideWorkspace, NotFound) as exc:
            log.warning("restore of %s: could not remove %s, moved out of the way: %s",
                        plan.agent_id,
                        safepath.masked(str(root / rel.rpartition("/")[0] / away)),
                        getattr(exc, "strerror", None) or exc)
    cleared = tuple(f"{rel}/" for rel in plan.clears)
    removed = 0
    for rel in plan.removes:
        progress.advance()
        if rel in plan.clears or rel.startswith(cleared):
            removed += 1  # went with what was in the way
            continue
        folder, name = rel.rpartition("/")[::2]
        try:
            in_folder(root, folder, rel, unlink_at, name)
            removed += 1
        except (FileNotFoundError, NotFound):
            continue
    _remove_emptied(plan)
    return {"agent_id": plan.agent_id, "written": written, "unchanged": len(unchanged),
            "removed": removed, "skipped_derived": plan.skipped_derived}


def _remove_emptied(plan: RestorePlan) -> None:
    """Remove the folders ``plan``'s removes left empty (the backup has none of them:
    it holds files only), from the deepest up to the content directories, which stay."""
    tops = set(plan.tops)
    folders = {rel.rsplit("/", 1)[0] for rel in plan.removes if "/" in rel}
    for folder in sorted(folders, key=lambda f: f.count("/"), reverse=True):
        while folder and folder not in tops:
            parent, name = folder.rpartition("/")[::2]
            try:
                in_folder(plan.root, parent, folder, rmdir_at, name, translate=False)
            except (OSError, PathOutsideWorkspace, NotFound):  # not empty (a file the
                break  # backup has, a hidden one), gone, or no longer the workspace's own
            folder = parent


def _stage(zf: zipfile.ZipFile, name: str, backup: CheckedBackup, folder: int,
           names: tuple[str, str], target: Path, private: bool) -> bool:
    """Copy member ``name`` to the new file ``tmp`` in ``folder`` (beside ``target``,
    ``names``: the target's name and ``tmp``) with the modification time it was backed
    up with, and fsync it; the checksum must match (``refuse`` otherwise). False, and
    nothing written, if the target holds the member's bytes already. A ``private``
    file (state) is written PRIVATE_MODE, a note as notes are: with the mode of the note
    it replaces, NOTE_MODE where there is none (the umask applies to both). The caller
    removes ``tmp`` on any error."""
    member = backup.members[name]
    mode = PRIVATE_MODE if private else NOTE_MODE
    try:
        st = os.stat(names[0], dir_fd=folder, follow_symlinks=False)
    except OSError:
        pass
    else:
        if stat.S_ISREG(st.st_mode) and not private:
            mode = stat.S_IMODE(st.st_mode)
        if _holds_member(folder, names[0], st, member):
            return False
    try:
        fd = REAL.open_write_at(folder, names[1], mode)
    except OSError as exc:
        raise translate_os_error(exc, target) from exc
    try:
        digest = hashlib.sha256()
        with zf.open(name) as src:
            while chunk := src.read(COPY_CHUNK):
                digest.update(chunk)
                REAL.write(fd, chunk)
        mtime_ns = member.get("mtime_ns")
        if mtime_ns is not None:  # as it was backed up (an archive of old has none)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        REAL.fsync(fd)
    except OSError as exc:
        raise translate_os_error(exc, target) from exc
    finally:
        os.close(fd)
    if digest.hexdigest() != member["sha256"]:  # the file changed under us
        raise refuse(backup.path, f"checksum mismatch for {name!r} while restoring")
    return True


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _holds_member(folder: int, name: str, st: os.stat_result, member: Member) -> bool:
    """Whether ``name`` in ``folder`` (``st``: its lstat) is a regular file with
    ``member``'s size and SHA-256: a restore leaves it in place."""
    return (stat.S_ISREG(st.st_mode) and st.st_size == member["size"]
            and _holds(folder, name, member["sha256"]))


def _holds(folder: int, name: str, sha256: str) -> bool:
    """Whether the regular file ``name`` in ``folder`` has the SHA-256 ``sha256``
    (read through ``folder``, never through a link); one that cannot be read does not."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        digest = hashlib.sha256()
        while chunk := os.read(fd, COPY_CHUNK):
            digest.update(chunk)
    except OSError:
        return False
    finally:
        os.close(fd)
    return digest.hexdigest() == sha256


def _set_mtime(folder: int, name: str, *, mtime_ns: int) -> None:
    """Give the regular file ``name`` in ``folder`` the modification time ``mtime_ns``
    durably (fsynced), unless it has it; not through a link."""
    fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mtime_ns != mtime_ns:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
            REAL.fsync(fd)
    finally:
        os.close(fd)
