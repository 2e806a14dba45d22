"""Saving and loading one workspace's index under ``<workspace>/<metadata_dir>/``.

Generation files live in ``index/`` with a manifest as the only commit point
(:mod:`recalld.daemon.store.manifest`); the QwenPaw-compatible names are mirrors of the
current generation: ``file_store/file_chunks_default_v1.jsonl.zst`` (chunk records with
``_embedding_f16_b64`` where a vector exists), ``file_graph/default.jsonl.zst`` (links) and
``file_catalog/default.jsonl.zst`` (what was indexed, at which stat and digest). The
keyword index is saved as checksummed numpy arrays, never pickled.

Everything here blocks; the index service runs it in worker threads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.links import Link, LinkGraph
from recalld.daemon.index.state import FileInfo, IndexState, StoredChunk
from recalld.daemon.index.tokenizer import tokenize
from recalld.daemon.store.arrays import write_arrays
from recalld.daemon.store.errors import CorruptState
from recalld.daemon.store.fsio import FS, REAL
from recalld.daemon.store.manifest import GenerationStore
from recalld.daemon.store.records import write_records

log = logging.getLogger(__name__)

CHUNKS_MIRROR = "file_store/file_chunks_default_v1.jsonl.zst"
GRAPH_MIRROR = "file_graph/default.jsonl.zst"
CATALOG_MIRROR = "file_catalog/default.jsonl.zst"
FORMAT_VERSION = 1


@dataclass(slots=True)
class Snapshot:
    """A consistent copy of what to save, taken under the index lock (cheap: no I/O)."""

    files: list[FileInfo]
    chunks: list[StoredChunk]
    graph: list[dict[str, Any]]
    bm25_arrays: dict[str, Any]
    bm25_meta: dict[str, Any]
    next_key: int


def snapshot(state: IndexState) -> Snapshot:
    return Snapshot(
        files=list(state.files.values()),
        chunks=list(state.chunks.values()),
        graph=state.graph.to_records(),
        bm25_arrays=state.bm25.to_arrays(),
        bm25_meta=state.bm25.meta(),
        next_key=state.next_key,
    )


@dataclass(slots=True)
class LoadReport:
    generation: int | None = None
    rebuilt: list[str] = field(default_factory=list)
    corrupt: dict[str, str] = field(default_factory=dict)
    fresh: bool = False


class IndexStore:
    """The generations of one workspace's derived index state."""

    def __init__(self, metadata_dir: Path, fs: FS = REAL) -> None:
        self.metadata_dir = metadata_dir
        self.store = GenerationStore(metadata_dir / "index", fs, mirror_root=metadata_dir)

    def save(self, snap: Snapshot) -> int:
        """Commit ``snap`` as a new generation; returns its number.

        Raises StorageError / DiskFull; the previous generation then stays current.
        """
        fs = self.store.fs
        with self.store.transaction() as txn:
            txn.add("catalog", write_records(
                fs, txn.path("catalog", ".jsonl.zst"), (f.to_record() for f in snap.files)),
                mirror=CATALOG_MIRROR)
            txn.add("chunks", write_records(
                fs, txn.path("chunks", ".jsonl.zst"), (c.to_record() for c in snap.chunks)),
                mirror=CHUNKS_MIRROR)
            txn.add("graph", write_records(
                fs, txn.path("graph", ".jsonl.zst"), snap.graph), mirror=GRAPH_MIRROR)
            meta = {**snap.bm25_meta, "next_key": snap.next_key, "state_format": FORMAT_VERSION}
            txn.add("bm25", write_arrays(fs, txn.path("bm25", ".arr"), snap.bm25_arrays, meta))
        assert txn.generation is not None
        return txn.generation.number

    def load(self, state: IndexState) -> LoadReport:
        """Fill ``state`` from the newest good generation.

        A corrupt keyword index is rebuilt from the chunk texts; corrupt chunks, catalog or
        graph leave ``state`` empty (the caller's reconcile then rebuilds everything from
        the Markdown). Never raises for bad state files.
        """
        report = LoadReport()
        try:
            gen = self.store.open()
        except CorruptState as exc:
            report.corrupt["manifest"] = exc.reason
            report.fresh = True
            return report
        if gen is None:
            report.fresh = True
            return report
        report.generation = gen.number
        try:
            files = [FileInfo.from_record(r) for r in gen.iter_records("catalog")]
            chunks = [StoredChunk.from_record(r) for r in gen.iter_records("chunks")]
            graph = LinkGraph.from_records(gen.read_records("graph"))
        except (CorruptState, KeyError, ValueError, TypeError) as exc:
            report.corrupt.update(gen.corrupt or {"state": _reason(exc)})
            report.rebuilt.append("all")
            return report
        next_key = 1
        try:
            arrays, meta = gen.read_arrays("bm25")
            if meta.get("state_format") != FORMAT_VERSION:
                raise ValueError(f"state format {meta.get('state_format')}")
            bm25 = BM25Index.from_arrays(arrays, meta)
            next_key = int(meta.get("next_key", 1))
        except (CorruptState, KeyError, ValueError, TypeError) as exc:
            report.corrupt["bm25"] = _reason(exc)
            report.rebuilt.append("bm25")
            bm25 = BM25Index()
            bm25.add_many((c.key, tokenize(_index_text(c))) for c in chunks)
        try:
            state.restore(files, chunks, bm25, graph, next_key)
        except ValueError as exc:
            report.corrupt["consistency"] = str(exc)
            report.rebuilt.append("all")
            state.__init__(daily_dir=state.daily_dir, digest_dir=state.digest_dir)  # type: ignore[misc]
        return report


def _index_text(chunk: StoredChunk) -> str:
    starts = bool(chunk.metadata.get("starts_with_heading", False))
    return chunk.heading + "\n" + chunk.text if chunk.heading and not starts else chunk.text


def _reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, CorruptState) else f"{type(exc).__name__}: {exc}"


__all__ = ["IndexStore", "Link", "LoadReport", "Snapshot", "snapshot"]
