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
``secrets_left_out`` naming the record's).
Hidden files (``.name``: temp files, sync cookies) are left out.

Checking an archive is ``backup_check.py``'s, planning and applying a restore
``backup_restore.py``'s.

Everything here blocks on the file system; the RPC layer runs it in worker threads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NotRequired, Protocol, TypedDict, cast

import orjson

from recalld.daemon import safepath
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.fsio import REAL, atomic_writer, ensure_dir
from recalld.ipc.errors import InvalidParams, RecalldError

log = logging.getLogger(__name__)

FORMAT = "recalld-backup"
VERSION = 1


class Member(TypedDict):
    """A file in the archive, as meta.json lists it."""

    path: str  # the zip member's name
    size: int
    sha256: str
    #: The file's modification time (a restore sets it again: ReMe's records of what
    #: its dream and auto_resource read know a file by it).
    mtime_ns: NotRequired[int]


class AgentEntry(TypedDict):
    path: str  # the workspace's root when backed up
    dirs: dict[str, str]  # directory settings by role
    files: int


class BackupMeta(TypedDict):
    """meta.json of an archive."""

    format: str
    version: int
    created: float
    recalld_version: str
    include_derived: bool
    note: str
    agents: dict[str, AgentEntry]
    files: list[Member]
    daemon: list[str]  # daemon files, by name
    secrets: bool  # whether the config kept its secrets
    secrets_left_out: dict[str, list[str]]  # by agent


META = "meta.json"
CONTENT_ROLES = ("daily_dir", "digest_dir", "session_dir", "mem_session_dir", "resource_dir")
DERIVED_ROLE = "metadata_dir"
#: Under ``metadata_dir``: what a restore needs to resume (never rebuilt from Markdown).
#: Without ``catalog/`` every resource would be summarized (and a file directly in
#: ``resource_dir`` dated) anew, and every daily note dreamed again, by the chat model;
#: without ReMe's ``file_catalog/`` (QwenPaw's workspaces), so would those ReMe did.
RESUMABLE = ("sessions/", "inbox/", "dream/runs/", "auto_memory/runs/", "catalog/",
             "file_catalog/")
DAEMON_FILES = ("config.toml", "workspaces.json")


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


# ------------------------------------------------------------------------------ writing


def walk_files(root: Path, top: str, passed_by: list[str] | None = None) -> Iterator[str]:
    """Workspace-relative paths of the regular, non-hidden files under ``root/top``; one
    whose name is not UTF-8 is passed by (and added to ``passed_by``, shown escaped)."""
    stack = [root / top]
    prefix = str(root) + os.sep
    while stack:
        current = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                rel = entry.path[len(prefix):].replace(os.sep, "/")
                if safepath.is_utf8(rel):
                    yield rel
                else:  # no zip member name can hold it (nor did the index)
                    log.warning("backup passes by %s: its name is not valid UTF-8",
                                safepath.shown(str(root / rel)))
                    if passed_by is not None:
                        passed_by.append(safepath.shown(rel))


def roles_for(include_derived: bool) -> tuple[str, ...]:
    return (*CONTENT_ROLES, DERIVED_ROLE) if include_derived else CONTENT_ROLES


def source_files(source: AgentSource, include_derived: bool,
                 passed_by: list[str] | None = None) -> list[str]:
    seen: dict[str, None] = {}
    tops = [d.strip("/") for d in (source.dirs.get(r) for r in roles_for(include_derived)) if d]
    meta = (source.dirs.get(DERIVED_ROLE) or "").strip("/")
    if not include_derived and meta:
        tops += [f"{meta}/{sub.rstrip('/')}" for sub in RESUMABLE]
    for top in tops:
        for rel in walk_files(source.root, top, passed_by):
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
    progress: ProgressSink = NO_PROGRESS,
    phase: str = "writing the archive",
    whole: bool = False,
) -> JsonObject:
    """Write a backup of ``sources`` (and ``daemon_files``, by name in
    :data:`DAEMON_FILES`) to ``out`` atomically; return its summary (meta minus the file
    list). ``secrets`` says whether the config in ``daemon_files`` kept its secrets,
    ``secrets_left_out`` which secrets of the workspace record were taken out, by agent.
    Files that vanish while being read are left out, and so are files whose names are
    not UTF-8 (``passed_by`` of the summary, by agent) and files larger than a restore
    takes (``too_large``; with ``whole``, for a snapshot a restore could not do without,
    InvalidParams instead). InvalidParams, before anything is written, when the files
    add up to more than a restore takes. ``progress`` gets a ``listing files`` phase,
    then ``phase`` with the files and bytes to write."""
    sources = list(sources)
    created = time.time()
    stamp = time.localtime(created)[:6]
    files: list[Member] = []
    agents: dict[str, AgentEntry] = {}
    ensure_dir(REAL, out.parent)
    # AtomicFile has no tell(): zipfile then streams members with data descriptors.
    progress.phase("listing files")
    listed: list[tuple[AgentSource, list[tuple[str, int]]]] = []
    passed_by: dict[str, list[str]] = {}
    too_large: dict[str, list[str]] = {}
    for src in sources:
        sized = []
        unnamed: list[str] = []
        for rel in source_files(src, include_derived, unnamed):
            try:
                size = os.lstat(src.root / rel).st_size
            except OSError:
                size = 0
            progress.advance()
            if size <= MAX_MEMBER_BYTES:
                sized.append((rel, size))
                continue
            why = f"{src.root / rel} has {size} bytes, more than a restore takes of a file"
            if whole:
                raise InvalidParams(f"cannot back up {src.agent_id}: {why} "
                                    f"({MAX_MEMBER_BYTES}); move it out of the workspace")
            log.warning("backup leaves out %s", why)
            too_large.setdefault(src.agent_id, []).append(rel)
        listed.append((src, sized))
        if unnamed:
            passed_by[src.agent_id] = unnamed
    total = sum(n for _, s in listed for _, n in s)
    if total > MAX_TOTAL_BYTES:
        raise InvalidParams(f"the workspaces hold {total} bytes, more than a restore takes "
                            f"from one archive ({MAX_TOTAL_BYTES}): back up fewer agents at "
                            "a time (--agent)")
    progress.phase(phase, total=sum(len(s) for _, s in listed),
                   bytes_total=sum(n for _, s in listed for _, n in s))
    # Private: the archive holds every file of the workspaces (and with ``secrets``, the
    # model keys), wherever ``out`` puts it.
    with atomic_writer(REAL, out, private=True) as raw, zipfile.ZipFile(
        cast(IO[bytes], raw), "w", compression=zipfile.ZIP_DEFLATED,
        compresslevel=COMPRESS_LEVEL
    ) as zf:
        for src, sized in listed:
            count = 0
            for rel, size in sized:
                entry = _add_member(zf, src, rel, stamp)
                progress.advance(1, size)
                if entry is not None:
                    files.append(entry)
                    count += 1
            agents[src.agent_id] = {"path": str(src.root), "dirs": dict(src.dirs), "files": count}
        for name, data in sorted((daemon_files or {}).items()):
            if name not in DAEMON_FILES:
                raise ValueError(f"unknown daemon file {name!r}")
            info = zipfile.ZipInfo(f"daemon/{name}", stamp)
            info.external_attr = (stat.S_IFREG | 0o600) << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            files.append({"path": f"daemon/{name}", "size": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
        meta: BackupMeta = {
            "format": FORMAT, "version": VERSION, "created": created,
            "recalld_version": recalld_version, "include_derived": include_derived,
            "note": note, "agents": agents, "files": files,
            "daemon": sorted(daemon_files or {}), "secrets": secrets,
            "secrets_left_out": dict(secrets_left_out or {}),
        }
        info = zipfile.ZipInfo(META, stamp)
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        zf.writestr(info, orjson.dumps(meta, option=orjson.OPT_INDENT_2),
                    compress_type=zipfile.ZIP_DEFLATED)
    summary: JsonObject = {k: v for k, v in meta.items() if k != "files"}
    summary.update(file=str(out), size=out.stat().st_size, members=len(files),
                   bytes=sum(f["size"] for f in files), passed_by=passed_by,
                   too_large=too_large)
    return summary


def _add_member(zf: zipfile.ZipFile, src: AgentSource, rel: str,
                stamp: tuple[int, ...]) -> Member | None:
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
        info.compress_type = (zipfile.ZIP_STORED if _deflates_like_a_bomb(f)
                              else zipfile.ZIP_DEFLATED)
        with zf.open(info, "w", force_zip64=True) as member:
            mtime_ns = os.fstat(f.fileno()).st_mtime_ns
            while chunk := f.read(COPY_CHUNK):
                member.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    return {"path": name, "size": size, "sha256": digest.hexdigest(), "mtime_ns": mtime_ns}


def _deflates_like_a_bomb(f: IO[bytes]) -> bool:
    """Whether the file ``f`` (at its start, and left there) deflates so well that a
    restore would refuse it as a decompression bomb (with a margin: the zip's deflate
    stream may differ a little from this one)."""
    size = os.fstat(f.fileno()).st_size
    if size < RATIO_MIN_BYTES:
        return False
    enough = size / (MAX_RATIO / 2)  # this many deflated bytes: far from a bomb
    deflate = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, -15)
    deflated = 0
    try:
        while deflated < enough and (chunk := f.read(COPY_CHUNK)):
            deflated += len(deflate.compress(chunk))
        deflated += len(deflate.flush()) if deflated < enough else 0
    finally:
        f.seek(0)
    return deflated < enough
