"""Names in a daily folder that are no daily note of their own.

A conflict copy (``note.sync-conflict-20261201-153216-host.md``, as the replica of a
shared workspace and Syncthing name them) holds a version of a note that lost to
another: the day index does not list it, the dream does not read it as a daily note, and
``auto_memory`` does not take it for its session's note. The day index
(``index.md``, :mod:`dayindex`) is made from the notes, not one of them.
"""

from __future__ import annotations

import re

from recalld.daemon import safepath

#: A day folder's index (:mod:`recalld.daemon.memory.dayindex`).
DAY_INDEX = "index.md"
#: The tail of a conflict copy's name (``localfs.conflict_name``; Syncthing's own too).
CONFLICT_COPY_RE = re.compile(r"\.sync-conflict-\d{8}-\d{6}-[^/]+$")
_DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def is_conflict_copy(name: str) -> bool:
    """Whether the file ``name`` (or path) is a conflict copy of a note."""
    stem = name.rsplit("/", 1)[-1]
    stem = stem[:-3] if stem.endswith(".md") else stem
    return CONFLICT_COPY_RE.search(stem) is not None


def is_daily_note_name(name: str) -> bool:
    """Whether a Markdown file named ``name`` in a daily folder is a note of its own:
    neither hidden, nor the day index, nor a conflict copy."""
    return (name.endswith(".md") and not name.startswith(".") and name != DAY_INDEX
            and not is_conflict_copy(name))


def note_day(path: str, daily_dir: str) -> str | None:
    """The date of the day folder ``path`` (workspace-relative) lies directly in, below
    ``daily_dir`` (``memory/2026-12-03/x.md``: ``2026-12-03``), else None."""
    head = "/".join(safepath.split_relative(daily_dir)) + "/"
    if not path.startswith(head):
        return None
    parts = path[len(head):].split("/")
    if len(parts) != 2 or not _DAY_RE.fullmatch(parts[0]):
        return None
    return parts[0]


def is_day_index(path: str, daily_dir: str) -> bool:
    """Whether ``path`` is a day index (derived on each host, never replicated)."""
    return path.endswith("/" + DAY_INDEX) and note_day(path, daily_dir) is not None
