"""The names of temp files: what an atomic publish writes before its rename, and how a
cleanup knows them (``.<name>.tmp-<hex>``); and the lock by which a cleanup tells a live
writer's temp file from one a killed writer left, where another daemon may be writing
(an archive written to a folder a client named, the backups folder of another data
directory among them). Owns nothing and starts nothing."""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import stat
from pathlib import Path

from recalld.daemon.safepath import MAX_NAME_BYTES

#: A temp file left by an interrupted publish: ``.<name>.tmp-<hex>``. ``<name>`` is a
#: file's name, which may hold a line break (DOTALL); nothing follows the hex (``\Z``:
#: ``$`` would let a name ending in a line break after it pass for one).
TEMP_RE = re.compile(r"\A\..+\.tmp-[0-9a-f]{8,}\Z", re.DOTALL)


def temp_name(name: str) -> str:
    """A fresh temp name for publishing ``name`` (matches ``TEMP_RE``); ``name`` is cut
    short where the whole would pass ``MAX_NAME_BYTES``."""
    suffix = f".tmp-{secrets.token_hex(6)}"
    return "." + fit_name(name, MAX_NAME_BYTES - 1 - len(suffix)) + suffix


def fit_name(text: str, limit: int) -> str:
    """``text`` cut at a character boundary to at most ``limit`` bytes as a file name."""
    n = min(len(text), limit)  # a character takes at least one byte
    while n and len(os.fsencode(text[:n])) > limit:
        n -= 1
    return text[:n]


def temp_prefix(name: str) -> str:
    """What every ``temp_name(name)`` starts with: the temp files of ``name`` alone."""
    return temp_name(name).rsplit(".tmp-", 1)[0] + ".tmp-"


def lock_temp(fd: int) -> bool:
    """Lock the fresh temp file ``fd`` (exclusive ``flock``, held till it is closed; it
    dies with the process); whether the file still has its name (a cleanup that took
    the lock between its open and this one removed it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # no locks on this file system: no cleanup can lock it either
        return True
    return os.fstat(fd).st_nlink > 0


def remove_dead_temps(directory: Path, prefix: str) -> list[str]:
    """Remove the temp files in ``directory`` named ``prefix...`` (and ``TEMP_RE``) that
    no writer holds: those a writer with :func:`lock_temp` left when killed. A live
    writer's, one that cannot be locked and anything not a regular file stay. Their
    names. Blocks on the file system."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        if not (name.startswith(prefix) and TEMP_RE.match(name)):
            continue
        try:
            fd = os.open(directory / name,
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held, there = os.fstat(fd), os.lstat(directory / name)
            if stat.S_ISREG(held.st_mode) and (held.st_dev, held.st_ino) == (
                    there.st_dev, there.st_ino):
                # Under the lock: a writer that locks its file after this sees it gone.
                os.unlink(directory / name)
                removed.append(name)
        except OSError:  # a live writer's (locked), gone meanwhile, or not ours to remove
            pass
        finally:
            os.close(fd)
    return removed
