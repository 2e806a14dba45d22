"""The shape of an ``index.verify`` answer (``maintenance.verify``): plain data."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from recalld.daemon.index.graphcheck import LinkCheck
from recalld.daemon.index.service_status import MAX_LISTED
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.secret_names import mask_path

__all__ = ["ChunkCheck", "GenerationCheck", "Listed", "LiveCheck", "VerifyReport", "listed"]


class Listed(TypedDict):
    count: int
    paths: list[str]  # the first MAX_LISTED, sorted


def listed(paths: list[str]) -> Listed:
    """``paths`` counted, the first MAX_LISTED named as status names them (a note or
    folder named by a credential masked)."""
    return {"count": len(paths), "paths": [mask_path(p) for p in sorted(paths)[:MAX_LISTED]]}


class ChunkCheck(TypedDict):
    """The index's chunks checked against its file entries and its keyword index."""

    chunks: int
    chunk_keys_in_files: int
    duplicate_keys: int
    orphan_chunks: int
    missing_chunks: int
    keyword_docs: int
    keyword_mismatch: int


class GenerationCheck(TypedDict):
    """The committed generation, re-read with every checksum verified."""

    ok: bool
    error: NotRequired[str]
    note: NotRequired[str]  # none committed yet, and none needed so far
    generation: NotRequired[int]
    created: NotRequired[float]
    corrupt: NotRequired[dict[str, str]]
    skipped: NotRequired[list[JsonObject]]
    records: NotRequired[dict[str, int | None]]


class LiveCheck(TypedDict):
    ok: bool
    damaged: dict[str, str]


class VerifyReport(TypedDict):
    agent_id: str
    ok: bool
    files_on_disk: int
    files_indexed: int
    not_indexed: Listed
    indexed_but_gone: Listed
    stat_differs: Listed
    content_differs: Listed
    read_again: Listed  # loaded under older rules, not read again yet under these
    partly_indexed: Listed
    misnamed: Listed  # passed by: their name is not UTF-8 (shown escaped, as in status)
    chunks: ChunkCheck
    chunks_consistent: bool
    links_differ: Listed  # notes whose edges in the link graph are not what their text says
    links: LinkCheck
    generation: GenerationCheck
    live: LiveCheck
    uncommitted_changes: int
    committed_matches_index: bool
    duration_s: float
