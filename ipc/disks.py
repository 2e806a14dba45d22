"""Free space on the file systems recalld writes to, and the one rule for how little is
too little: ``recalld doctor`` measures with it, and so does the daemon each time
``daemon.status`` is asked (no polling between). Everything here blocks."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, TypedDict

#: Under this much free, writes are about to fail: a FAIL.
DISK_FAIL_BYTES = 100 << 20
#: Under this much free (or under a twentieth of the file system): a WARN.
DISK_WARN_BYTES = 1 << 30

Level = Literal["ok", "warn", "fail"]


class DiskSpace(TypedDict):
    """One file system: the folder measured (``path``), what of recalld's it holds
    (``data``, ``workspace <agent_id>``), its free and total bytes, and the level."""

    path: str
    holds: list[str]
    free_bytes: int
    total_bytes: int
    level: Level


def level(free_bytes: int, total_bytes: int) -> Level:
    """How ``free_bytes`` free of ``total_bytes`` rates."""
    if free_bytes < DISK_FAIL_BYTES:
        return "fail"
    if free_bytes < DISK_WARN_BYTES or free_bytes < total_bytes // 20:
        return "warn"
    return "ok"


def measure(targets: Iterable[tuple[str, Path]]) -> list[DiskSpace]:
    """Free space of each file system holding one of ``targets`` (what, where), once per
    file system (the nearest existing folder of a place not made yet). A place that cannot
    be reached (gone meanwhile, a link on the way not readable) is passed by: its own
    check says so."""
    by_device: dict[int, tuple[Path, list[str]]] = {}
    for what, target in targets:
        probe = target
        try:
            while not probe.exists() and probe != probe.parent:
                probe = probe.parent
            device = os.stat(probe).st_dev
        except OSError:
            continue
        by_device.setdefault(device, (probe, []))[1].append(what)
    out: list[DiskSpace] = []
    for probe, holds in by_device.values():
        try:
            usage = shutil.disk_usage(probe)
        except OSError:
            continue
        out.append({"path": str(probe), "holds": holds, "free_bytes": usage.free,
                    "total_bytes": usage.total, "level": level(usage.free, usage.total)})
    return out


def described(disk: DiskSpace) -> str:
    """``N MiB free of M MiB at PATH (what it holds)``."""
    holds = disk["holds"]
    others = [h for h in holds if h != "data"]
    where = ("" if holds == ["data"] else
             f" ({'data directory, ' if 'data' in holds else ''}{', '.join(others)})")
    return (f"{disk['free_bytes'] >> 20} MiB free of {disk['total_bytes'] >> 20} MiB at "
            f"{disk['path']}{where}")


def fix(disk: DiskSpace) -> str:
    """What to do when it is low."""
    return f"free space on the file system of {disk['path']}"
