"""Lines far over the chunk cap (a pasted log or minified text): cut in time linear in the line."""

from __future__ import annotations

from typing import SupportsIndex

from recalld.daemon.index.chunker import chunk_markdown, split_line


class _CountedText(str):
    """A string that counts the characters every slice of it copies."""

    copied = 0

    def __getitem__(self, key: SupportsIndex | slice) -> _CountedText:
        piece = _CountedText(str.__getitem__(self, key))
        _CountedText.copied += len(piece)
        return piece


def test_an_overlong_line_is_cut_copying_each_character_once() -> None:
    words = " ".join(f"w{i % 997}" for i in range(60_000))  # ~330k characters, one line
    _CountedText.copied = 0
    pieces = split_line(_CountedText(words), 2000)
    assert "".join(pieces) == words
    assert all(len(p) <= 2000 for p in pieces)
    # Each character is copied into its piece once; copying the rest of the line again
    # at every piece made cutting a line of megabytes take seconds.
    assert _CountedText.copied <= len(words)


def test_a_line_of_megabytes_becomes_pieces_in_order_with_its_line_number() -> None:
    line = " ".join(f"word{i}" for i in range(400_000))
    chunks = chunk_markdown("memory/2026-11-01/paste.md", f"# Paste\n{line}\n", max_chars=2000)
    assert all(len(c.text) <= 2000 for c in chunks)
    assert [c.start_line for c in chunks[1:]] == [2] * (len(chunks) - 1)
    assert chunks[-1].text.endswith("word399999")
    assert chunks[0].text.startswith("# Paste\nword0 ")


def test_a_heading_line_over_the_cap_is_named_within_the_cap() -> None:
    # A note of one line that opens with "# " (a paste, a file with old Mac line ends):
    # each of its pieces is named by the heading and indexed with it, so the name is cut
    # to the cap. Whole, every piece carried the entire line: index text growing with the
    # square of the line, and the line matched as a heading again for each piece.
    line = "# " + " ".join(f"topic{i}" for i in range(30_000))
    text = line + "\nzqvbody after it\n"
    chunks = chunk_markdown("memory/2026-11-01/pasted.md", text, max_chars=2000)
    assert len(chunks) > 50
    assert all(0 < len(c.heading) <= 2000 for c in chunks)
    assert chunks[0].heading == line[2:2000 + 2].rsplit(" ", 1)[0]
    assert sum(len(c.index_text) for c in chunks) <= 3 * len(text)
    assert chunks[-1].text.endswith("zqvbody after it")
