"""Changes in a workspace's folders made through handles: each folder opened from the
workspace's root one folder at a time without following a link, so that a link put on
the way while a restore (:mod:`backup_restore`) writes is refused, never followed.

Owns nothing and starts nothing; everything here blocks on the file system.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from recalld.daemon import safepath
from recalld.daemon.store.errors import translate_os_error
from recalld.daemon.store.fsio import NOTE_DIR_MODE, REAL, ensure_root
from recalld.daemon.store.tempnames import TEMP_RE
from recalld.ipc.errors import NotFound, PathOutsideWorkspace


def remove_entry(folder: int, name: str) -> None:
    """Remove ``name`` in ``folder``, a file or a whole folder (links not followed)."""
    if stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
        shutil.rmtree(name, dir_fd=folder)
    else:
        os.unlink(name, dir_fd=folder)


def open_folder(root: Path, folder: str, rel: str, made: list[str] | None = None) -> int:
    """A descriptor of ``root``'s folder ``folder`` (workspace-relative, "" for the
    root), opened one folder at a time without following a link
    (:func:`safepath.open_parent`), for the change of ``rel``; with ``made``, missing
    folders are made and listed in it. The caller closes it. PathOutsideWorkspace for a
    link on the way (or a root that now leads elsewhere); NotFound, without ``made``, for
    a missing folder."""
    def make(parent: int, name: str, walked: str) -> None:
        if made is not None and make_folder(parent, name, root / walked):
            made.append(walked)

    if made is not None:  # a workspace restored where it never was (checked: its place)
        ensure_root(REAL, root)
    parts = [*folder.split("/"), "_"] if folder else ["_"]
    return safepath.open_parent(root, parts, rel, None if made is None else make)


def make_folder(parent: int, name: str, path: Path) -> bool:
    """Make the folder ``name`` (at ``path``) in ``parent`` durably (``parent`` fsynced);
    False if something was made there meanwhile (opening it says what)."""
    try:
        os.mkdir(name, NOTE_DIR_MODE, dir_fd=parent)
        REAL.fsync(parent)
    except FileExistsError:
        return False
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    return True


def in_folder(root: Path, folder: str, rel: str, change: Callable[..., None],
              *names: str, translate: bool = True) -> None:
    """``change(fd, *names)`` with ``fd`` the descriptor of ``root``'s ``folder``
    (:func:`open_folder`): its OSError is translated (DiskFull...) but
    FileNotFoundError, or, without ``translate``, raised as it is."""
    fd = open_folder(root, folder, rel)
    try:
        change(fd, *names)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if not translate:
            raise
        raise translate_os_error(exc, root / rel) from exc
    finally:
        os.close(fd)


def quietly(root: Path, folder: str, change: Callable[..., None], *names: str) -> None:
    """:func:`in_folder`, any failure ignored (undoing after an error)."""
    with contextlib.suppress(OSError, PathOutsideWorkspace, NotFound):
        in_folder(root, folder, folder or ".", change, *names, translate=False)


def unlink_at(folder: int, name: str) -> None:
    os.unlink(name, dir_fd=folder)


def rmdir_at(folder: int, name: str) -> None:
    os.rmdir(name, dir_fd=folder)


def remove_leftovers(root: Path, targets: Iterable[str]) -> int:
    """Remove what a restore killed while it wrote ``targets`` (workspace-relative) left
    beside them or their folders: the temp files (``.<name>.tmp-<hex>``, :data:`TEMP_RE`)
    of files written and of what it moved out of the way alike. Only while the
    workspace's writes wait for the restore (no other writer's temp file is there).
    Returns how many went."""
    by_folder: dict[str, set[str]] = {}
    for rel in targets:
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            by_folder.setdefault("/".join(parts[:depth - 1]), set()).add(parts[depth - 1])
    removed = 0
    for folder, names in sorted(by_folder.items()):
        try:
            fd = open_folder(root, folder, folder or ".")
        except (NotFound, PathOutsideWorkspace):
            continue
        try:
            for entry in os.listdir(fd):
                base = entry[1:entry.rfind(".tmp-")]
                if TEMP_RE.match(entry) and base and any(n.startswith(base) for n in names):
                    with contextlib.suppress(FileNotFoundError):
                        remove_entry(fd, entry)
                        removed += 1
        finally:
            os.close(fd)
    return removed
