"""An auto_memory run's turns as the conversation texts of its prompts: no I/O.

:func:`conversation_parts` cuts the turns into parts of at most ``MAX_PROMPT_CHARS``
each, in order, leaving nothing out; a turn longer than one prompt goes in numbered
pieces. Each part says the last turn it finishes, so that a run can commit the turns of
a part before it sends the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.turns import said_by

MAX_PROMPT_CHARS = 60_000


@dataclass(frozen=True, slots=True)
class Part:
    """Turns as one prompt's conversation text, and the seq of the last turn it ends
    (None: it ends inside a turn that goes on in the next part)."""

    text: str
    done: int | None


def _pieces(text: str, size: int) -> list[str]:
    """``text`` in pieces of at most ``size`` characters that join to it again, cut
    after a line or a word where one ends in the piece's second half."""
    out: list[str] = []
    start = 0
    while len(text) - start > size:
        end = start + size
        at = max(text.rfind("\n", start + size // 2, end), text.rfind(" ", start + size // 2, end))
        end = at + 1 if at >= 0 else end
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


def conversation_parts(turns: list[JsonObject]) -> list[Part]:
    """The turns as conversation texts of at most ``MAX_PROMPT_CHARS`` each, in order:
    nothing is left out; a turn longer than one prompt is split into numbered pieces.
    Each turn starts with who said it (:func:`~recalld.daemon.memory.turns.said_by`)."""
    piece_chars = MAX_PROMPT_CHARS - 100  # room for the piece's label
    parts: list[Part] = []
    lines: list[str] = []
    size = 0
    done: int | None = None
    for t in turns:
        role, content, seq = said_by(t), str(t["content"]), t["seq"]
        if len(content) <= piece_chars:
            pieces = [f"{role}: {content}"]
        else:
            cut = _pieces(content, piece_chars)
            pieces = [f"{role} (part {k + 1} of {len(cut)}): {piece}"
                      for k, piece in enumerate(cut)]
        for k, piece in enumerate(pieces):
            if lines and size + len(piece) > MAX_PROMPT_CHARS:
                parts.append(Part("\n\n".join(lines), done))
                lines, size, done = [], 0, None
            lines.append(piece)
            size += len(piece) + 2
            if k == len(pieces) - 1 and isinstance(seq, int):
                done = seq
    if lines:
        parts.append(Part("\n\n".join(lines), done))
    return parts
