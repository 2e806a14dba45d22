"""Client-named paths as the disk spells them: names alike but for Unicode normalisation.

A workspace made on macOS, or synced from one, often holds names decomposed (NFD,
``nai\u0308ve.md``) while people and agents type them composed (NFC, ``naïve.md``), or the
other way round. :func:`on_disk` maps a typed path to the one spelling the disk holds, so
that a read, an edit or a write of either form finds the file (and a write never makes a
second file beside it). :func:`on_disk` blocks; :func:`spelled` runs it in a thread
(and not at all for an ASCII path).
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import trio

from recalld.daemon.safepath import quoted, split_relative
from recalld.ipc.errors import InvalidParams

__all__ = ["on_disk", "spelled"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def on_disk(root: Path, path: str) -> str:
    """The workspace-relative ``path`` (checked as :func:`split_relative` checks it) as
    the disk spells it: a name typed composed names the file or folder written
    decomposed, and the other way round, when the disk holds just one of the names alike
    but for Unicode normalisation; a name the disk holds as typed is taken as typed.
    From the first name the disk holds in no form on, the rest is as typed (a file to
    make). Several names alike, none as typed: InvalidParams.

    Cheap for the common case: an ASCII path is given back at once; otherwise each folder
    on the way is opened (no link followed) and one is listed only for a name it does not
    hold as typed."""
    parts = split_relative(path)
    if path.isascii():
        return "/".join(parts)
    spelled: list[str] = []
    try:
        current = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return "/".join(parts)
    try:
        for name in parts:
            if not name.isascii():
                name = _spelled(current, name, "/".join([*spelled, name]))
            spelled.append(name)
            if len(spelled) == len(parts):
                break
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=current)
            except OSError:  # missing, a link, not a folder: the caller's own walk says so
                break
            os.close(current)
            current = child
    finally:
        os.close(current)
    return "/".join(spelled + parts[len(spelled):])


async def spelled(root: Path, path: str) -> str:
    """:func:`on_disk` of ``path``, in a worker thread unless ``path`` is ASCII. On
    cancellation the thread's walk finishes unobserved (it only opens and lists)."""
    if path.isascii():
        return on_disk(root, path)
    return await trio.to_thread.run_sync(on_disk, root, path, abandon_on_cancel=True)


def _spelled(folder: int, name: str, path: str) -> str:
    """``name`` as the folder ``folder`` spells it (see :func:`on_disk`)."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        pass
    except OSError:
        return name
    else:
        return name
    wanted = unicodedata.normalize("NFC", name)
    try:
        alike = [n for n in os.listdir(folder)
                 if not n.isascii() and unicodedata.normalize("NFC", n) == wanted]
    except OSError:
        return name
    if len(alike) > 1:
        raise InvalidParams(f"several names on disk are {quoted(path)} but for Unicode "
                            "normalisation (composed or decomposed): rename all but one")
    return alike[0] if alike else name
