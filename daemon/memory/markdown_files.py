"""The Markdown files of a workspace's daily and digest folders, as ``memory.list`` and
the topic index list them: a bounded walk, first by path, in a worker thread (it blocks).
"""

from __future__ import annotations

import heapq
import operator
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from recalld.daemon import safepath
from recalld.daemon.index.filters import composed
from recalld.daemon.memory.secret_names import MASK, mask_path
from recalld.daemon.watchpaths import IGNORE_DIRS
from recalld.ipc.answers import FileEntry

__all__ = ["walk_markdown"]


def walk_markdown(root: Path, tops: list[str], prefix: str, limit: int) -> tuple[
        list[FileEntry], bool]:
    """The first ``limit`` Markdown files by path under ``tops`` (relative folders) whose
    path starts with ``prefix`` (as it is, or as it is shown: a prefix that holds a mask,
    ``memory/[REDACTED]``, is compared with each path masked as it is listed), and
    whether there are more. A prefix typed composed (NFC) or decomposed matches the
    names alike on disk in either form, both where both are. Hidden names and the folders
    the index passes by (``mem_metadata``) are passed by, no symlink is followed or
    listed; a top folder that is a link leading out of the workspace (to another agent's
    notes) is passed by, as the index passes it by."""

    as_named: Callable[[str], str] = mask_path if MASK in prefix else str
    # Names alike but for Unicode normalisation (a folder written decomposed, typed
    # composed) are one name to the prefix, as to a search's path_prefix.
    prefix = composed(prefix)

    def shown(name: str) -> str:
        return composed(as_named(name))

    def found() -> Iterator[tuple[str, os.DirEntry[str]]]:
        for top in tops:
            base = root / top
            if not safepath.is_inside(base, root, str(root)):  # root: as opened
                continue
            stack = [(str(base), top)]
            while stack:
                path, rel = stack.pop()
                try:
                    with os.scandir(path) as it:
                        entries = list(it)
                except OSError:
                    continue
                for entry in entries:
                    if entry.name.startswith(".") or entry.name in IGNORE_DIRS:
                        continue
                    if not safepath.is_utf8(entry.name):
                        continue  # passed by, as the index passes it by (and names it)
                    name = f"{rel}/{entry.name}"
                    seen = shown(name)
                    if entry.is_dir(follow_symlinks=False):
                        # Only folders that hold the prefix or lie below it.
                        if seen.startswith(prefix) or prefix.startswith(seen + "/"):
                            stack.append((entry.path, name))
                    elif (entry.name.endswith(".md") and seen.startswith(prefix)
                          and entry.is_file(follow_symlinks=False)):
                        yield name, entry

    # The first by path of them all, not the first a walk met: a limit cut the digest
    # nodes off behind the daily notes, and a folder's files off behind its subfolders.
    first = heapq.nsmallest(limit + 1, found(), key=operator.itemgetter(0))
    files: list[FileEntry] = []
    for rel, entry in first[:limit]:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        # A note named by a credential is listed as search shows it (and read so).
        files.append({"path": mask_path(rel), "size": st.st_size, "mtime": st.st_mtime})
    return files, len(first) > limit
