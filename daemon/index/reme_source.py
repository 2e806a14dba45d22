"""What one workspace takes from ReMe's chunk store, read only when something needs it.

ReMe's chunk store (``reme_import.py``) gives two things: chunk boundaries, needed only
when a note it chunked is prepared (a first build, a changed note, a rebuild), and
vectors, needed once per vector space to seed recalld's embedding cache. Reading the
whole store at every start (tens of MB of JSON and base64 for a few thousand notes) paid
for both each time, though a restart usually needs neither.

:class:`ReMeSource` keeps a small record of what it found (``SEEN``, in
``metadata_dir``: the store's size, mtime, ctime and inode, its counts, the notes it has chunks
of, and per seeding the text hashes it gave the cache). At a start whose store is the
one recorded, only that record is read: boundaries are read when a pass first
prepares a note the store has chunks of, vectors only when the seeding recorded is not
for this space or the cache no longer holds them. A store that changed (ReMe ran) is
read at the start, as before. The record is derived state: missing, damaged or of
another version, it is rebuilt by reading the store.

Blocking (:meth:`ReMeSource.seed` runs in the backfill's worker thread) except
:meth:`ReMeSource.boundaries`, which reads in a worker thread under the
given limiter; cancelled there, the read finishes in its thread and is kept.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from recalld.daemon import safepath
from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.index import reme_import
from recalld.daemon.index.embedcache import EmbeddingCache, text_hash
from recalld.daemon.index.reme_chunks import ReMeChunk
from recalld.daemon.index.vector_status import ReMeVectors
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store import confine
from recalld.daemon.store.errors import StorageError
from recalld.daemon.store.fsio import REAL, ensure_dir
from recalld.daemon.store.records import read_records, write_records
from recalld.ipc.errors import InvalidParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Seeding:
    """What a seeding found: ReMe's cache of the space (its key -> vector), the text
    hashes of the store's vectors in recalld's cache, what was found, how many were new."""

    cache: dict[str, reme_import.F16]
    hashes: set[str]
    report: ReMeVectors
    stored: int


#: Beside ``recalld.lock``: recalld's own, and in no folder whose temp files a commit sweeps.
SEEN: Final = "recalld-reme-store.jsonl.zst"
#: 2: vectors stored as lists of numbers (ReMe 0.4.0, 0.4.1) are read; a record of 1 may
#: say such a store has none.
SEEN_VERSION: Final = 2


def _identity(path: Path) -> list[int] | None:
    try:
        st = confine.stat_file(path)  # below the workspace: through its folders' handles
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class ReMeSource:
    """ReMe's chunk store of one workspace: its summary, boundaries and vectors."""

    def __init__(self, metadata_dir: Path, agent_id: str, *, root: Path | None = None,
                 max_input_length: int = 8192) -> None:
        self.metadata_dir = metadata_dir
        self.agent_id = agent_id
        #: The workspace folder (the store's paths are below it): where :meth:`moved`
        #: looks whether ReMe's notes are still there.
        self.root = root
        #: ReMe's character budget of one embedding input: a chunk of more than twice
        #: that is not kept (its vector covers only its head;
        #: docs/adr/0015-reme-chunk-boundaries.md).
        self.max_input_length = max_input_length
        self._path = metadata_dir / reme_import.CHUNK_STORE
        self._seen_path = metadata_dir / SEEN
        #: What the store held (None: there is none), as the import report gives it.
        self.summary: dict[str, int | str] | None = None
        #: The notes the store has chunks of.
        self.paths: frozenset[str] = frozenset()
        self._boundaries: dict[str, list[ReMeChunk]] | None = None
        self._vectors: list[tuple[str, str]] | None = None
        self._seen: JsonObject = {}
        # The start, a pass and the seeding may each read the store, in their threads.
        self._lock = threading.Lock()
        self._loading = trio.Lock()

    def open(self, fresh: bool) -> None:
        """At the index's start (``fresh``: no generation of our own yet): remove what an
        older recalld wrote under ReMe's names, then take the record of the store when it
        is of this store, else read the store."""
        if not fresh:
            removed = reme_import.remove_own_mirrors(self.metadata_dir)
            if removed:
                log.info("%s: removed the copies of the index an older version wrote under "
                         "ReMe's names: %s", self.agent_id, ", ".join(removed))
        identity = _identity(self._path)
        if identity is None:
            return
        seen = self._read_seen()
        with self._lock:
            if seen.get("store") == identity and isinstance(seen.get("summary"), dict):
                self._seen = seen
                self.summary = seen["summary"]
                self.paths = frozenset(p for p in seen.get("paths", ()) if isinstance(p, str))
                return
            self._read(keep_vectors=True)

    def _read(self, *, keep_vectors: bool) -> None:
        """Read the whole store (its boundaries, and its vectors with ``keep_vectors``)
        and record what it holds. Under ``_lock``."""
        identity = _identity(self._path)
        found = reme_import.read_store(self.metadata_dir)
        if found is None:
            self.summary, self.paths, self._boundaries = None, frozenset(), {}
            return
        self.summary = found.summary()
        self.paths = frozenset(found.chunks)
        self._boundaries = {path: [ReMeChunk(c.start_line, c.end_line, c.text) for c in cs]
                            for path, cs in found.chunks.items()}
        if keep_vectors:
            self._vectors = found.vectors
        log.info("%s: ReMe's chunk store holds %d chunks of %d notes (%d with vectors)",
                 self.agent_id, len(found), len(found.chunks), len(found.vectors))
        if self._seen.get("store") != identity:
            self._seen = {"version": SEEN_VERSION, "store": identity,
                          "summary": self.summary, "paths": sorted(self.paths)}
            self._write_seen()

    async def boundaries(self, paths: Iterable[str], limiter: trio.CapacityLimiter,
                         ) -> dict[str, list[ReMeChunk]]:
        """ReMe's chunks of those of ``paths`` it has chunked (the store is read the
        first time one of them is asked for), but for those its vector covers less than
        half of: their lines are chunked by recalld."""
        wanted = [p for p in paths if p in self.paths]
        if not wanted:
            return {}
        if self._boundaries is None:
            async with self._loading:  # one read, not one per batch waiting for it
                await trio.to_thread.run_sync(self._read_boundaries, limiter=limiter)
        got = self._boundaries or {}
        budget = self.max_input_length
        return {p: [c for c in got[p] if reme_import.mostly_embedded(c.text, budget)]
                for p in wanted if p in got}

    async def moved(self, paths: Iterable[str], limiter: trio.CapacityLimiter,
                    ) -> dict[str, list[ReMeChunk]]:
        """When one of ``paths`` is a note the store has no chunks of: ReMe's chunks of the
        store's notes no longer where ReMe indexed them (those a vector covers at least
        half of), by their former path. A note renamed or moved since keeps those its
        lines still say (``reme_chunks.adopt_moved``); empty otherwise."""
        if self.root is None or not self.paths or all(p in self.paths for p in paths):
            return {}
        # Looked for first: with every note of ReMe's where it was, the store is not read.
        gone = await trio.to_thread.run_sync(self._gone, limiter=limiter)
        if not gone:
            return {}
        if self._boundaries is None:
            async with self._loading:
                await trio.to_thread.run_sync(self._read_boundaries, limiter=limiter)
        got = self._boundaries or {}
        budget = self.max_input_length
        out = {p: [c for c in got.get(p, ()) if reme_import.mostly_embedded(c.text, budget)]
               for p in gone}
        return {p: cs for p, cs in out.items() if cs}

    def _gone(self) -> list[str]:
        """The store's notes that are not in the workspace (file metadata only)."""
        assert self.root is not None
        out: list[str] = []
        for rel in sorted(self.paths):
            try:
                parts = safepath.split_relative(rel)
            except InvalidParams:  # no note's path (ReMe's store says odd things)
                continue
            if not os.path.lexists(self.root.joinpath(*parts)):
                out.append(rel)
        return out

    def _read_boundaries(self) -> None:
        with self._lock:
            if self._boundaries is None:
                # The seeding reads the vectors itself if it still needs them.
                self._read(keep_vectors=False)

    # -- seeding (the vector backfill's side) ------------------------------------------

    def seed(self, config: EmbeddingModelConfig, space: str, cache: EmbeddingCache,
             ) -> Seeding:
        """Put the store's vectors that serve ``space`` (``config``'s) into its ``cache``:
        those ReMe's own cache says were made in it, or about which it says nothing and
        does not contradict (``reme_import.stored_vectors``). A seeding recorded for this
        space and ReMe's cache files as they are, whose vectors ``cache`` still holds, is
        not done again (the store is not even read). ReMe's cache of the space is read
        either way (the backfill looks texts up in it by ReMe's key)."""
        remes = reme_import.read_embeddings(self.metadata_dir, config)
        if self.summary is None:
            return Seeding(remes.vectors, set(), {}, 0)
        key = reme_import.seed_key(self.metadata_dir, config, space)
        done = self._seen.get("seed")
        if (isinstance(done, dict) and done.get("key") == key
                and isinstance(done.get("hashes"), list) and cache.holds(done["hashes"])):
            return Seeding(remes.vectors, set(done["hashes"]), done.get("report") or {}, 0)
        found = self.take_vectors()
        usable, other, other_dims = reme_import.stored_vectors(
            found, remes, cache.dims, config.max_input_length)
        items = [(text_hash(text), vec) for text, vec in usable]
        report: ReMeVectors = {
            "space": remes.space, "cache_vectors": len(remes.vectors),
            "other_spaces": remes.other_spaces, "refused": remes.refused,
            "store_vectors": len(found), "store_vectors_used": len(items),
            "store_vectors_other_space": other, "store_vectors_other_dims": other_dims}
        hashes = {h for h, _ in items}
        stored = cache.put_many(items)
        if cache.holds(hashes):  # else (not written): seeded again at the next start
            with self._lock:
                if self._seen:
                    self._seen["seed"] = {"key": key, "hashes": sorted(hashes),
                                          "report": dict(report)}
                    self._write_seen()
        log.info("%s: reused %d of %d stored vectors for %s (ReMe's cache of this space: "
                 "%d vectors)", self.agent_id, stored, len(found), space, len(remes.vectors))
        return Seeding(remes.vectors, hashes, report, stored)

    def take_vectors(self) -> list[tuple[str, str]]:
        """The store's ``(text, _embedding_f16_b64)`` pairs, read now unless the start
        read them; handed over once (they are not kept)."""
        with self._lock:
            if self._vectors is None and self.summary is not None:
                self._read(keep_vectors=True)
            found, self._vectors = self._vectors or [], None
        return found

    def drop_vectors(self) -> None:
        """Nothing will seed from them (vectors are off): let them go."""
        self._vectors = None

    # -- the record ------------------------------------------------------------------

    def _read_seen(self) -> JsonObject:
        if not self._seen_path.is_file():
            return {}
        try:
            records = read_records(self._seen_path)
        except (OSError, StorageError) as exc:
            log.info("%s: %s cannot be used (%s); ReMe's chunk store is read again",
                     self.agent_id, self._seen_path.name, exc)
            return {}
        rec = records[0] if len(records) == 1 else {}
        return rec if rec.get("version") == SEEN_VERSION else {}

    def _write_seen(self) -> None:
        try:
            ensure_dir(REAL, self._seen_path.parent)
            write_records(REAL, self._seen_path, [self._seen])
        except (OSError, StorageError) as exc:
            # Only the next start pays: it reads the store again.
            log.warning("%s: cannot save %s: %s", self.agent_id, self._seen_path, exc)


__all__ = ["SEEN", "ReMeSource", "Seeding"]
