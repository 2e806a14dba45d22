"""The tags that mark recalled memory in a conversation, and how text is kept from
closing them.

An agent puts recalled memory before its reply wrapped in one of :data:`RECALL_TAGS`;
``memory.add_turns`` drops such a block when the conversation comes back, up to the
first closing tag of its name. A note that itself holds that tag (a page about prompt
formats, a pasted transcript) would end the block early, and the memories after it would
be stored as what the user said: :func:`inert_recall_tags` is applied to every text put
inside the wrapper.
"""

from __future__ import annotations

import re
from typing import Final

#: Tags an agent wraps recalled memory in when it injects it into a prompt.
RECALL_TAGS: Final = ("recalled-memory", "recalled_memory", "memory-context",
                      "relevant-memories")
#: What stands for ``<`` in a recall tag inside recalled text: one character, so a block
#: keeps its length (its ``budget_chars``), and a reader still sees the tag's name.
LOOKALIKE: Final = "\u2039"
_TAG = re.compile(r"<(/?\s*(?:" + "|".join(map(re.escape, RECALL_TAGS)) + r"))", re.I)


def inert_recall_tags(text: str) -> str:
    """``text`` with every opening or closing recall tag (any case) made plain text, so
    that, wrapped in a recall tag, it can neither end the block nor open another."""
    return _TAG.sub(LOOKALIKE + r"\1", text)
