"""The files of one shared workspace's replica: local changes up, the feed's rows down.

Built on :class:`~recalld.daemon.remote.replicafiles.ReplicaFiles` (the outbox and
replica state in ``<metadata_dir>/remote/``, the lock under which files are read, written
and compared with them), it owns a :class:`~recalld.daemon.watcher.Watcher` of the
workspace's Markdown folders (the same mechanism as the index: inotify plus reconcile
scans). The replica (``remote/replica.py``) opens and closes them, runs the watcher, and
while online runs :meth:`FileSync.upload_loop` on its writer connection and
:meth:`FileSync.pull_loop` on its listener (:mod:`calls` runs their blocking calls).

Local → remote: the watcher reports paths; each is read and hashed under the replica
lock and compared with the last content the replica knows for it (the server's, or the
last queued change). A difference becomes a :class:`~recalld.daemon.remote.outbox.Change`
appended durably to the outbox; the uploader sends changes in order, each based on the
version the replica last agreed on for that path, and records the answer
(:mod:`recalld.daemon.remote.db`): a run of up to ``UPLOAD_RUN`` changes to distinct
files in one transaction, their answers recorded with one append to the state and one
to the outbox (a change the server refuses to store waits alone: ``refusals.py``). A
conflict keeps the other host's version at the path: this host's version is written
beside it as ``*.sync-conflict-<date>-<host>.md`` (already stored on the server as
such), later local edits of that path go to the copy until the winning version has been
written locally, and an inbox item says what happened. An edit after that is based on the
winning version: one that loses again is a conflict of its own, with a copy of its own
(it holds text the first copy lacks, so it never overwrites it).

Remote → local: after every (re)connect, on each notification and every
``CATCH_UP_EVERY_S`` (every reconcile interval while notified), the feed is read from the
last applied version on. A newer row is written into the directory atomically (confined
to the watched folders; into the file this host's disk spells, whatever the Unicode
form: ``forms.py``) unless the path has local changes not yet uploaded (those upload
first, and conflict); the watcher then finds the file identical to what the replica
knows, so nothing goes back up, and the index picks it up through its own watcher."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

import psycopg
import trio

from recalld.daemon.config import RemoteConfig
from recalld.daemon.index.records import note_stamp
from recalld.daemon.remote import chunkplan, db, leftovers, refusals, writes
from recalld.daemon.remote.calls import in_thread, on_conn
from recalld.daemon.remote.conflicts import report_conflict, report_restored
from recalld.daemon.remote.feedapply import FeedApply
from recalld.daemon.remote.forms import here, spelt_rows, twins
from recalld.daemon.remote.localfs import EditedMeanwhile
from recalld.daemon.remote.outbox import Change
from recalld.daemon.remote.replicastatus import OutsideStatus, count_outside
from recalld.daemon.remote.state import Base
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import RecalldError

log = logging.getLogger(__name__)


#: How often the feed is read while the server refuses LISTEN (no notification says when).
CATCH_UP_EVERY_S = 30.0
#: How soon a row this host could not write is tried again.
BLOCKED_RETRY_S = 5.0
#: At most this many changes (to distinct files) go up in one transaction, and past the
#: first of them at most this much file content.
UPLOAD_RUN = 100
UPLOAD_RUN_BYTES = 4 << 20


class FileSync(FeedApply):
    """The file exchange of one shared workspace's replica (see the module docstring)."""

    def __init__(self, ws: Workspace, cfg: RemoteConfig, *, host: str,
                 writer_lock: trio.Lock, reconcile_interval_s: float,
                 cpu: trio.CapacityLimiter | None = None) -> None:
        super().__init__(ws, cfg)
        self.host = host
        s = ws.settings
        self.watcher = Watcher(
            ws.root, [s.daily_dir, s.digest_dir], apply=self._apply_local,
            known=lambda: self._known, stamp=note_stamp,  # as the replica reads files
            config=WatcherConfig(reconcile_interval_s=reconcile_interval_s,
                                 reconcile_before_ready=False,
                                 misnamed_hint="so it is not shared with the other hosts "
                                               "either: rename it to have it shared"))
        self.watcher.root_lost.append(self._root_lost)
        # Held around each call on the replica's writer connection, which the embedding
        # exchange and the chunk backfill use too.
        self._writer_lock = writer_lock
        self._cpu = cpu or trio.CapacityLimiter(1)  # the daemon's, for the chunk rows
        self._uploaded_event = trio.Event()
        self.last_upload: float | None = None
        self.last_pull: float | None = None
        self.uploaded = 0
        self.pulled = 0
        self.conflicts = 0
        #: Rows of the feed the catch-up under way has still to apply (0 when none is).
        self.behind = 0
        #: Paths of the feed this host could not write, and why (tried at each catch-up).
        self._feed_blocked: dict[str, str] = {}
        #: Local changes the server refuses to store, held back each by itself.
        self.refusals = refusals.Refusals()
        #: Whether the server refuses every write of this host now (``writes.py``).
        self.writes = writes.WriteRefusal()
        self.writes.on_refused = self._refused_elsewhere
        self._idle = False
        #: Paths that must take the server's version (a change of this host's lost to
        #: another's) which this host could not write, and why (tried at each catch-up).
        self._unsettled: dict[str, str] = {}
        #: Notes of the workspace outside this host's folders (another host's
        #: ``daily_dir`` or ``digest_dir`` differs), counted when the feed passes one by.
        self.outside = OutsideStatus(notes=0, example=None)
        self._passed_outside = True

    @property
    def blocked(self) -> dict[str, str]:
        """Paths whose server version this host cannot write now, and why."""
        return {**self._feed_blocked, **self._unsettled}

    async def shut(self) -> None:
        """Close the outbox and replica state once no call writes with them (a restore
        of held notes runs in the call that asked for it, not in the replica's tasks):
        closed under it, the notes it writes next would not be recorded. Waits for local
        file calls only: none holds the lock over a call to the server."""
        async with self._lock:
            await in_thread(self.close)

    async def adopt(self, ident: str) -> None:
        """Start over when the state belongs to another shared workspace than the server's."""
        async with self._lock:
            reset = await in_thread(self.state.adopt, ident)
            if not reset:
                return
            log.warning("shared workspace %s: the server's workspace is not the one this "
                        "replica synced with; every local file goes up again (identical "
                        "content is no change, different content a conflict copy)", self._cfg.name)
            self._last_local = {c.path: c.hash for c in self._outbox.pending()}
            self._known.clear()
        await self.watcher.reconcile("shared workspace changed")

    async def forget_removed(self, conn: db.Conn, workspace_id: int) -> None:
        """Delete from the server the rows of the shared workspaces this replica synced
        with before, if their workspace row was removed (``leftovers.py``); those a
        session could not delete are tried again at the next."""
        for ident in sorted(self.state.forget):
            async with self._writer_lock:
                done = await on_conn(conn, leftovers.forget_removed, ident, workspace_id)
            if done is not None:
                await in_thread(self.state.forgot, ident)

    # -- uploading -------------------------------------------------------------------

    async def upload_loop(self, conn: db.Conn, workspace_id: int) -> None:
        """Upload the outbox in order on ``conn`` (the writer) until cancelled, when the
        session ends. Cancellation waits for the call in flight; a change leaves the
        outbox only once the server's answer is recorded. Nothing goes up before the
        startup rescan has applied what changed while the daemon was stopped: a note
        respelt then takes over the changes queued under its old spelling before their
        answers come (``_take_base``), as it does when the daemon sees the rename.
        """
        await self.watcher.wait_reconciled()
        # Paths whose settling a disconnect or a crash interrupted.
        for path, base in list(self.state.bases.items()):
            if (base.redirect or base.settle) and not self._outbox.pending_for(path):
                await self._fetch_and_settle(conn, workspace_id, path)
        self.refusals.clear()
        while True:
            wake = self._wake_uploader
            run = self._outbox.head_run(UPLOAD_RUN, UPLOAD_RUN_BYTES,
                                         self.refusals.held(self._outbox.count_for))
            if not run:
                # Nothing to send while the server refuses writes (the refused change
                # was replaced or given up, a job's catalog or the chunks were refused):
                # a write that changes nothing tries again, with the refusal's backoff.
                refused = self.writes.kind is not None
                wait = self.refusals.wait_s(self._outbox.count_for)
                self._idle = True
                with trio.move_on_after(min(wait, self.writes.delay_s) if refused
                                        else wait) as waited:
                    await wake.wait()
                self._idle = False
                self._wake_uploader = trio.Event()
                if refused and waited.cancelled_caught and self.writes.kind is not None:
                    await self._try_write(conn, workspace_id)
                continue
            async with self._lock:
                batch = self.state.targets(run)
            await self._send(conn, workspace_id, batch)

    async def _send(self, conn: db.Conn, workspace_id: int,
                    batch: list[tuple[Change, str, int]],
                    plan: chunkplan.Plan | None = None) -> None:
        """Upload ``batch`` (its chunk rows made first: ``chunkplan.py``) and record the
        answers; a run the server refuses is sent again one change at a time, so only the
        change it refuses waits (``refusals``), as does a note too slow to chunk."""
        if plan is None:
            plan = await chunkplan.prepare(conn, workspace_id, batch, cpu=self._cpu,
                                           writer_lock=self._writer_lock)
            for change in [c for c, _t, _b in batch if c.path in plan.slow]:
                await self._hold(change, plan.slow[change.path], until_changed=True)
            if not (batch := [one for one in batch if one[0].path not in plan.slow]):
                self._answered()
                return
        try:
            async with self._writer_lock:
                answers = await on_conn(conn, db.upload_many, workspace_id, self.host,
                                        batch, plan.rows)
        except psycopg.Error as exc:
            delay = self.writes.refused(exc, self._cfg.name)
            if delay is not None:
                await self._wait_writable(delay)
                return
            if not refusals.refuses(exc):
                raise
            if len(batch) > 1:
                for one in batch:
                    await self._send(conn, workspace_id, [one], plan)
                return
            await self._hold(batch[0][0], refusals.reason(batch[0][0].path, exc))
            self._answered()
            return
        self.writes_taken()
        async with self._lock:
            settle = await self._record_answers(batch, answers)
        self.refusals.clear(change.path for change, _t, _b in batch)
        self.last_upload = time.time()
        self._answered()
        for path in settle:
            await self._fetch_and_settle(conn, workspace_id, path)

    async def _hold(self, change: Change, why: str, *, until_changed: bool = False) -> None:
        """Hold ``change`` back (``refusals``), or drop it if a later one replaces it."""
        async with self._lock:
            if self._outbox.count_for(change.path) > 1:  # a later change replaces it
                self.refusals.clear([change.path])
                with trio.CancelScope(shield=True):
                    await in_thread(self._outbox.done, [change.id])
            else:
                self.refusals.add(self._cfg.name, change.path, why,
                                  until_changed=until_changed)

    async def _try_write(self, conn: db.Conn, workspace_id: int) -> None:
        """Whether the server takes this host's writes again (nothing to upload)."""
        try:
            async with self._writer_lock:
                await on_conn(conn, db.try_write, workspace_id)
        except psycopg.Error as exc:
            if self.writes.refused(exc, self._cfg.name) is None:
                raise
            return
        self.writes_taken()

    def writes_taken(self) -> None:
        """The server took a write of this host (said once where it refused before)."""
        if self.writes.cleared():
            log.info("shared workspace %s: the server takes this host's writes again",
                     self._cfg.name)

    def _refused_elsewhere(self) -> None:
        """A refusal recorded while the uploader waits with nothing to send: it wakes
        to wait the refusal's backoff and try again."""
        if self._idle:
            self._wake_uploader.set()

    async def _wait_writable(self, delay: float) -> None:
        """The server refuses every write (``writes.py``): the session goes on reading,
        the outbox waits ``delay`` before writing again (less at a new local change)."""
        self._answered()  # those waiting for the upload learn it does not go up now
        with trio.move_on_after(delay):
            await self._wake_uploader.wait()
        self._wake_uploader = trio.Event()

    def _answered(self) -> None:
        """Wake those waiting for changes to be answered (``wait_uploaded``)."""
        self._uploaded_event.set()
        self._uploaded_event = trio.Event()

    async def _fetch_and_settle(self, conn: db.Conn, workspace_id: int, path: str) -> None:
        """Read ``path``'s row on ``conn`` and give the path its version."""
        async with self._writer_lock:
            row = await on_conn(conn, db.fetch, workspace_id, path)
        async with self._lock:
            await self._settle(path, row)

    async def _record_answers(self, batch: list[tuple[Change, str, int]],
                              answers: list[db.Answer]) -> list[str]:
        """Apply the server's answers locally, then mark the changes done. Returns the
        paths that must now take the server's version (caller holds the lock)."""
        bases = self.state.bases
        updates: list[tuple[str, Base]] = []
        ended: list[tuple[str, str | None]] = []  # take-overs of other spellings that end
        for (change, target, _base), answer in zip(batch, answers, strict=True):
            if answer.outcome in ("applied", "same"):
                stat = self._known.get(target)
                if target != change.path:
                    # Redirected to this host's conflict copy: the copy on disk follows.
                    stat = await self._put_local(target, change.data)
                    self._last_local[target] = change.hash
                updates += self._stored(target, answer.version, change.hash, stat, ended)
            elif answer.outcome == "conflict":
                copy = await here(self._ws.root, answer.stored_path)
                stat = await self._put_local(copy, change.data)
                self._last_local[copy] = change.hash
                updates.append((copy, Base(answer.version, change.hash, stat)))
                updates += self._marked(change.path, copy)
                self.conflicts += 1
                await report_conflict(self._ws, self._cfg.name, change.path, copy,
                                      answer.replayed)
            elif answer.outcome == "kept":
                updates += self._marked(change.path, None)
                await report_restored(self._ws, self._cfg.name, change.path, answer.version,
                                      answer.replayed)
        settle: list[str] = []
        after = dict(updates)
        for change, _target, _base in batch:
            if self._outbox.count_for(change.path) <= 1:  # its last one (the run's paths differ)
                paths, instead = self._handed_over(
                    change.path, after.get(change.path, bases.get(change.path)), ended)
                settle += paths
                if instead is not None:
                    updates.append((change.path, instead))
        # Counted before the outbox lets go of them: an empty outbox means counted.
        self.uploaded += len(batch)
        with trio.CancelScope(shield=True):
            await in_thread(partial(self.state.record, updates, respelt=ended))
            await in_thread(self._outbox.done, [change.id for change, _, _ in batch])
        return settle

    async def _settle(self, path: str, row: db.Row | None) -> None:
        """Give ``path`` the server's version once every local edit of it went up. A
        version this host cannot write (a folder in its place) is passed by, named in
        ``blocked``, and tried again at each catch-up."""
        # Named in ``blocked`` until settled (status reads it while this awaits).
        failed_before = self._unsettled.get(path)
        if self._outbox.pending_for(path):
            self._unsettled.pop(path, None)
            return
        try:
            local = await in_thread(self._fs.read, path)
            if local.hash != self._last_local.get(path):
                self._unsettled.pop(path, None)
                await self._observe([local])  # edited again meanwhile: that goes up first
                return
            base = await self._install(path, row, local.hash)
        except EditedMeanwhile as exc:  # saved since the read above: that goes up first
            self._unsettled.pop(path, None)
            await self._observe([exc.found])
            return
        except (OSError, RecalldError) as exc:  # a folder in its place: only it waits
            reason = refusals.cannot_write(path, exc)
            if failed_before is None:
                log.warning("shared workspace %s: %s", self._cfg.name, reason)
            self._unsettled[path] = reason
            return
        self._unsettled.pop(path, None)
        await self._record_pulled([(path, base)])

    async def wait_uploaded(self, timeout_s: float, online: Callable[[], bool]) -> bool:
        """Wait until every local change made before the call is on the server (False:
        not within ``timeout_s``, or ``online()`` says the server cannot be reached now)."""
        with trio.move_on_after(timeout_s):
            await self.watcher.sync()
            await self.wait_judged()
            if self.guard.held:  # deletions held back are not on the server
                return False
            async with self._lock:
                waiting = {c.id: c.path for c in self._outbox.pending()}
            while waiting:
                # A change the server refuses does not go up now either.
                if (not online() or self.writes.kind is not None
                        or not self.refusals.reasons.keys().isdisjoint(waiting.values())):
                    return False
                event = self._uploaded_event
                pending = {c.id for c in self._outbox.pending()}
                waiting = {i: p for i, p in waiting.items() if i in pending}
                if waiting:
                    await event.wait()
            return True
        return False

    # -- pulling ---------------------------------------------------------------------

    async def pull_loop(self, conn: db.Conn, workspace_id: int, *, every_s: float) -> None:
        """Apply the change feed read on ``conn`` (the listener) at the start, when
        notified and every ``every_s``, until cancelled, when the session ends.
        Cancellation waits for the call in flight; the cursor moves past a page of the
        feed only once all of it is applied. A notification that came while the feed was
        read is kept by the driver for the next drain, so none is missed."""
        fd = conn.fileno()
        read_upto = 0
        self._passed_outside = True  # counted once per session, then as rows pass by
        while True:
            read_upto = await self.pulled_upto(await self._catch_up(conn, workspace_id, read_upto))
            for path in list(self._unsettled):
                await self._fetch_and_settle(conn, workspace_id, path)
            if self.heard(await on_conn(conn, db.drain_notifies)):
                continue
            with trio.move_on_after(BLOCKED_RETRY_S if self.blocked else every_s):
                await trio.lowlevel.wait_readable(fd)

    async def _catch_up(self, conn: db.Conn, workspace_id: int, read_upto: int) -> int:
        """Apply the feed from the cursor on; the version read up to. A row this host
        cannot write (a folder in its place, a file it may not replace) is passed by,
        named in ``blocked``: the rows after it are applied, and the cursor stays before
        it, so a restart reads it again; within the session (the feed read up to
        ``read_upto``), each catch-up fetches only the rows passed by again, by path."""
        after = max(self.state.cursor, read_upto)
        blocked: dict[str, str] = {}
        hold: int | None = None  # the version of the first row passed by
        again = [await on_conn(conn, db.fetch, workspace_id, p) for p in self._feed_blocked]
        retry: list[db.Row] | None = sorted(filter(None, again), key=lambda r: r.version)
        while True:
            if retry is not None:  # first the rows passed by before
                rows, retry = retry, None
            elif rows := await on_conn(conn, db.feed, workspace_id, after):
                if not self.behind:  # how far this catch-up goes
                    self.behind = len(rows) + await on_conn(conn, db.left_after, workspace_id,
                                                            rows)
                after = rows[-1].version
            else:
                break
            exact = await on_conn(conn, twins, workspace_id, [r.path for r in rows])
            async with self._lock:
                failed: dict[str, Exception] = {}  # each as this disk spells it:
                rows = await in_thread(spelt_rows, self._ws.root, rows, failed, exact)
                wanted = [r for r in rows if r.path not in failed and self._wanted(r)]
                landing = [(r.path, r.hash) for r in wanted if r.hash is not None
                           and self.state.landing.get(r.path) != r.hash]
                with trio.CancelScope(shield=True):
                    await in_thread(self.state.land, landing)
                updates = await self._apply_remote(wanted, failed)
                for row in rows:
                    if row.path in failed:
                        blocked[row.path] = refusals.cannot_write(row.path, failed[row.path])
                        hold = row.version if hold is None else min(hold, row.version)
                    elif row.path in self._feed_blocked:  # written now: status says so now
                        del self._feed_blocked[row.path]
                cursor = after if hold is None else min(after, hold - 1)
                await self._record_pulled(updates, cursor)
            self.pulled += len(updates)
            self.last_pull = time.time()
            self.behind = max(0, self.behind - len(rows))
        self.behind = 0
        if self._passed_outside:  # counted again (status, doctor)
            self._passed_outside = False
            self.outside = await count_outside(conn, workspace_id, self.folders,
                                               self._cfg.name, self.outside)
        for path in blocked.keys() - self._feed_blocked.keys():
            log.warning("shared workspace %s: %s", self._cfg.name, blocked[path])
        self._feed_blocked = blocked
        return after
