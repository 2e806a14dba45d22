"""Folders made with the mode meant for them, the missing ones on the way too: shared by
the daemon and the clients (which make the data folder of a daemon they start).

``mkdir -p`` (``Path.mkdir(parents=True)``) gives each parent it makes the umask's mode
alone, 0777 under a umask of 000, whatever mode the last one is asked for.
"""

from __future__ import annotations

import os
from pathlib import Path


def make_dirs_private(path: Path) -> None:
    """Create ``path`` and the folders missing on the way to it with mode 0700, as the
    XDG base directory specification asks of a base directory that does not exist
    (``$XDG_DATA_HOME``, ``$XDG_RUNTIME_DIR``'s parents, ...). Made as ``mkdir -p`` makes
    them, under the umask, a umask of 000 would leave them open to every user, who could
    then move recalld's private folder away and put one of theirs in its place. Folders
    that exist are left as they are."""
    make_dirs(path, 0o700)


def make_dirs(path: Path, mode: int, made: list[Path] | None = None) -> None:
    """Create ``path`` and the folders missing on the way to it with ``mode`` (less the
    umask), where ``mkdir -p`` gives every folder the umask's mode alone (0777 under a
    umask of 000). Folders that exist are left as they are; those made are added to
    ``made``, in the order made."""
    for folder in (*reversed(path.parents), path):
        if folder.is_dir():
            continue
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            if not folder.is_dir():
                raise
        else:
            if made is not None:
                made.append(folder)
