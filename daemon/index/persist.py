"""Saving and loading one workspace's index under ``<workspace>/<metadata_dir>/``.

Generation files live in ``index/`` with a manifest as the only commit point
(:mod:`recalld.daemon.store.manifest`): the chunk records (QwenPaw's record format, with
``_embedding_f16_b64`` where a vector exists), links, and what was indexed at which stat
and digest. Nothing is written under ReMe's names (``file_store/``, ``file_graph/``,
``file_catalog/``): a workspace ReMe (QwenPaw) also serves keeps ReMe's files as ReMe wrote
them, so going back to it needs no rebuild. The keyword index is saved as checksummed numpy
arrays, never pickled.

Everything here blocks; the index service runs it in worker threads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from recalld.daemon.index.bm25 import BM25Index, OutdatedFormat
from recalld.daemon.index.chunker import index_text
from recalld.daemon.index.chunktable import ChunkTable, StoredChunk
from recalld.daemon.index.links import Link, LinkGraph, LinkRecord
from recalld.daemon.index.persist_vectors import restore_vectors, restore_windows
from recalld.daemon.index.records import FileInfo
from recalld.daemon.index.rules import CHUNKING, LINKING
from recalld.daemon.index.state import IndexState
from recalld.daemon.index.tokenizer import tokenize
from recalld.daemon.index.vectors import matrix_format
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.arrays import Mapped, write_arrays, write_blob
from recalld.daemon.store.errors import CorruptState, StorageError
from recalld.daemon.store.fsio import FS, REAL
from recalld.daemon.store.generation import Generation
from recalld.daemon.store.manifest import GenerationStore
from recalld.daemon.store.records import write_records, write_records_twice

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Checked after a warm start is serving: the mapped arrays (hundreds of MB at 100k chunks,
# slow to hash) and the chunk records, which a load reads only when the table is bad.
DEFERRED = ("bm25", "chunk_table", "chunks")
# The files a loaded state serves from private mapped copies (ADR 0020).
MAPPED = ("chunk_table", "bm25")


@dataclass(slots=True)
class Snapshot:
    """A consistent copy of what to save, taken under the index lock (cheap: no I/O)."""

    files: list[FileInfo]
    chunks: ChunkTable
    graph: list[LinkRecord]
    bm25_arrays: dict[str, npt.NDArray[np.generic]]
    bm25_meta: JsonObject
    next_key: int
    #: hnswlib bytes when the vectors changed since the last save; None: carry or none.
    vectors_blob: bytes | None = None
    vectors_meta: JsonObject | None = None
    #: (state identity, vectors version) this snapshot's vectors correspond to.
    vectors_stamp: tuple[int, int] | None = None
    #: :func:`state_stamp` of the state this snapshot was taken from.
    stamp: tuple[int, int, int] = (0, 0, 0)
    #: The window vectors, as for ``vectors_*`` (arrays None: carry or none).
    windows_arrays: dict[str, npt.NDArray[np.generic]] | None = None
    windows_meta: JsonObject | None = None
    windows_stamp: tuple[int, int] | None = None


def _vectors_format(is_matrix: bool) -> int | str:
    return matrix_format(FORMAT_VERSION) if is_matrix else FORMAT_VERSION


def snapshot(state: IndexState, *, saved_stamp: tuple[int, int] | None = None,
             tmp_dir: Path | None = None,
             saved_windows: tuple[int, int] | None = None) -> Snapshot:
    """Copy what to save; the hnswlib graph is serialized only if it changed."""
    snap = Snapshot(
        files=list(state.files.values()),
        chunks=state.chunks.copy(),
        graph=state.graph.to_records(),
        bm25_arrays=state.bm25.to_arrays(),
        bm25_meta={**state.bm25.meta(), "vector_space": state.vector_space,
                   "vector_config": state.vector_config},
        next_key=state.next_key,
        stamp=state_stamp(state),
    )
    if state.vectors is not None and len(state.vectors):
        stamp = (id(state), state.vectors_version)
        snap.vectors_stamp = stamp
        snap.vectors_meta = {"space": state.vector_space, "dims": state.vectors.dim,
                             "count": len(state.vectors),
                             "state_format": _vectors_format(state.vectors.is_matrix)}
        if stamp != saved_stamp:
            try:
                snap.vectors_blob = state.vectors.to_bytes(tmp_dir)
            except OSError as exc:
                # This generation goes without a graph; a load rebuilds it from the
                # chunk embeddings, and the next commit tries again.
                log.warning("saving the vector graph failed: %s", exc)
                snap.vectors_meta = snap.vectors_stamp = None
    wins = state.windows
    if wins is not None and len(wins):
        snap.windows_stamp = (id(state), state.windows_version)
        snap.windows_meta = {"of": state.windows_of, "dims": wins.dim, "count": len(wins),
                             "state_format": _vectors_format(wins.is_matrix)}
        if snap.windows_stamp != saved_windows:
            try:
                snap.windows_arrays = wins.to_arrays(tmp_dir)
            except OSError as exc:  # refilled from the embedding cache after a load
                log.warning("saving the window vectors failed: %s", exc)
                snap.windows_meta = snap.windows_stamp = None
    return snap


#: What stands in for each part of a generation a load rebuilt (``LoadReport.rebuilt``)...
_REBUILT = {
    "bm25": "the keyword index is rebuilt from the chunks",
    "vectors": "the vector graph is rebuilt from the chunks' saved vectors",
    "windows": "the window vectors are refilled from the embedding cache",
    "chunks": "every note is chunked again",
    "links": "every note's links are read again",
}
#: ...and for a damaged part it did without (``LoadReport.corrupt``).
_REPAIRED = {
    "chunks": "the chunk records are written again from the chunk table",
    "chunk_table": "the chunks are read from their records",
}


@dataclass(slots=True)
class LoadReport:
    """What loading the saved index found: its generation, and what was rebuilt or corrupt."""

    generation: int | None = None
    rebuilt: list[str] = field(default_factory=list)
    corrupt: dict[str, str] = field(default_factory=dict)
    fresh: bool = False

    def recovery(self) -> str:
        """What stands in for the damage found, in words (for the log)."""
        if self.fresh or self.generation is None or "all" in self.rebuilt:
            return "every index is rebuilt from the Markdown"
        done = [f"generation {self.generation} serves, the notes changed since it read "
                "again from the Markdown"] if "manifest" in self.corrupt else []
        done += [_REBUILT[name] for name in self.rebuilt if name in _REBUILT]
        done += [_REPAIRED[name] for name in self.corrupt
                 if name in _REPAIRED and name not in self.rebuilt]
        return "; ".join(done) or "a new generation is saved from memory"


class IndexStore:
    """The generations of one workspace's derived index state."""

    def __init__(self, metadata_dir: Path, fs: FS = REAL) -> None:
        self.metadata_dir = metadata_dir
        # Generations of older versions list copies under ReMe's names: not written again
        # (ReMe may have written its own files there since).
        self.store = GenerationStore(metadata_dir / "index", fs, mirror_root=metadata_dir,
                                     publish_mirrors=False)
        #: The vectors stamp of the last committed generation (None: re-serialize next).
        self.saved_vectors: tuple[int, int] | None = None
        self.saved_windows: tuple[int, int] | None = None
        #: The generation the last ``load`` filled a state from.
        self.loaded: Generation | None = None
        #: The state holds chunks a generation saved under other chunking rules (older
        #: redaction too): the generations before the next save are not kept after it.
        self.outdated = False

    def save(self, snap: Snapshot) -> int:
        """Commit ``snap`` as a new generation; returns its number.

        Raises StorageError / DiskFull; the previous generation then stays current.
        """
        fs = self.store.fs
        with self.store.transaction() as txn:
            txn.add("catalog", write_records(
                fs, txn.path("catalog", ".jsonl.zst"), (f.to_record() for f in snap.files)))
            # Serialized twice rather than held whole: at 100k chunks the records are
            # hundreds of MB of JSON.
            txn.add("chunks", write_records_twice(
                fs, txn.path("chunks", ".jsonl.zst"), snap.chunks.records))
            # The same chunks as columns: what a warm start loads (no JSON per chunk).
            txn.add("chunk_table", write_arrays(
                fs, txn.path("chunk_table", ".arr"), snap.chunks.save_arrays(),
                {"state_format": FORMAT_VERSION}))
            txn.add("graph", write_records(
                fs, txn.path("graph", ".jsonl.zst"), snap.graph))
            meta = {**snap.bm25_meta, "next_key": snap.next_key, "state_format": FORMAT_VERSION,
                    "chunking": CHUNKING, "linking": LINKING}
            txn.add("bm25", write_arrays(fs, txn.path("bm25", ".arr"), snap.bm25_arrays, meta))
            carried = False
            if snap.vectors_blob is not None:
                txn.add("vectors", write_blob(fs, txn.path("vectors", ".hnsw"),
                                              snap.vectors_blob, snap.vectors_meta))
            elif snap.vectors_meta is not None:
                try:
                    txn.carry("vectors")
                    carried = True
                except (KeyError, CorruptState):
                    # Nothing to carry: this generation goes without a graph (a load
                    # rebuilds it from the chunk embeddings) and the next save writes one.
                    pass
            windows = snap.windows_arrays is not None
            if snap.windows_arrays is not None:
                txn.add("windows", write_arrays(fs, txn.path("windows", ".arr"),
                                                snap.windows_arrays, snap.windows_meta))
            elif snap.windows_meta is not None:
                with contextlib.suppress(KeyError, CorruptState):  # as for the graph
                    txn.carry("windows")
                    windows = True
        assert txn.generation is not None
        if self.outdated:
            # Kept as fallbacks, they would stay on disk (chunks a secret of the new
            # rules' shape unmasked) until two more saves: a workspace left idle, for good.
            with contextlib.suppress(StorageError):
                self.store.cleanup(keep=1)
            # Files not chunked again yet read as changed (no digest): their chunks are
            # still the old ones, and this generation goes once they are not.
            self.outdated = any(not f.digest for f in snap.files)
        self.saved_windows = snap.windows_stamp if windows else None
        self.saved_vectors = (
            snap.vectors_stamp if snap.vectors_blob is not None or carried else None)
        return txn.generation.number

    def load(self, state: IndexState, *, defer_checks: bool = False) -> LoadReport:
        """Fill ``state`` from the newest good generation.

        A corrupt keyword index is rebuilt from the chunk texts; corrupt chunks, catalog or
        graph leave ``state`` empty (the caller's reconcile then rebuilds everything from
        the Markdown). Never raises for bad state files.

        ``defer_checks``: the large files (``DEFERRED``) are mapped after their structural
        checks only, so a warm start serves at once; the caller must run
        ``verify_deferred`` before it saves anything taken from ``state``.
        """
        report = LoadReport()
        try:
            gen = self.store.open(defer=DEFERRED if defer_checks else ())
        except CorruptState as exc:
            report.corrupt["manifest"] = exc.reason
            report.fresh = True
            return report
        # A damaged manifest is damage too, also when an older generation (or the
        # Markdown, with none left) stands in for it.
        passed_by = "; ".join(f"{name}: {why}" for name, why in self.store.skipped)
        if gen is None:
            if passed_by:
                report.corrupt["manifest"] = passed_by
            report.fresh = True
            return report
        self.loaded = gen
        report.generation = gen.number
        # The mapped files are copied (ADR 0020) while this thread reads the small ones.
        copying = {name: _Copying(gen, name) for name in MAPPED if name in gen.files}
        try:
            report = self._fill(state, gen, report, copying)
        finally:
            for pending in copying.values():
                pending.join()
        if passed_by:
            report.corrupt.setdefault("manifest", passed_by)
        return report

    def _fill(self, state: IndexState, gen: Generation, report: LoadReport,
              copying: dict[str, _Copying]) -> LoadReport:
        maps: list[Mapped] = []  # the files state arrays are mapped from
        try:
            files = [FileInfo.from_record(r) for r in gen.iter_records("catalog")]
            chunks = _load_chunks(gen, report, maps, copying.get("chunk_table"))
            graph = LinkGraph.from_records(gen.read_records("graph"))
        except (CorruptState, KeyError, ValueError, TypeError) as exc:
            for pending in copying.values():
                pending.join()  # they may still record what they find in gen.corrupt
            report.corrupt.update(gen.corrupt or {"state": _reason(exc)})
            report.rebuilt.append("all")
            return report
        next_key = 1
        meta: JsonObject = {}
        try:
            mapped = copying["bm25"].result() if "bm25" in copying else gen.map_arrays("bm25")
            meta = mapped.meta
            if meta.get("state_format") != FORMAT_VERSION:
                raise ValueError(f"state format {meta.get('state_format')}")
            bm25 = BM25Index.from_arrays(mapped.arrays, meta)
            maps.append(mapped)
            next_key = int(meta.get("next_key", 1))
        except (CorruptState, KeyError, ValueError, TypeError) as exc:
            if not isinstance(exc, OutdatedFormat):  # an older format is not damage
                report.corrupt["bm25"] = _reason(exc)
            report.rebuilt.append("bm25")
            bm25 = BM25Index()
            bm25.add_many(
                (c.key, tokenize(index_text(c.text, c.heading, c.metadata)))
                for c in chunks.values())
        if any(f.read_again for f in files):
            # Saved while notes of older rules were read again (a stop midway): it holds
            # their old chunks still, so it goes as a generation of those rules goes.
            self.outdated = True
        # The rules a generation was saved under are in the keyword index's header: when
        # they differ, or are unknown for its damage, the notes are read again, also
        # where other files of the generation are damaged (a generation saved next is
        # numbered by the present rules, so no later load would catch them).
        if meta.get("linking") != LINKING:
            # Links read by other rules (some in comments, say): every file reads as
            # changed, so the startup reconcile reads its links again.
            files = [FileInfo(f.path, 0, 0, "", f.keys, f.secret_name, f.encoding)
                     for f in files]
            report.rebuilt.append("links")
        if meta.get("chunking") != CHUNKING:
            # Chunked by other rules: every file reads as changed, so the startup
            # reconcile chunks it again (its unchanged texts keep their cached vectors).
            # Paths named by a secret are told at once (older rules may not have), so
            # none is shown unmasked until then.
            from recalld.daemon.memory.secret_names import named_by_secret

            files = [FileInfo(f.path, 0, 0, "", f.keys, named_by_secret(f.path))
                     for f in files]
            report.rebuilt.append("chunks")
            self.outdated = True
        try:
            state.restore(files, chunks, bm25, graph, next_key)
        except ValueError as exc:
            report.corrupt["consistency"] = str(exc)
            report.rebuilt.append("all")
            state.__init__(daily_dir=state.daily_dir, digest_dir=state.digest_dir)  # type: ignore[misc]
            return report
        if meta.get("linking") != LINKING:
            # Saved under older link rules: an edge to no note may name one by these.
            state.graph.relink(state.files, state.resolve)
        state.mapped = maps
        state.evict()  # the loading checks read every page; searches need few of them
        bm25_meta = meta if "bm25" not in report.corrupt else {}
        restore_vectors(gen, state, bm25_meta, report, FORMAT_VERSION)
        if "vectors" not in report.corrupt and state.vectors is not None:
            self.saved_vectors = (id(state), state.vectors_version)
        restore_windows(gen, state, report, FORMAT_VERSION)
        if state.windows is not None:
            self.saved_windows = (id(state), state.windows_version)
        return report


    def verify_deferred(self) -> dict[str, str]:
        """Checksum what the last ``load(defer_checks=True)`` left unchecked; returns the
        files found corrupt (name: reason)."""
        return {} if self.loaded is None else self.loaded.verify_deferred()


class _Copying(threading.Thread):
    """``gen.map_arrays(logical)`` in a thread of its own, started at once: the private
    copy is made in the kernel (``copy_file_range``, without the GIL), so it runs beside
    the loading thread's parsing of the other files instead of before or after it."""

    def __init__(self, gen: Generation, logical: str) -> None:
        super().__init__(name=f"recalld-copy-{logical}", daemon=True)
        self._gen, self._logical = gen, logical
        self._mapped: Mapped | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._mapped = self._gen.map_arrays(self._logical)
        except BaseException as exc:  # raised again in the loading thread by result()
            self._error = exc

    def result(self) -> Mapped:
        """The mapping, or what ``map_arrays`` raised."""
        self.join()
        if self._error is not None:
            raise self._error
        assert self._mapped is not None
        return self._mapped


def _load_chunks(gen: Generation, report: LoadReport, maps: list[Mapped],
                 copying: _Copying | None = None) -> ChunkTable:
    """The chunk table of ``gen``: its columns, else (damaged, or state written before
    they existed) its chunk records. Raises CorruptState, KeyError or ValueError.
    ``copying``: the table's mapping, already under way.

    The records are QwenPaw's chunk store; damage to them alone is noted in ``report``
    (the caller commits soon, which writes them again).
    """
    if "chunks" in gen.corrupt:
        report.corrupt["chunks"] = gen.corrupt["chunks"]
    if "chunk_table" in gen.files:
        try:
            mapped = copying.result() if copying is not None else gen.map_arrays("chunk_table")
            if mapped.meta.get("state_format") != FORMAT_VERSION:
                raise ValueError(f"chunk table format {mapped.meta.get('state_format')}")
            table = ChunkTable.from_arrays(mapped.arrays)
            maps.append(mapped)
            return table
        except (CorruptState, ValueError) as exc:
            report.corrupt["chunk_table"] = _reason(exc)
    table = ChunkTable()
    records = sorted((StoredChunk.from_record(r) for r in gen.iter_records("chunks")),
                     key=lambda c: c.key)
    for c in records:
        table.add(c.key, c.path, c.start_line, c.end_line, c.text, c.heading, c.metadata)
        table.set_embedding(c.key, c.embedding)
    return table


def state_stamp(state: IndexState) -> tuple[int, int, int]:
    """What must be unchanged for a saved generation to stand in for ``state``'s memory."""
    return (id(state), state.bm25.main_generation, state.chunks.version)


def map_saved(gen: Generation) -> tuple[Mapped, Mapped]:
    """``gen``'s keyword index and chunk table files, mapped (private copies, ADR 0020; the
    two made at the same time), for :func:`adopt_saved` or :func:`reload_saved`.

    Touches no state: run it before taking the index lock, so searches go on while the
    files are copied (a generation's files never change once committed). Raises
    CorruptState / KeyError / OSError."""
    table = _Copying(gen, "chunk_table")
    try:
        bm25 = gen.map_arrays("bm25")
    finally:
        table.join()
    return bm25, table.result()


def adopt_saved(state: IndexState, gen: Generation,
                saved: tuple[Mapped, Mapped] | None = None) -> None:
    """Serve ``state``'s keyword main segment and chunk table from ``gen``'s files, mapped,
    instead of the copies in memory; the caller checked that ``gen`` was saved from
    ``state`` as it is now (:func:`state_stamp`). ``saved``: ``map_saved(gen)``, when the
    caller mapped them already. Raises CorruptState / ValueError, leaving ``state`` as it
    was."""
    bm25, table_map = map_saved(gen) if saved is None else saved
    table = ChunkTable.from_arrays(table_map.arrays)
    if table.live != state.chunks.live:
        raise ValueError("saved chunk table does not match the one in memory")
    state.bm25.adopt_main(bm25.arrays)
    table.adopt_extras(state.chunks)
    state.chunks = table
    state.mapped = [bm25, table_map]
    state.evict()


def reload_saved(state: IndexState, gen: Generation,
                 saved: tuple[Mapped, Mapped] | None = None) -> None:
    """Replace ``state``'s files, chunks, keyword index and links by what a warm start
    loads from ``gen`` (its vectors stay); the caller checked that ``gen`` was saved from
    ``state`` as it is now (:func:`state_stamp`). ``saved``: ``map_saved(gen)``, when the
    caller mapped them already.

    For the end of a first build or another large pass: the objects that outlive it
    (term strings, file records, links) were made one batch at a time in between the
    pass's garbage, and each keeps a page of the heap resident that is otherwise free.
    Loaded at once, the same state fills few pages, the pass's copies go, and the keyword
    dictionary stays the saved bytes until a write needs it, as after a warm start.
    Raises CorruptState / ValueError, leaving ``state`` as it was."""
    bm25_map, table_map = map_saved(gen) if saved is None else saved
    bm25 = BM25Index.from_arrays(bm25_map.arrays, bm25_map.meta, check_values=False)
    table = ChunkTable.from_arrays(table_map.arrays)
    table.adopt_extras(state.chunks)
    state.repack(table, bm25)
    state.mapped = [bm25_map, table_map]
    state.evict()


def _reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, CorruptState) else f"{type(exc).__name__}: {exc}"


__all__ = ["IndexStore", "Link", "LoadReport", "Snapshot", "adopt_saved", "map_saved",
           "reload_saved", "snapshot", "state_stamp"]
