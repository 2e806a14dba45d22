"""auto_resource: turn files dropped into ``resource/`` into daily notes.

Owns one workspace's resource catalog (``<metadata_dir>/catalog/resource.jsonl.zst``:
per file its path, SHA-256, state, reason, date and note) and a :class:`Watcher` on
``resource_dir`` that sees every file (any suffix; dot files and editor junk excepted).
:meth:`ResourceCatalog.run` loads the catalog, starts the watcher (its startup reconcile
catches what changed while the daemon was down) and stops by cancellation.

The watcher only catalogs: a file with an allowed suffix (md markdown txt json jsonl csv
yaml yml html htm) that is new or whose digest changed becomes ``queued``; any other
suffix, a name that holds a credential, or a file that is there but is not read (not a
regular file, a link, refused by the system) is ``skipped`` with the reason (that last
keeps its note, and is itself again once it can be read); a deleted file becomes
``removed``.
Then an ``auto_resource`` job is requested; the job (:meth:`ResourceCatalog.process`) asks
the chat model for a summary of each queued file (input bounded by ``max_input_chars``) and
writes it to ``memory/<date>/resource-<slug>.md`` with ``source_resource:
[[resource/...]]`` and the file's digest (:mod:`resource_notes`); a changed file rewrites
its own note. A deleted file's note is kept (it is memory, and digest nodes may cite it) and marked:
frontmatter ``source_removed: <date>`` and a line in the body; so is the note of a file
that no longer holds text (emptied, made binary): ``source_changed: <date>`` and why.
States: queued, processed, skipped, failed (the model failed; a job started by hand or by
the nightly dream, or a change to the file, retries it; the jobs the watcher starts do
not), pending (no chat model configured), removed (kept while its note names the file: a
file back takes the note back; one with no note is dropped by the next job, one whose note
was deleted or rewritten by hand at the next start).

A file ReMe (QwenPaw) interpreted keeps the note ReMe wrote, and is not interpreted
again while it is as ReMe read it (``reme_resource.py``); so does a file recalld's own
catalog lost track of (a damaged catalog, a workspace copied without it), by the digest
its note carries.

Dates (``resource_files``): a file moved to another day has its note moved to that day's
folder. The notes a job wrote are told in the inbox when it ends, or, killed before,
when the catalog is loaded next (``resource_told``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from datetime import date as Date
from typing import TYPE_CHECKING, Final

import trio

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import reme_resource, resource_told
from recalld.daemon.memory.catalog import catalog_path, load_catalog, save_catalog
from recalld.daemon.memory.resource_files import (
    ResourceConfig,
    file_digest,
    files_below,
    folders_among,
    folders_of,
    name_masked,
    not_text,
    read_head,
    resource_date,
    unfenced,
)
from recalld.daemon.memory.resource_notes import (
    mark_changed,
    mark_removed,
    renamed_in_note,
    write_note,
)
from recalld.daemon.memory.resource_prompt import cut_summary, messages, refused
from recalld.daemon.memory.resource_results import ResourceResult, ResourceStatus, listed
from recalld.daemon.memory.slugs import names_nothing
from recalld.daemon.providers.errors import NO_CHAT_MODEL, ProviderConfigError, ProviderError
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchpaths import UNREAD_STAMP
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import PathOutsideWorkspace, RecalldError

if TYPE_CHECKING:
    from recalld.daemon.providers.chat import ChatClient

log = logging.getLogger(__name__)
#: Text formats, each by the suffixes it is saved with (``.yml`` is YAML as ``.yaml`` is).
ALLOWED_SUFFIXES: Final = (".md", ".markdown", ".txt", ".json", ".jsonl", ".csv", ".yaml",
                           ".yml", ".html", ".htm")
RequestJob = Callable[[], Awaitable[None]]

class ResourceCatalog:
    """One workspace's resource catalog, watcher and note writer."""

    def __init__(self, ws: Workspace, *, request_job: RequestJob | None = None,
                 today: Callable[[], Date] = Date.today,
                 config: ResourceConfig | None = None,
                 limiter: trio.CapacityLimiter | None = None,
                 background: trio.CapacityLimiter | None = None,
                 chat_enabled: Callable[[], bool] = lambda: False) -> None:
        self.ws = ws
        self._chat_enabled = chat_enabled
        self.config = config or ResourceConfig()
        self._request_job = request_job
        self._today = today
        s = ws.settings
        self.resource_dir = s.resource_dir
        self.path = catalog_path(ws.root, s.metadata_dir, "resource")
        #: Catalog records by path: JSON as the catalog file keeps it (``state``,
        #: ``digest``, ``size``, ``mtime_ns``, ``reason``, ``note``...).
        self.records: dict[str, JsonObject] = {}
        #: ReMe's record of the resource files it interpreted (``reme_resource.py``), and
        #: the daily notes by the resource they name (read when first needed).
        self._reme: dict[str, float] = {}
        self._notes_by_source: dict[str, str] | None = None
        #: The catalog was empty when loaded: notes may name files it does not know.
        self._fresh = False
        self._lock = trio.Lock()
        #: Saves one at a time, each of the records as they are when its turn comes: the
        #: watcher's and the job's overlap, and an older state written last would stay.
        self._save_lock = trio.Lock()
        self.watcher = Watcher(
            ws.root, [self.resource_dir], apply=self.apply_paths, known=self.known,
            # The startup reconcile runs once the workspace serves: behind a large index's
            # start-up scans (CPU limiter) it would hold up the first search. What it
            # finds requests its job like any change (``apply_paths``).
            config=WatcherConfig(suffixes=("",), ignore_dirs=(s.metadata_dir,),
                                 unread_listed=True,
                                 reconcile_interval_s=self.config.reconcile_interval_s,
                                 reconcile_before_ready=False),
            limiter=limiter, background=background)

    # -- catalog -----------------------------------------------------------------------

    def known(self) -> dict[str, tuple[int, int]]:
        return {p: (int(r.get("mtime_ns", 0)), int(r.get("size", 0)))
                for p, r in self.records.items() if r.get("state") != "removed"}

    async def _save(self) -> None:
        """Write the catalog as it is now, or as a later save found it (shielded: a
        cancelled caller still has its state on disk)."""
        with trio.CancelScope(shield=True), trio.move_on_after(20.0):
            async with self._save_lock:
                snapshot = {k: dict(v) for k, v in self.records.items()}
                await trio.to_thread.run_sync(save_catalog, self.path, snapshot)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records.values():
            out[r["state"]] = out.get(r["state"], 0) + 1
        return out

    def status(self) -> ResourceStatus:
        return {"files": self.counts(), "failed": listed(self.records, "failed"),
                "skipped": listed(self.records, "skipped"), "watcher": self.watcher.status()}

    def work(self, *, chat_enabled: bool, retry_failed: bool = False) -> list[str]:
        states = {"queued"} | ({"pending"} if chat_enabled else set()) | (
            {"failed"} if retry_failed and chat_enabled else set())
        return sorted(p for p, r in self.records.items()
                      if r["state"] in states
                      or (r["state"] == "removed" and r.get("note") and not r.get("marked")))

    # -- watcher side ------------------------------------------------------------------

    async def apply_paths(self, paths: set[str]) -> None:
        """Catalog what changed under resource/ (called by the watcher, never overlapping)."""
        folders = await trio.to_thread.run_sync(folders_among, self.ws.root, paths)
        # A folder where the catalog has a file (``a.txt/`` made for it): that file is gone.
        todo = (paths - folders) | (folders & self.records.keys())
        # A directory event (a folder moved in or out) stands for the files below it, on
        # disk and in the catalog. Any path but a file the catalog has may be a folder
        # (one gone leaves no trace): one pass over the catalog finds what lies below.
        maybe = folders | {rel for rel in paths if rel not in self.records}
        todo.update(p for p in self.records if not maybe.isdisjoint(folders_of(p)))
        for rel in folders:
            # Not what the watcher passes by (a folder named as metadata_dir): its scans
            # would find it gone at every reconcile.
            below = await trio.to_thread.run_sync(files_below, self.ws.root, rel)
            todo.update(p for p in below if self.watcher.is_note(p))
        changed = False
        async with self._lock:
            for rel in sorted(todo):
                changed |= await self._catalog_one(rel)
            await self._follow_moves(todo)
        if changed:
            await self._save()
            if self._request_job is not None and self.work(chat_enabled=False):
                await self._request_job()

    async def _follow_moves(self, paths: set[str]) -> None:
        """A file interpreted before that went, and a new one of the same bytes, is that
        file renamed, moved or put back: it keeps its note (which now names it, no longer
        marked "source removed" if the job marked it meanwhile: the two halves of a rename
        may come in two batches) instead of a second model call and a second note.
        ``paths``: those just catalogued; the new ones are those never interpreted (no
        note yet), so a copy seen first empty or in part is matched once whole."""
        new = [rel for rel in paths if self.records.get(rel, {}).get("state") == "queued"
               and not self.records[rel].get("note")]
        if not new:
            return
        gone: dict[str, list[str]] = {}  # digest -> paths, those not yet marked first
        for rel, rec in sorted(self.records.items(), key=lambda kv: bool(kv[1].get("marked"))):
            if rec["state"] == "removed" and rec.get("note"):
                gone.setdefault(str(rec["digest"]), []).append(rel)
        for rel in sorted(new):
            rec = self.records[rel]
            # Files of the same bytes moved together (a folder): each takes the note of
            # the file of its name, not one all of them, the others summarised again.
            name = rel.rsplit("/", 1)[-1]
            olds = sorted(gone.get(rec["digest"], []), key=lambda p: p.rsplit("/", 1)[-1] != name)
            old = olds[0] if olds else None
            if old is not None:
                gone[rec["digest"]].remove(old)
            if old is None or not await self._note_says(old, self.records[old]):
                continue
            moved = self.records.pop(old)
            first_seen = str(moved["first_seen"])
            rec.update(state="processed", first_seen=first_seen,
                       date=resource_date(rel[len(self.resource_dir) + 1:], first_seen))
            rec["note"] = await renamed_in_note(
                self.ws, str(moved["note"]), old, rel,
                moved.get("removed_on") if moved.get("marked") else None, date=rec["date"])

    async def _catalog_one(self, rel: str) -> bool:
        info = await trio.to_thread.run_sync(file_digest, self.ws.root, rel)
        rec = self.records.get(rel)
        inside = rel[len(self.resource_dir) + 1:]
        first_seen = (rec or {}).get("first_seen") or self._today().isoformat()
        if info is None:
            if rec is None or rec["state"] == "removed":
                return False
            rec.update(state="removed", reason="file deleted", marked=False,
                       removed_on=self._today().isoformat())
            rec.pop("unreadable", None)
            return True
        if isinstance(info, str):  # there, but not read: skipped with why, its note kept
            if rec is not None and rec.get("unreadable") == info:
                return False  # as it was (a reconcile looks again: its stamp is none)
            self.records[rel] = {
                "path": rel, "digest": "", "first_seen": first_seen,
                "date": resource_date(inside, first_seen), **(rec or {}),
                "state": "skipped", "reason": info, "unreadable": info,
                "mtime_ns": UNREAD_STAMP[0], "size": UNREAD_STAMP[1]}
            return True
        sha, mtime_ns, size = info
        if rec is not None and rec.get("digest") == sha and (
                (rec["state"] != "removed" and not rec.get("unreadable"))
                or await self._put_back(rec)):
            rec.update(mtime_ns=mtime_ns, size=size)  # touched or put back: same bytes
            return True
        new = {"path": rel, "digest": sha, "mtime_ns": mtime_ns, "size": size,
               "first_seen": first_seen, "date": resource_date(inside, first_seen),
               "note": (rec or {}).get("note"), "state": "queued", "reason": ""}
        if not rel.lower().endswith(ALLOWED_SUFFIXES):
            suffix = os.path.splitext(rel)[1] or "(none)"
            new.update(state="skipped",
                       reason=f"suffix {suffix} is not one of {' '.join(ALLOWED_SUFFIXES)}")
        elif name_masked(rel, inside):
            # Its note would carry the name (file name, title, link), unmasked or broken.
            new.update(state="skipped", reason="its name looks like a credential: rename it")
        elif rec is None and (reme_resource.same_name(rel) in self._reme or self._fresh):
            if self._notes_by_source is None:  # read when first needed
                self._notes_by_source = await trio.to_thread.run_sync(
                    reme_resource.resource_notes, self.ws.root, self.ws.settings.daily_dir)
            await trio.to_thread.run_sync(
                reme_resource.take_note, self.ws.root, rel, inside, new,
                self._reme.get(reme_resource.same_name(rel)), self._notes_by_source)
        elif rec is not None and new["note"]:
            # Back to the bytes its note was written from (an edit undone; a file seen
            # empty or gone a moment while it was written again): that note, no model call.
            back = {**rec, "digest": sha, "mtime_ns": mtime_ns, "size": size}
            if await self._put_back(back):
                self.records[rel] = back
                return True
        self.records[rel] = new
        return True

    async def _moved_here(self, rel: str, rec: JsonObject) -> bool:
        """Is the file ``rel``, never interpreted, one interpreted before that was moved
        here (renamed, moved into a folder), whose old name the watcher has not found
        gone yet? The halves of a move may come in two batches (a folder seen with the
        file in it before the old name's event), the job started between them. The files
        of its bytes that have a note are cataloged again first, so one that went gives
        its note as the watcher would (``_follow_moves``): no model call for bytes
        interpreted. A copy beside a file that is still there is interpreted."""
        async with self._lock:
            same = [p for p, r in self.records.items() if p != rel and r.get("note")
                    and r.get("digest") == rec["digest"] and r["state"] != "removed"]
            for other in same:
                await self._catalog_one(other)
            await self._follow_moves({rel})
        return self.records.get(rel) is not rec or rec["state"] == "processed"

    async def _put_back(self, rec: JsonObject) -> bool:
        """A removed file back with the bytes its note was written from (its folder moved
        out and in again, the file restored): that note again, unmarked, no model call."""
        note = rec.get("note")
        fields = await trio.to_thread.run_sync(
            reme_resource.note_fields, self.ws.root, str(note)) if note else {}
        if fields.get("resource_digest") != rec["digest"]:
            return False
        marked_on = fields.get("source_removed") or rec.get("removed_on")  # as the note says
        if rec.get("marked") or fields.get("source_removed") or fields.get("source_changed"):
            await renamed_in_note(self.ws, str(note), rec["path"], rec["path"], marked_on)
        rec.update(state="processed", reason="", marked=False)
        rec.pop("removed_on", None)
        rec.pop("unreadable", None)
        return True

    async def _note_says(self, rel: str, rec: JsonObject) -> bool:
        """Is the note of ``rec`` (the record of ``rel``) still that file's, written from
        the bytes it had last (not from those before it was emptied, say: a new empty
        file is not that file moved)? A note deleted or rewritten by hand is not. A note
        without a digest (ReMe's) is taken at its catalog record's word."""
        fields = await trio.to_thread.run_sync(
            reme_resource.note_fields, self.ws.root, str(rec["note"]))
        return bool(fields.get("source_resource") == f"[[{rel}]]"
                    and fields.get("resource_digest", rec["digest"]) == rec["digest"])

    def _prune(self, *, notes_read: bool = False) -> bool:
        """Drop the records of deleted files that keep nothing: no note (a skipped file,
        one deleted before its note was written), or, ``notes_read`` (blocking), a note
        marked that no longer names the file (deleted or rewritten by hand). A record
        is kept only while a file that comes back can take a note back. Called where no
        file is being interpreted (whose note, once written, needs its record)."""
        def keeps(rel: str, rec: JsonObject) -> bool:
            if rec["state"] != "removed":
                return True
            if not rec.get("note"):
                return False
            return not (notes_read and rec.get("marked")) or reme_resource.note_fields(
                self.ws.root, str(rec["note"])).get("source_resource") == f"[[{rel}]]"

        gone = [rel for rel, rec in self.records.items() if not keeps(rel, rec)]
        for rel in gone:
            del self.records[rel]
        return bool(gone)

    # -- job side ----------------------------------------------------------------------

    async def process(self, chat: ChatClient | None, *, retry_failed: bool = False,
                      job_id: str | None = None,
                      progress: Callable[[int, int | None, str], None] = lambda d, t, m: None,
                      ) -> ResourceResult:
        """Interpret queued files and mark removed ones; loops until no work is left."""
        enabled = chat is not None and chat.enabled
        done: dict[str, int] = {}
        changes: list[str] = []
        total = 0
        try:
            while True:
                async with self._lock:
                    if self._prune():
                        await self._save()
                    batch = self.work(chat_enabled=enabled, retry_failed=retry_failed)
                    if not enabled:
                        for p in batch:
                            if self.records[p]["state"] == "queued":
                                self.records[p].update(state="pending", reason=NO_CHAT_MODEL)
                                done["pending"] = done.get("pending", 0) + 1
                        batch = [p for p in batch if self.records[p]["state"] == "removed"]
                        await self._save()
                retry_failed = False
                if not batch:
                    break
                for rel in batch:
                    progress(total, None, rel)
                    total += 1
                    outcome, note = await self._handle(rel, chat)
                    if note is not None:  # told when the job ends, or at the next start
                        resource_told.mark(self.records, rel, note, job_id)
                    done[outcome] = done.get(outcome, 0) + 1
                    if note is not None and note not in changes:  # one note, written twice
                        changes.append(note)
                    await self._save()
        finally:
            # Also when the job is cancelled or fails midway (the daemon stopping): the
            # notes written are processed in the catalog, so no later job tells of them.
            if changes:
                with trio.CancelScope(shield=True):  # bounded: push_inbox waits a little
                    await resource_told.tell_of(self.ws, self.records, changes, job_id,
                                                {"outcomes": done}, self._save)
        waiting = self.counts().get("pending", 0)
        if not enabled and waiting:
            # Not a success: the files the job is for are still waiting.
            raise ProviderConfigError(f"{NO_CHAT_MODEL}: {waiting} resource file(s) wait "
                                      "(set chat_model_config.model_name)")
        return {"outcomes": done, "notes": changes, "catalog": self.counts()}

    async def _handle(self, rel: str, chat: ChatClient | None) -> tuple[str, str | None]:
        found = self.records.get(rel)
        if found is None or found["state"] in ("processed", "skipped"):
            return "superseded", None  # since the job looked: moved, put back, skipped
        rec: JsonObject = found
        if rec["state"] == "removed":
            # Under the catalog's lock: a file back meanwhile (put back, unmarked) must
            # not find its note marked after all.
            async with self._lock:
                if self.records.get(rel) is not rec or rec["state"] != "removed":
                    return "superseded", None
                note = await mark_removed(self.ws, rec, str(rec.get("removed_on")
                                                            or self._today().isoformat()))
                rec["marked"] = True
            return "removed", note
        assert chat is not None
        sha = rec["digest"]

        def superseded() -> bool:
            # Changed or deleted while it was read or the model asked: the watcher has
            # recorded that (a deleted file's note is still to be marked), and an outcome
            # about bytes no longer there must not overwrite it.
            return self.records.get(rel) is not rec or rec["digest"] != sha or (
                rec["state"] == "removed")

        def settle(state: str, reason: str) -> tuple[str, None]:
            if superseded():
                return "superseded", None
            rec.update(state=state, reason=reason)
            return state, None

        try:
            text, cut, read_sha = await trio.to_thread.run_sync(
                read_head, self.ws.root, rel, self.config.max_input_chars)
        except OSError as exc:
            return settle("failed", f"unreadable: {exc.strerror}")
        except PathOutsideWorkspace:
            return settle("failed", "outside the workspace (a directory link)")
        if read_sha != sha:
            # Written since it was cataloged (seen empty or in part, the watcher not there
            # yet): cataloged again first, so bytes a note was written from take it back
            # and only bytes the catalog has are interpreted (by a later pass, if queued).
            async with self._lock:
                if not superseded():
                    await self._catalog_one(rel)
                    await self._follow_moves({rel})
            return "superseded", None
        if rec["state"] == "queued" and not rec.get("note") and await self._moved_here(rel, rec):
            return "superseded", None  # a file interpreted before: it took that note
        why = not_text(text)
        if why is not None:  # read again when it changes, as a file of another suffix
            if not rec.get("note"):
                return settle("skipped", why)
            # Its note says what the file held: marked as no longer held (under the
            # catalog's lock, as a removal is), unmarked if those bytes come back.
            async with self._lock:
                if superseded():
                    return "superseded", None
                note = await mark_changed(self.ws, rec, why, self._today().isoformat())
                rec.update(state="skipped", reason=why)
            return "skipped", note
        try:
            answer = await chat.complete(messages(rel, int(rec["size"]), text, cut=cut),
                                         max_tokens=self.config.summary_max_tokens)
        except ProviderError as exc:
            return settle("failed", exc.message)
        from recalld.daemon.memory.redact import redact_async

        # Masked before it is cut (to max_summary_chars, its first line to the description).
        why = refused(answer.refusal)  # no summary, whatever content came beside it
        summary = "" if why else unfenced(await redact_async(answer.content or ""))
        if names_nothing(summary):  # none, or only what shows nothing
            return settle("failed", why or "the chat model answered with no text")
        if superseded():
            # Moved while the model read it: its bytes under the new name take the answer.
            name = rel.rsplit("/", 1)[-1]
            heirs = sorted((p for p, r in self.records.items() if p != rel and r["state"] ==
                            "queued" and r.get("digest") == sha and not r.get("note")),
                           key=lambda p: p.rsplit("/", 1)[-1] != name)
            if not heirs:
                return "superseded", None
            rel, rec = heirs[0], self.records[heirs[0]]
        summary = cut_summary(summary, answer.finish_reason, self.config.max_summary_chars)
        try:
            note = await write_note(self.ws, rec, summary, truncated=cut)
        except RecalldError as exc:  # the note cannot be written: this file fails, not all
            return settle("failed", f"note not written: {exc.message}")
        if superseded():
            # Deleted or changed while its note was written: the note is the file's all
            # the same, to be marked removed or rewritten by the work that is now queued.
            current = self.records.get(rel)
            if current is not None and not current.get("note"):
                current["note"] = note
            return "superseded", note
        rec.update(state="processed", reason="", note=note)
        return "processed", note

    # -- service -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.records = await trio.to_thread.run_sync(load_catalog, self.path)
        self._fresh = not self.records
        if await trio.to_thread.run_sync(lambda: self._prune(notes_read=True)):
            await self._save()
        self._reme = await trio.to_thread.run_sync(
            reme_resource.read_reme_resources, self.ws.root, self.ws.settings.metadata_dir)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.watcher.run)
            if resource_told.untold(self.records):  # written by a job killed before its end
                nursery.start_soon(resource_told.tell, self.ws, self.records, self._save)
            # Work left by a previous run of the daemon (queued when it stopped).
            if self._request_job is not None and self.work(chat_enabled=self._chat_enabled()):
                nursery.start_soon(self._request_job)
            task_status.started()
