"""Ways to damage a file on disk, shared by the storage tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def truncate(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


def extend(path: Path, extra: bytes = b"\0") -> None:
    with path.open("ab") as f:
        f.write(extra)


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    # In place: rewriting with O_TRUNC makes ext4 flush on close (auto_da_alloc), slowly.
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def restore(path: Path, original: bytes) -> None:
    """Put ``original`` back (in place, see ``flip``)."""
    with path.open("r+b") as f:
        f.write(original)
        f.truncate(len(original))


@contextmanager
def damaged(path: Path) -> Iterator[bytes]:
    """Restore ``path``'s original bytes after the block (yields them)."""
    original = path.read_bytes()
    try:
        yield original
    finally:
        restore(path, original)


def temp_files(*dirs: Path) -> list[str]:
    """Leftover publish temp files in ``dirs``."""
    from recalld.daemon.store.fsio import TEMP_RE

    return [p.name for d in dirs if d.is_dir() for p in d.iterdir() if TEMP_RE.match(p.name)]
