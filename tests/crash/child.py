"""The process the crash harness kills: it commits generations of derived state in a loop.

Run as ``python child.py zygote``: a long-lived process that imports everything once and
then, per command on stdin, forks a worker (so a kill costs a fork, not a Python start):

    loop <state_dir> <mirror_root>          commit generations until killed
    killat <k> <state_dir> <mirror_root>    commit once, SIGKILL itself before the k-th
                                            mutating filesystem call of that commit
    reap <pid>                              wait for a worker, answer "reaped <pid> <status>"

or as ``python child.py loop <state_dir> <mirror_root>`` to be the worker itself.

Workers write one line per event to stdout: ``opened <gen|none>``, ``committed <gen>``
(printed only after the commit and its log record are durable), ``ops <n>`` (killat mode,
when the commit finished before op k), ``error <text>``.

Each generation's content is a pure function of its number (``records_for``,
``arrays_for``, ``bitmap_for``), so the parent can check what it loads byte for byte.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import numpy.random  # numpy imports it lazily: a worker would pay that in its kill window
from pyroaring import BitMap

from recalld.daemon.store.applog import AppendLog
from recalld.daemon.store.arrays import write_arrays, write_blob
from recalld.daemon.store.fsio import FS, NOTE_DIR_MODE, PRIVATE_MODE, REAL
from recalld.daemon.store.manifest import GenerationStore
from recalld.daemon.store.records import write_records

MIRROR = "file_store/file_chunks_default_v1.jsonl.zst"
LOG_NAME = "pending.log"


def records_for(n: int) -> list[dict[str, Any]]:
    rng = random.Random(n)
    return [
        {
            "id": f"g{n}-{i}",
            "path": f"memory/2026-01-{1 + i % 28:02d}/note.md",
            "start_line": i + 1,
            "end_line": i + 1 + rng.randint(0, 9),
            "text": " ".join(rng.choice(("alpha", "beta", "记忆", "ECONNREFUSED")) for _ in
                             range(rng.randint(1, 40))),
            "metadata": {"gen": n},
        }
        for i in range(rng.randint(0, 40))
    ]


def arrays_for(n: int) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(n)
    size = int(rng.integers(0, 800))
    return {
        "postings": rng.integers(0, 1 << 20, size=size, dtype=np.int64),
        "weights": rng.random(size, dtype=np.float32),
        "doc_len": rng.integers(0, 500, size=(size // 4, 2), dtype=np.uint16),
    }


def bitmap_for(n: int) -> BitMap:
    rng = random.Random(-n)
    return BitMap(rng.sample(range(100_000), rng.randint(0, 300)))


def commit_one(store: GenerationStore, log: AppendLog) -> int:
    """Commit the next generation; bm25 is carried over from the current one every third."""
    n = store.next_number
    current = store.current
    with store.transaction() as txn:
        chunks = write_records(store.fs, txn.path("chunks", ".jsonl.zst"), records_for(n))
        txn.add("chunks", chunks, mirror=MIRROR)
        if current is not None and "bm25" in current.files and n % 3 == 0:
            txn.carry("bm25")
        else:
            entry = write_arrays(store.fs, txn.path("bm25", ".arr"), arrays_for(n), {"gen": n},
                                 compress=n % 2 == 0)
            txn.add("bm25", entry)
        live = write_blob(store.fs, txn.path("live", ".roar"), bitmap_for(n).serialize(),
                          {"gen": n})
        txn.add("live", live)
    log.append([{"gen": n}])
    return n


class KillingFS(FS):
    """The real filesystem, but SIGKILL this process before the ``kill_at``-th call."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.calls = 0
        self.armed = False

    def _tick(self) -> None:
        if self.armed:
            self.calls += 1
            if self.calls == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    def open_write(self, path: Path, mode: int = PRIVATE_MODE) -> int:
        self._tick()
        return super().open_write(path, mode)

    def open_append(self, path: Path) -> int:
        self._tick()
        return super().open_append(path)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        self._tick()
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._tick()
        super().fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        self._tick()
        super().truncate(fd, size)

    def close(self, fd: int) -> None:
        self._tick()
        super().close(fd)

    def replace(self, src: Path, dst: Path) -> None:
        self._tick()
        super().replace(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        self._tick()
        super().link(src, dst)

    def fsync_dir(self, path: Path) -> None:
        self._tick()
        super().fsync_dir(path)

    def unlink(self, path: Path) -> None:
        self._tick()
        super().unlink(path)

    def mkdir(self, path: Path, mode: int = NOTE_DIR_MODE) -> None:
        self._tick()
        super().mkdir(path, mode)


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write per line: lines never interleave


def open_store(state_dir: Path, mirror_root: Path, fs: FS) -> tuple[GenerationStore, AppendLog]:
    store = GenerationStore(state_dir, fs, mirror_root=mirror_root)
    gen = store.open()
    log = AppendLog(state_dir / LOG_NAME, fs)
    log.open()
    say(f"opened {'none' if gen is None else gen.number}")
    return store, log


def run_loop(state_dir: Path, mirror_root: Path) -> None:
    store, log = open_store(state_dir, mirror_root, REAL)
    while True:
        say(f"committed {commit_one(store, log)}")


def run_killat(kill_at: int, state_dir: Path, mirror_root: Path) -> None:
    fs = KillingFS(kill_at)
    store, log = open_store(state_dir, mirror_root, fs)
    fs.armed = True
    n = commit_one(store, log)
    fs.armed = False
    say(f"committed {n}")
    say(f"ops {fs.calls}")


def worker(args: list[str]) -> None:
    """Run one worker command; never returns (exits the process)."""
    code = 0
    try:
        if args[0] == "loop":
            run_loop(Path(args[1]), Path(args[2]))
        elif args[0] == "killat":
            run_killat(int(args[1]), Path(args[2]), Path(args[3]))
        else:
            raise ValueError(f"unknown command {args!r}")
    except BaseException:
        say("error " + traceback.format_exc().replace("\n", " | "))
        code = 1
    os._exit(code)


def zygote() -> None:
    say("zygote ready")
    while raw := sys.stdin.readline():
        args = raw.split()
        if not args:
            continue
        if args[0] == "reap":
            pid = int(args[1])
            _, status = os.waitpid(pid, 0)
            say(f"reaped {pid} {status}")
        elif args[0] == "quit":
            return
        else:
            pid = os.fork()
            if pid == 0:
                worker(args)
            say(f"pid {pid}")


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote()
    else:
        worker(sys.argv[1:])
