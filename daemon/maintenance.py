"""Index maintenance and truthful health: ``index.verify``, ``index.compact``, health.

``verify`` compares a workspace's derived state with its Markdown: files on disk against
files indexed (by stat, then by content digest), chunk bookkeeping against the chunk
table and the keyword index, and the committed generation (manifest, checksums, record
counts) against what the index holds. ``compact`` forces a merge of the keyword index
and commits a generation.

The ``health`` workspace service (started after ``index`` and ``vectors``) adds ``health`` to
each workspace's status: ``clean`` only when nothing is pending and the last disk scan
matched the index; ``pending`` while changes wait, files on disk are not (yet) indexed,
notes loaded from an index saved under older rules are read again (``read_again``), or
chunks wait for their vectors (not parked ones: they wait for the provider, an hour);
``degraded`` when the workspace folder is missing, persisting fails, the watcher or the
workspace failed, state was found corrupt and is not yet re-committed, a file of the
current generation changed on disk (a few ``stat`` calls on every status; a new generation
is saved from memory), or ``verify`` found the index in memory damaged. It scans the disk
in a worker thread once the workspace is open (not before: a large workspace would wait for
it), ``HEALTH_MIN_RESCAN_S`` (on trio's clock) after the index applied changes, every
``HEALTH_SCAN_INTERVAL_S`` otherwise, after every ``verify`` and restore; between scans it
sleeps on the index's change event (no wake-ups when idle), and stops by cancellation. A
watcher that reconciles at least as often does the periodic scans for it: each of its
scans moves health's next one on, so an idle workspace's folders are walked once a period,
and health scans itself only when that reconcile is ``HEALTH_SCAN_GRACE_S`` late (beside
one a period after the last, it measures ``derived_bytes`` only).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext, suppress
from pathlib import Path

import trio

from recalld.daemon.healthreport import HealthError, HealthReport
from recalld.daemon.index.embedder import VectorWorker
from recalld.daemon.index.encodings import not_utf8_notes, not_utf8_reasons
from recalld.daemon.index.graphcheck import check_links, masked_examples
from recalld.daemon.index.links import Link
from recalld.daemon.index.prepare import MAX_NOTE_BYTES, partly_indexed, unchanged_links
from recalld.daemon.index.records import FileInfo
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.service_status import MAX_LISTED
from recalld.daemon.index.state import IndexState
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.secret_names import mask_path, secret_named_folders, secret_notice
from recalld.daemon.store.errors import CorruptState, StorageError
from recalld.daemon.store.manifest import GenerationStore
from recalld.daemon.verifyreport import ChunkCheck, GenerationCheck, VerifyReport, listed
from recalld.daemon.workspaces import Workspace
from recalld.ipc.answers import IndexCompacted
from recalld.ipc.health_fixes import NAME_NOT_UTF8

log = logging.getLogger(__name__)

# Missed watcher events are what a scan finds; the watcher's own reconcile (every
# reconcile_interval_s, 5 min by default) repairs them, so health looks as often.
HEALTH_SCAN_INTERVAL_S = 300.0
#: How late the watcher's periodic reconcile may be (queued behind other workspaces' scans)
#: before health scans itself.
HEALTH_SCAN_GRACE_S = HEALTH_SCAN_INTERVAL_S / 2
HEALTH_MIN_RESCAN_S = 2.0  # after a change, let a burst of edits settle first
HEALTH_FIRST_SCAN_WAIT_S = 30.0  # for the watcher's startup reconcile, then scan ourselves
MAX_READ_ERRORS = 3  # notes that could not be read, in last_errors
FOLDER_MISSING = ("the workspace folder is missing (moved away, removed, or on a disk not "
                  "mounted): changes go unseen; searches answer from the index it had")


def dir_bytes(top: Path) -> int:
    """Bytes used by the regular files under ``top`` (symlinks not followed)."""
    total = 0
    for dirpath, _dirs, names in os.walk(top):
        for name in names:
            with suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


class Health:
    """The last disk scan of one workspace and what it says about the index."""

    def __init__(self, ws: Workspace, index: WorkspaceIndex, cpu: trio.CapacityLimiter,
                 vectors: VectorWorker | None = None,
                 capture: Callable[[], str | None] | None = None,
                 background: trio.CapacityLimiter | None = None) -> None:
        self.ws = ws
        #: Why conversation turns still wait for auto_memory (None: none wait).
        self._capture = capture
        self.index = index
        self.vectors = vectors
        self._cpu = cpu
        self._background = background or trio.CapacityLimiter(1)
        self.scanned_at: float | None = None  # wall time, as status shows it
        self._scanned_clock: float | None = None  # on trio's clock: freshness reads it
        self._began = 0.0  # on trio's clock: when health's own last scan (or try) began
        self._pause: trio.CancelScope | None = None  # health's wait for its next scan
        self._measured: float | None = None  # on trio's clock: derived_bytes measured
        self.disk_files: int | None = None
        self.derived_bytes: int | None = None
        # Paths whose disk stat differed from the index at the last scan, with that stat
        # (None: indexed but gone from disk). Re-checked cheaply on every status call.
        self._differs: dict[str, tuple[int, int] | None] = {}
        self.errors: list[HealthError] = []
        self.first_scan = trio.Event()  # set once the first scan is done
        # The watcher's reconciles scan the disk anyway (one at startup): their view is
        # taken instead of scanning twice, which would also hold a CPU slot the startup
        # needs. Added before the index starts, so the startup reconcile's scan is seen.
        index.watcher.scan_listeners.append(self._adopt)

    def _vectors(self) -> JsonObject | None:
        """Coverage and provider state: some keys of the vector service's status."""
        if self.vectors is None:
            return None
        try:
            full = dict(self.vectors.status())
        except Exception:  # the vector service's own status must not break health
            log.exception("vector status of %s failed", self.ws.agent_id)
            return {"error": "status unavailable"}
        keys = ("enabled", "state", "counted", "coverage", "embedded", "total", "rate_per_s",
                "eta_s", "health", "last_error", "parked", "parked_paths", "parked_error")
        return {k: full.get(k) for k in keys if k in full}

    async def scan(self, *, unattended: bool = False) -> None:
        """Scan the workspace against the index. ``unattended``: nobody waits for it (the
        periodic scan), so it waits for a background token first; a restore or a verify
        that waits for its answer does not queue behind other workspaces' background work."""
        async with (self._background if unattended else None) or nullcontext():
            disk = await trio.to_thread.run_sync(self.index.watcher.scan, limiter=self._cpu)
            await self._measure_derived()
        # Under the index lock: an apply mutates the state in a worker thread.
        known = self.index.known_files(await self.index.locked(IndexState.known))
        self._adopt(disk, known)

    async def _measure_derived(self) -> None:
        meta = self.ws.root / self.ws.settings.metadata_dir
        self.derived_bytes = await trio.to_thread.run_sync(dir_bytes, meta, limiter=self._cpu)
        self._measured = trio.current_time()

    def _adopt(self, disk: Mapping[str, tuple[int, int]],
               known: Mapping[str, tuple[int, int]]) -> None:
        """Take ``disk`` (a scan, ours or the watcher's) against the index's ``known``."""
        differs: dict[str, tuple[int, int] | None] = {
            p: st for p, st in disk.items() if known.get(p) != st}
        differs.update({p: None for p in known if p not in disk})
        self._differs = differs
        self.disk_files = len(disk)
        self.scanned_at = time.time()
        self._scanned_clock = trio.current_time()
        self.first_scan.set()
        if self._pause is not None:
            # Once a period, derived_bytes is measured beside the watcher's scan.
            stale = self._measured is None or (
                self._scanned_clock - self._measured >= HEALTH_SCAN_INTERVAL_S)
            self._pause.deadline = self._scanned_clock if stale else self._due()

    def _due(self) -> float:
        """When the next periodic scan is due: ``HEALTH_SCAN_INTERVAL_S`` after health's
        own last one began (a failing scan does not loop) and after the last scan of the
        disk, ours or the watcher's; a watcher that reconciles at least as often is waited
        for, up to ``HEALTH_SCAN_GRACE_S`` after its next reconcile should have scanned."""
        due = self._began + HEALTH_SCAN_INTERVAL_S
        if self._scanned_clock is None:
            return due
        every = self.index.watcher.reconcile_interval_s
        after = (every + HEALTH_SCAN_GRACE_S if every <= HEALTH_SCAN_INTERVAL_S
                 else HEALTH_SCAN_INTERVAL_S)
        return max(due, self._scanned_clock + after)

    def unindexed(self) -> tuple[list[str], int]:
        """Paths that still differ from the index (as of the last scan), and how many
        notes the index loaded under older rules still has to read again (they differ
        from the disk only for that: not listed)."""
        if not self._differs:
            return [], 0
        files = self.index.state.files  # lookups only: safe beside a running apply
        out, again = [], 0
        for path, st in self._differs.items():
            info = files.get(path)
            if st is not None and info is not None and info.read_again:
                again += 1
            elif (st is None and info is not None) or (
                    st is not None and (info is None or (info.mtime_ns, info.size) != st)):
                out.append(path)
        return sorted(out), again

    def status(self) -> HealthReport:
        idx = self.index.status()
        watcher = idx.get("watcher", {})
        unindexed, read_again = self.unindexed()
        degraded: list[str] = []
        pending: list[str] = []
        persist_error = idx["persist_error"]
        if gone := not self.ws.root.is_dir():  # one stat; what else fails follows from it
            degraded.append(FOLDER_MISSING)
        elif persist_error:
            degraded.append(f"saving the index fails: {persist_error['error']}")
        degraded += self.ws.writes.reasons()
        if watcher.get("state") == "failed":
            degraded.append(f"watcher failed: {watcher.get('why')}")
        if idx.get("load_corrupt") and idx.get("last_commit") is None:
            degraded.append("derived state was corrupt and is not re-committed yet")
        if self.ws.state == "failed":
            degraded.append(f"workspace failed: {self.ws.error}")
        damaged = self.index.check_files()
        for d in () if gone else damaged.values():
            degraded.append(f"index file {d['file']} damaged ({d['reason']}); a new "
                            "generation is saved from memory")
        live = self.index.live_problems()
        if live:
            degraded.append("the index in memory is damaged ("
                            + "; ".join(f"{k}: {v}" for k, v in live.items())
                            + "); rebuild it with reindex")
        partial = sorted(self.index.state.oversized)
        if partial:
            degraded.append(f"{len(partial)} note(s) over {MAX_NOTE_BYTES >> 20} MiB indexed "
                            "only up to that size")
        unreadable = self.index.unreadable
        unreadable_paths = sorted(unreadable)[:MAX_LISTED]  # idx's are shown masked
        if unreadable_paths:
            first = unreadable_paths[0]
            degraded.append(f"{idx['unreadable']} note(s) could not be read (first: "
                            f"{mask_path(first)}: "
                            f"{unreadable[first]['error']}); the index keeps what it had of "
                            "them, if anything, until they read again")
        encoded = not_utf8_notes(self.index.state)
        bad, told = not_utf8_reasons(encoded)
        degraded += bad
        if self.scanned_at is None:
            pending.append("first disk scan under way")
        if idx.get("pending_changes"):
            pending.append(f"{idx['pending_changes']} change(s) waiting to be applied")
        if unindexed:
            pending.append(f"{len(unindexed)} file(s) on disk differ from the index")
        if read_again:
            pending.append(f"{read_again} note(s) left to read again under this version's "
                           "rules (the saved index was made under older ones)")
        if idx.get("rebuilding"):
            pending.append("rebuilding")
        if watcher.get("rescan_owed") or watcher.get("state") in ("starting", "rescanning"):
            pending.append(f"watcher {watcher.get('state')}")
        vectors = self._vectors()
        if vectors and vectors.get("enabled") and isinstance(vectors.get("total"), int) and (
                isinstance(vectors.get("embedded"), int)):
            # Parked chunks do not catch up by themselves (``vectors.parked`` says why):
            # they leave the workspace clean, as ``recalld status`` shows it.
            parked = vectors.get("parked")
            parked = parked if isinstance(parked, int) else 0
            if vectors["embedded"] + parked < vectors["total"]:
                pending.append(f"vectors: {vectors['embedded']} of {vectors['total']} chunks "
                               "embedded" + (f" ({parked} parked)" if parked else ""))
        elif vectors and vectors.get("enabled") and vectors.get("counted") is False:
            pending.append("vectors: chunks not counted yet")
        waiting = self._capture() if self._capture is not None else None
        if waiting is not None:
            pending.append(waiting)
        state = "degraded" if degraded else "pending" if pending else "clean"
        # The first few reads that failed, before the rest: many of them (a failing disk)
        # must not push the others out (``unreadable_paths`` lists more).
        reads: list[JsonObject] = [
            {"what": f"read {mask_path(path)}", "error": unreadable[path]["error"],
             "time": unreadable[path]["time"]} for path in unreadable_paths[:MAX_READ_ERRORS]]
        last_errors: list[JsonObject] = [dict(e) for e in self.errors]
        if persist_error:
            last_errors.append({"what": "persist", **persist_error})
        if watcher.get("last_error"):
            last_errors.append({"what": "watcher", "error": watcher["last_error"],
                                "time": watcher.get("last_error_at")})
        for d in damaged.values():
            last_errors.append({"what": f"index file {d['file']}", "error": d["reason"],
                                "time": d["time"]})
        for name, why in (idx.get("load_corrupt") or {}).items():
            last_errors.append({"what": f"load {name}", "error": why,
                                "time": self.ws.opened_at})
        named = self.index.state.secret_named
        if misnamed := self.index.watcher.misnamed():
            told.append(f"{len(misnamed)} note(s) not indexed: {NAME_NOT_UTF8} (first: "
                        f"{misnamed[0]}); rename them to UTF-8")
        return {
            "state": state,
            "reasons": degraded + pending + told + ([secret_notice(named)] if named else []),
            "files_indexed": idx.get("files"),
            "files_on_disk": self.disk_files,
            "chunks": idx.get("chunks"),
            "pending_changes": idx.get("pending_changes"),
            "unindexed": len(unindexed),
            "unindexed_paths": [mask_path(p) for p in unindexed[:MAX_LISTED]],
            "read_again": read_again,
            "partly_indexed": len(partial),
            "partly_indexed_paths": [mask_path(p) for p in partial[:MAX_LISTED]],
            "unreadable": idx["unreadable"],
            "unreadable_paths": [mask_path(p) for p in unreadable_paths],
            "not_utf8": encoded,
            "secret_named": len(named),
            "secret_named_folders": secret_named_folders(named)[:MAX_LISTED],
            "write_errors": self.ws.writes.status(),
            "watcher": watcher.get("state"),
            "scanned_at": self.scanned_at,
            "derived_bytes": self.derived_bytes,
            # Coverage and provider state, from the vector service when one is attached.
            "vectors": vectors,
            "last_errors": reads + last_errors[len(reads) - MAX_LISTED:],
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        # A startup reconcile that ended before this service was made went unseen: the
        # first scan is then ours, at once.
        if self.index.watcher.status()["last_reconcile"] is None:
            with trio.move_on_after(HEALTH_FIRST_SCAN_WAIT_S):
                await self.first_scan.wait()
        while True:
            self.index.check_files()
            changed = self.index.changed  # taken before the scan: no change slips between
            self._began = trio.current_time()
            fresh = self._scanned_clock is not None and (
                trio.current_time() - self._scanned_clock < HEALTH_MIN_RESCAN_S)
            try:
                if fresh:
                    async with self._background:
                        await self._measure_derived()  # the watcher has just scanned
                else:
                    await self.scan(unattended=True)
            except OSError as exc:
                self.errors = [*self.errors[1 - MAX_LISTED:],
                               {"what": "health scan", "error": str(exc), "time": time.time()}]
            # Its deadline moves on with every scan of the disk (see _adopt).
            with trio.CancelScope(deadline=self._due()) as self._pause:
                await changed.wait()
                # A first build or a large reconcile changes the index at every apply of
                # its pass, and its files differ from the disk until it ends: scanning
                # meanwhile would list all of them again, on the CPU the pass needs.
                await self.index.passes_ended()
                await trio.sleep(HEALTH_MIN_RESCAN_S)
            self._pause = None


# -------------------------------------------------------------------------------- verify


NO_GENERATION = "no committed generation"


def _verify_generation(index: WorkspaceIndex) -> GenerationCheck:
    """Re-read the committed generation read-only, verifying every checksum."""
    live = index.store.store
    store = GenerationStore(live.state_dir, live.fs, mirror_root=live.mirror_root)
    out: GenerationCheck = {"ok": False}
    try:
        gen = store.load(verify="checksum")
    except (CorruptState, StorageError) as exc:
        out["error"] = str(exc)
        return out
    if gen is None:
        out["error"] = NO_GENERATION
        return out
    out["generation"] = gen.number
    out["created"] = gen.created
    out["corrupt"] = dict(gen.corrupt)
    out["skipped"] = [{"manifest": m, "why": w} for m, w in gen.skipped]
    counts: dict[str, int | None] = {}
    for logical in ("catalog", "chunks"):
        if logical in gen.files and logical not in gen.corrupt:
            counts[logical] = gen.files[logical].records
    out["records"] = counts
    # A newer manifest passed by is the committed one not verifying: the generation
    # checked is then an older fallback, not what was committed.
    out["ok"] = not gen.corrupt and not gen.skipped
    return out


async def verify(ws: Workspace, index: WorkspaceIndex, cpu: trio.CapacityLimiter,
                 health: Health | None = None) -> VerifyReport:
    """Compare ``ws``'s derived state (``index``) with its Markdown; report every
    difference. ``health`` rescans afterwards."""
    started = time.monotonic()
    disk = await trio.to_thread.run_sync(index.watcher.scan, limiter=cpu)
    misnamed = index.watcher.misnamed()  # what that scan passed by, as it is shown

    def inspect(state: IndexState) -> tuple[dict[str, FileInfo], ChunkCheck]:
        files = dict(state.files)
        keys_in_files = [k for f in files.values() for k in f.keys]
        key_set = set(keys_in_files)
        live = state.bm25.live | state.bm25.staged  # a pass's held documents are indexed
        return files, {
            "chunks": len(state.chunks),
            "chunk_keys_in_files": len(keys_in_files),
            "duplicate_keys": len(keys_in_files) - len(key_set),
            "orphan_chunks": len(set(state.chunks) - key_set),
            "missing_chunks": len(key_set - set(state.chunks)),
            "keyword_docs": len(live),
            "keyword_mismatch": len(set(live) ^ set(state.chunks)),
        }

    # Under the index lock: one consistent view, never half a batch.
    files, snap = await index.locked(inspect)
    missing = [p for p in disk if p not in files]
    stale_entries = [p for p in files if p not in disk]
    # Notes an index saved under older rules has yet to read again: their stat was
    # cleared at the load, not changed on disk.
    read_again = [p for p in disk if p in files and files[p].read_again]
    stat_differs = [p for p in disk if p in files and not files[p].read_again
                    and (files[p].mtime_ns, files[p].size) != disk[p]]
    differs = {*stat_differs, *read_again}
    same_stat = [p for p in disk if p in files and p not in differs]

    def digests(paths: list[str], redacted: bool,
                ) -> tuple[list[str], dict[str, tuple[str, list[Link]]]]:
        """Of ``paths``, those whose content is not the digest indexed, and the others'
        links."""
        real_root = os.path.realpath(index.root)
        differ, read = [], {}
        for p in paths:
            found = unchanged_links(index.root, p, known_digest=files[p].digest,
                                    redacted=redacted, real_root=real_root)
            if found is None:
                differ.append(p)
            else:
                read[p] = (files[p].digest, found)
        return differ, read

    content_differs, read = await trio.to_thread.run_sync(digests, same_stat, False,
                                                          limiter=cpu)
    links_differ, links = await index.locked(lambda state: check_links(state, read))
    if links_differ:
        # Read as the index reads them (redacted), the notes found differing: a link a
        # secret touches is none, or another, there.
        again = [p for p in links_differ if p in read]
        _gone, redacted = await trio.to_thread.run_sync(digests, again, True, limiter=cpu)
        read = {p: got for p, got in read.items() if p not in again} | redacted
        links_differ, links = await index.locked(lambda state: check_links(state, read))
    index.check_files()
    generation = await trio.to_thread.run_sync(_verify_generation, index, limiter=cpu)
    live = await index.locked(index.check_live)
    status = index.status()
    if generation.get("error") == NO_GENERATION and (
            not files or status.get("uncommitted_changes", 0) > 0):
        # An empty workspace has nothing to commit, and a new one's first commit may be
        # still to come: neither is a difference.
        generation = {"ok": True, "note": "none committed yet: " + (
            "its first commit is still to come" if files else "nothing to commit")}
    consistent_chunks = (snap["duplicate_keys"] == 0 and snap["orphan_chunks"] == 0
                         and snap["missing_chunks"] == 0 and snap["keyword_mismatch"] == 0)
    committed_matches = (status.get("uncommitted_changes", 0) > 0
                         or generation.get("records", {}).get("catalog") in (None, len(files)))
    partial = partly_indexed(files)
    ok = (not missing and not stale_entries and not stat_differs and not content_differs
          and not read_again and not links_differ
          and consistent_chunks and generation.get("ok", False) and committed_matches
          and not partial and not live and not misnamed)
    if health is not None:
        await health.scan()
    return {
        "agent_id": ws.agent_id,
        "ok": ok,
        "files_on_disk": len(disk),
        "files_indexed": len(files),
        "not_indexed": listed(missing),
        "indexed_but_gone": listed(stale_entries),
        "stat_differs": listed(stat_differs),
        "content_differs": listed(content_differs),
        "read_again": listed(read_again),
        "partly_indexed": listed(partial),
        "misnamed": listed(misnamed),
        "chunks": snap,
        "chunks_consistent": consistent_chunks,
        "links_differ": listed(links_differ),
        "links": masked_examples(links),
        "generation": generation,
        "live": {"ok": not live, "damaged": live},
        "uncommitted_changes": status.get("uncommitted_changes", 0),
        "committed_matches_index": committed_matches,
        "duration_s": round(time.monotonic() - started, 3),
    }


async def compact(ws: Workspace, index: WorkspaceIndex) -> IndexCompacted:
    """Merge ``ws``'s keyword index segments now and commit a generation."""
    started = time.monotonic()
    before = index.state.bm25.stats()
    await index.compact()
    after = index.state.bm25.stats()
    return {"agent_id": ws.agent_id, "keyword_before": before, "keyword_after": after,
            "generation": None if index.last_commit is None else index.last_commit["generation"],
            "duration_s": round(time.monotonic() - started, 3)}

