"""Defaults that were chosen by measurement stay in one place."""

from __future__ import annotations

from pathlib import Path

from recalld.daemon import config
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS


def test_daemon_chunk_size_is_the_measured_default(tmp_path: Path) -> None:
    cfg = config.load(environ={"HOME": str(tmp_path)})
    assert cfg.chunk_max_chars == DEFAULT_MAX_CHARS
