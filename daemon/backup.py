"""Backup archives: write them, check them, and plan and apply a restore.

A backup is a zip file. ``meta.json`` names the format and version, the time, and each
agent with its workspace path and directory settings, and lists every other member with
its size and SHA-256. Members are ``agents/<agent_id>/<path in the workspace>``: the
Markdown (``daily_dir``, ``digest_dir``), sessions (``session_dir``, ``mem_session_dir``)
and resources (``resource_dir``); of ``metadata_dir`` the state that cannot be rebuilt
(:data:`RESUMABLE`: pending conversation turns, the inbox, the change logs of dream and
auto_memory runs), the rest
of it (derived, rebuilt from the Markdown) only on request. Members ``daemon/<name>``
carry the daemon's own files (:data:`DAEMON_FILES`: its config file and its record of
workspaces, whose model keys handed over by clients are secrets too; both with secrets
left out unless asked for, ``meta.json``'s ``secrets_left_out`` naming the record's).
Hidden files (``.name``: temp files, sync cookies) are left out.

A restore reads nothing it has not checked: :func:`open_checked` validates the whole
archive first (meta.json well-formed, every member named in it and vice versa, names
relative without ``..``, no symlink or special members, no duplicates, no encryption,
bounded sizes and compression ratios, checksums) and raises BackupInvalid (wire code -32012) on
the first problem, before anything is written. Writes go through :func:`atomic_write`, so each
restored file appears whole or not at all.

Everything here blocks on the file system; the RPC layer runs it in worker threads.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NotRequired, Protocol, TypedDict, cast

import orjson

from recalld.daemon import safepath
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.fsio import REAL, atomic_writer, ensure_dir
from recalld.daemon.watchrecords import ReconcileRecord
from recalld.ipc.errors import InvalidBackup, PathOutsideWorkspace, RecalldError

FORMAT = "recalld-backup"
VERSION = 1


class Member(TypedDict):
    """A file in the archive, as meta.json lists it."""

    path: str  # the zip member's name
    size: int
    sha256: str


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


class PlanSummary(TypedDict):
    """What restoring one agent would do (a dry run)."""

    agent_id: str
    root: str
    write: int
    overwrite: int
    remove: int
    removes: list[str]  # the first few
    skipped_derived: int


class Restored(TypedDict):
    """One agent restored (``backup.restore`` adds what happened around the copy)."""

    agent_id: str
    written: int
    removed: int
    skipped_derived: int
    opened: NotRequired[bool]  # the workspace was opened for the restore
    secrets_left_out: NotRequired[list[str]]
    warning: NotRequired[str]
    reconcile: NotRequired[ReconcileRecord]  # the rescan after the restore
META = "meta.json"
CONTENT_ROLES = ("daily_dir", "digest_dir", "session_dir", "mem_session_dir", "resource_dir")
DERIVED_ROLE = "metadata_dir"
#: Under ``metadata_dir``: what a restore needs to resume (never rebuilt from Markdown).
RESUMABLE = ("sessions/", "inbox/", "dream/runs/", "auto_memory/runs/")
DAEMON_FILES = ("config.toml", "workspaces.json")
_SECRET_VALUE = re.compile(
    r"""(?im)^([ \t]*[\w.-]*(?:api_key|apikey|token|secret|password)[\w.-]*[ \t]*=[ \t]*)"""
    r"""("[^"\n]*"|'[^'\n]*')""")
_INLINE_SECRET = re.compile(
    r"""(?i)([{,][ \t]*[\w.-]*(?:api_key|apikey|token|secret|password)[\w.-]*[ \t]*=[ \t]*)"""
    r"""("[^"\n]*"|'[^'\n]*')""")


def mask_secrets(config_text: str) -> str:
    """``config_text`` (TOML) with every secret-named string value emptied."""
    return _INLINE_SECRET.sub(r'\1""', _SECRET_VALUE.sub(r'\1""', config_text))
_COPY_CHUNK = 1 << 20


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
class BackupLimits:
    """What a restore accepts; anything beyond is refused as hostile or broken."""

    max_total_bytes: int = 16 << 30
    max_member_bytes: int = 4 << 30
    max_members: int = 500_000
    max_meta_bytes: int = 256 << 20
    # Text compresses ~3-10x; a member far beyond this ratio is a decompression bomb.
    max_ratio: float = 200.0
    ratio_min_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class AgentSource:
    """One workspace to back up: its root and directory settings by role."""

    agent_id: str
    root: Path
    dirs: Mapping[str, str]


class BackupInvalid(InvalidBackup):
    """The archive is not a recalld backup or fails a check; nothing was changed."""


def _refuse(path: Path, why: str) -> BackupInvalid:
    return BackupInvalid(f"refusing backup {path}: {why}", {"file": str(path), "reason": why})


# ------------------------------------------------------------------------------ writing


def _walk_files(root: Path, top: str) -> Iterator[str]:
    """Workspace-relative paths of the regular, non-hidden files under ``root/top``."""
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
                yield entry.path[len(prefix):].replace(os.sep, "/")


def roles_for(include_derived: bool) -> tuple[str, ...]:
    return (*CONTENT_ROLES, DERIVED_ROLE) if include_derived else CONTENT_ROLES


def source_files(source: AgentSource, include_derived: bool) -> list[str]:
    seen: dict[str, None] = {}
    tops = [d.strip("/") for d in (source.dirs.get(r) for r in roles_for(include_derived)) if d]
    meta = (source.dirs.get(DERIVED_ROLE) or "").strip("/")
    if not include_derived and meta:
        tops += [f"{meta}/{sub.rstrip('/')}" for sub in RESUMABLE]
    for top in tops:
        for rel in _walk_files(source.root, top):
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
) -> JsonObject:
    """Write a backup of ``sources`` (and ``daemon_files``, by name in
    :data:`DAEMON_FILES`) to ``out`` atomically; return its summary (meta minus the file
    list). ``secrets`` says whether the config in ``daemon_files`` kept its secrets,
    ``secrets_left_out`` which secrets of the workspace record were taken out, by agent.
    Files that vanish while being read are left out. ``progress`` gets a ``listing
    files`` phase, then ``phase`` with the files and bytes to write."""
    sources = list(sources)
    created = time.time()
    stamp = time.localtime(created)[:6]
    files: list[Member] = []
    agents: dict[str, AgentEntry] = {}
    ensure_dir(REAL, out.parent)
    # AtomicFile has no tell(): zipfile then streams members with data descriptors.
    progress.phase("listing files")
    listed: list[tuple[AgentSource, list[tuple[str, int]]]] = []
    for src in sources:
        sized = []
        for rel in source_files(src, include_derived):
            try:
                sized.append((rel, os.lstat(src.root / rel).st_size))
            except OSError:
                sized.append((rel, 0))
            progress.advance()
        listed.append((src, sized))
    progress.phase(phase, total=sum(len(s) for _, s in listed),
                   bytes_total=sum(n for _, s in listed for _, n in s))
    with atomic_writer(REAL, out) as raw, zipfile.ZipFile(
        cast(IO[bytes], raw), "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6
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
                   bytes=sum(f["size"] for f in files))
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
    info.compress_type = zipfile.ZIP_DEFLATED
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as f, zf.open(info, "w", force_zip64=True) as member:
        while chunk := f.read(_COPY_CHUNK):
            member.write(chunk)
            digest.update(chunk)
            size += len(chunk)
    return {"path": name, "size": size, "sha256": digest.hexdigest()}


# ----------------------------------------------------------------------------- checking


@dataclass(slots=True)
class CheckedBackup:
    """A validated archive: its meta and members, grouped by agent."""

    path: Path
    meta: JsonObject  # meta.json as read (its agents and files checked)
    members: dict[str, Member]  # by zip name
    by_agent: dict[str, list[str]] = field(default_factory=dict)
    #: Daemon files in the archive: name (in DAEMON_FILES) -> member.
    daemon: dict[str, str] = field(default_factory=dict)

    def daemon_file(self, name: str) -> bytes | None:
        """The verified bytes of daemon file ``name``, None if the archive has none."""
        member = self.daemon.get(name)
        if member is None:
            return None
        with zipfile.ZipFile(self.path) as zf:
            data = zf.read(member)
        if hashlib.sha256(data).hexdigest() != self.members[member]["sha256"]:
            raise _refuse(self.path, f"checksum mismatch for {member!r}")
        return data

    @property
    def agents(self) -> list[str]:
        return sorted(self.meta["agents"])

    def summary(self) -> JsonObject:
        out: JsonObject = {k: v for k, v in self.meta.items() if k != "files"}
        out.update(file=str(self.path), members=len(self.members),
                   bytes=sum(m["size"] for m in self.members.values()))
        return out


def _check_name(path: Path, name: str) -> list[str]:
    if not name or "\x00" in name or "\\" in name or name.startswith("/") or (
            len(name) > 1 and name[1] == ":"):
        raise _refuse(path, f"member {name!r} is not a relative path")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise _refuse(path, f"member {name!r} has an empty, '.' or '..' component")
    if len(name) > safepath.MAX_PATH_CHARS:
        raise _refuse(path, f"member name too long: {name[:80]!r}...")
    return parts


def _check_info(path: Path, info: zipfile.ZipInfo, limits: BackupLimits) -> None:
    mode = info.external_attr >> 16
    # No type bits (zips made elsewhere often carry permissions only) means a plain file.
    if info.is_dir() or (stat.S_IFMT(mode) and not stat.S_ISREG(mode)):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
        raise _refuse(path, f"member {info.filename!r} is {kind}")
    if info.flag_bits & 0x1:
        raise _refuse(path, f"member {info.filename!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _refuse(path, f"member {info.filename!r} uses an unsupported compression")
    if info.file_size > limits.max_member_bytes:
        raise _refuse(path, f"member {info.filename!r} is too large ({info.file_size} bytes)")
    if info.file_size >= limits.ratio_min_bytes and (
            info.file_size > limits.max_ratio * max(info.compress_size, 1)):
        raise _refuse(path, f"member {info.filename!r} expands {info.file_size} bytes from "
                            f"{info.compress_size}: a decompression bomb")


def _read_meta(path: Path, zf: zipfile.ZipFile, limits: BackupLimits) -> JsonObject:
    try:
        info = zf.getinfo(META)
    except KeyError:
        raise _refuse(path, "no meta.json: not a recalld backup") from None
    _check_info(path, info, limits)
    if info.file_size > limits.max_meta_bytes:
        raise _refuse(path, "meta.json is too large")
    with zf.open(info) as f:
        raw = f.read(limits.max_meta_bytes + 1)
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _refuse(path, f"meta.json is not JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _refuse(path, "meta.json does not describe a recalld backup")
    if meta.get("version") != VERSION:
        raise _refuse(path, f"unsupported backup version {meta.get('version')!r}")
    agents, files = meta.get("agents"), meta.get("files")
    if not isinstance(agents, dict) or not isinstance(files, list):
        raise _refuse(path, "meta.json lacks agents or files")
    for agent_id, info_ in agents.items():
        dirs = info_.get("dirs") if isinstance(info_, dict) else None
        if not isinstance(dirs, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in dirs.items()):
            raise _refuse(path, f"meta.json: agent {agent_id!r} lacks its directory settings")
    for entry in files:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
                and len(entry["sha256"]) == 64):
            raise _refuse(path, "meta.json has a malformed file entry")
    return meta


def open_checked(path: Path, limits: BackupLimits = BackupLimits(),
                 progress: ProgressSink = NO_PROGRESS) -> CheckedBackup:
    """Validate the whole archive at ``path`` (see the module docstring), reading every
    member once to verify its checksum (``progress``: a ``checking the archive`` phase
    counting members and bytes). Raises BackupInvalid; writes nothing."""
    try:
        return _open_checked(path, limits, progress)
    except BackupInvalid:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
            ValueError, OSError) as exc:
        raise _refuse(path, f"unreadable archive ({type(exc).__name__}: {exc})") from None


def _open_checked(path: Path, limits: BackupLimits, progress: ProgressSink) -> CheckedBackup:
    if not path.is_file():
        raise _refuse(path, "no such file")
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > limits.max_members + 1:
            raise _refuse(path, f"too many members ({len(infos)})")
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise _refuse(path, "duplicate member names")
        total = 0
        for info in infos:
            _check_name(path, info.filename)
            _check_info(path, info, limits)
            total += info.file_size
        if total > limits.max_total_bytes:
            raise _refuse(path, f"uncompressed size {total} exceeds {limits.max_total_bytes}")
        meta = _read_meta(path, zf, limits)
        listed: dict[str, Member] = {e["path"]: e for e in meta["files"]}
        if len(listed) != len(meta["files"]):
            raise _refuse(path, "meta.json lists a member twice")
        present = set(names) - {META}
        if present != set(listed):
            extra = sorted(present - set(listed))[:3]
            missing = sorted(set(listed) - present)[:3]
            raise _refuse(path, f"members and meta.json disagree (unlisted {extra}, "
                                f"missing {missing})")
        checked = CheckedBackup(path, meta, listed)
        progress.phase("checking the archive", total=len(listed),
                       bytes_total=sum(e["size"] for e in listed.values()))
        for info in infos:
            if info.filename == META:
                continue
            progress.advance(1, info.file_size)
            parts = info.filename.split("/")
            if parts[0] == "daemon" and len(parts) == 2 and parts[1] in DAEMON_FILES:
                entry = listed[info.filename]
                if entry["size"] != info.file_size or (
                        _member_sha256(zf, info) != entry["sha256"]):
                    raise _refuse(path, f"checksum mismatch for {info.filename!r}")
                checked.daemon[parts[1]] = info.filename
                continue
            if len(parts) < 3 or parts[0] != "agents" or parts[1] not in meta["agents"]:
                raise _refuse(path, f"member {info.filename!r} belongs to no listed agent")
            tops = [d.strip("/") + "/" for r, d in meta["agents"][parts[1]]["dirs"].items()
                    if r in (*CONTENT_ROLES, DERIVED_ROLE) and d.strip("/")]
            if not "/".join(parts[2:]).startswith(tuple(tops)):
                raise _refuse(path, f"member {info.filename!r} is outside the agent's "
                                    "directories")
            entry = listed[info.filename]
            if entry["size"] != info.file_size:
                raise _refuse(path, f"member {info.filename!r} size differs from meta.json")
            if _member_sha256(zf, info) != entry["sha256"]:
                raise _refuse(path, f"checksum mismatch for {info.filename!r}")
            checked.by_agent.setdefault(parts[1], []).append(info.filename)
    return checked


def _member_sha256(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    digest = hashlib.sha256()
    seen = 0
    with zf.open(info) as f:
        while chunk := f.read(_COPY_CHUNK):
            seen += len(chunk)
            if seen > info.file_size:  # never trust the header's size alone
                raise zipfile.BadZipFile(f"{info.filename} is longer than declared")
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------- restoring


@dataclass(slots=True)
class RestorePlan:
    """What restoring one agent does: members to write where, files to remove."""

    agent_id: str
    root: Path
    writes: dict[str, str]  # zip member -> workspace-relative target
    removes: list[str]
    skipped_derived: int


def plan_restore(backup: CheckedBackup, agent_id: str, root: Path,
                 dirs: Mapping[str, str]) -> RestorePlan:
    """Map ``agent_id``'s members onto the workspace at ``root`` with settings ``dirs``
    (directory names may differ from the backed-up workspace: they map by role).

    Files now in the content directories that the backup lacks are removed, so the
    workspace ends equal to the backup. Of ``metadata_dir`` only :data:`RESUMABLE` state is
    written (the rest is rebuilt).
    Raises PathOutsideWorkspace if a target would pass through a symlink.
    """
    saved_dirs: dict[str, str] = backup.meta["agents"][agent_id]["dirs"]
    roles = sorted(((r, d.strip("/")) for r, d in saved_dirs.items()
                    if r in (*CONTENT_ROLES, DERIVED_ROLE) and d.strip("/")),
                   key=lambda rd: -len(rd[1]))
    prefix = f"agents/{agent_id}/"
    writes: dict[str, str] = {}
    skipped = 0
    for name in backup.by_agent.get(agent_id, []):
        rel = name[len(prefix):]
        role = next((r for r, d in roles if rel.startswith(d + "/")), None)
        if role is None:
            raise _refuse(backup.path, f"member {name!r} is outside the agent's directories")
        if role == DERIVED_ROLE and not rel[len(dict(roles)[role]) + 1:].startswith(RESUMABLE):
            skipped += 1
            continue
        target_dir = dirs.get(role, "").strip("/")
        if not target_dir:
            raise _refuse(backup.path, f"the target workspace has no {role} for {name!r}")
        rest = rel[len(dict(roles)[role]) + 1:]
        target = f"{target_dir}/{rest}"
        safepath.split_relative(target)
        _check_no_symlink(root, target)
        writes[name] = target
    wanted = set(writes.values())
    removes = []
    for role in CONTENT_ROLES:
        top = dirs.get(role, "").strip("/")
        if top:
            removes += [rel for rel in _walk_files(root, top) if rel not in wanted]
    return RestorePlan(agent_id, root, writes, sorted(set(removes)), skipped)


def plan_summary(plan: RestorePlan, listed: int = 20) -> PlanSummary:
    """What ``plan`` would do, for a dry run: counts, and the first files it removes."""
    overwrite = sum(1 for rel in plan.writes.values() if (plan.root / rel).exists())
    return {"agent_id": plan.agent_id, "root": str(plan.root), "write": len(plan.writes),
            "overwrite": overwrite, "remove": len(plan.removes),
            "removes": plan.removes[:listed], "skipped_derived": plan.skipped_derived}


def _check_no_symlink(root: Path, rel: str) -> None:
    current = root
    for part in rel.split("/"):
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise PathOutsideWorkspace(f"restore target {rel} passes through a symlink")


def apply_restore(backup: CheckedBackup, plan: RestorePlan,
                  progress: ProgressSink = NO_PROGRESS) -> Restored:
    """Write ``plan``'s files atomically (checksums verified again while copying), then
    remove the files the backup lacks. Returns counts. ``progress``: a ``restoring
    <agent>`` phase counting files written and removed."""
    progress.phase(f"restoring {plan.agent_id}", total=len(plan.writes) + len(plan.removes),
                   bytes_total=sum(backup.members[n]["size"] for n in plan.writes))
    written = 0
    with zipfile.ZipFile(backup.path) as zf:
        for name, rel in sorted(plan.writes.items()):
            target = plan.root / rel
            _check_no_symlink(plan.root, rel)
            ensure_dir(REAL, target.parent)
            expected = backup.members[name]["sha256"]
            digest = hashlib.sha256()
            with zf.open(name) as src, atomic_writer(REAL, target) as dst:
                while chunk := src.read(_COPY_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                if digest.hexdigest() != expected:  # the file changed under us: publish nothing
                    raise _refuse(backup.path, f"checksum mismatch for {name!r} while restoring")
            written += 1
            progress.advance(1, backup.members[name]["size"])
    removed = 0
    for rel in plan.removes:
        progress.advance()
        _check_no_symlink(plan.root, rel)
        try:
            (plan.root / rel).unlink()
            removed += 1
        except FileNotFoundError:
            continue
    return {"agent_id": plan.agent_id, "written": written, "removed": removed,
            "skipped_derived": plan.skipped_derived}
