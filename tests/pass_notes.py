"""Notes for the tests of passes that fail: how many a pass indexes at start and adds,
which new one cannot be read, and writing them (each with its own marker word)."""

from __future__ import annotations

from pathlib import Path

from markers import marker

# Indexed at start, then a batch of new notes larger than one apply: the first apply of
# the new notes is staged (the index holds more than it adds) before the failure.
BEFORE = 1100
ADDED = 1200
# The new note that cannot be read: prepared only after the pass's first apply (of 512
# files), also when worker processes prepare batches of 128 a few batches ahead.
BAD_AT = 1050


def _write(root: Path, first: int, count: int) -> list[str]:
    """Notes ``first`` to ``first + count - 1``, each with its own marker word; their
    paths sort in their order (as a pass takes them)."""
    assert first + count <= 2800
    rels = []
    for i in range(first, first + count):
        rel = f"memory/2026-07-{i // 100 + 1:02d}/n{i:05d}.md"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {i}\n\ncommon words and {marker(i)}\n", encoding="utf-8")
        rels.append(rel)
    return rels
