"""Backup archives: their format, and writing them.

A backup is a zip file. ``meta.json`` names the format and version, the time, and each
agent with its workspace path and directory settings, and lists every other member with
its size and SHA-256 (and a workspace file's modification time). Members are
``agents/<agent_id>/<path in the workspace>``: the Markdown (``daily_dir``,
``digest_dir``), sessions (``session_dir``, ``mem_session_dir``) and resources
(``resource_dir``); of ``metadata_dir`` the state that cannot be rebuilt
(:data:`RESUMABLE`: pending conversation turns, the inbox, the change logs of dream and
auto_memory runs, the catalogs of the resources and daily notes already turned into
notes and digest nodes, ReMe's of the same in a QwenPaw workspace), the rest of it
(derived, rebuilt from the Markdown) only on request. Members ``daemon/<name>``
carry the daemon's own files (:data:`DAEMON_FILES`: its config file and its record of
workspaces, whose model keys handed over by clients are secrets too; both with secrets
left out unless asked for (``backup_secrets.py``), ``meta.json``'s
``secrets_left_out`` naming the record's). Symlinks and hidden files (``.name``) are left
out; the summary names them (but the daemon's own temp files and sync cookies).

Checking an archive is ``backup_check.py``'s, planning and applying a restore
``backup_restore.py``'s.

Everything here blocks on the file system; the RPC layer runs it in worker threads.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, cast

import orjson

from recalld.daemon import safepath
from recalld.daemon.backup_meta import AgentEntry, BackupMeta, Member
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.fsio import REAL, TEMP_RE, atomic_writer, ensure_dir, temp_name
from recalld.daemon.store.tempnames import remove_dead_temps
from recalld.daemon.watchsource import COOKIE_PREFIX
from recalld.ipc.agent_ids import MAX_AGENT_ID_CHARS
from recalld.ipc.errors import InvalidParams, RecalldError

log = logging.getLogger(__name__)

FORMAT = "recalld-backup"
VERSION = 1


META = "meta.json"
CONTENT_ROLES = ("daily_dir", "digest_dir", "session_dir", "mem_session_dir", "resource_dir")
DERIVED_ROLE = "metadata_dir"
#: Under ``metadata_dir``: what a restore needs to resume (never rebuilt from Markdown).
#: Without ``catalog/`` every resource would be summarized (and a file directly in
#: ``resource_dir`` dated) anew, and every daily note dreamed again, by the chat model;
#: without ReMe's ``file_catalog/`` (QwenPaw's workspaces), so would those ReMe did.
#: Of them, the records recalld's own jobs keep, which a restore makes equal to the
#: backup's; ReMe's ``file_catalog/`` is ReMe's: written back, nothing of it removed.
JOB_RECORDS = ("sessions/", "inbox/", "dream/runs/", "auto_memory/runs/", "catalog/")
RESUMABLE = (*JOB_RECORDS, "file_catalog/")
DAEMON_FILES = ("config.toml", "workspaces.json")


#: Linux's PATH_MAX, with the NUL that ends a path. A restore writes each file by its
#: absolute path under a temp name first, which adds TEMP_NAME_EXTRA bytes.
PATH_MAX_BYTES = 4096
TEMP_NAME_EXTRA = len(temp_name(""))
#: The longest member name a restore takes: ``agents/<agent_id>/`` and a path in the
#: workspace as long as a restore writes (``safepath.MAX_PATH_CHARS``).
MAX_MEMBER_NAME_CHARS = len("agents//") + MAX_AGENT_ID_CHARS + safepath.MAX_PATH_CHARS


def restorable_path(path: str | os.PathLike[str]) -> bool:
    """Whether a restore can write a file at the absolute ``path``: with its temp name,
    the path stays within PATH_MAX."""
    return len(os.fsencode(path)) + TEMP_NAME_EXTRA < PATH_MAX_BYTES

#: How an archive's temp file is named (``.recalld-unfinished-<name>.tmp-<hex>``): its
#: writer holds a lock on it, so that the next backup to the same folder removes one
#: that a daemon killed while writing left, wherever a client put it.
UNFINISHED = "recalld-unfinished-"


def _archive_temp(name: str) -> str:
    return temp_name(UNFINISHED + name)


COPY_CHUNK = 1 << 20
#: A member of at least RATIO_MIN_BYTES that inflates more than MAX_RATIO times is taken
#: for a decompression bomb by a restore (``backup_check.BackupLimits``); text
#: compresses ~3-10x. One that deflates that well is stored uncompressed instead.
MAX_RATIO = 200.0
RATIO_MIN_BYTES = 1 << 20
#: The largest file, and the most bytes, a restore takes from an archive.
MAX_MEMBER_BYTES = 4 << 30
MAX_TOTAL_BYTES = 16 << 30
COMPRESS_LEVEL = 6


class ProgressSink(Protocol):
    """Where the long steps here report their counts (from the worker thread)."""

    def phase(self, name: str, total: int | None = None,
              bytes_total: int | None = None) -> None: ...

    def advance(self, n: int = 1, nbytes: int = 0) -> None: ...


class _NoProgress:
    def phase(self, name: str, total: int | None = None,
              bytes_total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        pass


NO_PROGRESS: ProgressSink = _NoProgress()


@dataclass(frozen=True, slots=True)
class AgentSource:
    """One workspace to back up: its root and directory settings by role."""

    agent_id: str
    root: Path
    dirs: Mapping[str, str]
    others: tuple[str, ...] = ()  # other agents' workspace folders inside root: theirs


# ------------------------------------------------------------------------------ writing


@dataclass(slots=True)
class PassedBy:
    """What a walk of a workspace's folders leaves out, workspace-relative (bytes that are
    not UTF-8 shown as ``\\xNN``): files whose names are not UTF-8 (no zip member name
    can hold them, nor did the index) or have a backslash (taken for a Windows path
    separator: a restore refuses such a member) or whose absolute path is past the
    system's PATH_MAX (a restore cannot write them), symlinks (what they lead to is not
    the workspace's), hidden files and folders (``.name``) other than the daemon's own
    temp files and sync cookies, and FIFOs, sockets and device files (no content of their
    own: reading one would block, or never end)."""

    unnamed: list[str] = field(default_factory=list)
    symlinks: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    special: list[str] = field(default_factory=list)


def _daemons_own(name: str) -> bool:
    """Whether the hidden name ``name`` is a temp file or sync cookie of the daemon's."""
    return bool(TEMP_RE.match(name)) or name.startswith(COOKIE_PREFIX)


def walk_files(root: Path, top: str, passed: PassedBy | None = None) -> Iterator[str]:
    """Workspace-relative paths of the regular, non-hidden files under ``root/top`` that
    an archive can hold and a restore to the same place can write; what it leaves out is
    added to ``passed`` (a folder too deep to list, as one path). A ``top`` that is, or
    lies under, a symlink is left out whole (the index passes it by too, and what is
    there is not the workspace's: a restore must not remove it)."""
    current = root
    for part in top.split("/"):
        current = current / part
        if current.is_symlink():
            if passed is not None:
                passed.symlinks.append(safepath.shown_masked(str(current.relative_to(root))))
            return
    stack = [root / top]
    prefix = str(root) + os.sep
    while stack:
        current = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            _pass_by(passed, root, str(current)[len(prefix):])  # and all it holds
            continue
        for entry in entries:
            rel = entry.path[len(prefix):].replace(os.sep, "/")
            if entry.name.startswith("."):
                if passed is not None and not _daemons_own(entry.name):
                    passed.hidden.append(safepath.shown_masked(rel))
            elif entry.is_symlink():
                if passed is not None:
                    passed.symlinks.append(safepath.shown_masked(rel))
            elif entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                if safepath.is_utf8(rel) and "\\" not in rel and restorable_path(entry.path):
                    yield rel
                else:  # no zip member name can hold it (a restore refuses a backslash)
                    _pass_by(passed, root, rel)
            elif passed is not None:  # a FIFO, socket or device file, or gone since
                try:
                    entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                passed.special.append(safepath.shown_masked(rel))


def _pass_by(passed: PassedBy | None, root: Path, rel: str) -> None:
    log.warning("backup passes by %s: its name is not valid UTF-8, has a backslash, or "
                "its path is too long for a restore to write (%d bytes or more)",
                safepath.shown_masked(str(root / rel)), PATH_MAX_BYTES - TEMP_NAME_EXTRA)
    if passed is not None:
        passed.unnamed.append(safepath.shown_masked(rel))


def state_folders(meta: str, subs: tuple[str, ...] = RESUMABLE) -> tuple[str, ...]:
    """The folders ``subs`` (by default the :data:`RESUMABLE` state, which a backup holds)
    of a workspace whose ``metadata_dir`` is ``meta``."""
    return tuple(f"{meta}/{sub.rstrip('/')}" for sub in subs)


def roles_for(include_derived: bool) -> tuple[str, ...]:
    return (*CONTENT_ROLES, DERIVED_ROLE) if include_derived else CONTENT_ROLES


def source_files(source: AgentSource, include_derived: bool,
                 passed: PassedBy | None = None) -> list[str]:
    seen: dict[str, None] = {}
    tops = [d.strip("/") for d in (source.dirs.get(r) for r in roles_for(include_derived)) if d]
    meta = (source.dirs.get(DERIVED_ROLE) or "").strip("/")
    if not include_derived and meta:
        tops += state_folders(meta)
    for top in tops:
        for rel in walk_files(source.root, top, passed):
            if not any(rel.startswith(f"{other}/") for other in source.others):
                seen.setdefault(rel, None)
    return list(seen)


def create_backup(
    out: Path,
    sources: Iterable[AgentSource],
    *,
    include_derived: bool = False,
    recalld_version: str = "",
    note: str = "",
    daemon_files: Mapping[str, bytes] | None = None,
    secrets: bool = False,
    secrets_left_out: Mapping[str, list[str]] | None = None,
    config_secrets_left_out: Iterable[str] = (),
    progress: ProgressSink = NO_PROGRESS,
    phase: str = "writing the archive",
    whole: bool = False,
) -> JsonObject:
    """Write a backup of ``sources`` (and ``daemon_files``, by name in
    :data:`DAEMON_FILES`) to ``out`` atomically; return its summary (meta minus the file
    list). ``secrets`` says whether the config in ``daemon_files`` kept its secrets,
    ``secrets_left_out`` which secrets of the workspace record were taken out, by agent,
    ``config_secrets_left_out`` which of the config file's (dotted keys).
    Files that vanish while being read are left out, and so are, by agent in the
    summary, files whose names are not UTF-8 or have a backslash (``passed_by``),
    symlinks (``symlinks``), hidden files and folders (``hidden``), FIFOs, sockets and
    device files (``special``) and files larger than
    a restore takes (``too_large``; with ``whole``, for a snapshot a restore could not do
    without, InvalidParams instead). InvalidParams, before anything is written, when the files
    add up to more than a restore takes. A file is copied as far as it reached when
    opened: one growing meanwhile makes no member a restore refuses. ``progress`` gets a
    ``listing files`` phase, then ``phase`` with the files and bytes to write."""
    sources = list(sources)
    created = time.time()
    stamp = time.localtime(created)[:6]
    ensure_dir(REAL, out.parent)
    for name in remove_dead_temps(out.parent, "." + UNFINISHED):
        log.warning("removed %s: an unfinished archive of a backup killed while writing it",
                    out.parent / name)
    progress.phase("listing files")
    listed: list[tuple[AgentSource, list[tuple[str, int]]]] = []
    left_out: dict[str, dict[str, list[str]]] = {
        "passed_by": {}, "symlinks": {}, "hidden": {}, "special": {}, "too_large": {}}
    for src in sources:
        sized = []
        passed = PassedBy()
        for rel in source_files(src, include_derived, passed):
            try:
                size = os.lstat(src.root / rel).st_size
            except OSError:
                size = 0
            progress.advance()
            if size <= MAX_MEMBER_BYTES:
                sized.append((rel, size))
            else:
                _too_large(src, rel, size, whole, left_out["too_large"])
        listed.append((src, sized))
        for key, names in (("passed_by", passed.unnamed), ("symlinks", passed.symlinks),
                           ("hidden", passed.hidden), ("special", passed.special)):
            if names:
                left_out[key][src.agent_id] = sorted(names)
    total = sum(n for _, s in listed for _, n in s)
    if total > MAX_TOTAL_BYTES:
        raise InvalidParams(f"the workspaces hold {total} bytes, more than a restore takes "
                            f"from one archive ({MAX_TOTAL_BYTES}): back up fewer agents at "
                            "a time (--agent)")
    def meta_of(files: list[Member], agents: dict[str, AgentEntry]) -> BackupMeta:
        return {"format": FORMAT, "version": VERSION, "created": created,
                "recalld_version": recalld_version, "include_derived": include_derived,
                "note": note, "agents": agents, "files": files,
                "daemon": sorted(daemon_files or {}), "secrets": secrets,
                "secrets_left_out": dict(secrets_left_out or {}),
                "config_secrets_left_out": list(config_secrets_left_out)}

    stored: set[str] = set()
    while True:
        try:
            meta, grown = _write_archive(out, listed, stamp, stored, daemon_files, meta_of,
                                         progress, phase, whole)
            break
        except _Redo as redo:  # written once more, that file stored as it is
            log.info("backup writes its archive again: %s came out deflated like a "
                     "decompression bomb (it changed while copied)", redo.name)
            stored.add(redo.name)
    for agent_id, names in grown.items():
        left_out["too_large"].setdefault(agent_id, []).extend(names)
    summary: JsonObject = {k: v for k, v in meta.items() if k != "files"}
    summary.update(file=str(out), size=out.stat().st_size, members=len(meta["files"]),
                   bytes=sum(f["size"] for f in meta["files"]), **left_out)
    return summary


class _Redo(Exception):
    """A member came out deflated as a restore refuses (its file became far more
    compressible while copied): the archive is written again with that file stored."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Oversize(Exception):
    """The file held more bytes when opened than the archive has room for."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _too_large(src: AgentSource, rel: str, size: int, whole: bool,
               too_large: dict[str, list[str]]) -> None:
    why = f"{src.root / rel} has {size} bytes, more than a restore takes of a file"
    if whole:
        raise InvalidParams(f"cannot back up {src.agent_id}: {why} "
                            f"({MAX_MEMBER_BYTES}); move it out of the workspace")
    log.warning("backup leaves out %s", why)
    too_large.setdefault(src.agent_id, []).append(rel)


def _write_archive(
    out: Path, listed: list[tuple[AgentSource, list[tuple[str, int]]]],
    stamp: tuple[int, ...], stored: set[str], daemon_files: Mapping[str, bytes] | None,
    meta_of: Callable[[list[Member], dict[str, AgentEntry]], BackupMeta],
    progress: ProgressSink, phase: str, whole: bool,
) -> tuple[BackupMeta, dict[str, list[str]]]:
    """Write the archive: the members of ``listed`` (those named in ``stored``
    uncompressed), the daemon files, and ``meta_of`` them. Returns the meta and the files
    left out for they had grown past what a restore takes of a file when opened, by
    agent. Raises _Redo for a member to store, InvalidParams as :func:`create_backup`."""
    files: list[Member] = []
    agents: dict[str, AgentEntry] = {}
    grown: dict[str, list[str]] = {}
    total = sum(n for _, s in listed for _, n in s)
    progress.phase(phase, total=sum(len(s) for _, s in listed), bytes_total=total)
    rest, written = total, 0  # listed bytes still to copy, bytes copied
    # Private: the archive holds every file of the workspaces (and with ``secrets``, the
    # model keys), wherever ``out`` puts it.
    # AtomicFile has no tell(): zipfile then streams members with data descriptors.
    with atomic_writer(REAL, out, temp_of=_archive_temp, locked=True) as raw, zipfile.ZipFile(
        cast(IO[bytes], raw), "w", compression=zipfile.ZIP_DEFLATED,
        compresslevel=COMPRESS_LEVEL
    ) as zf:
        for src, sized in listed:
            count = 0
            for rel, size in sized:
                rest -= size
                room = min(MAX_MEMBER_BYTES, MAX_TOTAL_BYTES - written - rest)
                try:
                    entry = _add_member(zf, src, rel, stamp, room, stored)
                except _Oversize as big:
                    if big.size <= MAX_MEMBER_BYTES:
                        raise InvalidParams(
                            f"the workspaces grew past {MAX_TOTAL_BYTES} bytes, more than a "
                            "restore takes from one archive, while backed up: back up fewer "
                            "agents at a time (--agent)") from None
                    _too_large(src, rel, big.size, whole, grown)
                    entry = None
                progress.advance(1, size)
                if entry is not None:
                    files.append(entry)
                    written += entry["size"]
                    count += 1
            agents[src.agent_id] = {"path": str(src.root), "dirs": dict(src.dirs), "files": count}
        for name, data in sorted((daemon_files or {}).items()):
            if name not in DAEMON_FILES:
                raise ValueError(f"unknown daemon file {name!r}")
            info = zipfile.ZipInfo(f"daemon/{name}", stamp)  # type: ignore[arg-type]
            info.external_attr = (stat.S_IFREG | 0o600) << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            files.append({"path": f"daemon/{name}", "size": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
        meta = meta_of(files, agents)
        info = zipfile.ZipInfo(META, stamp)  # type: ignore[arg-type]
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        zf.writestr(info, orjson.dumps(meta, option=orjson.OPT_INDENT_2),
                    compress_type=zipfile.ZIP_DEFLATED)
    return meta, grown


def _add_member(zf: zipfile.ZipFile, src: AgentSource, rel: str, stamp: tuple[int, ...],
                room: int, stored: set[str]) -> Member | None:
    """Copy the file ``rel`` of ``src`` into ``zf`` as far as it reached when opened (a
    writer appending meanwhile adds nothing a restore could refuse); None if it is gone.
    Raises _Oversize if it held more than ``room`` bytes then, _Redo if it came out
    deflated like a decompression bomb (then named in ``stored`` on the next try)."""
    try:
        fd = safepath.open_confined(src.root, rel)
    except RecalldError:
        return None  # removed or swapped for a symlink since the walk: not ours to copy
    name = f"agents/{src.agent_id}/{rel}"
    info = zipfile.ZipInfo(name, stamp[:6])  # type: ignore[arg-type]
    info.external_attr = (stat.S_IFREG | 0o644) << 16
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as f:
        left = os.fstat(f.fileno()).st_size
        if left > room:
            raise _Oversize(left)
        store = name in stored or _deflates_like_a_bomb(f, left)
        info.compress_type = zipfile.ZIP_STORED if store else zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as member:
            while left > 0 and (chunk := f.read(min(COPY_CHUNK, left))):
                member.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                left -= len(chunk)
        # Taken after the read: the time restored is never older than the bytes.
        mtime_ns = os.fstat(f.fileno()).st_mtime_ns
    if inflates_like_a_bomb(info.file_size, info.compress_size):
        raise _Redo(name)
    return {"path": name, "size": size, "sha256": digest.hexdigest(), "mtime_ns": mtime_ns}


def inflates_like_a_bomb(file_size: int, compress_size: int, max_ratio: float = MAX_RATIO,
                         min_bytes: int = RATIO_MIN_BYTES) -> bool:
    """Whether a member of ``file_size`` bytes stored in ``compress_size`` is taken for a
    decompression bomb by a restore."""
    return file_size >= min_bytes and file_size > max_ratio * max(compress_size, 1)


def _deflates_like_a_bomb(f: IO[bytes], size: int) -> bool:
    """Whether the first ``size`` bytes of the file ``f`` (at its start, and left there)
    deflate so well that a restore would refuse them as a decompression bomb (with a
    margin: the zip's deflate stream may differ a little from this one)."""
    if size < RATIO_MIN_BYTES:
        return False
    enough = size / (MAX_RATIO / 2)  # this many deflated bytes: far from a bomb
    deflate = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, -15)
    deflated = 0
    left = size
    try:
        while deflated < enough and left > 0 and (chunk := f.read(min(COPY_CHUNK, left))):
            left -= len(chunk)
            deflated += len(deflate.compress(chunk))
        deflated += len(deflate.flush()) if deflated < enough else 0
    finally:
        f.seek(0)
    return deflated < enough
