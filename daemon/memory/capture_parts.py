"""An auto_memory run's turns as the conversation texts of its prompts: no I/O.

:func:`conversation_parts` cuts the turns into parts that cost at most
``MAX_PROMPT_CHARS`` each (:func:`~recalld.daemon.textcost.text_cost`: that many
characters of English, a ninth as many of Chinese, Japanese or Korean), in order, leaving
nothing out; a turn longer than one prompt goes in numbered pieces. Each part says the
last turn it finishes, so that a run can commit the turns of a part before it sends the
next.
"""

from __future__ import annotations

from dataclasses import dataclass

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.turns import said_by
from recalld.daemon.textcost import pieces_within, text_cost

#: What one part's conversation text may cost, in thirds of an estimated token
#: (:func:`~recalld.daemon.textcost.text_cost`): 60,000 characters of ASCII text.
MAX_PROMPT_CHARS = 60_000


@dataclass(frozen=True, slots=True)
class Part:
    """Turns as one prompt's conversation text, and the seq of the last turn it ends
    (None: it ends inside a turn that goes on in the next part)."""

    text: str
    done: int | None


def conversation_parts(turns: list[JsonObject]) -> list[Part]:
    """The turns as conversation texts that cost at most ``MAX_PROMPT_CHARS`` each, in
    order: nothing is left out; a turn longer than one prompt is split into numbered pieces.
    Each turn starts with who said it (:func:`~recalld.daemon.memory.turns.said_by`)."""
    piece_cost = MAX_PROMPT_CHARS - 100  # room for the piece's label
    parts: list[Part] = []
    lines: list[str] = []
    size = 0
    done: int | None = None
    for t in turns:
        role, content, seq = said_by(t), str(t["content"]), t["seq"]
        if text_cost(content) <= piece_cost:
            pieces = [f"{role}: {content}"]
        else:
            cut = pieces_within(content, piece_cost)
            pieces = [f"{role} (part {k + 1} of {len(cut)}): {piece}"
                      for k, piece in enumerate(cut)]
        for k, piece in enumerate(pieces):
            cost = text_cost(piece)
            if lines and size + cost > MAX_PROMPT_CHARS:
                parts.append(Part("\n\n".join(lines), done))
                lines, size, done = [], 0, None
            lines.append(piece)
            size += cost + 2
            if k == len(pieces) - 1 and isinstance(seq, int):
                done = seq
    if lines:
        parts.append(Part("\n\n".join(lines), done))
    return parts
