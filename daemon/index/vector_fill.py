"""Which vector index one workspace's backfill fills, and which vectors serve its searches.

:class:`VectorFill` is the part of a :class:`~.embedder.VectorWorker` that works on the
index state; the worker calls it under the index lock. It binds to the state (a rebuild
swaps in a new one), picks each round's chunks (newest content first: daily notes by
date, other notes by mtime; parked chunks wait until their time) and installs the vectors
the worker embedded. On a model change, when the index holds vectors of another space,
those keep serving searches while the new space fills a second :class:`VectorIndex`; at
full coverage the new index is swapped in and the chunk embeddings rewritten. It also
keeps the chunks' window vectors and answers a search's vector branch from them (a chunk
by its best window). It awaits nothing and starts no task: nothing to stop.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap

from recalld.daemon.arraytypes import F32
from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.index.embedcache import decode_f16, encode_f16, text_hash
from recalld.daemon.index.filters import note_date
from recalld.daemon.index.parking import ParkedTexts
from recalld.daemon.index.records import FileInfo
from recalld.daemon.index.spaces import VectorSpace, VectorSpaces, public_config
from recalld.daemon.index.state import IndexState
from recalld.daemon.index.vectors import VectorIndex, WindowVectors
from recalld.daemon.index.windows import Window, chunk_windows, embed_units
from recalld.daemon.memory.slugs import shows_no_word

#: Chunks with a vector whose text a locked call splits into windows to learn whether
#: they need window vectors (~10 us each): a restart looks at every chunk once, and
#: searches wait for the lock meanwhile; the rest follow in the next calls.
SPLITS_PER_CALL = 2048


@dataclass(slots=True)
class _Round:
    """What one locked read found: the next texts to embed and the coverage counts."""

    items: list[tuple[int, str]]
    total: int
    pending: int
    #: Per item, the texts to embed: its windows, or the chunk text itself.
    texts: list[list[str]]
    #: Chunks still to be looked at (whether they need window vectors).
    more: bool = False


def _recency(info: FileInfo, daily_dir: str) -> float:
    """Newest first: a daily note by its folder date, anything else by its mtime."""
    if info.path.startswith(daily_dir + "/"):
        day = note_date(info.path)
        if day is not None:  # a calendar day (note_date)
            return dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp() + 86399.0
    return info.mtime_ns / 1e9


def _same(saved: str | None, vec: F32) -> bool:
    """Whether ``saved`` (a chunk's ``_embedding_f16_b64``) is ``vec`` up to float16
    rounding: the mean of windows read back from the cache (float16) is not bit for bit
    the mean of the provider's float32 rows."""
    if saved is None:
        return False
    try:
        old = decode_f16(saved)
    except ValueError:
        return False
    return old.shape == vec.shape and bool(np.allclose(old, vec, rtol=0.0, atol=2e-3))


class VectorFill:
    """The vector index being filled and the space serving searches, for one worker."""

    def __init__(self, agent_id: str, spaces: VectorSpaces, config: EmbeddingModelConfig,
                 target: VectorSpace, window_chars: int, *, log: logging.Logger) -> None:
        self.agent_id = agent_id
        #: The worker's logger: a model change is logged as the vector service's news.
        self.log = log
        self.spaces = spaces
        self.config = config
        self.target = target
        #: Window size of the vector unit (see ``VectorWorker.window_chars``).
        self.window_chars = window_chars
        #: The window vectors, in the target space (with ``window_chars``), of the chunks
        #: of more than one window. A chunk of one window has none: its window is the
        #: chunk itself, whose vector the chunk index holds (a copy would double the
        #: memory and cost an hnswlib insert per chunk at every start).
        self.windows: WindowVectors | None = None
        #: Chunks known to be of one window (keys are never reused: a key names one text).
        self._single = BitMap()
        #: Chunks looked at for words, and those of them that show none (``#``, ``---``,
        #: zero-width spaces): those need no vector, never get one and are not counted.
        self._seen = BitMap()
        self.wordless = BitMap()
        #: Chunks given window vectors so far (the worker commits them).
        self.new_windows = 0
        #: The space whose vectors answer searches now (the old one during a model change).
        self.serving: VectorSpace | None = target
        self._state: IndexState | None = None
        self._building: VectorIndex | None = None
        self._shadow: VectorIndex | None = None
        #: Parked chunks (key -> when they are tried again): the provider refused them.
        self.failed: dict[int, float] = {}
        #: The parked texts kept across restarts (``parking.py``; set by the worker), and
        #: the chunks already looked up in them (a chunk's key names one text).
        self.texts: ParkedTexts | None = None
        self._looked_up: set[int] = set()
        #: Whether a chunk text has a vector of its whole that serves as its one window
        #: (ReMe embedded it whole: its windows would be paid for again).
        self.whole: Callable[[str], bool] = lambda _text: False

    @property
    def migrating(self) -> bool:
        return self._shadow is not None

    # -- mode: which index is being filled, which one serves ---------------------------

    def adopted(self, state: IndexState) -> bool:
        """Whether the fill is bound to ``state`` (:meth:`adopt` has taken it)."""
        return state is self._state

    def adopt(self, state: IndexState) -> None:
        """Bind to ``state`` (a rebuild swaps in a new one): normal mode or a migration."""
        if self.adopted(state):
            return
        self._state = state
        self.failed.clear()
        self._looked_up.clear()
        self._single = BitMap()
        self._seen, self.wordless = BitMap(), BitMap()
        target = self.target
        # Keys are those of ``state``: the windows it loaded serve if they are of this
        # space and window size; else (a swapped-in state, another setting) they start
        # afresh, from the embedding cache.
        wins, of = state.windows, f"{target.key}/{self.window_chars}"
        if not self.window_chars:
            wins = None
        elif wins is None or state.windows_of != of or wins.dim != target.dims:
            wins = WindowVectors(target.dims)
        if wins is not state.windows:
            state.windows, state.windows_of = wins, of
            state.windows_version += 1
        self.windows = wins
        old = state.vectors
        if old is None or not len(old) or (
            state.vector_space in (None, target.key) and old.dim == target.dims):
            if old is None or old.dim != target.dims:
                state.vectors = VectorIndex(target.dims)
            state.vector_space = target.key
            state.vector_config = public_config(target.client.config)
            self._building, self._shadow = state.vectors, None
            self.serving = target
            return
        # Another space's vectors: keep them answering while the new space fills up.
        self._shadow = VectorIndex(target.dims, initial_capacity=max(len(state.chunks), 16))
        self._building = self._shadow
        self.serving = self.spaces.old_space(state.vector_config, self.config)
        meanwhile = ("the old vectors serve" if self.serving is not None else
                     "searches are keyword-only (the old model cannot embed a query)")
        self.log.info("%s: embedding model changed (%s -> %s); %s until the new vectors "
                      "are complete", self.agent_id, state.vector_space, target.key,
                      meanwhile)

    def next_round(self, state: IndexState, limit: int, now: float) -> _Round:
        self.adopt(state)
        building = self._building
        assert building is not None
        daily = state.daily_dir
        items: list[tuple[int, str]] = []
        pending = split = 0
        more = False
        single = self._single
        parked: dict[int, float] = {}
        wins = self.windows
        if wins is not None:
            for key in wins.keys():
                if key not in state.chunks:
                    wins.remove(key)
                    state.windows_version += 1
            single -= BitMap(key for key in single if key not in state.chunks)
        wordless, seen = self.wordless, self._seen
        wordless -= BitMap(key for key in wordless if key not in state.chunks)
        for info in sorted(state.files.values(), key=lambda f: _recency(f, daily),
                           reverse=True):
            for key in info.keys:
                if key not in seen:
                    seen.add(key)
                    if shows_no_word(state.chunks.text(key)):
                        wordless.add(key)
                        self._drop(state, key)  # a vector of a former release
                if key in wordless:
                    continue
                if key in building:
                    if wins is None or key in wins or key in single:
                        continue
                    if split >= SPLITS_PER_CALL:
                        more = True
                        continue
                    split += 1
                    if len(self.units(state.chunks.text(key))) == 1:
                        single.add(key)  # its own vector is its window's
                        continue
                pending += 1
                until = self.failed.get(key, -math.inf)
                if until <= now and self.texts and key not in self._looked_up:
                    until = self._parked_until(state.chunks.text(key), now)
                    self._looked_up.add(key)
                if until > now:
                    parked[key] = until
                elif len(items) < limit:
                    items.append((key, state.chunks.text(key)))
        self.failed = parked  # vanished or due keys leave the parking lot
        return _Round(items, len(state.chunks) - len(wordless), pending,
                      [self.units(t) for _, t in items], more)

    def _drop(self, state: IndexState, key: int) -> None:
        """Take the vectors of ``key`` (a chunk that shows no word) out of every index."""
        dropped = False
        for index in (self._building, state.vectors):
            if index is not None and key in index:
                index.remove(key)
                dropped = True
        if self.windows is not None and key in self.windows:
            self.windows.remove(key)
            state.windows_version += 1
        if dropped or state.chunks.embedding(key) is not None:
            state.chunks.set_embedding(key, None)
            state.vectors_version += 1

    def _parked_until(self, text: str, now: float) -> float:
        """When a chunk of ``text`` is tried again (``now``'s clock) if one of its texts was
        parked before a restart and its time has not come, else -inf."""
        assert self.texts is not None
        wall = time.time()
        until = -math.inf
        for unit in self.units(text):
            found = self.texts.get(text_hash(unit))
            if found is not None and found.until > wall:
                until = max(until, now + found.until - wall)
        return until

    def parked_in_use(self, state: IndexState) -> set[str] | None:
        """The hashes of the parked texts (``texts``) that a chunk of ``state`` still
        waits for, or None when not bound to ``state`` (a rebuild swapped it)."""
        if self.texts is None or not self.adopted(state) or self._building is None:
            return None
        building, wins, single = self._building, self.windows, self._single
        used: set[str] = set()
        for key in state.chunks:
            if key in self.wordless or (key in building and (
                    wins is None or key in wins or key in single)):
                continue  # it has every vector it needs (or needs none): nothing waits
            used.update(h for unit in self.units(state.chunks.text(key))
                        if (h := text_hash(unit)) in self.texts)
        return used

    def parked_places(self, state: IndexState, limit: int) -> list[str]:
        """``path:start-end`` of the first ``limit`` parked chunks still in ``state``, by
        path (lookups only: safe beside a running apply)."""
        chunks = state.chunks
        places = sorted((c.path, c.start_line, c.end_line) for c in
                        (chunks[key] for key in list(self.failed) if key in chunks))
        return [f"{path}:{start}-{end}" for path, start, end in places[:limit]]

    def holds(self, key: int) -> bool:
        """Whether the index being filled has a vector for ``key``."""
        return self._building is not None and key in self._building

    def units(self, text: str) -> list[str]:
        """What is embedded for a chunk of ``text``: its windows, or the text itself (also
        when :attr:`whole` says its whole vector is had already)."""
        units = embed_units(text, self.window_chars)
        return [text] if len(units) > 1 and self.whole(text) else units

    def install(self, state: IndexState, found: list[tuple[int, str, F32]],
                 windows: list[F32] | None = None) -> int:
        if state is not self._state or self._building is None:
            return 0  # a rebuild swapped the state; the cache keeps the vectors
        keys: list[int] = []
        rows: list[F32] = []
        for i, (key, text, vec) in enumerate(found):
            if key not in state.chunks or state.chunks.text(key) != text:
                continue  # edited meanwhile: the new chunk is pending under a new key
            if windows is not None and self.windows is not None:
                if len(windows[i]) > 1:
                    self.windows.add(key, windows[i])
                    state.windows_version += 1
                    self.new_windows += 1
                else:
                    self._single.add(key)
            if key in self._building and _same(state.chunks.embedding(key), vec):
                # The vector it has (a restart refilling its windows from the cache):
                # no change to install, count or commit.
                continue
            if self._shadow is None:
                state.chunks.set_embedding(key, encode_f16(vec))
            keys.append(key)
            rows.append(vec)
        if keys:
            self._building.add(keys, np.stack(rows))
            if self._shadow is None:
                state.vectors_version += 1
        return 0 if self._shadow is not None else len(keys)

    def swap(self, state: IndexState) -> int:
        """Finish a model change once the new space covers every chunk it can: all but
        those whose texts the new model refused (parked: they wait in the new space as
        they would without a change; waiting for them would leave every note written
        since out of vector search for good). Never to a space holding no vector (a model
        that refuses every text is a fault of its configuration: the old one serves on)."""
        shadow = self._shadow
        if shadow is None or state is not self._state:
            return 0
        live = set(state.chunks)
        for key in shadow.keys() - live:
            shadow.remove(key)
        refused = [key for key in live if key not in shadow and key not in self.wordless]
        if any(key not in self.failed for key in refused) or (refused and not len(shadow)):
            return 0
        for key in refused:
            state.chunks.set_embedding(key, None)  # the old space's vector
        keys = sorted(live - set(refused) - set(self.wordless))
        if keys:
            for key, vec in zip(keys, shadow.vectors(keys), strict=True):
                state.chunks.set_embedding(key, encode_f16(vec))
        state.vectors = shadow
        state.vector_space = self.target.key
        state.vector_config = public_config(self.target.client.config)
        state.vectors_version += 1
        self._building, self._shadow = shadow, None
        self.serving = self.target
        return max(len(keys), 1)

    # -- search side -----------------------------------------------------------------

    def search(self, state: IndexState, query: F32, limit: int,
               allowed: BitMap | None) -> list[tuple[int, float]]:
        """Nearest chunks, each by its best window where its windows are in (not during
        a model change), else by its own vector. Called under the index lock."""
        wins = self.windows
        if wins is None or not len(wins) or self._shadow is not None or state is not self._state:
            return state.vector_search(query, limit, allowed)
        chunks = state.chunks

        def test(key: int) -> bool:
            # A removed chunk's windows stay until the backfill's next round drops them
            # (it may be waiting on the provider meanwhile).
            return key in chunks and (allowed is None or key in allowed)

        hits = wins.search(query, limit, allowed=test, candidates=allowed)
        vectors = state.vectors
        if vectors is not None and (self._single or len(wins) < len(vectors)):
            # Chunks of one window, and those whose windows are not back yet (after a
            # restart), by their own vector.
            hits += vectors.search(query, limit, candidates=allowed,
                                   allowed=lambda key: key not in wins and test(key))
            hits.sort(key=lambda kv: (-kv[1], kv[0]))
        return hits[:limit]

    def best_windows(self, state: IndexState, query: F32,
                     keys: Iterable[int]) -> dict[int, Window]:
        """The best window (lines of the chunk text) of each of ``keys`` that has windows.
        Called under the index lock."""
        wins = self.windows
        if wins is None or self._shadow is not None or state is not self._state:
            return {}
        keys = list(keys)
        out: dict[int, Window] = {}
        for key, (i, _) in wins.best(query, keys).items():
            parts = chunk_windows(state.chunks.text(key), self.window_chars)
            if wins.count(key) == len(parts):  # else one vector spans the whole chunk
                out[key] = parts[i]
        for key in keys:
            if key in self._single and key not in wins:
                parts = chunk_windows(state.chunks.text(key), self.window_chars)
                if len(parts) == 1:  # else one vector spans the whole chunk (ReMe's)
                    out[key] = parts[0]
        return out


__all__ = ["VectorFill"]
