"""Which paths the watcher takes, and the disk scans that list them.

Owns the path rules of the watched roots (the folders passed by, :data:`IGNORE_DIRS` and
:func:`passed_by`; what is a note; what may be a folder) and :class:`WatchedRoots`, the
roots of one workspace with their blocking scans (run by the watcher in worker threads).
No trio and no I/O at import: the rules are read where the watcher is not loaded. Paths
are workspace-relative with ``/`` separators (``memory/2026-07-23/commute.md``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, TypedDict

from recalld.daemon import safepath
from recalld.daemon.store import confine
from recalld.daemon.store.fsio import TEMP_RE
from recalld.daemon.store.leftovers import file_times_now
from recalld.daemon.watchsource import COOKIE_PREFIX, Change
from recalld.ipc.errors import RecalldError

__all__ = ["IGNORE_DIRS", "UNREAD_STAMP", "Stamp", "WatchedRoots", "mtime_stamp", "passed_by"]

#: A note's file as ``(st_dev, st_ino, st_nlink)``: the names of one file share it.
Inode = tuple[int, int, int]

# The scans are the watcher's: they log under its name.
log = logging.getLogger("recalld.daemon.watcher")

# Names editors use for probes and backups that never are Markdown notes.
_JUNK_NAMES = frozenset({"4913"})

#: How a scan stamps a file it lists, as the consumer's ``known`` stamps it.
Stamp = Callable[[os.stat_result], tuple[int, int]]


def mtime_stamp(st: os.stat_result) -> tuple[int, int]:
    """A file's ``(mtime_ns, size)``: the stamp scans list files with by default."""
    return st.st_mtime_ns, st.st_size


#: The ``(mtime_ns, size)`` a scan lists a file that is there but is not read with (see
#: ``WatcherConfig.unread_listed``): no file read has it.
UNREAD_STAMP: Final = (0, -1)

#: Folders the watcher passes by (besides hidden ones): the daemon's own state.
IGNORE_DIRS: Final = ("mem_metadata",)


_shown = safepath.shown_masked


def passed_by(rel: str, ignore_dirs: tuple[str, ...] = IGNORE_DIRS) -> bool:
    """Whether the watcher passes the workspace-relative ``rel`` by: a hidden part, or a
    folder of ``ignore_dirs``."""
    return any(p.startswith(".") or p in ignore_dirs for p in rel.split("/"))


def _leads_to_folder(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` (no folder itself) is a link to a folder; not one that loops or
    cannot be followed (ELOOP, EACCES): that is a link to no folder."""
    try:
        return entry.is_dir()
    except OSError:
        return False


class MisnamedStatus(TypedDict):
    """Notes the last scan passed by because their name is not valid UTF-8."""

    notes: int
    example: str | None  # one of them, other bytes escaped, a credential in it masked


class WatchedRoots:
    """The workspace-relative ``roots`` of one workspace a watcher watches: which paths
    below them are notes (a name ending in one of ``suffixes``, nothing passed by under
    ``ignore_dirs``), and the disk scans that list those notes with their
    ``(mtime_ns, size)``."""

    def __init__(self, workspace: Path, roots: Sequence[str], *,
                 suffixes: tuple[str, ...], ignore_dirs: tuple[str, ...],
                 misnamed_hint: str = "rename it to have it indexed",
                 unread_listed: bool = False, stamp: Stamp = mtime_stamp) -> None:
        self.workspace = Path(os.path.abspath(workspace))
        self._stamp = stamp  # what a scan lists each file with
        self.root_rels = tuple(r.strip("/") for r in roots)
        self.roots = [self.workspace / r for r in self.root_rels]
        self._suffixes = suffixes
        self._ignore_dirs = ignore_dirs
        self._prefix = str(self.workspace) + os.sep
        # Where the workspace folder really lies, from the first scan on: a link put in
        # its place since leads the scans nowhere (see ``_walk``).
        self._real: str | None = None
        self._warned: set[str] = set()  # names passed by for their encoding, said once
        self._misnamed_hint = misnamed_hint  # what the warning of one says to do
        self._unread_listed = unread_listed  # files not read listed too (UNREAD_STAMP)
        # Those the last whole scan found (each scan collects its own: scans may overlap).
        self._misnamed: frozenset[str] = frozenset()
        # Roots and folders the last scan could not list, said once; whether the last
        # folder events named one (a scan then says so, see ``expand_dirs``).
        self._unlisted: dict[str, str] = {}
        self.unlisted_seen = False
        # Notes with more than one name (hard links) and their file: a write through one
        # name changes every other, and makes an event for that name alone (or none, from
        # a name outside the roots). ``_mapped``: the files a walk found every name of.
        self._links: dict[str, Inode] = {}
        self._mapped: frozenset[Inode] = frozenset()
        # The daemon's own temp files (an atomic write's, a restore's) whose inode last
        # changed before the workspace opened are what a kill cut short. Read on the clock
        # file times are taken from: none made after this dates from before it.
        self._opened_ns = file_times_now()
        self._uid = os.getuid()  # whose read bit lets the daemon read a note (_readable)

    # -- path classification (pure, cheap: runs for every raw event) ----------------------

    def relative(self, path: str) -> str | None:
        """The workspace-relative form of the absolute ``path``; None outside the roots."""
        if not path.startswith(self._prefix):
            return None
        rel = path[len(self._prefix):].replace(os.sep, "/")
        for root in self.root_rels:
            if rel == root or rel.startswith(root + "/"):
                return rel
        return None

    def passed_by(self, rel: str) -> bool:
        """Whether the watcher passes the workspace-relative ``rel`` by (see
        :func:`passed_by`)."""
        return passed_by(rel, self._ignore_dirs)

    def is_note(self, rel: str) -> bool:
        """Whether a workspace-relative path names a file the consumer indexes."""
        name = rel.rsplit("/", 1)[-1]
        return self._note_but_for_encoding(rel, name) and safepath.is_utf8(rel)

    def misnamed_change(self, rel: str, change: Change) -> bool:
        """Whether ``change`` to the workspace-relative ``rel`` may change which notes are
        passed by for a name that is not valid UTF-8 (see :meth:`misnamed_status`): such a
        note made or gone (not one written to again), a folder so named, or a folder
        above one."""
        if self._note_but_for_encoding(rel, rel.rsplit("/", 1)[-1]):
            gone = change in (Change.deleted, Change.moved_away)
            return not safepath.is_utf8(rel) and (rel in self._misnamed) == gone
        if not (change == Change.folder or self.maybe_dir(rel)) or self.passed_by(rel):
            return False
        return not safepath.is_utf8(rel) or any(m.startswith(rel + "/")
                                                for m in self._misnamed)

    def _note_but_for_encoding(self, rel: str, name: str) -> bool:
        return (not self.passed_by(rel) and name.endswith(self._suffixes)
                and name not in _JUNK_NAMES)

    def misnamed_status(self) -> MisnamedStatus:
        """The notes the last scan passed by for their name's encoding."""
        first = min(self._misnamed, default=None)
        return {"notes": len(self._misnamed),
                "example": None if first is None else _shown(first)}

    def misnamed_shown(self) -> list[str]:
        """Every note the last scan passed by for its name's encoding, sorted, as status
        and the log show it (other bytes escaped, a credential masked): a name that is
        not UTF-8 cannot travel in JSON as it is."""
        return sorted(_shown(rel) for rel in self._misnamed)

    def maybe_dir(self, rel: str) -> bool:
        """Whether a workspace-relative path that is no note may name a folder (for a
        source that does not say which paths are folders: see ``Change.folder``)."""
        # Directory names in a workspace are dates and buckets; names with a suffix or
        # an editor's marks are files that are not notes (swap, backup, probe).
        name = rel.rsplit("/", 1)[-1]
        return not (self.passed_by(rel) or "." in name or name.endswith("~")
                    or name.startswith("#") or name in _JUNK_NAMES)

    # -- disk scans (worker threads) ---------------------------------------------------------

    def _walk(self, top: Path, out: dict[str, tuple[int, int]],
              reached: tuple[int, Callable[[], None]] | None = None,
              links: dict[str, Inode] | None = None,
              unlisted: dict[str, str] | None = None,
              misnamed: set[str] | None = None) -> str | None:
        # Links below ``top`` are never descended (``follow_symlinks=False``); ``top``
        # itself (a root, or a folder named by an event) may be a link, followed only
        # while it stays in the workspace: another agent's memory never enters this one.
        # Notes with more than one name go to ``links`` too, notes passed by for their
        # name's encoding to ``misnamed``; folders below ``top`` that are there but cannot
        # be listed for now (no permission, a failing disk) to ``unlisted`` with why: what
        # they hold is unknown, not gone.
        # Returns why ``top`` itself could not be listed, or None.
        if self._real is None:
            self._real = os.path.realpath(self.workspace)
        if not safepath.is_inside(top, self.workspace, self._real):
            if not os.path.lexists(top):  # gone, or the workspace itself is
                return os.strerror(errno.ENOENT)
            if os.path.realpath(self.workspace) != self._real:
                # The workspace folder (or one on its path) was replaced by a link: what
                # it leads to is another folder's, and this one's notes are unknown.
                return "the workspace folder now leads to another folder"
            if top in self.roots:
                # A root moved elsewhere with a link left in its place: its notes are
                # unknown, not gone, as for a root moved away or a file in its place.
                return "it is a symbolic link leading out of the workspace"
            log.warning("not descending %s: it leads out of the workspace", _shown(str(top)))
            return None
        stack = [top]
        while stack:
            current = stack.pop()
            try:
                entries = list(os.scandir(current))
            except OSError as exc:
                why = exc.strerror or type(exc).__name__
                if current is top:
                    return why
                if unlisted is not None and (isinstance(exc, PermissionError)
                                             or exc.errno == errno.EIO):
                    # No permission (for now), a failing disk: its notes are unknown.
                    unlisted[self._rel(str(current))] = why
                elif not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                    # A name past PATH_MAX, which no note below was ever read by: this
                    # folder alone is passed by, the rest is listed.
                    log.warning("reconcile skips %s: %s", _shown(str(current)), why)
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    if TEMP_RE.match(entry.name) or entry.name.startswith(COOKIE_PREFIX):
                        self._remove_left_over(entry)
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in self._ignore_dirs:
                            stack.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        rel = self._rel(entry.path)
                        if self.is_note(rel):
                            st = entry.stat(follow_symlinks=False)
                            if not self._readable(entry.path, st):
                                if self._unread_listed:
                                    out[rel] = UNREAD_STAMP
                                continue  # no note, as a read of it finds (see below)
                            out[rel] = self._stamp(st)
                            if links is not None and st.st_nlink > 1:
                                links[rel] = (st.st_dev, st.st_ino, st.st_nlink)
                            if reached is not None and len(out) == reached[0]:
                                reached[1]()
                        elif self._note_but_for_encoding(rel, entry.name):
                            if misnamed is not None:
                                misnamed.add(rel)
                            if rel not in self._warned:
                                self._warned.add(rel)
                                log.warning("passing by %s: its name is not valid UTF-8 "
                                            "(%s)", _shown(rel), self._misnamed_hint)
                    elif self._unread_listed and not _leads_to_folder(entry):  # a link, a FIFO
                        rel = entry.path[len(self._prefix):].replace(os.sep, "/")
                        if self.is_note(rel):
                            out[rel] = UNREAD_STAMP
                except FileNotFoundError:
                    continue
                except OSError as exc:  # a name past PATH_MAX, a failing disk
                    log.warning("reconcile skips %s: %s", _shown(entry.path),
                                exc.strerror or exc)
        return None

    def _rel(self, path: str) -> str:
        """The workspace-relative name of ``path``, a path the walk reached below it."""
        return path[len(self._prefix):].replace(os.sep, "/")

    def _readable(self, path: str, st: os.stat_result) -> bool:
        """Whether the daemon may read the file ``path`` (its lstat ``st``). One its owner
        made unreadable (``chmod 000``) is no note: a read of it leaves the index, so a
        scan that listed it would find the index behind the disk for as long as it stays
        so (status pending, verify failing, each reconcile reading it again). The
        owner's read bit decides for the daemon's own files, with no system call; others
        (another owner, no read bit but privileges that read all) ask ``access``."""
        if st.st_uid == self._uid and st.st_mode & stat.S_IRUSR:
            return True
        return os.access(path, os.R_OK)

    def _remove_left_over(self, entry: os.DirEntry[str]) -> None:
        """Remove the temp file of a write a kill cut short (hidden, never indexed, as
        large as the note it was to be) or a sync cookie a kill left: one whose inode last
        changed before the workspace opened (a restore's file moved aside has a new
        ``ctime``, whatever its ``mtime``; a cookie of this daemon's is newer)."""
        with contextlib.suppress(OSError):
            if (entry.is_file(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_ctime_ns < self._opened_ns):
                os.unlink(entry.path)
                log.info("removed %s, left over by a write cut short", _shown(entry.path))

    def scan(self, reached: tuple[int, Callable[[], None]] | None = None,
             ) -> dict[str, tuple[int, int]]:
        """Every note under the roots with its ``(mtime_ns, size)`` (blocking);
        ``reached``: ``(n, fn)``, ``fn()`` called once the scan has found ``n`` notes."""
        return self.scan_roots(reached)[0]

    def scan_roots(self, reached: tuple[int, Callable[[], None]] | None = None,
                   out: dict[str, tuple[int, int]] | None = None,
                   ) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
        """As :meth:`scan`, and the roots, or folders below them, that could not be
        listed (gone, not a folder, no permission) with why: what they hold is unknown,
        not gone. ``out``: the (empty) mapping the notes are listed into, which another
        thread may count while the scan goes on."""
        out = {} if out is None else out
        unlisted: dict[str, str] = {}
        links: dict[str, Inode] = {}
        misnamed: set[str] = set()
        for rel, root in zip(self.root_rels, self.roots, strict=True):
            why = self._walk(root, out, reached, links, unlisted, misnamed)
            if why is not None:
                unlisted[rel] = why
        for rel, why in unlisted.items():
            if self._unlisted.get(rel) != why:
                log.warning("cannot list %s (%s): its notes stay indexed until it can",
                            _shown(str(self.workspace / rel)), why)
        self._unlisted = unlisted
        self._misnamed = frozenset(misnamed)
        if not unlisted:  # else names in a root not listed may be missing
            self._links, self._mapped = links, frozenset(links.values())
        return out, unlisted

    def with_other_names(self, paths: set[str]) -> set[str]:
        """``paths`` (notes a batch of events names) and every other name of a note among
        them that has more than one: a write through one name of a file changes them all,
        but only the name written through has an event (blocking). A file whose names
        are not known yet (a link just made) has the roots walked for them once."""
        files: set[Inode] = set()
        for rel in paths:
            try:
                st = os.lstat(self.workspace / rel)
            except OSError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
                self._links.pop(rel, None)
                continue
            self._links[rel] = inode = (st.st_dev, st.st_ino, st.st_nlink)
            files.add(inode)
        if not files:
            return paths
        if not files <= self._mapped:
            links: dict[str, Inode] = {}
            for root in self.roots:
                self._walk(root, {}, None, links)
            self._links = {**self._links, **links}
            self._mapped = self._mapped | frozenset(links.values()) | files
        same = {inode[:2] for inode in files}
        return paths | {rel for rel, inode in self._links.items() if inode[:2] in same}

    def has_other_names(self) -> bool:
        """Whether a note with more than one name is known (see :meth:`changed_links`)."""
        return bool(self._links)

    def changed_links(self, known: Mapping[str, tuple[int, int]]) -> set[str]:
        """The notes with more than one name whose ``(mtime_ns, size)`` on disk is not
        ``known``'s: a name outside the roots may have changed them, which no event says
        (blocking)."""
        out: set[str] = set()
        for rel in list(self._links):
            try:
                st = os.lstat(self.workspace / rel)
            except OSError:
                out.add(rel)
                continue
            if known.get(rel) != self._stamp(st):
                out.add(rel)
        return out

    def expand_dirs(self, dirs: set[str], known: Mapping[str, tuple[int, int]]) -> set[str]:
        """The notes the folder events ``dirs`` stand for, against ``known`` (blocking)."""
        # A directory event stands for the files below it: those on disk that the
        # consumer does not have as they are, and those it has that are gone.
        found: dict[str, tuple[int, int]] = {}
        unlisted: dict[str, str] = {}
        misnamed: set[str] = set()
        for rel in dirs:
            folder = self.workspace / rel
            # A link to a folder below a root is not descended, as a scan does not: its
            # notes would be indexed twice (here and where it points), and each scan
            # would drop them again.
            if rel in self.root_rels or not folder.is_symlink():
                why = self._walk(folder, found, unlisted=unlisted, misnamed=misnamed)
                if why is not None and folder.is_dir():  # there, but not listed
                    unlisted[rel] = why
        if not misnamed <= self._misnamed:  # a folder moved in holding some
            self._misnamed = self._misnamed | misnamed
        out = {p for p, stat in found.items() if known.get(p) != stat}
        # What a folder that could not be listed holds is unknown: nothing of it is gone
        # (a scan says which it is, see ``unlisted_seen``).
        unknown = tuple(rel + "/" for rel in unlisted)
        prefixes = tuple(rel + "/" for rel in dirs)
        out.update(p for p in known if p.startswith(prefixes) and p not in found
                   and not p.startswith(unknown))
        self.unlisted_seen = bool(unlisted)
        return out

    def make_roots(self, leave: frozenset[str] = frozenset()) -> None:
        """Create the roots that are missing but those named in ``leave`` (blocking)."""
        for rel in self.root_rels:
            if rel not in leave:
                self._make_below(rel)

    def _make_below(self, rel: str) -> None:
        """Make the root ``rel`` folder by folder below the workspace folder, never the
        workspace folder itself: one removed meanwhile (a link in its place taken away) is
        not made again, empty, where the user is about to put it back (FileNotFoundError).
        Made as the workspace's writes are (:mod:`confine`): never through a link put in
        the place of the workspace folder or of a folder on the way (OSError)."""
        folder = self.workspace
        for name in rel.split("/"):
            folder = folder / name
            try:
                confine.mkdir(folder, 0o777)  # as Path.mkdir: the umask decides
            except FileExistsError:
                if not folder.is_dir():  # as Path.mkdir(exist_ok=True): a file there
                    raise

    def make_removed_roots(self, leave: frozenset[str]) -> None:
        """Create the roots gone from a workspace folder still there, but those named in
        ``leave`` (moved away) and links (their target may come back) (blocking)."""
        if not self.workspace.is_dir():
            return  # the workspace moved away or its disk is gone: nothing is known
        for rel, root in zip(self.root_rels, self.roots, strict=True):
            if rel not in leave and not os.path.lexists(root):
                try:
                    self._make_below(rel)
                except OSError as exc:
                    log.debug("root %s not made again: %s", root, exc)

    def mark(self, name: str, *, remove: bool = False) -> None:
        """Create the empty file ``name`` in the first root (``remove``: remove it), never
        through a link: the root or a folder on its path replaced by one (``memory`` moved
        away, a link to another folder left) raises OSError instead of writing there, for
        the watcher's sync cookies (blocking)."""
        parts = [*self.root_rels[0].split("/"), name]
        try:
            folder = safepath.open_parent(self.workspace, parts, "/".join(parts))
        except RecalldError as exc:
            raise OSError(errno.ENOTDIR, exc.message) from None
        try:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=folder)
            else:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=folder))
        finally:
            os.close(folder)
