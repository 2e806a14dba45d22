"""The day index ``<daily_dir>/<date>/index.md``.

The day index lists each note of a day folder with its description. It is derived from
the notes there, so every host makes its own: :func:`refresh_day_index` runs after a
local ``auto_memory`` run and, in a shared workspace, after notes of that day arrive from
the other hosts where the day has an index here (:func:`refresh_days`); it is never
replicated (ADR 0017, addendum), since two hosts writing theirs from different notes
would conflict every day. A day left with no notes has its index removed, and its
folder if that leaves it empty.

Conflict copies are not listed (:mod:`notenames`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

import trio

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.index.frontmatter_edit import render_frontmatter
from recalld.daemon.memory.confined import rmdir_confined, unlink_confined
from recalld.daemon.memory.fileops import (
    DAY_INDEX,
    FileOps,
    NotUtf8,
    WritePolicy,
    read_confined,
)
from recalld.daemon.memory.notenames import is_daily_note_name, is_day_index, note_day
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import RecalldError

log = logging.getLogger(__name__)

async def refresh_day_index(ws: Workspace, date: str, ops: FileOps) -> bool:
    """Rewrite ``<daily_dir>/<date>/index.md`` from the day's notes; True if it changed.
    A day with no notes left has no index (nor folder, if nothing else is in it)."""
    folder = ops.day_folder(date)

    def collect() -> list[tuple[str, str]]:
        try:
            names = sorted((ws.root / folder).iterdir())
        except FileNotFoundError:
            return []
        out: list[tuple[str, str]] = []
        for path in names:
            if (not is_daily_note_name(path.name) or not path.is_file()
                    or path.is_symlink()):
                continue
            try:
                text = read_confined(ws.root, f"{folder}/{path.name}", strict=True) or ""
            except NotUtf8:  # listed without its description, never as U+FFFD
                text = ""
            desc = parse_frontmatter(text)[0].get("description")
            # One line per note, whatever lines the model put in its description.
            out.append((path.name, " ".join(str(desc).split()) if desc else ""))
        return out

    notes = await trio.to_thread.run_sync(collect)
    if not notes:
        return await _drop_index(ws, folder, ops.lock, collect)
    body = [f"# {date}", ""]
    for name, desc in notes:
        body.append(f"- [{name[:-3]}]({name})" + (f": {desc}" if desc else ""))
    text = render_frontmatter({"name": f"index {date}",
                               "description": f"daily notes of {date}"}) + "\n".join(body) + "\n"
    index_ops = FileOps(root=ops.root, settings=ops.settings,
                        policy=WritePolicy((ws.settings.daily_dir,), (".md",)),
                        lock=ops.lock, sync=ops.sync, writes=ops.writes)
    result = await index_ops.write(f"{folder}/{DAY_INDEX}", text)
    ops.changes.extend(index_ops.changes)
    return result.changed


async def _drop_index(ws: Workspace, folder: str, lock: trio.Lock,
                      collect: Callable[[], list[tuple[str, str]]]) -> bool:
    """Remove the index of a day folder whose notes are all gone, and the folder if that
    leaves it empty (as the folder of any other note deleted); True if the index went.
    Under the write lock, so a note written meanwhile keeps its folder and index."""

    def drop() -> bool:
        index = f"{folder}/{DAY_INDEX}"
        if collect() or not os.path.lexists(ws.root / index):
            return False
        unlink_confined(ws.root, index)
        rmdir_confined(ws.root, folder)
        return True

    async with lock:
        return await trio.to_thread.run_sync(drop)


async def refresh_days(ws: Workspace, paths: Iterable[str]) -> None:
    """Rewrite the day index of each day folder that ``paths`` (notes another host
    wrote, deleted or changed) lie in, where this host has one (an ``auto_memory`` run
    of that day here made it); one that cannot be written is logged and left."""
    daily_dir = ws.settings.daily_dir
    folder = "/".join(safepath.split_relative(daily_dir))
    named = {d for p in paths if not is_day_index(p, daily_dir)
             and (d := note_day(p, daily_dir)) is not None}

    def indexed() -> list[str]:
        return sorted(d for d in named if os.path.lexists(ws.root / folder / d / DAY_INDEX))

    days = await trio.to_thread.run_sync(indexed) if named else []
    if not days:
        return
    # Not waiting for the index to take each in: the feed's catch-up goes on meanwhile.
    ops = FileOps(root=ws.root, settings=ws.settings, policy=WritePolicy((daily_dir,), (".md",)),
                  lock=ws.services.write_lock, sync=None, writes=ws.writes)
    for day in days:
        try:
            await refresh_day_index(ws, day, ops)
        except (OSError, RecalldError) as exc:
            log.warning("the day index of %s was not refreshed: %s", day, exc)
