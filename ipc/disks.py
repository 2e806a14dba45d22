"""Free space on the file systems recalld writes to, and the one rule for how little is
too little: ``recalld doctor`` measures with it, and so does the daemon each time
``daemon.status`` is asked (no polling between). Everything here blocks."""

# Annotations are evaluated, not postponed: a TypedDict compiles each string
# annotation into a ForwardRef at import, which every client process would pay.
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, TypedDict

#: Under this much free, writes are about to fail: a FAIL.
DISK_FAIL_BYTES = 100 << 20
#: Under this much free (or under a twentieth of the file system): a WARN.
DISK_WARN_BYTES = 1 << 30
#: Under this many inodes free, new notes and folders are about to be refused (ENOSPC,
#: bytes to spare or not): a FAIL; under a twentieth of them, a WARN.
DISK_FAIL_INODES = 1000

Level = Literal["ok", "warn", "fail"]


class DiskSpace(TypedDict):
    """One file system: the folder measured (``path``), what of recalld's it holds
    (``data``, ``workspace <agent_id>``), its free and total bytes and inodes (0 total:
    it counts none), whether it is mounted read-only, and the level."""

    path: str
    holds: list[str]
    free_bytes: int
    total_bytes: int
    free_inodes: int
    total_inodes: int
    read_only: bool
    level: Level


def level(free_bytes: int, total_bytes: int) -> Level:
    """How ``free_bytes`` free of ``total_bytes`` rates."""
    if free_bytes < DISK_FAIL_BYTES:
        return "fail"
    if free_bytes < DISK_WARN_BYTES or free_bytes < total_bytes // 20:
        return "warn"
    return "ok"


def inodes_level(free_inodes: int, total_inodes: int) -> Level:
    """How ``free_inodes`` free of ``total_inodes`` rates (0 total: not counted, ok)."""
    if not total_inodes:
        return "ok"
    if free_inodes < DISK_FAIL_INODES:
        return "fail"
    return "warn" if free_inodes < total_inodes // 20 else "ok"


def _worse(a: Level, b: Level) -> Level:
    return a if ("ok", "warn", "fail").index(a) >= ("ok", "warn", "fail").index(b) else b


def measure(targets: Iterable[tuple[str, Path]]) -> list[DiskSpace]:
    """Free space of each file system holding one of ``targets`` (what, where), once per
    file system and mount flag (a read-only bind mount of it apart), at the nearest
    existing folder of a place not made yet. A place that cannot be reached (gone
    meanwhile, a link on the way not readable) is passed by: its own check says so."""
    by_place: dict[tuple[int, bool], tuple[Path, os.statvfs_result, list[str]]] = {}
    for what, target in targets:
        probe = target
        try:
            while not probe.exists() and probe != probe.parent:
                probe = probe.parent
            device, fs = os.stat(probe).st_dev, os.statvfs(probe)
        except OSError:
            continue
        key = (device, bool(fs.f_flag & os.ST_RDONLY))
        holds = by_place.setdefault(key, (probe, fs, []))[2]
        if what not in holds:
            holds.append(what)
    out: list[DiskSpace] = []
    for (_, read_only), (probe, fs, holds) in by_place.items():
        free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize  # as df says
        rated = _worse(level(free, total), inodes_level(fs.f_favail, fs.f_files))
        out.append({"path": str(probe), "holds": holds, "free_bytes": free,
                    "total_bytes": total, "free_inodes": fs.f_favail,
                    "total_inodes": fs.f_files, "read_only": read_only,
                    "level": "fail" if read_only else rated})
    return out


def _holds(disk: DiskSpace) -> str:
    holds = disk["holds"]
    others = [h for h in holds if h != "data"]
    return ("" if holds == ["data"] else
            f" ({'data directory, ' if 'data' in holds else ''}{', '.join(others)})")


def described(disk: DiskSpace) -> str:
    """``N MiB free of M MiB at PATH (what it holds)``, led by the inodes when few."""
    free, total = disk.get("free_inodes", 0), disk.get("total_inodes", 0)
    inodes = ""
    if inodes_level(free, total) != "ok":
        inodes = (f"{free} inode(s) free" if free else "no inode free") + f" (of {total}), "
    return (f"{inodes}{disk['free_bytes'] >> 20} MiB free of {disk['total_bytes'] >> 20} MiB "
            f"at {disk['path']}{_holds(disk)}")


def problem(disk: DiskSpace) -> tuple[str, str]:
    """What is wrong with a file system not rated ok, and the fix."""
    if disk.get("read_only"):
        return (f"the file system of {disk['path']}{_holds(disk)} is read-only",
                f"remount the file system of {disk['path']} read-write")
    return (f"low on disk space: {described(disk)}",
            f"free space on the file system of {disk['path']}")
