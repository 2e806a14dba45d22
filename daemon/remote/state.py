"""What the replica last agreed on with the server, per file, and how far it has read.

For each replicated path: the server version the local file corresponds to, its content
hash (None: deleted or never present), the file's stat when the replica last saw it
(its last change, the later of its modification and status-change times, and its size:
``note_stamp``; a release before kept the modification time, so such a note is read once
more and, found as agreed, only its stat taken over), ``redirect``, the conflict copy that
further local edits of the path go to until the winning version has been written locally,
and ``settle``, set while the path still has to take the server's version. Plus
``cursor``, the highest server version the change feed has been applied up to.

Persisted as an append log (``<metadata_dir>/remote/state.log``; records
``{"p": path, "v", "h", "m", "r"}`` and ``{"cursor": n}``, the last one of a path wins),
compacted into a snapshot when it grows. Appends happen after the file they describe is
on disk, so a crash leaves the state behind the directory, never ahead of it: the next
catch-up or upload then finds the file already as the server has it.

Before the replica writes server content into a file it records a *landing*
(``{"w": path, "h": hash}``): content that, found on disk after a crash, came from the
server and is not a local edit. A landing ends with the next base recorded for its path.

``{"t": path, "o": other}`` says that the new file ``path`` took over the note the replica
knew spelt ``other``, its name in another Unicode form (renamed between forms), until the
old spelling is found gone (``"o": null`` ends it): ``other`` gone is then no deletion,
after a restart too.

``{"x": path, "why": reason}`` holds a local deletion of ``path`` back (``remote/guard.py``);
``"why": null`` ends the hold.

``{"folders": [...]}`` names the replicated folders the cursor was read under: others
(a changed ``daily_dir``) read the feed again from the start.

``{"ident": ...}`` names the shared workspace the state belongs to: pointed at another
one, the replica starts over (every local file becomes a change based on nothing;
identical content on the server is no change, differing content a conflict copy).
The one it was bound to before is then named by ``{"forget": ident}`` until its rows are
deleted from the server (``{"forgot": ident}``; ``leftovers.py``), so a session that
could not delete them leaves them to the next.

Blocking file I/O: ``open``, ``record`` and ``close`` run in a worker thread.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.remote.outbox import Change
from recalld.daemon.store.applog import AppendLog

#: The state log's name in the replica's folder (:func:`replica_dir`).
STATE_LOG = "state.log"


def replica_dir(root: Path, metadata_dir: str) -> Path:
    """The folder of a workspace's replica files (its state log and outbox), under the
    workspace ``root``'s ``metadata_dir``."""
    return root / metadata_dir / "remote"


class BaseRecord(TypedDict):
    """A :class:`Base` in the state log (short keys: one line per file)."""

    p: str  # path
    v: int  # version
    h: str | None  # hash
    m: list[int] | None  # stat: last change (ns), size
    r: str | None  # redirect
    s: bool  # settle


@dataclass(frozen=True, slots=True)
class Base:
    """The version of a note both sides last agreed on."""

    version: int
    hash: str | None
    stat: tuple[int, int] | None = None
    redirect: str | None = None
    #: The server kept another version of this path (a conflict, a delete that lost):
    #: the path takes the server's version once no local edit of it is waiting.
    settle: bool = False

    def to_record(self, path: str) -> BaseRecord:
        return {"p": path, "v": self.version, "h": self.hash,
                "m": None if self.stat is None else list(self.stat), "r": self.redirect,
                "s": self.settle}

    @classmethod
    def from_record(cls, rec: JsonObject) -> Base:
        m = rec.get("m")
        return cls(version=int(rec.get("v") or 0), hash=rec.get("h"),
                   stat=None if not m else (int(m[0]), int(m[1])), redirect=rec.get("r"),
                   settle=bool(rec.get("s")))


class ReplicaState:
    def __init__(self, path: Path) -> None:
        self._log = AppendLog(path)
        self.bases: dict[str, Base] = {}
        self.cursor = 0
        #: Server content being written into files: path to hash (see the docstring).
        self.landing: dict[str, str] = {}
        #: The shared workspace this state was agreed with (see ``db.open_workspace``).
        self.ident: str | None = None
        #: Shared workspaces this state was agreed with before, whose rows on the server
        #: are to be deleted if their workspace row was removed (``leftovers.py``).
        self.forget: set[str] = set()
        #: New spelling -> the other Unicode form whose note it took over (see the
        #: docstring).
        self.respelt: dict[str, str] = {}
        #: Local deletions held back (``remote/guard.py``): path to why.
        self.held: dict[str, str] = {}
        #: The replicated folders the cursor was read under (None: not recorded yet).
        self.folders: list[str] | None = None
        self._lines = 0

    def open(self) -> None:
        records, _report = self._log.open()
        for rec in records:
            if "ident" in rec:
                self.ident = str(rec["ident"])
            elif "forget" in rec:
                self.forget.add(str(rec["forget"]))
            elif "forgot" in rec:
                self.forget.discard(str(rec["forgot"]))
            elif "folders" in rec:
                self.folders = [str(f) for f in rec["folders"]]
            elif "cursor" in rec:
                self.cursor = max(self.cursor, int(rec["cursor"]))
            elif "p" in rec:
                self.bases[str(rec["p"])] = Base.from_record(rec)
                self.landing.pop(str(rec["p"]), None)
            elif "t" in rec:
                if rec.get("o") is None:
                    self.respelt.pop(str(rec["t"]), None)
                else:
                    self.respelt[str(rec["t"])] = str(rec["o"])
            elif "w" in rec:
                self.landing[str(rec["w"])] = str(rec["h"])
            elif "x" in rec:
                if rec.get("why") is None:
                    self.held.pop(str(rec["x"]), None)
                else:
                    self.held[str(rec["x"])] = str(rec["why"])
        self._lines = len(records)

    def close(self) -> None:
        self._log.close()

    def adopt(self, ident: str) -> bool:
        """Bind the state to shared workspace ``ident``; a different one than before
        (another server, a recreated database) empties it first. Returns whether it did."""
        if self.ident == ident:
            return False
        reset = self.ident is not None
        if reset:
            assert self.ident is not None
            self.forget.add(self.ident)
            self.bases.clear()
            self.landing.clear()
            self.held.clear()
            self.respelt.clear()
            self.cursor = 0
            self.ident = ident
            self._rewrite()
        else:
            self._log.append([{"ident": ident}])
            self._lines += 1
        self.ident = ident
        return reset

    def forgot(self, ident: str) -> None:
        """The rows of shared workspace ``ident`` are off the server (or not this
        replica's to delete)."""
        if ident in self.forget:
            self._log.append([{"forgot": ident}])
            self.forget.discard(ident)
            self._lines += 1

    def land(self, files: Iterable[tuple[str, str]]) -> None:
        """Record server content about to be written into files (path, hash)."""
        batch = list(files)
        if batch:
            self._log.append([{"w": p, "h": h} for p, h in batch])
            self.landing.update(batch)
            self._lines += len(batch)

    def hold(self, paths: Iterable[tuple[str, str | None]]) -> None:
        """Hold local deletions back (path, why) or end their hold (why None)."""
        batch = list(paths)
        if not batch:
            return
        self._log.append([{"x": p, "why": why} for p, why in batch])
        for path, why in batch:
            if why is None:
                self.held.pop(path, None)
            else:
                self.held[path] = why
        self._lines += len(batch)

    def record(self, bases: Iterable[tuple[str, Base]], cursor: int | None = None,
               respelt: Iterable[tuple[str, str | None]] = ()) -> None:
        """Persist new bases (and the cursor, and which new spelling took over which
        note: ``respelt``, None ends it) in one append, then apply them."""
        batch = list(bases)
        taken = list(respelt)
        records: list[Mapping[str, object]] = [b.to_record(p) for p, b in batch]
        records += [{"t": p, "o": o} for p, o in taken]
        if cursor is not None and cursor > self.cursor:
            records.append({"cursor": cursor})
        if not records:
            return
        self._log.append(records)
        for path, base in batch:
            self.bases[path] = base
            self.landing.pop(path, None)
        for path, other in taken:
            if other is None:
                self.respelt.pop(path, None)
            else:
                self.respelt[path] = other
        if cursor is not None:
            self.cursor = max(self.cursor, cursor)
        self._lines += len(records)
        if self._lines > 2 * len(self.bases) + len(self.held) + len(self.respelt) + 1_000:
            self._rewrite()

    def restamp(self, files: Iterable[tuple[str, str | None, tuple[int, int] | None]]
                ) -> None:
        """Take over the stat of files (path, hash, stat) read again and found as agreed:
        a note touched, or whose stat an older release saved, is read once, not at every
        start."""
        self.record([(p, replace(base, stat=stat)) for p, h, stat in files
                     if (base := self.bases.get(p)) is not None and h is not None
                     and base.hash == h and stat is not None and base.stat != stat
                     and p not in self.landing])

    def _rewrite(self) -> None:
        snapshot: list[Mapping[str, object]] = [b.to_record(p) for p, b in self.bases.items()]
        snapshot += [{"w": p, "h": h} for p, h in self.landing.items()]
        snapshot += [{"x": p, "why": why} for p, why in self.held.items()]
        snapshot += [{"t": p, "o": o} for p, o in self.respelt.items()]
        snapshot += [{"forget": ident} for ident in sorted(self.forget)]
        snapshot.append({"cursor": self.cursor})
        if self.folders is not None:
            snapshot.insert(0, {"folders": self.folders})
        if self.ident is not None:
            snapshot.insert(0, {"ident": self.ident})
        self._log.rewrite(snapshot)
        self._lines = len(snapshot)

    def bind_folders(self, folders: list[str]) -> bool:
        """Record the replicated folders (``daily_dir``, ``digest_dir``). Others than
        before set the cursor back to 0: the feed's rows passed by as outside the old
        ones are read again (rows already known are passed by at once). Returns whether
        it did."""
        if self.folders == folders:
            return False
        moved = self.folders is not None
        self.folders = folders
        if moved:
            self.cursor = 0
            self._rewrite()
        else:
            self._log.append([{"folders": folders}])
            self._lines += 1
        return moved

    def target(self, path: str) -> tuple[str, int]:
        """Where a change of ``path`` goes (the path, or its conflict copy while edits
        are redirected there) and the version it is based on."""
        base = self.bases.get(path)
        if base is not None and base.redirect:
            copy = self.bases.get(base.redirect)
            return base.redirect, copy.version if copy else 0
        return path, base.version if base else 0

    def targets(self, run: list[Change]) -> list[tuple[Change, str, int]]:
        """Where each change of ``run`` goes and the version it is based on, up to the
        first whose path or target another one of the run already names (one transaction
        must not base a change on a version an earlier one of it is about to make)."""
        batch: list[tuple[Change, str, int]] = []
        named: set[str] = set()  # in NFC form: two spellings of a name are one note
        for change in run:
            target, base_version = self.target(change.path)
            names = {unicodedata.normalize("NFC", p) for p in (change.path, target)}
            if batch and not names.isdisjoint(named):
                break
            batch.append((change, target, base_version))
            named.update(names)
        return batch
