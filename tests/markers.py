"""Words that each name one generated note alone, for tests that search a note by its own
word and expect no other note back."""

from __future__ import annotations


def marker(i: int, name: str = "marker") -> str:
    """``name`` and ``i`` made one word that no other ``i``'s word shares a term with. A
    name with a number glued on is indexed under the name too (``marker7`` is also
    ``marker``, which every such note holds), so a letter ends the word (``marker7x``)."""
    return f"{name}{i}x"
