"""The native change source on Linux: inotify, awaited by trio, no thread and no polling.

watchfiles' notifier loops in a thread, waking every step to look for changes and for its
stop event, so an idle daemon with many workspaces would still wake dozens of times a
second. Here the inotify descriptor is registered with trio's I/O loop
(``trio.lowlevel.wait_readable``): an idle workspace costs nothing, a change wakes the
source at once, and cancellation is immediate.

Owns the process's one inotify instance (shared by every source: the per-user limit on
instances never bounds how many workspaces are watched) and, per source, one watch per
directory below its roots but hidden ones (which every watcher passes by: a ``.git``
holds hundreds). New and moved-in directories get watches as they appear (their files
are reported through the directory event, ``Change.folder`` whatever the directory's
name; the watcher expands it). A directory moved away loses its watches, so stale
paths never leak out. Queue overflow (``IN_Q_OVERFLOW``: the kernel dropped events;
:class:`WatchOverflow`, which the watcher counts) and a full watch table (``ENOSPC``:
``fs.inotify.max_user_watches``) raise :class:`WatchError`; the watcher then reconciles
and restarts the source with backoff.
Losing a root is reported as a deletion of the root itself, or ``Change.moved_away``; a root
that cannot be watched when the source starts (gone, a link or a file in its place) raises
:class:`WatchError`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import trio

from recalld.daemon.libc import libc
from recalld.daemon.watchsource import Change, Emit, RawChange, WatchError, WatchOverflow

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
              | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
_EVENT = struct.Struct("iIII")
_READ_BYTES = 64 * 1024


def available() -> bool:
    """Whether this platform has inotify (Linux with a C library exposing it)."""
    lib = libc()
    return lib is not None and hasattr(lib, "inotify_init1")


def parse_events(data: bytes) -> Iterator[tuple[int, int, str]]:
    """``(wd, mask, name)`` for each ``struct inotify_event`` in ``data``."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        offset += _EVENT.size
        raw = data[offset:offset + length]
        offset += length
        yield wd, mask, os.fsdecode(raw.split(b"\0", 1)[0])


class _Instance:
    """The process's one inotify instance, shared by every source: the per-user limit
    (``fs.inotify.max_user_instances``, often 128 for every program together) then
    never bounds how many workspaces a daemon watches. One reader task (a trio system
    task, started with the first source and stopped with the last) routes each event to
    the sources that watch its directory. Watches are added from worker threads (walking
    a tree is disk work) under ``lock``, which the reader holds while it routes, so no
    event of a new watch is read before its owner is known."""

    def __init__(self) -> None:
        lib = libc()
        if lib is None:
            raise WatchError("no C library to call inotify through")
        self._libc = lib
        self._libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise WatchError(f"inotify_init1 failed: {os.strerror(err)}")
        self.fd: int = fd
        self.lock = threading.Lock()
        #: For each watch descriptor, the sources watching it and the directory it is to
        #: each (two sources may watch one directory: a resource folder inside memory/).
        self.owners: dict[int, dict[_Watches, str]] = {}
        self.users: set[_Watches] = set()
        self.closed = False
        self._reader = trio.CancelScope()

    def add(self, watches: _Watches, path: str) -> int:
        """Watch the directory ``path`` for ``watches`` (from any thread): 0, or the errno
        that kept it unwatched."""
        with self.lock:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
            if wd < 0:
                err: int = ctypes.get_errno()
                if err == errno.ENOSPC:
                    raise WatchError(
                        "inotify watch limit reached: raise fs.inotify.max_user_watches")
                return err  # ENOENT/ENOTDIR: it went away before we got to it
            self.owners.setdefault(wd, {})[watches] = path
            watches.paths[wd] = path
        return 0

    def remove(self, watches: _Watches, wd: int) -> None:
        """Stop watching ``wd`` for ``watches``; the kernel's watch goes with its last owner."""
        with self.lock:
            owners = self.owners.get(wd)
            if owners is None or owners.pop(watches, None) is None:
                return
            if not owners:
                del self.owners[wd]
                if not self.closed:
                    self._libc.inotify_rm_watch(self.fd, wd)

    def route(self, data: bytes) -> None:
        """Hand each event in ``data`` to the sources whose watch it is."""
        with self.lock:
            for wd, mask, name in parse_events(data):
                if mask & IN_Q_OVERFLOW:
                    for watches in self.users:
                        watches.fail(WatchOverflow(
                            "inotify event queue overflowed; events were lost"))
                    continue
                owners = (self.owners.pop(wd, None) if mask & IN_IGNORED
                          else self.owners.get(wd))
                for watches, base in (owners or {}).items():
                    watches.deliver(wd, base, mask, name)

    async def read_loop(self) -> None:
        """The reader (a system task: it raises nothing, it tells the sources instead)."""
        with self._reader:
            try:
                while True:
                    await trio.lowlevel.wait_readable(self.fd)
                    self.route(self._read())
            except (OSError, trio.ClosedResourceError) as exc:
                if not self.closed:
                    self.closed = True
                    for watches in self.users:
                        watches.fail(WatchError(f"reading inotify events failed: {exc}"))

    def _read(self) -> bytes:
        chunks = []
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data)
            if len(data) < _READ_BYTES - 4096:
                break
        return b"".join(chunks)

    def release(self, watches: _Watches) -> None:
        """``watches`` is done; the instance closes with its last source."""
        self.users.discard(watches)
        if self.users:
            return
        self._reader.cancel()
        if _INSTANCE.get() is self:
            _INSTANCE.set(None)
        with self.lock:
            self.closed = True
            self.owners.clear()
        trio.lowlevel.notify_closing(self.fd)
        os.close(self.fd)


_INSTANCE: trio.lowlevel.RunVar[_Instance | None] = trio.lowlevel.RunVar(
    "recalld_inotify", default=None)


class _Watches:
    """One source's watches on the shared instance, and the events routed to it."""

    def __init__(self) -> None:
        instance = _INSTANCE.get()
        if instance is None or instance.closed:
            instance = _Instance()
            _INSTANCE.set(instance)
            trio.lowlevel.spawn_system_task(instance.read_loop, name="recalld inotify reader")
        self.instance = instance
        instance.users.add(self)
        #: The directory each of this source's watch descriptors stands for.
        self.paths: dict[int, str] = {}
        self._events: list[tuple[int, str, int, str]] = []
        self._error: WatchError | None = None
        self._wake = trio.Event()

    def add_tree(self, top: str, *, root: bool = False) -> None:
        """Watch ``top`` and every directory below it but hidden ones (symlinks are not
        followed). ``root``: ``top`` is a watched root, which must itself be watched:
        WatchError if it cannot be (a link or a file in its place, or gone again), so the
        watcher says so and retries rather than go on with a root nobody watches."""
        if not root and _hidden(top):
            return
        stack = [top]
        while stack:
            path = stack.pop()
            err = self.instance.add(self, path)
            if err and root and path == top:
                # A link to a folder reads as ENOTDIR ("Not a directory"), which it seems
                # to be: say what it is.
                why = ("it is a symbolic link, which is not followed: put the folder itself "
                       "there" if err == errno.ENOTDIR and os.path.islink(top)
                       else os.strerror(err))
                raise WatchError(f"cannot watch {top}: {why}")
            if err:
                continue
            try:
                with os.scandir(path) as entries:
                    stack.extend(e.path for e in entries
                                 if not _hidden(e.name) and e.is_dir(follow_symlinks=False))
            except OSError:
                continue  # vanished or unreadable: its parent's events tell the rest

    def forget_tree(self, top: str) -> None:
        """Drop the watches of ``top`` and below (it left the watched tree)."""
        prefix = top + os.sep
        for wd, path in list(self.paths.items()):
            if path == top or path.startswith(prefix):
                del self.paths[wd]
                self.instance.remove(self, wd)

    def deliver(self, wd: int, base: str, mask: int, name: str) -> None:
        self._events.append((wd, base, mask, name))
        self._wake.set()

    def fail(self, error: WatchError) -> None:
        self._error = error
        self._wake.set()

    async def next(self) -> list[tuple[int, str, int, str]]:
        """The events routed here since the last call (waits for one)."""
        await self._wake.wait()
        self._wake = trio.Event()
        if self._error is not None:
            raise self._error
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        for wd in list(self.paths):
            self.instance.remove(self, wd)
        self.paths.clear()
        self.instance.release(self)


class InotifySource:
    """The Linux change source (see the module docstring)."""

    async def run(
        self,
        roots: Sequence[Path],
        emit: Emit,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        watches = _Watches()
        try:
            root_paths = {os.fspath(r) for r in roots}
            for root in root_paths:
                # Walking a large tree is disk work: keep it off the event loop.
                await trio.to_thread.run_sync(partial(watches.add_tree, root, root=True))
            task_status.started()
            while True:
                batch, new_dirs = self._translate(watches, await watches.next(), root_paths)
                if new_dirs:
                    # Watch new directories before their change goes out (the watcher
                    # then scans them, so nothing created meanwhile is missed); walking
                    # a tree moved in is disk work: keep it off the event loop.
                    await trio.to_thread.run_sync(_add_trees, watches, new_dirs)
                if batch:
                    emit(batch)
        finally:
            watches.close()

    @staticmethod
    def _translate(
        watches: _Watches, events: list[tuple[int, str, int, str]], roots: set[str]
    ) -> tuple[set[RawChange], list[str]]:
        """The changes of ``events`` and the directories that appeared (to watch)."""
        batch: set[RawChange] = set()
        new_dirs: list[str] = []
        for wd, base, mask, name in events:
            if mask & IN_IGNORED:
                watches.paths.pop(wd, None)
                if base in roots:
                    batch.add((Change.deleted, base))
                continue
            if wd not in watches.paths:
                continue  # a watch already dropped (a folder moved away): stragglers
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                if base in roots:
                    moved = mask & IN_MOVE_SELF
                    batch.add((Change.moved_away if moved else Change.deleted, base))
                continue
            path = os.path.join(base, name) if name else base
            if mask & IN_ISDIR:
                if mask & (IN_CREATE | IN_MOVED_TO):
                    new_dirs.append(path)
                elif mask & IN_MOVED_FROM:
                    watches.forget_tree(path)
                batch.add((Change.folder, path))
            elif mask & (IN_CREATE | IN_MOVED_TO):
                batch.add((Change.added, path))
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                batch.add((Change.deleted, path))
            else:
                batch.add((Change.modified, path))
        return batch, new_dirs


def _hidden(path: str) -> bool:
    """Whether the last part of ``path`` is hidden: every watcher passes those folders by
    (a ``.git`` of hundreds of folders, an editor's state), so they get no watch; one
    renamed to a visible name is watched as it is moved in."""
    return os.path.basename(path).startswith(".")


def _add_trees(watches: _Watches, tops: list[str]) -> None:
    for top in tops:
        watches.add_tree(top)
