"""The native change source on Linux: inotify, awaited by trio, no thread and no polling.

watchfiles' notifier loops in a thread, waking every step to look for changes and for its
stop event, so an idle daemon with many workspaces would still wake dozens of times a
second. Here the inotify descriptor is registered with trio's I/O loop
(``trio.lowlevel.wait_readable``): an idle workspace costs nothing, a change wakes the
source at once, and cancellation is immediate.

Every source of a trio run (the daemon: two per workspace) shares one inotify instance
(:class:`_Hub`; the kernel's default is 128 instances per user), with one watch per
directory below each source's roots. New and moved-in directories get watches as they
appear (their files are reported through the directory event; the watcher expands it). A
directory moved away loses its watches, so stale paths never leak out. Queue overflow
(``IN_Q_OVERFLOW``: the kernel dropped events, anyone's) fails every source, and a full
watch table (``ENOSPC``: ``fs.inotify.max_user_watches``) the source that hit it, with
:class:`WatchError`; the watcher then reconciles and restarts its source with backoff.
Losing a root (deleted or moved) is reported as a deletion of the root itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import trio
from watchfiles import Change

from recalld.daemon.watchsource import Emit, RawChange, WatchError

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


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def available() -> bool:
    """Whether this platform has inotify (Linux with a C library exposing it)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return hasattr(_libc(), "inotify_init1")
    except OSError:
        return False


def parse_events(data: bytes) -> Iterator[tuple[int, int, str]]:
    """``(wd, mask, name)`` for each ``struct inotify_event`` in ``data``."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        offset += _EVENT.size
        raw = data[offset:offset + length]
        offset += length
        yield wd, mask, os.fsdecode(raw.split(b"\0", 1)[0])


class _Inotify:
    """One inotify instance and the directory each watch descriptor stands for."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise WatchError(f"inotify_init1 failed: {os.strerror(err)}")
        self.fd: int = fd
        self.paths: dict[int, str] = {}

    def add(self, path: str) -> int | None:
        """Watch ``path``; its descriptor (the same one again for a watched directory), or
        None when it went away first. WatchError when the watch table is full."""
        wd: int = self._libc.inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOSPC:
                raise WatchError(
                    "inotify watch limit reached: raise fs.inotify.max_user_watches")
            return None  # ENOENT/ENOTDIR: it went away before we got to it
        return wd

    def remove(self, wd: int) -> None:
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self) -> bytes:
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

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.fd)
        os.close(self.fd)


class _Subscription:
    """One running :class:`InotifySource`: its roots, its callback, its watches."""

    def __init__(self, roots: set[str], emit: Emit) -> None:
        self.roots = roots
        self.emit = emit
        self.wds: set[int] = set()
        self.failed = trio.Event()
        self.error = ""

    def fail(self, error: str) -> None:
        if not self.failed.is_set():
            self.error = error
            self.failed.set()


class _Hub:
    """The one inotify instance of a trio run, shared by every source in it.

    The kernel allows 128 instances per user by default; with one per workspace watcher a
    daemon would run out at a few dozen workspaces. Watches are counted per subscription
    (two workspaces may watch one directory: inotify gives both the same descriptor), and
    a descriptor is removed when no subscription needs it. One system task reads the
    instance and hands each subscription its share of every batch; it ends, and the
    instance is closed, when the last subscription leaves. Initial trees are walked in
    worker threads, so the maps are guarded by a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notify: _Inotify | None = None
        self._subs: set[_Subscription] = set()
        self._subs_of: dict[int, set[_Subscription]] = {}  # wd -> who watches it

    @property
    def fd(self) -> int | None:
        return None if self._notify is None else self._notify.fd

    def subscribe(self, sub: _Subscription) -> None:
        if self._notify is None:
            self._notify = _Inotify()
            trio.lowlevel.spawn_system_task(self._read_loop, self._notify,
                                            name="recalld inotify reader")
        self._subs.add(sub)

    def unsubscribe(self, sub: _Subscription) -> None:
        self._subs.discard(sub)
        notify = self._notify
        if notify is None:
            return
        with self._lock:
            for wd in sub.wds:
                self._release(notify, sub, wd)
            sub.wds.clear()
        if not self._subs:
            self._notify = None
            notify.close()  # the reader sees it closed and ends

    def _release(self, notify: _Inotify, sub: _Subscription, wd: int) -> None:
        # Under the lock: ``sub`` no longer needs ``wd``; drop the watch if nobody does.
        subs = self._subs_of.get(wd)
        if subs is None:
            return
        subs.discard(sub)
        if not subs:
            del self._subs_of[wd]
            notify.paths.pop(wd, None)
            notify.remove(wd)

    def add_tree(self, sub: _Subscription, top: str) -> None:
        """Watch ``top`` and every directory below it for ``sub`` (symlinks are not
        followed). May run in a worker thread."""
        notify = self._notify
        if notify is None:
            return
        stack = [top]
        while stack:
            path = stack.pop()
            wd = notify.add(path)
            if wd is None:
                continue
            with self._lock:
                notify.paths[wd] = path
                self._subs_of.setdefault(wd, set()).add(sub)
                sub.wds.add(wd)
            try:
                with os.scandir(path) as entries:
                    stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
            except OSError:
                continue  # vanished or unreadable: its parent's events tell the rest

    def _forget_tree(self, notify: _Inotify, sub: _Subscription, top: str) -> None:
        """Drop ``sub``'s watches of ``top`` and below (it left the watched tree)."""
        prefix = top + os.sep
        with self._lock:
            for wd in [w for w in sub.wds if (p := notify.paths.get(w)) is not None
                       and (p == top or p.startswith(prefix))]:
                sub.wds.discard(wd)
                self._release(notify, sub, wd)

    async def _read_loop(self, notify: _Inotify) -> None:
        try:
            while self._notify is notify:
                await trio.lowlevel.wait_readable(notify.fd)
                self.dispatch(notify, notify.read())
        except (trio.ClosedResourceError, OSError) as exc:
            if self._notify is notify:  # not closed by the last unsubscribe: a failure
                self._fail_all(f"inotify read failed: {exc}")
        except Exception as exc:  # a system task must not raise: tell the sources
            self._fail_all(f"inotify reader failed: {type(exc).__name__}: {exc}")

    def _fail_all(self, error: str) -> None:
        for sub in list(self._subs):
            sub.fail(error)

    def dispatch(self, notify: _Inotify, data: bytes) -> None:
        """Turn ``data`` (events read from ``notify``) into a batch per subscription."""
        batches: dict[_Subscription, set[RawChange]] = {}
        for wd, mask, name in parse_events(data):
            if mask & IN_Q_OVERFLOW:
                self._fail_all("inotify event queue overflowed; events were lost")
                return
            with self._lock:
                base = notify.paths.get(wd)
                subs = list(self._subs_of.get(wd, ()))
            if base is None or not subs:
                continue  # a watch we already dropped (IN_IGNORED and stragglers)
            if mask & IN_IGNORED:
                with self._lock:
                    notify.paths.pop(wd, None)
                    self._subs_of.pop(wd, None)
                    for sub in subs:
                        sub.wds.discard(wd)
                for sub in subs:
                    if base in sub.roots:
                        batches.setdefault(sub, set()).add((Change.deleted, base))
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                for sub in subs:
                    if base in sub.roots:
                        batches.setdefault(sub, set()).add((Change.deleted, base))
                continue
            path = os.path.join(base, name) if name else base
            if mask & (IN_CREATE | IN_MOVED_TO):
                change = Change.added
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                change = Change.deleted
            else:
                change = Change.modified
            for sub in subs:
                if mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        try:
                            self.add_tree(sub, path)
                        except WatchError as exc:
                            sub.fail(str(exc))
                    elif mask & IN_MOVED_FROM:
                        self._forget_tree(notify, sub, path)
                batches.setdefault(sub, set()).add((change, path))
        for sub, batch in batches.items():
            if sub in self._subs and not sub.failed.is_set():
                try:
                    sub.emit(batch)
                except Exception as exc:  # one watcher's failure is not everyone's
                    sub.fail(f"delivering changes failed: {type(exc).__name__}: {exc}")


_HUB: trio.lowlevel.RunVar[_Hub] = trio.lowlevel.RunVar("recalld_inotify_hub")


def _hub() -> _Hub:
    try:
        return _HUB.get()
    except LookupError:
        hub = _Hub()
        _HUB.set(hub)
        return hub


def open_instances() -> int:
    """inotify instances this trio run holds: 1 while any source runs, else 0."""
    try:
        return 0 if _HUB.get().fd is None else 1
    except LookupError:
        return 0


class InotifySource:
    """The Linux change source (see the module docstring)."""

    async def run(
        self,
        roots: Sequence[Path],
        emit: Emit,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        hub = _hub()
        sub = _Subscription({os.fspath(r) for r in roots}, emit)
        hub.subscribe(sub)
        try:
            for root in sub.roots:
                # Walking a large tree is disk work: keep it off the event loop.
                await trio.to_thread.run_sync(hub.add_tree, sub, root)
            if sub.failed.is_set():
                raise WatchError(sub.error)
            task_status.started()
            await sub.failed.wait()
            raise WatchError(sub.error)
        finally:
            hub.unsubscribe(sub)
