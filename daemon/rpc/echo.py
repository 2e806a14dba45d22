"""What the daemon sends back of a caller's own text, masked as the index masks it.

An answer or an error that quotes what the caller sent (an id it named, a path, a method
or param name, a query) shows it as search and status would show it: what looks like a
credential is ``[REDACTED]``. A caller that put a key where an id belongs must not get it
back in a log line, a terminal or a chat transcript that prints the answer. Every error
goes through :func:`shown_message` (``calls.run_call`` sends no other), so a new error
that quotes a param is masked without its own code; an answer that quotes one masks it
with :func:`echoed` (text, ids) or :func:`echoed_path` (a path: each component as a
note's name is shown, its suffix kept).

The redaction rules are imported on the first text masked (an error, an echoed id).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MESSAGE_END_CHARS", "echoed", "echoed_path", "shown_data", "shown_message"]

#: An error message (and each text of its data) is sent whole up to some 2 KiB (a long
#: path and its reason); longer, its middle is cut (see :func:`shown_message`).
MESSAGE_END_CHARS: Final = 1000
#: How far past each kept end of a long message is read for a secret the cut falls in,
#: so that a key cut by it is masked, not left as a piece too short to be found.
_READ_PAST_CHARS: Final = 4096
#: A character's escape as ``repr`` writes it.
_ESCAPE: Final = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")


def echoed(text: str) -> str:
    """``text`` (the caller's) as the daemon sends it back: redacted."""
    from recalld.daemon.memory.redact import redact

    return redact(text)


def echoed_path(path: str) -> str:
    """A caller's ``path`` as the daemon sends it back: each component masked as a
    note's name is shown (``backups/[REDACTED].tar.zst``)."""
    from recalld.daemon.memory.secret_names import mask_path

    return mask_path(path)


def shown_message(message: str) -> str:
    """``message`` as sent: masked (:func:`echoed`), and one that quotes much of what the
    client sent (a method name, a param, a path) kept to its first and last
    :data:`MESSAGE_END_CHARS` characters, so that the reason, often at its end, stays and
    the client's input does not come back whole.

    A message that quotes a text with ``!r`` shows a character that shows nothing as its
    escape (``ghp_\\u200b…``): it is read as that character, as the rules read a
    token it cuts, and shown escaped again."""
    if "\\" not in message:
        return _masked(message)
    from recalld.daemon.memory.secret_rules import INVISIBLE

    def unescape(m: re.Match[str]) -> str:
        char = chr(int(m.group(m.lastindex or 0), 16))
        return char if INVISIBLE.fullmatch(char) else m.group()

    read = _ESCAPE.sub(unescape, message)
    if read == message:
        return _masked(message)
    return INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"),
                         _masked(read))


def _masked(message: str) -> str:
    if len(message) <= 2 * MESSAGE_END_CHARS + 100:
        return echoed(message)
    from recalld.daemon.memory.redact import redact_prefix

    cut = len(message) - 2 * MESSAGE_END_CHARS
    head = redact_prefix(message[:MESSAGE_END_CHARS + _READ_PAST_CHARS], MESSAGE_END_CHARS)
    tail = _tail(message[-MESSAGE_END_CHARS - _READ_PAST_CHARS:], MESSAGE_END_CHARS)
    return f"{head}…[{cut} characters cut]…{tail}"


def _tail(text: str, length: int) -> str:
    """The last ``length`` characters of ``text``, redacted as in the whole of it."""
    from recalld.daemon.memory.redact import MASK, find_spans

    start = len(text) - length
    spans = [(max(s, start) - start, e - start) for s, e in find_spans(text) if e > start]
    parts: list[str] = []
    pos = 0
    kept = text[start:]
    for s, e in spans:
        parts += [kept[pos:s], MASK]
        pos = e
    return "".join(parts) + kept[pos:]


def shown_data(data: object) -> object:
    """An error's ``data`` as sent: each text in it, at any depth (keys too), masked and
    cut as :func:`shown_message` does, since it too may quote the client's input (a path,
    a name)."""
    if isinstance(data, str):
        return shown_message(data)
    if isinstance(data, dict):
        return {shown_message(k) if isinstance(k, str) else k: shown_data(v)
                for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [shown_data(v) for v in data]
    return data
