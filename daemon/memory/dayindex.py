"""The day index ``<daily_dir>/<date>/index.md``.

The day index lists each note of a day folder with its description, made again by
:func:`refresh_day_index` after an ``auto_memory`` run.

Conflict copies are not listed (:mod:`notenames`).
"""

from __future__ import annotations

import trio

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.index.frontmatter_edit import render_frontmatter
from recalld.daemon.memory.fileops import (
    DAY_INDEX,
    FileOps,
    NotUtf8,
    WritePolicy,
    read_confined,
)
from recalld.daemon.memory.notenames import is_daily_note_name
from recalld.daemon.workspaces import Workspace


async def refresh_day_index(ws: Workspace, date: str, ops: FileOps) -> bool:
    """Rewrite ``<daily_dir>/<date>/index.md`` from the day's notes; True if it changed."""
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
        return False
    body = [f"# {date}", ""]
    for name, desc in notes:
        body.append(f"- [{name[:-3]}]({name})" + (f": {desc}" if desc else ""))
    text = render_frontmatter({"name": f"index {date}",
                               "description": f"daily notes of {date}"}) + "\n".join(body) + "\n"
    index_ops = FileOps(root=ops.root, settings=ops.settings,
                        policy=WritePolicy((ws.settings.daily_dir,), (".md",)),
                        lock=ops.lock, sync=ops.sync)
    result = await index_ops.write(f"{folder}/{DAY_INDEX}", text)
    ops.changes.extend(index_ops.changes)
    return result.changed
