"""One workspace's in-memory index: files, chunks, keyword index and link graph.

Pure and synchronous. The per-workspace service's passes (``passes.py``) prepare files in
worker threads with :func:`prepare` (read, chunk, tokenize: the CPU-heavy part, no shared
state touched) and then apply the prepared files here under the index lock. Doc keys are
small integers shared by the keyword index, the vector index and fusion; they are never
reused within one state, and a full rebuild starts a new state. The records it keeps and
reports are in ``records.py``, the search filters it applies in ``filters.py``.
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Iterable, Iterator, Sequence

import orjson
from pyroaring import BitMap, FrozenBitMap

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.chunktable import ChunkTable, StoredChunk
from recalld.daemon.index.filters import Filters, authors_of, passing
from recalld.daemon.index.fusion import keyword_reach
from recalld.daemon.index.linked import Target, linked_chunks
from recalld.daemon.index.links import (
    Link,
    LinkGraph,
    name_key,
    note_name,
    pick_note,
    resolve_links,
)
from recalld.daemon.index.postings import Slab
from recalld.daemon.index.prepare import (
    Prepared,
    PreparedBatch,
    partly_indexed,
    prepare,
    prepare_files,
    too_large,
)
from recalld.daemon.index.records import ApplyStats, FileInfo, StateStats, compact_keys
from recalld.daemon.index.tokenizer import tokenize_query
from recalld.daemon.index.vectors import VectorIndex, WindowVectors
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.arrays import Mapped

# :meth:`IndexState.neighbours` remembers up to this many files' neighbours.
NEIGHBOURS_MEMO_MAX = 4096
ALLOWED_MEMO_MAX = 64


def _stem(path: str) -> str:
    return name_key(posixpath.splitext(posixpath.basename(path))[0])


class IndexState:
    """Files, chunks, BM25 and links of one workspace. Not thread-safe: one user at a time."""

    def __init__(self, *, daily_dir: str = "memory", digest_dir: str = "digest") -> None:
        self.daily_dir = daily_dir
        self.digest_dir = digest_dir
        self.files: dict[str, FileInfo] = {}
        #: The indexed notes over ``MAX_NOTE_BYTES`` (indexed up to that size), kept as
        #: files change: replaced, never changed in place, so that status reads it while
        #: an apply in a worker thread changes ``files`` (which it must not iterate then).
        self.oversized: frozenset[str] = frozenset()
        #: The indexed files whose path holds what redaction masks (shown masked), kept
        #: as ``oversized`` is.
        self.secret_named: frozenset[str] = frozenset()
        #: The indexed notes not read as UTF-8 (``FileInfo.encoding``), kept as
        #: ``oversized`` is.
        self.not_utf8: frozenset[str] = frozenset()
        self.chunks = ChunkTable()
        self.bm25 = BM25Index()
        self.graph = LinkGraph()
        self.next_key = 1
        # Stem -> the paths of that stem for bare [[names]] (pick_note picks the one
        # named); None until needed after a load (a workspace that is only searched
        # never builds it).
        self._by_stem: dict[str, dict[str, None]] | None = {}
        # The vectors of ``vector_space`` (chunk ``embedding`` values belong to that space);
        # the backfill owns filling them, ``_drop`` keeps them in step with the chunks.
        self.vectors: VectorIndex | None = None
        self.vector_space: str | None = None
        self.vector_config: JsonObject | None = None
        self.vectors_version = 0
        #: The backfill's window vectors, saved with the generations (``vector_fill.py``
        #: owns them), ``"<space>/<window chars>"`` they are of, and their version.
        self.windows: WindowVectors | None = None
        self.windows_of: str | None = None
        self.windows_version = 0
        #: Files whose memory maps back parts of this state (kept to evict their pages).
        self.mapped: list[Mapped] = []
        # What :meth:`neighbours` found, until files or links change (every search asks
        # it for each hit's file).
        self._neighbours: dict[str, list[str]] = {}
        #: The key of the chunk that stands for a linked note (and section) without a
        #: keyword match (``linked.py``), None for a note with none, until files change.
        self.standing: dict[Target, int | None] = {}
        # What :meth:`allowed` found per filters, until files change: finding it reads
        # every file's path (2-9 ms at 3k notes, against 0.1 ms for the search it filters).
        self._allowed: dict[Filters, FrozenBitMap] = {}

    # -- reading ---------------------------------------------------------------------

    def known(self) -> dict[str, tuple[int, int]]:
        return {p: (f.mtime_ns, f.size) for p, f in self.files.items()}

    def digest_of(self, path: str) -> str | None:
        info = self.files.get(path)
        return info.digest if info else None

    def resolve(self, target: str, src: str = "") -> str | None:
        """The note a wikilink target in the note ``src`` names (a bare name or a path,
        as ``normalize_target`` cleans it), as :func:`links.pick_note` picks it."""
        if "/" in target:
            for path in (target.lstrip("/"), f"{target.lstrip('/')}.md"):
                if path in self.files:
                    return path
        if self._by_stem is None:
            self._by_stem = {}
            for p in self.files:
                self._by_stem.setdefault(_stem(p), {})[p] = None
        return pick_note(target, list(self._by_stem.get(note_name(target), ())), src)

    def allowed(self, filters: Filters) -> BitMap | None:
        """The doc keys that pass ``filters`` (None: everything)."""
        if filters.empty:
            return None
        return BitMap(self._kept(filters))  # the caller's own: nothing it does changes the memo

    def allows_any(self, filters: Filters) -> bool:
        """Whether some chunk passes ``filters``: whether :meth:`allowed` finds any (what
        it finds is kept for the search that follows)."""
        return filters.empty or bool(self._kept(filters))

    def _kept(self, filters: Filters) -> FrozenBitMap:
        """The doc keys that pass ``filters``, found once until files change."""
        found = self._allowed.get(filters)
        if found is None:
            if len(self._allowed) >= ALLOWED_MEMO_MAX:
                self._allowed = {}
            found = self._allowed[filters] = FrozenBitMap(
                key for info in self._passing(filters) for key in info.keys)
        return found

    def _passing(self, filters: Filters) -> Iterator[FileInfo]:
        return passing(self.files, filters, daily_dir=self.daily_dir,
                       digest_dir=self.digest_dir, authors=self.authors)

    def authors(self, path: str) -> tuple[str, ...]:
        """The authors the file's frontmatter names (kept with its first chunk)."""
        info = self.files.get(path)
        if info is None or not info.keys:
            return ()
        return authors_of(self.chunks[info.keys[0]].metadata.get("frontmatter"))

    def keyword_search(
        self, query: str, limit: int, allowed: BitMap | None = None, *,
        tokens: list[str] | None = None,
    ) -> list[tuple[int, float]]:
        """The best ``limit`` keyword hits; ``tokens``: ``tokenize_query(query)`` when the
        caller has it."""
        return self.bm25.search(tokenize_query(query) if tokens is None else tokens, limit,
                                allowed=allowed)

    def keyword_reach(self, tokens: list[str], hits: Sequence[tuple[int, float]]) -> float:
        """How much of the query (``tokens``, as ``tokenize_query`` gives them) the keyword
        branch sees, judged by its best hit (``fusion.keyword_reach``)."""
        bm25 = self.bm25
        return keyword_reach(tokens, hits[0][1] if hits else 0.0, bm25.doc_freq, len(bm25))

    def vector_search(
        self, query: F32, limit: int, allowed: BitMap | None = None
    ) -> list[tuple[int, float]]:
        """Nearest chunks by cosine similarity (empty without vectors)."""
        if self.vectors is None or not len(self.vectors):
            return []
        return self.vectors.search(query, limit, candidates=allowed,
                                   allowed=None if allowed is None else allowed.__contains__)

    def neighbours(self, path: str) -> list[str]:
        """The indexed files one link from ``path`` (either way), sorted."""
        memo = self._neighbours
        found = memo.get(path)
        if found is None:
            if len(memo) >= NEIGHBOURS_MEMO_MAX:
                memo.clear()
            files = self.files
            found = memo[path] = sorted(p for p in self.graph.linked(path) if p in files)
        return list(found)

    def linked_chunks(self, query: str, targets: Sequence[Target], *,
                      tokens: list[str] | None = None) -> dict[Target, StoredChunk]:
        """:func:`linked.linked_chunks` of this state."""
        return linked_chunks(self, query, targets, tokens=tokens)

    # -- writing ---------------------------------------------------------------------

    def apply(self, batches: Iterable[PreparedBatch], *, stage: bool = False,
              compact: bool = True) -> ApplyStats:
        """Bring the index in line with ``batches`` (each file replaced or dropped whole).

        ``stage``: more of the same pass follows; the keyword index may keep these
        documents aside and merge them with the next (``BM25Index.add_encoded``), at the
        latest at the pass's last apply (or :meth:`end_pass`). ``compact`` False: the
        keyword index's compactions are the caller's (``BM25Index.plan_compaction``, run
        without the lock that this call holds; see ``compact_inline``).

        Should this raise part-way (the keyword index's merge out of memory), the files
        it gave new chunks are left out again: every file the state lists stays
        searchable, and the next reconcile reads those files again (on disk, unknown
        here). Files dropped or deleted before stay so."""
        batches = list(batches)
        self.bm25.compact_inline = compact
        # Vocabularies kept by worker processes are looked up first, in batch order (as
        # add_encoded would add the terms): a batch that does not fit what is held raises
        # before any document, file or link changes (earlier batches' new terms stay in
        # the term table, without postings, until a merge drops them).
        own_ids = [None if b.vocab is None else self.bm25.vocabulary_ids(
            (b.vocab.token, b.vocab.pid), b.vocab.start, b.terms) for b in batches]
        added = updated = deleted = unchanged = restat = 0
        unreadable: list[tuple[str, str]] = []
        self._neighbours, self.standing = {}, {}
        parts: list[tuple[list[str] | str | None, Slab]] = []
        made: list[FileInfo] = []  # files given new chunks: left out if the index fails
        waiting: set[str] = set()  # files whose unresolved links a file applied may resolve
        first_key = self.next_key
        try:
            for batch, to_global in zip(batches, own_ids, strict=True):
                keys: list[int] = []
                for prep in batch.files:
                    old = self.files.get(prep.path)
                    if prep.gone:
                        if old is not None:
                            self._drop(old)
                            # Links by name to it may name a file of that name elsewhere.
                            waiting.update(self.graph.unresolve(old.path))
                            deleted += 1
                        continue
                    if prep.error:
                        unreadable.append((prep.path, prep.error))
                        continue
                    if prep.unchanged:
                        # Read as unchanged against a digest this state no longer has (a
                        # file dropped meanwhile): leave it to the next reconcile, which
                        # re-reads it.
                        seen = (prep.mtime_ns, prep.size)
                        if old is not None and (old.mtime_ns, old.size) != seen:
                            self._put(FileInfo(prep.path, prep.mtime_ns, prep.size,
                                               old.digest, old.keys, old.secret_name,
                                               old.encoding))
                            restat += 1
                        unchanged += 1
                        continue
                    if old is not None:
                        self._drop(old)
                        updated += 1
                    else:
                        added += 1
                    first = len(keys)
                    for chunk in prep.chunks:
                        key = self.next_key
                        self.next_key += 1
                        keys.append(key)
                        self.chunks.add(key, chunk.path, chunk.start_line, chunk.end_line,
                                        chunk.text, chunk.heading, chunk.metadata)
                    info = FileInfo(prep.path, prep.mtime_ns, prep.size, prep.digest,
                                    compact_keys(keys[first:]), prep.secret_name,
                                    prep.encoding)
                    self._put(info)
                    made.append(info)
                    if self._by_stem is not None:
                        self._by_stem.setdefault(_stem(prep.path), {})[prep.path] = None
                    self.graph.add_file(prep.path,
                                        resolve_links(prep.path, prep.links, self.resolve))
                    if self.graph.has_dangling:
                        waiting.update(self.graph.waiting_for(_stem(prep.path)))
                    waiting.update(self.graph.naming(_stem(prep.path)))
                if keys:
                    slab = batch.slab
                    if to_global is not None:
                        parts.append((None, slab.mapped(to_global, keys)))
                    else:
                        parts.append((batch.terms,
                                      Slab(slab.tids, slab.tfs, slab.nterms, slab.lens, keys)))
            self.bm25.add_encoded(parts, stage=stage)
        except BaseException:
            # None of this call's documents is in the keyword index: leave out the
            # files given them, and any chunk of a file left half made.
            for info in made:
                if self.files.get(info.path) is info:
                    self._drop(info, keyword=False)
            for key in range(first_key, self.next_key):
                if key in self.chunks:
                    self.chunks.remove(key)
            raise
        if not stage:  # a pass's last apply, or no pass
            self.bm25.forget_vocabularies()
        # Links to a name no file had when their note was applied (a note written before
        # the one it links to, or applied before it in a pass) resolve now, and links by
        # a name a note applied has resolve anew: whatever order the notes came in.
        for path in sorted(waiting & self.files.keys()):
            self.graph.add_file(path, resolve_links(path, self.graph.outgoing(path),
                                                    self.resolve))
        return ApplyStats(added, updated, deleted, unchanged, tuple(unreadable), restat)

    def end_pass(self) -> list[str]:
        """End a pass whose last apply never came (it failed or was cancelled part-way):
        merge the documents its applies staged, so that every file listed is searchable,
        and let go of the worker vocabularies it held.

        Should that merge fail too, the staged documents' files are left out (the next
        reconcile reads them again: on disk, unknown here); returns their paths."""
        try:
            self.bm25.merge_staged()
        except Exception:
            staged = self.bm25.drop_staged()
            out = [info for info in self.files.values() if info.keys and info.keys[0] in staged]
            self._neighbours, self.standing = {}, {}
            for info in out:
                self._drop(info, keyword=False)
            return [info.path for info in out]
        finally:
            self.bm25.forget_vocabularies()
        return []

    def _put(self, info: FileInfo) -> None:
        self.files[info.path] = info
        self._allowed = {}
        big = too_large(info.size)
        if big != (info.path in self.oversized):
            self.oversized = (self.oversized | {info.path} if big
                              else self.oversized - {info.path})
        if info.secret_name != (info.path in self.secret_named):
            self.secret_named = (self.secret_named | {info.path} if info.secret_name
                                 else self.secret_named - {info.path})
        if bool(info.encoding) != (info.path in self.not_utf8):
            self.not_utf8 = (self.not_utf8 | {info.path} if info.encoding
                             else self.not_utf8 - {info.path})

    def _drop(self, info: FileInfo, *, keyword: bool = True) -> None:
        """Forget ``info``'s file; ``keyword``: its documents are in the keyword index."""
        for key in info.keys:
            if keyword:
                self.bm25.remove(key)
            self.chunks.remove(key)
            if self.vectors is not None and key in self.vectors:
                self.vectors.remove(key)
                self.vectors_version += 1
        del self.files[info.path]
        self._allowed = {}
        if info.path in self.oversized:
            self.oversized = self.oversized - {info.path}
        if info.path in self.secret_named:
            self.secret_named = self.secret_named - {info.path}
        if info.path in self.not_utf8:
            self.not_utf8 = self.not_utf8 - {info.path}
        stem = _stem(info.path)
        if self._by_stem is not None:  # another file of that stem is named now, if any
            paths = self._by_stem.get(stem, {})
            paths.pop(info.path, None)
            if not paths:
                self._by_stem.pop(stem, None)
        self.graph.remove_file(info.path)

    # -- persistence -----------------------------------------------------------------

    def restore(
        self,
        files: Iterable[FileInfo],
        chunks: ChunkTable,
        bm25: BM25Index,
        graph: LinkGraph,
        next_key: int,
    ) -> None:
        """Adopt loaded state; raises ValueError when the parts do not agree (and then
        leaves this state as it was)."""
        by_path = {f.path: f for f in files}
        keys = BitMap()
        for f in by_path.values():
            keys.update(f.keys)
        if len(keys) != sum(len(f.keys) for f in by_path.values()) or (
                keys != chunks.live or keys != bm25.live):
            raise ValueError("files, chunks and keyword index disagree")
        self.oversized = frozenset(partly_indexed(by_path))
        self.secret_named = frozenset(p for p, f in by_path.items() if f.secret_name)
        self.not_utf8 = frozenset(p for p, f in by_path.items() if f.encoding)
        self.files = by_path
        self._allowed = {}
        self.chunks = chunks
        self.bm25 = bm25
        self.graph = graph
        self.next_key = max(next_key, (keys.max() if keys else 0) + 1)
        self._by_stem = None
        self._neighbours, self.standing = {}, {}

    def repack(self, chunks: ChunkTable, bm25: BM25Index) -> None:
        """Serve ``chunks`` and ``bm25`` (this state's own, loaded back from the files it
        was just saved to) and make every file record and link anew, after the old ones
        are gone; raises ValueError (and changes nothing) if they hold other keys.

        After a large pass the objects that outlive it were made a batch at a time in
        between the pass's garbage, so a few of them keep most of the heap's pages in use
        (CPython never returns a partly used arena). Made anew from their records, one
        at a time, they fill few pages, and the old ones go. Readers without the lock
        (status, the watcher's file list) see the old parts or the new ones, never none.
        """
        if chunks.live != self.chunks.live or bm25.live != self.bm25.live:
            raise ValueError("the reloaded index holds other chunks than the one in memory")
        bm25.merges = self.bm25.merges
        records = io.BytesIO()
        for info in self.files.values():
            records.write(orjson.dumps(info.to_record()) + b"\n")
        links = io.BytesIO()
        for rec in self.graph.records():
            links.write(orjson.dumps(rec) + b"\n")
        records.seek(0)
        links.seek(0)
        files: dict[str, FileInfo] = {}
        for line in records:
            info = FileInfo.from_record(orjson.loads(line))
            files[info.path] = info
        graph = LinkGraph.from_records(orjson.loads(line) for line in links)
        self.files, self.graph, self._by_stem = files, graph, None
        self._allowed = {}
        self._neighbours, self.standing = {}, {}
        self.chunks, self.bm25 = chunks, bm25

    def evict(self) -> None:
        """Let go of the mapped state pages this process touched (a save reads them all);
        they stay in the page cache and searches fault in the few they need."""
        for mapped in self.mapped:
            mapped.evict()

    def stats(self) -> StateStats:
        return {"files": len(self.files), "chunks": len(self.chunks), "links": len(self.graph),
                "keyword": self.bm25.stats()}


__all__ = [
    "IndexState", "Link", "Prepared", "PreparedBatch", "StoredChunk", "prepare", "prepare_files",
]
