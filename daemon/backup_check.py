"""Checking a backup archive (the format is ``backup.py``'s) before anything is restored.

A restore reads nothing it has not checked: :func:`open_checked` validates the whole
archive first (meta.json well-formed, every member named in it and vice versa, names
relative without ``..``, no symlink or special members (empty folder entries, which
re-packing tools add, are skipped), no duplicates, no encryption,
bounded sizes and compression ratios, checksums) and raises BackupInvalid (wire code -32012) on
the first problem, before anything is written.

Everything here blocks on the file system; the RPC layer runs it in worker threads.
"""

from __future__ import annotations

import errno
import hashlib
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import orjson
import zstandard

from recalld.daemon import safepath
from recalld.daemon.backup import (
    CONTENT_ROLES,
    COPY_CHUNK,
    DAEMON_FILES,
    DERIVED_ROLE,
    FORMAT,
    MAX_MEMBER_BYTES,
    MAX_MEMBER_NAME_CHARS,
    MAX_RATIO,
    MAX_TOTAL_BYTES,
    META,
    NO_PROGRESS,
    RATIO_MIN_BYTES,
    VERSION,
    ProgressSink,
    inflates_like_a_bomb,
)
from recalld.daemon.backup_meta import Member
from recalld.daemon.config_rules import AGENT_ID_RULE, valid_agent_id
from recalld.daemon.jsontypes import JsonObject
from recalld.ipc.errors import InvalidBackup


@dataclass(frozen=True, slots=True)
class BackupLimits:
    """What a restore accepts; anything beyond is refused as hostile or broken."""

    max_total_bytes: int = MAX_TOTAL_BYTES
    max_member_bytes: int = MAX_MEMBER_BYTES
    max_members: int = 500_000
    max_meta_bytes: int = 256 << 20
    # Text compresses ~3-10x; a member far beyond this ratio is a decompression bomb
    # (a backup stores one that deflates that well uncompressed).
    max_ratio: float = MAX_RATIO
    ratio_min_bytes: int = RATIO_MIN_BYTES


class BackupInvalid(InvalidBackup):
    """The archive is not a recalld backup or fails a check; nothing was changed."""


def refuse(path: Path, why: str) -> BackupInvalid:
    return BackupInvalid(f"refusing backup {path}: {why}", {"file": str(path), "reason": why})


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
            raise refuse(self.path, f"checksum mismatch for {member!r}")
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
        raise refuse(path, f"member {name!r} is not a relative path")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise refuse(path, f"member {name!r} has an empty, '.' or '..' component")
    if len(name) > MAX_MEMBER_NAME_CHARS:
        raise refuse(path, f"member name too long: {name[:80]!r}...")
    if any(len(p.encode("utf-8", "surrogatepass")) > safepath.MAX_NAME_BYTES for p in parts):
        shown = name if len(name) <= 120 else name[:117] + "..."
        raise refuse(path, f"member {shown!r} has a part longer than a file name may be "
                           f"({safepath.MAX_NAME_BYTES} bytes)")
    return parts


def file_in_the_way(paths: Iterable[str]) -> tuple[str, str] | None:
    """Two of the relative ``paths`` that cannot both be files: the first where the
    second needs a folder, or the same path twice. None when all can be written."""
    seen: set[str] = set()
    for rel in paths:
        if rel in seen:
            return rel, rel
        seen.add(rel)
    for rel in sorted(seen):
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if (folder := "/".join(parts[:depth])) in seen:
                return folder, rel
    return None


def _folder_entry(path: Path, info: zipfile.ZipInfo) -> bool:
    """Whether ``info`` is a folder entry, as ``zip -r`` and file managers add for each
    folder when a backup is unpacked and packed again: it holds nothing and is skipped (a
    restore makes the folders its files need). One holding data, named unsafely or of
    another file type is refused."""
    if not info.filename.endswith("/"):
        return False
    _check_name(path, info.filename[:-1])
    mode = info.external_attr >> 16
    if info.file_size or (stat.S_IFMT(mode) and not stat.S_ISDIR(mode)):
        raise refuse(path, f"member {info.filename!r} is named as a folder but is not an "
                           "empty folder entry")
    return True


def _check_info(path: Path, info: zipfile.ZipInfo, limits: BackupLimits) -> None:
    mode = info.external_attr >> 16
    # No type bits (zips made elsewhere often carry permissions only) means a plain file.
    if info.is_dir() or (stat.S_IFMT(mode) and not stat.S_ISREG(mode)):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
        raise refuse(path, f"member {info.filename!r} is {kind}")
    if info.flag_bits & 0x1:
        raise refuse(path, f"member {info.filename!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise refuse(path, f"member {info.filename!r} uses an unsupported compression")
    if info.file_size > limits.max_member_bytes:
        raise refuse(path, f"member {info.filename!r} is too large ({info.file_size} bytes)")
    if inflates_like_a_bomb(info.file_size, info.compress_size, limits.max_ratio,
                            limits.ratio_min_bytes):
        raise refuse(path, f"member {info.filename!r} expands {info.file_size} bytes from "
                            f"{info.compress_size}: a decompression bomb")


def _read_meta(path: Path, zf: zipfile.ZipFile, limits: BackupLimits) -> JsonObject:
    try:
        info = zf.getinfo(META)
    except KeyError:
        raise refuse(path, "no meta.json: not a recalld backup") from None
    _check_info(path, info, limits)
    if info.file_size > limits.max_meta_bytes:
        raise refuse(path, "meta.json is too large")
    with zf.open(info) as f:
        raw = f.read(limits.max_meta_bytes + 1)
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise refuse(path, f"meta.json is not JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise refuse(path, "meta.json does not describe a recalld backup")
    version, made_by = meta.get("version"), meta.get("recalld_version")
    if type(version) is not int or version != VERSION:
        by = f" (written by recalld {made_by})" if isinstance(made_by, str) and made_by else ""
        if type(version) is int and version > VERSION:  # a later recalld's archive
            raise refuse(path, f"backup format version {version}{by} is newer than this "
                         f"recalld reads ({VERSION}): upgrade recalld to restore it")
        raise refuse(path, f"unsupported backup version {version!r}{by}")
    agents, files = meta.get("agents"), meta.get("files")
    if not isinstance(agents, dict) or not isinstance(files, list):
        raise refuse(path, "meta.json lacks agents or files")
    for agent_id, info_ in agents.items():
        if not valid_agent_id(agent_id):
            raise refuse(path, f"meta.json names an agent {agent_id!r} that is no valid "
                               f"agent id ({AGENT_ID_RULE})")
        dirs = info_.get("dirs") if isinstance(info_, dict) else None
        if not isinstance(dirs, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in dirs.items()):
            raise refuse(path, f"meta.json: agent {agent_id!r} lacks its directory settings")
        _check_fields(path, info_, _AGENT_FIELDS, f"agent {agent_id!r}'s ")
    _check_fields(path, meta, _META_FIELDS)
    for entry in files:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and _count(entry.get("size")) and isinstance(entry.get("sha256"), str)
                and len(entry["sha256"]) == 64
                and _time_ns(entry.get("mtime_ns", 0))):
            raise refuse(path, "meta.json has a malformed file entry")
    return meta


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


#: The optional fields of meta.json (an archive of old may lack them), each with what
#: its value must be: a restore reads ``secrets`` and the ``*secrets_left_out``, every
#: summary the rest.
_META_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "created": ("a time in seconds", lambda v: isinstance(v, int | float)
                and not isinstance(v, bool)),
    "recalld_version": ("a string", lambda v: isinstance(v, str)),
    "note": ("a string", lambda v: isinstance(v, str)),
    "include_derived": ("true or false", lambda v: isinstance(v, bool)),
    "secrets": ("true or false", lambda v: isinstance(v, bool)),
    "daemon": (f"a list of daemon file names ({', '.join(DAEMON_FILES)})",
               lambda v: _strings(v) and set(cast(list[str], v)) <= set(DAEMON_FILES)),
    "secrets_left_out": ("an object of agent ids to lists of keys", lambda v: isinstance(
        v, dict) and all(isinstance(k, str) and _strings(x) for k, x in v.items())),
    "config_secrets_left_out": ("a list of keys", _strings),
}
_AGENT_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "path": ("a string", lambda v: isinstance(v, str)),
    "files": ("a count of files", _count),
}


def _check_fields(path: Path, doc: JsonObject,
                  fields: dict[str, tuple[str, Callable[[object], bool]]],
                  whose: str = "") -> None:
    for key, (what, valid) in fields.items():
        if key in doc and not valid(doc[key]):
            shown = orjson.dumps(doc[key]).decode()
            raise refuse(path, f"meta.json: {whose}{key!r} is {shown[:60]}, not {what}")


def _time_ns(value: object) -> bool:
    """Whether ``value`` is a file time a restore can set (before 1970 too)."""
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63


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
        raise refuse(path, f"unreadable archive ({type(exc).__name__}: {exc})") from None


def _open_checked(path: Path, limits: BackupLimits, progress: ProgressSink) -> CheckedBackup:
    try:
        mode = path.stat().st_mode
    except OSError as exc:  # a name longer than a file name may be: no archive has it
        raise refuse(path, "no such file" if exc.errno in (errno.ENOENT, errno.ENAMETOOLONG)
                     else f"cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise refuse(path, "not a regular file")
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > limits.max_members + 1:
            raise refuse(path, f"too many members ({len(infos)})")
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise refuse(path, "duplicate member names")
        total = 0
        folders = {i.filename for i in infos if _folder_entry(path, i)}
        infos = [i for i in infos if i.filename not in folders]
        for info in infos:
            _check_name(path, info.filename)
            _check_info(path, info, limits)
            total += info.file_size
        if total > limits.max_total_bytes:
            raise refuse(path, f"uncompressed size {total} exceeds {limits.max_total_bytes}")
        meta = _read_meta(path, zf, limits)
        listed: dict[str, Member] = {e["path"]: e for e in meta["files"]}
        if len(listed) != len(meta["files"]):
            raise refuse(path, "meta.json lists a member twice")
        present = set(names) - {META} - folders
        if present != set(listed):
            extra = sorted(present - set(listed))[:3]
            missing = sorted(set(listed) - present)[:3]
            raise refuse(path, f"members and meta.json disagree (unlisted {extra}, "
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
                    raise refuse(path, f"checksum mismatch for {info.filename!r}")
                checked.daemon[parts[1]] = info.filename
                continue
            if len(parts) < 3 or parts[0] != "agents" or parts[1] not in meta["agents"]:
                raise refuse(path, f"member {info.filename!r} belongs to no listed agent")
            tops = [d.strip("/") + "/" for r, d in meta["agents"][parts[1]]["dirs"].items()
                    if r in (*CONTENT_ROLES, DERIVED_ROLE) and d.strip("/")]
            if not "/".join(parts[2:]).startswith(tuple(tops)):
                raise refuse(path, f"member {info.filename!r} is outside the agent's "
                                    "directories")
            entry = listed[info.filename]
            if entry["size"] != info.file_size:
                raise refuse(path, f"member {info.filename!r} size differs from meta.json")
            if _member_sha256(zf, info) != entry["sha256"]:
                raise refuse(path, f"checksum mismatch for {info.filename!r}")
            meta_dir = meta["agents"][parts[1]]["dirs"].get(DERIVED_ROLE, "").strip("/")
            if meta_dir and info.filename.endswith(".zst") and "/".join(parts[2:]).startswith(
                    meta_dir + "/"):  # state the daemon reads (a resource is only copied)
                _check_frame(path, zf, info, limits)
            checked.by_agent.setdefault(parts[1], []).append(info.filename)
    clash = file_in_the_way(checked.members)
    if clash is not None:
        raise refuse(path, f"member {clash[0]!r} is a file where {clash[1]!r} needs a folder")
    return checked


def _check_frame(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo,
                 limits: BackupLimits) -> None:
    """Refuse a zstd member (a catalog the restore writes back) that would inflate past
    the archive's limits when the daemon reads it: the zip's own ratio check sees only
    the compressed bytes. Its frames are inflated as far as the limit (ReMe's files are
    streamed: their frames do not declare their size, and may be several)."""
    cap = min(limits.max_member_bytes,
              max(limits.ratio_min_bytes, int(limits.max_ratio * max(info.file_size, 1))))
    inflated = 0
    with zf.open(info) as f, zstandard.ZstdDecompressor().stream_reader(
            f, read_across_frames=True) as frames:
        try:
            while chunk := frames.read(COPY_CHUNK):
                inflated += len(chunk)
                if inflated > cap:
                    raise refuse(path, f"member {info.filename!r} inflates to more than "
                                       f"{cap} bytes from {info.file_size}: a decompression "
                                       "bomb")
        except zstandard.ZstdError:
            return  # not (all) zstd: read as damaged (and started afresh) by the daemon


def _member_sha256(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    digest = hashlib.sha256()
    seen = 0
    with zf.open(info) as f:
        while chunk := f.read(COPY_CHUNK):
            seen += len(chunk)
            if seen > info.file_size:  # never trust the header's size alone
                raise zipfile.BadZipFile(f"{info.filename} is longer than declared")
            digest.update(chunk)
    return digest.hexdigest()


def peek(path: Path) -> JsonObject:
    """meta.json's summary without verifying members (:func:`open_checked` does that)."""
    if not path.is_file():  # a FIFO would block the open, a device link read forever
        return {"error": "not a regular file"}
    try:
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo(META)
            if info.file_size > BackupLimits().max_meta_bytes:
                return {"error": "meta.json too large"}
            meta = orjson.loads(zf.read(info))
    except (KeyError, OSError, ValueError, zipfile.BadZipFile):
        return {"error": "not a readable recalld backup"}
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(
            meta.get("agents"), dict) or not isinstance(meta.get("files"), list):
        return {"error": "meta.json does not describe a recalld backup"}
    created, note = meta.get("created"), meta.get("note")
    return {"created": created if isinstance(created, int | float) and not isinstance(
                created, bool) and 0 <= created < 1e11 else None,  # 1e11: year 5138
            "agents": sorted(meta["agents"]), "members": len(meta["files"]),
            "note": note if isinstance(note, str) else ""}


def list_backups(folder: Path) -> list[JsonObject]:
    """The ``*.zip`` files of ``folder``, each with its size, time and :func:`peek`'s
    summary, or the reason it cannot be used."""
    out: list[JsonObject] = []
    for entry in sorted(folder.glob("*.zip")):
        if not safepath.is_utf8(entry.name):
            # No answer can carry the name, and no restore could name it back.
            shown = str(entry).encode("utf-8", "surrogateescape").decode("utf-8",
                                                                         "backslashreplace")
            out.append({"file": shown, "name": Path(shown).name, "size": 0,
                        "modified_at": None, "error": "its name is not valid UTF-8: "
                        "rename it (convmv -f latin1 -t utf8 --notest FILE)"})
            continue
        item: JsonObject = {"file": str(entry), "name": entry.name}
        try:
            st = entry.stat()
        except OSError as exc:  # a link to a drive not mounted, one removed meanwhile
            out.append({**item, "size": 0, "modified_at": None,
                        "error": f"cannot be read: {exc.strerror}"})
            continue
        item.update({"size": st.st_size, "modified_at": st.st_mtime})
        item.update(peek(entry))
        out.append(item)
    return out
