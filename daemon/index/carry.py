"""Vectors carried over to a rebuilt index: a chunk whose text an older state had
embedded gets that vector, so a rebuild keeps hybrid search without waiting for the
backfill. Pure and synchronous (the index service runs it in a worker thread)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.embedcache import decode_f16
from recalld.daemon.index.vectors import VectorIndex
from recalld.daemon.jsontypes import JsonObject

if TYPE_CHECKING:
    from recalld.daemon.index.state import IndexState


def carry_vectors(
    fresh: IndexState, by_text: Mapping[str, str], space: str | None,
    config: JsonObject | None,
) -> int:
    """Give ``fresh`` the vectors (of ``space``) that an older state held for the same texts.

    A rebuild then keeps hybrid search without waiting for the backfill. Returns how many
    chunks got a vector; vectors of another size than the first are left out.
    """
    keys: list[int] = []
    rows: list[F32] = []
    for key, text in list(fresh.chunks.texts()):
        value = by_text.get(text)
        if value is None:
            continue
        try:
            vec = decode_f16(value)
        except ValueError:
            continue
        if rows and vec.shape != rows[0].shape:
            continue
        fresh.chunks.set_embedding(key, value)
        keys.append(key)
        rows.append(vec)
    if not keys:
        return 0
    fresh.vectors = VectorIndex(int(rows[0].shape[0]), initial_capacity=len(keys))
    fresh.vectors.add(keys, np.stack(rows))
    fresh.vector_space = space
    fresh.vector_config = config
    fresh.vectors_version += 1
    return len(keys)


__all__ = ["carry_vectors"]
