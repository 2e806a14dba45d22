"""A session's dialog log, ``<session_dir>/dialog/<session_id>.jsonl``: one turn a line.

Only the ``auto_memory`` job writes it, one job of a session at a time. :func:`append`
adds a run's turns at the end of the file and reads no more of it than its tail, so a
long conversation costs each run what that run adds, whatever the log's size.

A run killed between appending its turns and committing them runs again with the same
turns first: those the log already ends with are not written twice (the longest run of
turns that both ends the log and starts the new ones, by ``seq`` and text). Turns
numbered again from 1 (the pending-turns log was removed) are new and appended.

A kill in the middle of an append can leave a torn last line. The next append cuts it
off before it writes (its turns were not committed, so they come again whole), once it
knows it for the start of one of those turns' lines: an unfinished line that is not is
another writer's (ReMe writes these logs too), maybe still being written, and is kept,
as is a last line that is a whole record but lacks its newline (edited by hand); the
turns then go on lines of their own after it. An append
that fails (disk full) is undone: the file is cut back to its length before it.
Blocking I/O: call it from a worker thread.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import orjson

from recalld.daemon import safepath
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.confined import write_confined
from recalld.daemon.memory.redact import redact
from recalld.daemon.store.errors import translate_os_error
from recalld.ipc.errors import NotFound

log = logging.getLogger(__name__)

_BLOCK = 1 << 16
#: The fields of a turn that carry what was said and who said it (masked again on write).
_TEXT_FIELDS = ("content", "name")
#: What identifies a turn in the log: its seq and its text.
_Key = tuple[object, str]


def _key(rec: object) -> _Key | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("seq"), int):
        return None
    return rec["seq"], str(rec.get("content"))


def _tail(fd: int, size: int, lines: int) -> bytes:
    """The end of the file from the start of a line on, holding at least ``lines``
    whole lines before a torn last one (or the whole file)."""
    start, blocks, newlines, step = size, list[bytes](), 0, _BLOCK
    while start > 0 and newlines <= lines:
        step = min(step * 2, start)
        start -= step
        block = os.pread(fd, step, start)
        blocks.append(block)
        newlines += block.count(b"\n")
    data = b"".join(reversed(blocks))
    if start > 0:  # from the first whole line on
        data = data[data.index(b"\n") + 1:]
    return data


def _already_there(tail: Sequence[_Key | None], new: Sequence[_Key]) -> int:
    """How many of ``new`` the log's ``tail`` ends with (as its last lines, in order)."""
    for k in range(min(len(tail), len(new)), 0, -1):
        if list(tail[len(tail) - k:]) == list(new[:k]):
            return k
    return 0


def _ours(piece: bytes, turns: Sequence[JsonObject]) -> bool:
    """Whether ``piece`` (a torn last line) is the start of the line of one of ``turns``,
    as :func:`append` writes them but for its ``time``, which differs from run to run."""
    for t in turns:
        line = orjson.dumps({**t, "time": "\x00"})
        before, _, _ = line.partition(b'"\\u0000"')
        if before.startswith(piece) or piece.startswith(before):
            return True
    return False


def append(root: Path, rel: str, turns: Sequence[JsonObject]) -> None:
    """Add ``turns`` (in seq order) to the dialog log ``root/rel``, but those it ends
    with; ``time`` is set on each line written."""
    # Redacted when they were added; again here, for turns kept from before a rule was
    # added.
    turns = [{**t, **{k: redact(t[k]) for k in _TEXT_FIELDS if isinstance(t.get(k), str)}}
             for t in turns]
    keys = [(t.get("seq"), str(t.get("content"))) for t in turns]
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def lines(skip: int) -> bytes:
        return b"".join(orjson.dumps({**t, "time": now}) + b"\n" for t in turns[skip:])

    try:
        fd = safepath.open_confined(root, rel, writable=True)
    except NotFound:
        if turns:
            write_confined(root, rel, lines(0))
        return
    try:
        size = os.fstat(fd).st_size
        data = _tail(fd, size, len(turns))
        body, _, last = data.rpartition(b"\n")
        end = size
        if last:
            try:
                whole = isinstance(orjson.loads(last), dict)
            except orjson.JSONDecodeError:
                whole = False
            if not whole and _ours(last, turns):
                # Torn by a kill mid-append: its turns were not committed, they come again.
                log.warning("%s: cut off a torn last line (%d bytes at offset %d)",
                            rel, len(last), size - len(last))
                end = size - len(last)
                last = b""
            elif not whole:
                # Not the start of a line this append writes: another program's (ReMe's,
                # the log's other writer), maybe still being written. Never cut: the
                # turns go after it, on lines of their own.
                log.warning("%s: kept an unfinished last line that is not one of these "
                            "turns (%d bytes at offset %d)", rel, len(last), size - len(last))
        tail: list[_Key | None] = []
        for line in [*(body.split(b"\n") if body else []), *([last] if last else [])]:
            try:
                tail.append(_key(orjson.loads(line)))
            except orjson.JSONDecodeError:
                tail.append(None)
        add = lines(_already_there(tail, keys))
        if not add and end == size:
            return
        if last:  # a whole record without its newline, or another writer's piece
            add = b"\n" + add
        try:
            os.ftruncate(fd, end)
            written = 0
            while written < len(add):
                written += os.pwrite(fd, add[written:], end + written)
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
            raise translate_os_error(exc, root / rel) from exc
    finally:
        os.close(fd)
