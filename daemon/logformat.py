"""The daemon's log lines: one record, one line, whatever its message holds.

A message names notes, folders, agent ids and what clients sent, any of which may hold a
line break (a note named ``x\\n2026-01-01 ERROR forged.md``): written raw, it would split
its record in two, the second looking like a record of its own. Every handler the daemon
sets up (stderr, which systemd's journal reads, or ``--log-file``) formats with
:class:`LineFormatter`, which shows the control characters, line separators and bidi
marks of a record's line escaped (``\\n``, ``\\x1b``, ``\\u2028``), as the client shows a
note's name, and a name's bytes that are not UTF-8 as ``\\xNN`` (``safepath.shown``): a
log file is written as UTF-8, where such a record would otherwise be lost whole. The
traceback that follows a record keeps its lines: it is many lines by nature, and each of
its lines starts unlike a record's.
"""

from __future__ import annotations

import logging
import re
from typing import Final

from recalld.ipc.types import visible

#: Lone surrogates: a file name's bytes that are not UTF-8 (``os.fsdecode`` gives
#: U+DC80..U+DCFF for them) and what else a client's JSON may name (``"\ud800"``).
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _surrogate(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def one_line(text: str) -> str:
    """``text`` as a log line shows it: escaped where it could break or forge a line
    (see the module docstring); printable text is returned as it is."""
    if text.isprintable():
        return text
    return _SURROGATE.sub(_surrogate, visible(text))


class LineFormatter(logging.Formatter):
    """A record as one line (:func:`one_line`), then its traceback, if any, as it is."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))
