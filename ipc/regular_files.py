"""Reading a file that must be a regular one: a FIFO, device, socket or folder named where
a file was meant is refused at once, never waited on."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotRegularFile(OSError):
    """A FIFO, device, socket or directory where a file to read was named."""

    def __str__(self) -> str:
        return str(self.args[0])


def read_regular_file(path: Path) -> bytes:
    """All bytes of the regular file at ``path`` (a link to one is followed).

    Anything else raises NotRegularFile saying what it is: opening a FIFO for reading
    would wait for a writer that may never come, a device may never end. Other OSErrors
    (FileNotFoundError, ...) are the caller's.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket
            raise NotRegularFile("not a regular file (a socket)") from None
        raise
    try:  # asked before fdopen, which refuses a directory with the descriptor's number
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device or socket")
        raise NotRegularFile(f"not a regular file ({kind})")
    with os.fdopen(fd, "rb") as f:
        return f.read()


def broken_link(place: Path) -> str | None:
    """What ``place`` is when it is a symbolic link that leads to nothing or into a loop
    of links (saying "no such file" of it hides what to mend); None otherwise."""
    if not os.path.islink(place):
        return None
    try:
        os.stat(place)
    except OSError as exc:
        try:
            target = f" to {os.readlink(place)}"
        except OSError:
            target = ""
        if exc.errno == errno.ELOOP:
            return f"{place} is a symbolic link{target} that leads into a loop of links"
        return f"{place} is a symbolic link{target}, which leads to nothing"
    return None


def not_a_folder(place: Path) -> str:
    """Why ``place``, which is there (a file, or a link) but is no folder to make or find
    others in: a file, or a symbolic link that leads to nothing, into a loop of links or
    to a file (saying only "is not a directory" of a link hides what to mend)."""
    if (broken := broken_link(place)) is not None:
        return broken
    if os.path.islink(place):
        return f"{place} is a symbolic link to {os.readlink(place)}, which is not a directory"
    return f"{place} is not a directory"


def blocked_on_way(path: Path) -> Path | None:
    """The place on the way to the folder ``path`` (``path`` itself included) that is
    there but leads to no folder (a file, a link to nothing, a loop of links), so that
    ``path`` can neither be found nor made; None when there is none."""
    for place in (path, *path.parents):
        if os.path.lexists(place):
            return None if os.path.isdir(place) else place
    return None


def not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """Where ``data`` stops being UTF-8 (a TOML file must be), as a line and column an
    editor goes to, with the byte found there and the fix."""
    before = data[:exc.start]
    line = before.count(b"\n") + 1
    column = len(before[before.rfind(b"\n") + 1:].decode("utf-8-sig")) + 1  # characters
    return (f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column} "
            "(TOML files are UTF-8: save it as UTF-8, e.g. iconv -f latin1 -t utf-8)")
