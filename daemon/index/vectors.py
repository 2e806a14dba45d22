"""Approximate nearest neighbours over chunk vectors (hnswlib, cosine).

One :class:`VectorIndex` per workspace and vector space. Labels are the same integer
doc keys the keyword index uses, so fusion joins the branches without a lookup.
Deletions use hnswlib's ``mark_deleted``; a re-added key is first unmarked and then
overwritten; once more than half the graph is deleted, a new key takes the place of a
deleted one (hnswlib's ``replace_deleted``), so a graph edited for years stays within twice
the size of its live vectors (chunk keys are never reused: every edit deletes and adds).
The graph grows by doubling. Up to ``EXACT_MAX`` vectors there is no graph: they are a
matrix searched exactly (:mod:`exactvectors`; a graph's fixed cost would be most of a
small workspace's memory), saved as such (:data:`MATRIX_MAGIC`, a layout an earlier
version does not take for a graph: its format differs, :func:`matrix_format`). Not thread-safe:
the owner serialises calls (the index service runs them in one worker thread at a time).

Search uses ``ef = max(ef_search, 2 * k)``: hnswlib's default ef=10 gives poor recall at
100k vectors; 64-128 gives 0.97-0.99 and the benchmark in tests/bench checks >= 0.98.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.exactvectors import EXACT_MAX, ExactVectors
from recalld.daemon.index.windows import SLOTS
from recalld.daemon.store import confine
from recalld.daemon.store.errors import translate_os_error
from recalld.daemon.store.fsio import REAL, ensure_dir

if TYPE_CHECKING:
    import hnswlib
    from pyroaring import BitMap

#: The keys a search's filter may pass (``VectorIndex.search``).
Candidates: TypeAlias = "Collection[int] | BitMap"


def normalize(vectors: npt.ArrayLike) -> F32:
    """Rows scaled to unit length (zero rows stay zero)."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr[None, :]
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: F32 = arr / norms
    return out


def mean_unit(rows: F32) -> F32:
    """The normalised mean of unit rows (one row: itself): a chunk's vector from its
    windows'."""
    if len(rows) == 1:
        first: F32 = rows[0]
        return first
    mean = rows.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    out: F32 = mean / norm if norm > 0 else mean
    return out


def _new_hnsw(dim: int) -> hnswlib.Index:
    # hnswlib is imported on first use: a daemon with no embedding model never loads it
    # (nor the C++ runtime it links).
    import hnswlib

    return hnswlib.Index(space="cosine", dim=dim)


#: The start of a saved matrix (:meth:`VectorIndex.to_bytes` of an index without a graph):
#: then the count and the dimension (int64), the keys (int64), the rows (float32).
MATRIX_MAGIC = b"RCLDMAT1"
#: When a filter can pass at most this many keys, and at most one in ``FEW_SHARE`` of the
#: graph's, they are compared directly (some 60 us each: hnswlib hands out stored vectors
#: slowly) rather than through hnswlib's filter, which walks much of the graph when few
#: pass (``path_prefix`` naming a small folder): a tenth of a second and more on a graph
#: of tens of thousands.
FEW_CANDIDATES = 2048
FEW_SHARE = 40


def matrix_format(state_format: int) -> str:
    """The ``state_format`` of a saved matrix: one an earlier version, which knew only
    graphs, refuses (and rebuilds from the chunk embeddings) rather than hands to hnswlib."""
    return f"{state_format}-matrix"


class VectorIndex:
    """hnswlib cosine index keyed by doc key (up to ``exact_max`` vectors, a matrix)."""

    def __init__(
        self,
        dim: int,
        *,
        initial_capacity: int = 1024,
        m: int = 16,
        ef_construction: int = 200,
        ef_search: int = 128,
        num_threads: int = 1,
        exact_max: int = EXACT_MAX,
    ) -> None:
        self.dim = dim
        self.ef_search = ef_search
        self.exact_max = exact_max
        self._m = m
        self._ef_construction = ef_construction
        self._threads = num_threads
        self._exact: ExactVectors | None = ExactVectors(dim) if exact_max > 0 else None
        self._graph: hnswlib.Index | None = None
        if self._exact is None:
            self._graph = self._new_graph(initial_capacity)
        self._live: set[int] = set()
        #: Keys marked deleted that may still be in the graph (a new key may have taken
        #: the place of any of them), and how many deleted places the graph holds.
        self._deleted: set[int] = set()
        self._free = 0

    def _new_graph(self, capacity: int) -> hnswlib.Index:
        graph = _new_hnsw(self.dim)
        graph.init_index(max_elements=max(capacity, 16), M=self._m,
                         ef_construction=self._ef_construction, allow_replace_deleted=True)
        graph.set_num_threads(self._threads)
        return graph

    @property
    def _index(self) -> hnswlib.Index:
        """The graph, made of the exact vectors when the index first needs one."""
        if self._graph is None:
            assert self._exact is not None
            keys, rows = self._exact.items()
            self._graph = self._new_graph(max(2 * len(keys), 1024))
            if len(keys):
                self._graph.add_items(rows, keys, num_threads=self._threads)
            self._exact = None
        return self._graph

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: int) -> bool:
        return key in self._live

    def keys(self) -> set[int]:
        return set(self._live)

    @property
    def is_matrix(self) -> bool:
        """Whether the vectors are a matrix (no graph), and :meth:`to_bytes` saves one."""
        return self._exact is not None

    def add(self, keys: Iterable[int], vectors: npt.ArrayLike) -> None:
        """Insert or replace vectors for ``keys`` (rows of ``vectors``)."""
        labels = np.fromiter(keys, dtype=np.int64)
        data = normalize(vectors)
        if len(labels) != len(data):
            raise ValueError("keys and vectors differ in length")
        if data.shape[1] != self.dim:
            raise ValueError(f"vector dimension {data.shape[1]} != index dimension {self.dim}")
        if not len(labels):
            return
        exact = self._exact
        if exact is not None and len(exact) + sum(
                label not in exact for label in labels.tolist()) <= self.exact_max:
            exact.put(labels, data)
            self._live.update(labels.tolist())
            return
        fresh = np.zeros(len(labels), dtype=bool)
        for i, label in enumerate(labels.tolist()):
            if label in self._deleted:
                self._deleted.discard(label)
                try:
                    self._index.unmark_deleted(label)
                except RuntimeError:  # a new key took its place: it is new again
                    fresh[i] = True
                else:
                    self._free -= 1
            elif label not in self._live:
                fresh[i] = True
        # A place is taken over only once the graph is more than half deleted: that costs
        # ~10x an insert (hnswlib repairs the old place's neighbours).
        new = np.flatnonzero(fresh)
        reused = max(0, min(len(new), self._free - len(self._live)))
        needed = self._index.get_current_count() + len(new) - reused
        capacity = self._index.get_max_elements()
        if needed > capacity:
            self._index.resize_index(max(needed, capacity * 2))
        stored = np.flatnonzero(~fresh)
        # Stored keys have their vectors overwritten in place.
        for rows, replace in ((new[:reused], True), (np.concatenate([stored, new[reused:]]),
                                                     False)):
            if len(rows):
                self._index.add_items(data[rows], labels[rows], num_threads=self._threads,
                                      replace_deleted=replace)
        self._free -= reused
        self._live.update(labels.tolist())
        if len(self._deleted) > 2 * self._free + 1024:  # forget the keys replaced since
            self._deleted = set(self._index.get_ids_list()) - self._live

    def remove(self, key: int) -> None:
        if key in self._live and self._exact is not None:
            self._exact.remove(key)
            self._live.discard(key)
        elif key in self._live:
            self._index.mark_deleted(key)
            self._live.discard(key)
            self._deleted.add(key)
            self._free += 1

    def search(
        self, query: npt.ArrayLike, k: int, *, allowed: Callable[[int], bool] | None = None,
        candidates: Candidates | None = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` nearest live keys with cosine similarity, best first, only those
        ``allowed`` passes if given. ``candidates``, if given, holds every key ``allowed``
        may pass: when they are few (``FEW_CANDIDATES``, ``FEW_SHARE``) they are compared
        one by one, as hnswlib's filter walks much of a big graph, calling ``allowed`` at
        every key it meets, before it finds k of a few that pass."""
        if not self._live or k <= 0:
            return []
        k = min(k, len(self._live))
        q = normalize(query)
        if self._exact is not None:
            return self._exact.search(q[0], k, allowed)
        if candidates is not None and len(candidates) <= min(
                FEW_CANDIDATES, len(self._live) // FEW_SHARE):
            return self._search_small(q, k, allowed, candidates)
        self._index.set_ef(max(self.ef_search, 2 * k))
        try:
            labels, distances = self._index.knn_query(q, k=k, filter=allowed)
        except RuntimeError:
            # hnswlib raises when fewer than k elements pass the filter; ask for what exists.
            return self._search_small(q, k, allowed, candidates)
        return [
            (int(label), float(1.0 - dist))
            for label, dist in zip(labels[0].tolist(), distances[0].tolist(), strict=True)
        ]

    def _search_small(
        self, q: F32, k: int, allowed: Callable[[int], bool] | None,
        candidates: Candidates | None,
    ) -> list[tuple[int, float]]:
        live = self._live
        keys = [key for key in (live if candidates is None else candidates)
                if key in live and (allowed is None or allowed(key))]
        if not keys:
            return []
        vecs = normalize(self._index.get_items(keys, return_type="numpy"))
        sims = vecs @ q[0]
        order = np.argsort(-sims, kind="stable")[:k]
        return [(keys[i], float(sims[i])) for i in order.tolist()]

    def vectors(self, keys: list[int]) -> F32:
        """The stored (normalised) vectors for live ``keys``."""
        if self._exact is not None:
            return self._exact.vectors(keys)
        return np.asarray(self._index.get_items(keys, return_type="numpy"), dtype=np.float32)

    # Persistence: hnswlib writes files; callers wrap the bytes in a checksummed blob so
    # the native loader only ever sees verified bytes. The scratch file lives in
    # ``tmp_dir`` (the index's own state directory, whose cleanup removes a leftover).

    def to_bytes(self, tmp_dir: Path | None = None) -> bytes:
        if self._exact is not None:
            keys, rows = self._exact.items()
            return b"".join((MATRIX_MAGIC, np.array([len(keys), self.dim], "<i8").tobytes(),
                             keys.astype("<i8").tobytes(), rows.astype("<f4").tobytes()))
        with _scratch(tmp_dir) as path:
            self._index.save_index(str(path))
            return path.read_bytes()

    @classmethod
    def from_bytes(
        cls, data: bytes, *, dim: int, live: Iterable[int], ef_search: int = 128,
        num_threads: int = 1, tmp_dir: Path | None = None, exact_max: int = EXACT_MAX,
    ) -> VectorIndex:
        """Load verified bytes; ``live`` is the set of keys the manifest says are live.
        Up to ``exact_max`` of them are kept as a matrix, and the graph let go."""
        if data.startswith(MATRIX_MAGIC):
            return cls._from_matrix(data, dim=dim, live=live, ef_search=ef_search,
                                    num_threads=num_threads, exact_max=exact_max)
        self = cls.__new__(cls)
        self.dim = dim
        self.ef_search = ef_search
        self.exact_max = exact_max
        self._threads = num_threads
        self._m = 16
        self._ef_construction = 200
        self._exact = None
        graph = self._graph = _new_hnsw(dim)
        with _scratch(tmp_dir) as path:
            path.write_bytes(data)
            graph.load_index(str(path), max_elements=0, allow_replace_deleted=True)
        graph.set_num_threads(num_threads)
        self._live = set(live)
        stored = set(graph.get_ids_list())
        if not self._live <= stored:
            raise ValueError("hnswlib index lacks live keys")
        if len(self._live) <= exact_max:
            keys = np.fromiter(sorted(self._live), dtype=np.int64, count=len(self._live))
            self._exact = ExactVectors(dim)
            if len(keys):
                self._exact.put(keys, normalize(graph.get_items(keys, return_type="numpy")))
            self._graph = None
            self._deleted, self._free = set(), 0
            return self
        self._deleted = stored - self._live
        self._free = len(self._deleted)
        for key in self._deleted:
            try:
                self._index.mark_deleted(key)
            except RuntimeError:
                pass  # already marked in the saved file
        return self

    @classmethod
    def _from_matrix(cls, data: bytes, *, dim: int, live: Iterable[int], ef_search: int,
                     num_threads: int, exact_max: int) -> VectorIndex:
        head = len(MATRIX_MAGIC) + 16
        n, saved_dim = np.frombuffer(data, "<i8", count=2, offset=len(MATRIX_MAGIC)).tolist()
        if saved_dim != dim or n < 0 or len(data) != head + 8 * n + 4 * n * dim:
            raise ValueError("saved vectors do not fit together")
        keys = np.frombuffer(data, "<i8", count=n, offset=head).astype(np.int64)
        rows = np.frombuffer(data, "<f4", count=n * dim, offset=head + 8 * n).reshape(n, dim)
        wanted = set(live)
        if not wanted <= set(keys.tolist()):
            raise ValueError("saved vectors lack live keys")
        keep = np.fromiter((key in wanted for key in keys.tolist()), dtype=bool, count=n)
        self = cls(dim, ef_search=ef_search, num_threads=num_threads, exact_max=exact_max)
        self.add(keys[keep].tolist(), rows[keep])
        return self


class WindowVectors:
    """Vectors of chunk windows (``windows.py``), a chunk scored by its best window.

    Window ``i`` of chunk ``key`` is label ``key * SLOTS + i`` of one hnswlib index, so a
    chunk's windows are found, replaced and deleted together without a table. Saved with
    the index's generations (:meth:`to_arrays`); when that file is missing or damaged it
    is refilled from the text-keyed embedding cache. Not thread-safe, like
    :class:`VectorIndex`.
    """

    def __init__(self, dim: int, *, initial_capacity: int = 1024) -> None:
        self.dim = dim
        self._index = VectorIndex(dim, initial_capacity=initial_capacity)
        self._count: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, key: int) -> bool:
        return key in self._count

    def keys(self) -> set[int]:
        return set(self._count)

    def count(self, key: int) -> int:
        """How many window vectors chunk ``key`` has (0: none)."""
        return self._count.get(key, 0)

    def add(self, key: int, vectors: npt.ArrayLike) -> None:
        """Set chunk ``key``'s window vectors (rows, window order), replacing older ones."""
        rows = normalize(vectors)
        if not 0 < len(rows) <= SLOTS:
            raise ValueError(f"a chunk has 1 to {SLOTS} windows, not {len(rows)}")
        self.remove(key)
        self._index.add(range(key * SLOTS, key * SLOTS + len(rows)), rows)
        self._count[key] = len(rows)

    @property
    def is_matrix(self) -> bool:
        """Whether the windows' vectors are a matrix (:attr:`VectorIndex.is_matrix`)."""
        return self._index.is_matrix

    def to_arrays(self, tmp_dir: Path | None = None) -> dict[str, npt.NDArray[np.generic]]:
        """The graph's bytes and each chunk's window count (for a checksummed file)."""
        n = len(self._count)
        return {"graph": np.frombuffer(self._index.to_bytes(tmp_dir), dtype=np.uint8),
                "keys": np.fromiter(self._count, dtype=np.int64, count=n),
                "counts": np.fromiter(self._count.values(), dtype=np.uint8, count=n)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, npt.NDArray[np.generic]], *, dim: int,
                    tmp_dir: Path | None = None) -> WindowVectors:
        """Load what :meth:`to_arrays` gave (verified bytes); ValueError / RuntimeError
        when they do not fit together."""
        keys = np.asarray(arrays["keys"]).astype(np.int64)
        counts = np.asarray(arrays["counts"]).astype(np.int64)
        if keys.shape != counts.shape or keys.ndim != 1 or (
                len(keys) and (keys.min() < 0 or counts.min() < 1 or counts.max() > SLOTS)):
            raise ValueError("window keys and counts do not fit together")
        live = [key * SLOTS + i for key, n in zip(keys.tolist(), counts.tolist(), strict=True)
                for i in range(n)]
        self = cls.__new__(cls)
        self.dim = dim
        self._index = VectorIndex.from_bytes(np.asarray(arrays["graph"]).tobytes(), dim=dim,
                                             live=live, tmp_dir=tmp_dir)
        self._count = dict(zip(keys.tolist(), counts.tolist(), strict=True))
        if len(self._count) != len(keys):
            raise ValueError("a chunk's windows are listed twice")
        return self

    def remove(self, key: int) -> None:
        n = self._count.pop(key, 0)
        for label in range(key * SLOTS, key * SLOTS + n):
            self._index.remove(label)

    def search(
        self, query: npt.ArrayLike, k: int, *, allowed: Callable[[int], bool] | None = None,
        candidates: Candidates | None = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` chunks whose best window is nearest, with that window's cosine;
        ``allowed`` and ``candidates`` (chunk keys) as for :meth:`VectorIndex.search`."""
        if not self._count or k <= 0:
            return []
        count = self._count
        labels = None if candidates is None or len(candidates) > FEW_CANDIDATES else [
            key * SLOTS + i for key in candidates for i in range(count.get(key, 0))]

        def live(label: int) -> bool:
            key = label // SLOTS
            return key in count and (allowed is None or allowed(key))

        best: dict[int, float] = {}
        # Several windows of one chunk may come first; ask for more until k chunks show.
        want = 4 * k
        while True:
            hits = self._index.search(query, want, allowed=live, candidates=labels)
            best.clear()
            for label, score in hits:
                key = label // SLOTS
                if score > best.get(key, -2.0):
                    best[key] = score
            if len(best) >= k or len(hits) < want:
                break
            want *= 2
        ranked = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[:k]

    def best(self, query: npt.ArrayLike, keys: Iterable[int]) -> dict[int, tuple[int, float]]:
        """For each of ``keys`` that has windows: (its best window's index, cosine)."""
        q = normalize(query)[0]
        out: dict[int, tuple[int, float]] = {}
        for key in keys:
            n = self._count.get(key)
            if not n:
                continue
            sims = self._index.vectors(list(range(key * SLOTS, key * SLOTS + n))) @ q
            i = int(np.argmax(sims))
            out[key] = (i, float(sims[i]))
        return out


@contextlib.contextmanager
def _scratch(tmp_dir: Path | None) -> Iterator[Path]:
    """A private scratch file named like an interrupted publish (``.x.tmp-<hex>``). In
    ``tmp_dir`` it is named through a handle of that folder (``/proc/self/fd/N/name``):
    hnswlib writes by name, and a link put in the folder's place meanwhile (or in that of
    a folder on its path) cannot take the write elsewhere."""
    if tmp_dir is None:
        with tempfile.TemporaryDirectory(prefix="recalld-hnsw-") as tmp:
            yield Path(tmp) / "index.bin"
        return
    ensure_dir(REAL, tmp_dir)
    name = f".hnsw.tmp-{secrets.token_hex(6)}"
    try:
        folder = confine.open_folder(tmp_dir)
    except OSError as exc:
        raise translate_os_error(exc, tmp_dir) from exc
    try:
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o600, dir_fd=folder))
        except OSError as exc:
            raise translate_os_error(exc, tmp_dir / name) from exc
        try:
            handle = Path(f"/proc/self/fd/{folder}")
            yield (handle if handle.is_dir() else tmp_dir) / name
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=folder)
    finally:
        os.close(folder)
