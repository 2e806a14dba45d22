"""A small set of vectors searched exactly: one matrix, no graph.

An hnswlib graph costs about 2.6 MB however few vectors it holds (its 65,536 label
locks), so thirty workspaces of a few notes each held some 150 MB of graphs for kilobytes
of vectors. :class:`~recalld.daemon.index.vectors.VectorIndex` keeps up to
``EXACT_MAX`` vectors here instead; below ~10k vectors an exact scan answers in well
under a millisecond. Rows are unit vectors; a removed row is filled by the last one.
Not thread-safe, like the index it serves. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from recalld.daemon.arraytypes import F32

#: Up to this many vectors an index is an :class:`ExactVectors`; beyond, a graph.
EXACT_MAX = 1024


class ExactVectors:
    """Unit vectors by integer key, searched by a full scan."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._rows: F32 = np.zeros((0, dim), dtype=np.float32)
        self._keys: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._pos: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, key: int) -> bool:
        return key in self._pos

    def put(self, labels: npt.NDArray[np.int64], rows: F32) -> None:
        """Set the vectors of ``labels`` (rows of unit vectors), new or replaced."""
        for label, row in zip(labels.tolist(), rows, strict=True):
            at = self._pos.get(label)
            if at is None:
                at = len(self._pos)
                if at == len(self._rows):
                    self._grow(max(16, 2 * at))
                self._pos[label] = at
                self._keys[at] = label
            self._rows[at] = row

    def _grow(self, capacity: int) -> None:
        rows = np.zeros((capacity, self.dim), dtype=np.float32)
        keys = np.zeros(capacity, dtype=np.int64)
        n = len(self._pos)
        rows[:n], keys[:n] = self._rows[:n], self._keys[:n]
        self._rows, self._keys = rows, keys

    def remove(self, key: int) -> None:
        at = self._pos.pop(key, None)
        if at is None:
            return
        last = len(self._pos)
        if at != last:
            self._rows[at] = self._rows[last]
            self._keys[at] = self._keys[last]
            self._pos[int(self._keys[at])] = at

    def search(self, q: F32, k: int, allowed: Callable[[int], bool] | None,
               ) -> list[tuple[int, float]]:
        """The ``k`` keys (that ``allowed`` passes) of highest cosine with the unit row
        ``q``, best first (ties: the smaller key first)."""
        n = len(self._pos)
        keys = self._keys[:n]
        sims = self._rows[:n] @ q
        if allowed is not None:
            keep = np.fromiter((allowed(key) for key in keys.tolist()), dtype=bool, count=n)
            keys, sims = keys[keep], sims[keep]
        order = np.lexsort((keys, -sims))[:k]
        return [(int(keys[i]), float(sims[i])) for i in order.tolist()]

    def vectors(self, keys: list[int]) -> F32:
        """The stored vectors of ``keys`` (each one present)."""
        out: F32 = self._rows[[self._pos[key] for key in keys]]
        return out

    def items(self) -> tuple[npt.NDArray[np.int64], F32]:
        """Every key and its vector (copies)."""
        n = len(self._pos)
        return self._keys[:n].copy(), self._rows[:n].copy()
