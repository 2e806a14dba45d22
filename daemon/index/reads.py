"""Who uses one workspace's index state, and how: the index lock, searches, the idle trim.

:class:`StateAccess` owns the index lock. Mutations and searches take it and run in a
worker thread under the daemon-wide CPU limiter, so the event loop never waits on them and
searches always see a whole batch or none of it; a search whose keyword scoring is surely
short runs on the event loop instead (:meth:`StateAccess.reads_now`). It also owns the
idle trim, a task the index service starts (:meth:`StateAccess.trim_when_idle`), which
ends by cancellation. :func:`gather` is what one search reads from the state, in one call
under the lock; :class:`Candidates` is what it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

import trio

from recalld.daemon import memtrim
from recalld.daemon.arraytypes import F32
from recalld.daemon.index.chunktable import ChunkTable
from recalld.daemon.index.exact import exact_first
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.linked import Target, linked_sections, stands
from recalld.daemon.index.memo import Memo
from recalld.daemon.index.state import IndexState, StoredChunk
from recalld.daemon.index.ties import Place, exact_by_place, hits_by_place, settled
from recalld.daemon.index.tokenizer import tokenize_query
from recalld.daemon.index.windows import Window

if TYPE_CHECKING:
    from recalld.daemon.index.embedder import VectorWorker

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# A search runs on the event loop, rather than paying a worker-thread round trip, only
# while its keyword scoring surely takes under about a millisecond: scoring walks the
# postings of every query term, so its cost grows with chunks x terms (a 16-character
# Chinese query, 15 bigrams, over 15k chunks is about that). Anything larger goes to a
# worker thread under the CPU limiter.
INLINE_READ_MAX_CHUNKS = 20_000
INLINE_SEARCH_BUDGET = 200_000  # chunks x query terms
INLINE_QUERY_MAX_CHARS = 256  # longer queries are not even tokenized on the loop


@dataclass(frozen=True, slots=True)
class Candidates:
    """What one search needs from the index, read under one lock acquisition."""

    keyword: list[tuple[int, float]]
    vector: list[tuple[int, float]]
    exact: set[int]
    chunks: dict[int, StoredChunk]
    links: dict[str, list[str]]  # candidate path -> linked paths
    #: (linked path, the section a hit's link to it names, or "") -> its chunk that best
    #: matches the query, else its first with body text (``linked.linked_chunks``)
    firsts: dict[Target, StoredChunk]
    #: How much of the query the keyword branch sees (``fusion.keyword_reach``); measured
    #: only when there is a vector branch to fuse with.
    reach: float = 1.0
    #: candidate key -> its window nearest the query (when asked for and known)
    windows: dict[int, Window] = field(default_factory=dict)
    #: (candidate path, linked path) -> the section of the linked note that the
    #: candidate's first link naming one names (``linked.linked_sections``)
    sections: dict[tuple[str, str], str] = field(default_factory=dict)


class StateAccess:
    """The index lock of one workspace and the ways to take it.

    ``state`` gives the :class:`IndexState` served now (a rebuild swaps in a new object).
    ``lock`` is the index lock itself, for the owner's swaps and commits; ``idle_trims``
    counts the idle trims so far.
    """

    def __init__(self, state: Callable[[], IndexState], *, cpu: trio.CapacityLimiter,
                 idle_trim_s: float) -> None:
        self._state = state
        self._cpu = cpu
        self._idle_trim_s = idle_trim_s
        self.lock = trio.Lock()
        #: When a search or an apply last used the state (``trio.current_time``), whether
        #: one did since the last idle trim, and how many idle trims there were.
        self._last_use = 0.0
        self._used = trio.Event()
        self.idle_trims = 0
        self._compaction_wanted = trio.Event()
        self._thawing = trio.Lock()
        # The saved delta whose dicts could not be made (not tried again off the lock).
        self._thaw_failed: object = None

    async def run_locked(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Run ``fn(*args)`` (a search or an apply) in a worker thread, holding a CPU token
        and the index lock."""
        # The CPU token before the index lock, as a commit takes them: in the other order
        # a commit holding the last token and an apply holding the lock would wait for
        # each other for ever.
        self.note_use()  # from the call on: a trim waiting for the lock stands back
        async with self._cpu, self.lock:
            return await trio.to_thread.run_sync(partial(fn, *args))

    def reads_now(self, query: str) -> bool:
        """Whether a search for ``query`` runs at once, on the event loop: its scoring is
        short (see :data:`INLINE_SEARCH_BUDGET`) and no writer holds the lock."""
        if len(query) > INLINE_QUERY_MAX_CHARS or self.lock.locked():
            return False
        chunks = len(self._state().chunks)
        return chunks <= INLINE_READ_MAX_CHUNKS and (
            chunks * max(1, _query_terms(query)) <= INLINE_SEARCH_BUDGET)

    async def read(self, fn: Callable[[], T], query: str) -> T:
        """Run a search's read-only ``fn`` under the lock: inline when :meth:`reads_now`
        (a worker-thread hop costs more than the search itself; nothing else can run
        while ``fn`` does, so the free lock need not be taken), in a worker thread under
        the CPU limiter otherwise, so the event loop never waits on a long one."""
        self.note_use()
        if self.reads_now(query):
            return fn()
        return await self.run_locked(fn)

    async def locked(self, fn: Callable[[IndexState], T]) -> T:
        """Run ``fn(state)`` in a worker thread, holding a CPU token and the index lock."""
        async with self._cpu, self.lock:
            state = self._state()
            return await trio.to_thread.run_sync(fn, state)

    def note_use(self) -> None:
        """A search or an apply read the state (housekeeping through :meth:`locked`, such
        as health's periodic scan, does not count: it would wake the idle trim for ever)."""
        self._last_use = trio.current_time()
        self._used.set()

    async def trim_when_idle(self) -> None:
        """Once no search or apply used the state for ``idle_trim_s``, let go of the pages
        of its mapped files that searches faulted in (they stay in the page cache: the
        next search maps back the few it needs) and give freed heap back to the system.
        Sleeps while nothing uses the state: an idle daemon does no work for this."""
        if self._idle_trim_s <= 0:
            return
        def idle_since() -> float:  # when the state counts as idle (uses move it on)
            return self._last_use + self._idle_trim_s

        while True:
            await self._used.wait()
            await trio.sleep_until(idle_since())
            if trio.current_time() < idle_since():
                continue
            async with self.lock:  # a swap in a worker thread replaces the mapped files
                if trio.current_time() < idle_since():
                    continue  # used while the lock was held: not idle after all
                self._used = trio.Event()
                # On the event loop: both take about a millisecond (madvise over the
                # resident pages, malloc_trim over a heap of tens of MB), once per idle
                # period, and nothing can use the state meanwhile.
                self._state().evict()
                memtrim.trim()
                self.idle_trims += 1


    async def thaw_delta(self) -> None:
        """Make the keyword delta's dicts off the lock if a load left it as saved (see
        ``index/delta.py``): else the first write that changes it makes them under the
        lock, and every search waits for that (0.35 s at 110k chunks). A background step
        after the start and every write before it call this; one at a time, so the
        dicts are made once. Upkeep: a failure (out of memory) is logged, leaves it as
        saved and is not tried again here (a write then makes them, or fails, under the
        lock)."""
        async with self._thawing:
            # Read without the lock: a reference, and the adoption checks it is current.
            bm25 = self._state().bm25
            form = bm25.delta.saved_form
            if form is not self._thaw_failed:
                self._thaw_failed = None  # (its arrays, megabytes, are let go)
            if form is None or form is self._thaw_failed:
                return
            try:
                # Abandoned when cancelled: it reads only arrays nothing changes.
                docs, post = await trio.to_thread.run_sync(form.thaw, limiter=self._cpu,
                                                           abandon_on_cancel=True)
            except Exception as exc:
                self._thaw_failed = form
                log.warning("keyword index: the loaded delta stays as saved (%s: %s)",
                            type(exc).__name__, exc,
                            exc_info=not isinstance(exc, MemoryError))
                return
            async with self.lock:
                bm25.adopt_delta(form, docs, post)  # refused if a write made them meanwhile

    def want_compaction(self) -> None:
        """The keyword index's delta or dead rows reached their limits (an apply left the
        compaction to :meth:`compact_when_due`)."""
        self._compaction_wanted.set()

    async def compact_when_due(self, background: trio.CapacityLimiter,
                               compacted: Callable[[], None]) -> None:
        """Compact the keyword index when :meth:`want_compaction` says so, without holding
        the index lock through the merge: at 110k chunks a merge takes seconds, which
        every search and edit waited for when the apply that filled the delta merged it.
        The lock is taken to plan (the delta encoded, the alive bits copied) and to
        install (what changed meanwhile carried over); the merge runs between, in a
        worker thread with a CPU token. Background work: it takes a ``background`` token
        first. ``compacted`` is called after an install (the new main is to be saved).
        A task the index service starts; it ends by cancellation."""
        while True:
            await self._compaction_wanted.wait()
            self._compaction_wanted = trio.Event()
            async with background:
                if await self._compact_once():
                    compacted()

    async def _compact_once(self) -> bool:
        state = self._state()
        plan = None
        try:
            async with self.lock:
                state = self._state()
                plan = await trio.to_thread.run_sync(state.bm25.plan_compaction)
            if plan is None:
                return False
            # Abandoned when cancelled: it reads only arrays nothing changes and copies.
            await trio.to_thread.run_sync(plan.run, limiter=self._cpu, abandon_on_cancel=True)
            async with self.lock:
                if self._state() is not state:  # a rebuild or a load again replaced it
                    return False
                return await trio.to_thread.run_sync(state.bm25.install_compaction, plan)
        except Exception as exc:  # out of memory, or a fault: the index stays as it was
            async with self.lock:  # (logged there) and it tries again later
                (state.bm25 if plan is None else plan.index).compaction_failed(exc)
            return False


def gather(
    state: IndexState, vectors: Callable[[], VectorWorker | None], query: str, limit: int,
    filters: Filters, query_vector: tuple[str, F32] | None,
    *, link_limit: int, keep: int | None, windows: bool,
) -> Candidates:
    """Keyword hits, vector hits, exact keys, their chunks and their link neighbourhood
    from ``state`` (call under the index lock); ``vectors`` gives the workspace's vector
    backfill, if one is attached (see ``WorkspaceIndex.candidates``)."""
    allowed = state.allowed(filters)
    # The exact check reads the top hits' chunks; the results read them again
    # (the chunk table keeps the chunks it built lately).
    table = state.chunks
    # Once for every step below; a short query's are remembered (_query_tokens).
    tokens = list(_query_tokens(query))
    place = places(table)
    hits, exact = exact_first(
        query, state.bm25,
        settled(lambda n: state.keyword_search(query, n, allowed, tokens=tokens), limit,
                place, keep=keep),
        table, limit=limit, allowed=allowed, tokens=tokens)
    if exact:
        hits = exact_by_place(hits, exact, place)
    chunks = {key: table[key] for key, _ in (hits if keep is None else hits[:keep])}
    vec_hits: list[tuple[int, float]] = []
    reach = 1.0
    # A query embedded in another space (a model change ended meanwhile) meets no vector.
    if query_vector is not None and query_vector[0] != state.vector_space:
        query_vector = None
    if query_vector is not None:
        worker = vectors()
        vec_hits = (state.vector_search(query_vector[1], limit, allowed)
                    if worker is None else
                    worker.fill.search(state, query_vector[1], limit, allowed))
        vec_hits = hits_by_place(vec_hits, place)
        chunks.update((key, state.chunks[key]) for key, _ in vec_hits)
        reach = state.keyword_reach(tokens, hits)
    links: dict[str, list[str]] = {}
    firsts: dict[Target, StoredChunk] = {}
    sections: dict[tuple[str, str], str] = {}
    if link_limit:
        hit_paths = dict.fromkeys(c.path for c in chunks.values())
        targets: dict[str, None] = {}
        wanted: dict[Target, None] = {}
        for path in hit_paths:
            links[path] = state.neighbours(path)
            sections.update(linked_sections(path, state.graph.outgoing(path)))
            for other in links[path]:
                # With ``keep`` the hits are the results, which expansion skips, unless
                # ``min_score`` drops them: read, but taking no neighbour's place.
                if keep is not None and other in hit_paths:
                    wanted[other, sections.get((path, other), "")] = None
                    continue
                if other not in targets and (len(targets) >= link_limit
                                             or not stands(state, other)):
                    continue
                targets[other] = None
                wanted[other, sections.get((path, other), "")] = None
        firsts = state.linked_chunks(query, list(wanted), tokens=tokens)
    best: dict[int, Window] = {}
    if windows and query_vector is not None and (worker := vectors()) is not None:
        best = worker.fill.best_windows(state, query_vector[1], chunks)
    return Candidates(hits, vec_hits, exact, chunks, links, firsts, reach, best, sections)


def places(chunks: Mapping[int, StoredChunk]) -> Callable[[int], Place]:
    """A chunk's place (path, first line) by its key, as ``ties.py`` orders tied hits."""
    if isinstance(chunks, ChunkTable):
        return chunks.place  # without building the chunk

    def place(key: int) -> Place:
        chunk = chunks[key]
        return chunk.path, chunk.start_line

    return place


def _tokens(query: str) -> tuple[str, ...]:
    return tuple(tokenize_query(query))


#: ``tokenize_query(query)``, remembered for a short query (at most
#: :data:`INLINE_QUERY_MAX_CHARS`): an inline search asks for its terms to decide where it
#: runs, then searches with them; agents repeat queries.
_query_tokens = Memo(_tokens, 256, max_chars=INLINE_QUERY_MAX_CHARS).__getitem__


def _query_terms(query: str) -> int:
    """How many terms ``query`` has."""
    return len(_query_tokens(query))
