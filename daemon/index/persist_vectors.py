"""Loading a generation's vectors into a state: the chunk graph from its checksummed
hnswlib file, else rebuilt from the chunk embeddings; the window vectors from theirs, else
none (the backfill refills them from the embedding cache). ``persist.py`` calls these
while it fills a state; everything here blocks."""

from __future__ import annotations

from collections import Counter
from typing import Protocol

import numpy as np

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.embedcache import decode_f16
from recalld.daemon.index.state import IndexState
from recalld.daemon.index.vectors import VectorIndex, WindowVectors, matrix_format
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.errors import CorruptState
from recalld.daemon.store.generation import Generation


class _Report(Protocol):
    """What a load found (``persist.LoadReport``)."""

    corrupt: dict[str, str]
    rebuilt: list[str]


def restore_vectors(gen: Generation, state: IndexState, meta: JsonObject,
                    report: _Report, state_format: int) -> None:
    """The hnswlib graph from its checksummed blob, else rebuilt from chunk embeddings."""
    with_vec = state.chunks.embeddings()
    space = meta.get("vector_space")
    config = meta.get("vector_config")
    state.vector_space = space if isinstance(space, str) else None
    state.vector_config = config if isinstance(config, dict) else None
    if not with_vec:
        return
    live = list(with_vec)
    if "vectors" in gen.files:
        try:
            blob, vmeta = gen.read_blob("vectors")
            if vmeta.get("state_format") not in (state_format, matrix_format(state_format)):
                raise ValueError(f"state format {vmeta.get('state_format')}")
            if vmeta.get("count") != len(live):
                raise ValueError(f"graph holds {vmeta.get('count')} vectors, chunks {len(live)}")
            if state.vector_space is None and isinstance(vmeta.get("space"), str):
                state.vector_space = vmeta["space"]
            state.vectors = VectorIndex.from_bytes(blob, dim=int(vmeta["dims"]), live=live,
                                                   tmp_dir=gen.state_dir)
            return
        except (CorruptState, KeyError, ValueError, TypeError, RuntimeError) as exc:
            report.corrupt["vectors"] = _reason(exc)
    else:
        report.corrupt["vectors"] = "missing"
    report.rebuilt.append("vectors")
    decoded: dict[int, F32] = {}
    for key, value in with_vec.items():
        try:
            decoded[key] = decode_f16(value)
        except ValueError:
            continue
    dims = Counter(v.shape[0] for v in decoded.values()).most_common(1)
    dim = dims[0][0] if dims else 0
    keep = {k: v for k, v in decoded.items() if v.shape[0] == dim}
    for key in with_vec:
        if key not in keep:  # unreadable or of another size: embed it again
            state.chunks.set_embedding(key, None)
    if keep:
        index = VectorIndex(dim, initial_capacity=len(keep))
        index.add(list(keep), np.stack(list(keep.values())))
        state.vectors = index


def restore_windows(gen: Generation, state: IndexState, report: _Report,
                    state_format: int) -> None:
    """The window vectors of the live chunks, when saved and sound (else the backfill
    refills them from the embedding cache)."""
    if "windows" not in gen.files:
        return
    try:
        arrays, meta = gen.read_arrays("windows")
        if meta.get("state_format") not in (state_format, matrix_format(state_format)) or (
                not isinstance(meta.get("of"), str)):
            raise ValueError(f"window vectors format {meta.get('state_format')}")
        wins = WindowVectors.from_arrays(arrays, dim=int(meta["dims"]), tmp_dir=gen.state_dir)
    except (CorruptState, KeyError, ValueError, TypeError, RuntimeError) as exc:
        report.corrupt["windows"] = _reason(exc)
        report.rebuilt.append("windows")
        return
    for key in [key for key in wins.keys() if key not in state.chunks]:
        wins.remove(key)
    state.windows, state.windows_of = wins, str(meta["of"])


def _reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, CorruptState) else f"{type(exc).__name__}: {exc}"


__all__ = ["restore_vectors", "restore_windows"]
