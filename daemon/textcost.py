"""What a text costs a model, estimated without its tokenizer: pure functions, no I/O.

One estimator for every budget of what is sent to a model (the chat jobs' prompts, tool
results and file inputs; the embedding inputs). :func:`text_cost` counts in thirds of a
token: an ASCII character is 1 (real tokenizers average about four English characters a
token, so three is on the safe side), any other character 3 per byte of its UTF-8 form,
the most a byte-level tokenizer makes of it (CJK 9, that is 3 tokens; Cyrillic 6; an emoji
12). A budget stated in characters of ASCII text is then the same number in cost: English
is cut where it always was, and a Chinese, Japanese or Korean text at about a ninth of its
characters, so that it does not send a model several times the tokens English does.
"""

from __future__ import annotations

from typing import Final

__all__ = ["chars_within", "pieces_within", "tail_within", "text_cost"]


def text_cost(text: str) -> int:
    """The estimated tokens of ``text``, in thirds of a token (its length, if ASCII)."""
    if text.isascii():
        return len(text)
    # 3 per UTF-8 byte, less 2 for each ASCII character (1 byte, costing 1).
    return (3 * len(text.encode("utf-8", "surrogatepass"))
            - 2 * len(text.encode("ascii", "ignore")))


def chars_within(text: str, limit: int) -> int:
    """How many of ``text``'s first characters cost at most ``limit`` (all: its length)."""
    if text_cost(text) <= limit:
        return len(text)
    low, high = 0, min(len(text), max(limit, 0))  # each character costs 1 at least
    while low < high:  # the longest prefix within the limit: cost grows with length
        mid = (low + high + 1) // 2
        if text_cost(text[:mid]) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


def tail_within(text: str, limit: int) -> str:
    """The longest end of ``text`` that costs at most ``limit``."""
    n = chars_within(text[::-1], limit)
    return text[len(text) - n:]


# Where a piece may end besides a line or a word: after the punctuation that ends a
# sentence or a clause in Chinese and Japanese, which put no space between words. Cut
# anywhere, a long paragraph split "房租涨到九百" from "五十欧元": each part is read by
# the model on its own, and the first one says the rent is 900.
_ENDS: Final = "\n 。！？；，、：．\u3000"


def pieces_within(text: str, limit: int) -> list[str]:
    """``text`` in pieces that cost at most ``limit`` each (``limit`` of 12 or more: any
    character fits) and join to it again, each cut after a line, a word, or a Chinese or
    Japanese sentence or clause (:data:`_ENDS`) where one ends in the piece's second half."""
    out: list[str] = []
    start = 0
    # Each piece sliced to at most ``limit`` characters first (a character costs 1 at
    # least): the rest of a long text is never copied, nor its cost counted, per piece.
    while (n := max(chars_within(text[start:start + limit], limit), 1)) < len(text) - start:
        end = start + n
        at = max(text.rfind(c, start + n // 2, end) for c in _ENDS)
        end = at + 1 if at >= 0 else end
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out
