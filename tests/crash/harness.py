"""Parent side of the crash harness: drive killed workers, then check what survived."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import zstandard
from pyroaring import BitMap

from crash.child import LOG_NAME, MIRROR, arrays_for, bitmap_for, records_for
from recalld.daemon.store.applog import replay
from recalld.daemon.store.fsio import TEMP_RE
from recalld.daemon.store.manifest import GEN_FILE_RE, MANIFEST_RE, GenerationStore
from recalld.daemon.store.records import read_records

CHILD = Path(__file__).with_name("child.py")


@dataclass
class WorkerRun:
    """What one worker printed and how it ended."""

    pid: int
    lines: list[str] = field(default_factory=list)
    status: int = 0

    @property
    def committed(self) -> list[int]:
        return [int(line.split()[1]) for line in self.lines if line.startswith("committed ")]

    @property
    def errors(self) -> list[str]:
        return [line for line in self.lines if line.startswith("error ")]

    @property
    def killed(self) -> bool:
        return os.WIFSIGNALED(self.status) and os.WTERMSIG(self.status) == 9

    @property
    def ops(self) -> int | None:
        found = [int(line.split()[1]) for line in self.lines if line.startswith("ops ")]
        return found[0] if found else None


class Zygote:
    """A pre-imported child process that forks workers on request (see child.py)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "zygote"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._pending: list[str] = []
        line = self._line()
        assert line == "zygote ready", line

    def _line(self) -> str:
        assert self.proc.stdout is not None
        raw = self.proc.stdout.readline()
        if not raw:
            raise RuntimeError("crash zygote exited")
        return raw.decode().rstrip("\n")

    def _send(self, line: str) -> None:
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(line.encode() + b"\n")
        stdin.flush()

    def fork(self, *args: str) -> int:
        self._send(" ".join(args))
        while True:
            line = self._line()
            if line.startswith("pid "):
                return int(line.split()[1])
            self._pending.append(line)  # the worker may speak before the zygote answers

    def reap(self, pid: int) -> WorkerRun:
        self._send(f"reap {pid}")
        run = WorkerRun(pid, self._pending)
        self._pending = []
        while True:
            line = self._line()
            if line.startswith(f"reaped {pid} "):
                run.status = int(line.split()[2])
                return run
            run.lines.append(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self._send("quit")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@dataclass
class Checked:
    generation: int | None
    orphans_before_open: int


def check_state(
    state_dir: Path, mirror_root: Path, acked: int | None, *, reopen: bool = True
) -> Checked:
    """Everything a reopen after a crash must find; returns what it saw.

    ``acked`` is the newest generation a worker reported committed (durable). Without
    ``reopen`` the state is only read, so the next worker's own open has the cleanup and
    mirror repair to do (and can be killed while doing it).
    """
    store = GenerationStore(state_dir, mirror_root=mirror_root)
    gen = store.load()  # read-only: the state exactly as the crash left it
    if gen is None:
        assert acked is None, f"generation {acked} was acknowledged but nothing loads"
        return Checked(None, 0)
    assert gen.ok, gen.corrupt
    assert gen.skipped == [], gen.skipped
    assert acked is None or gen.number >= acked, (gen.number, acked)
    n = gen.number

    assert gen.read_records("chunks") == records_for(n)
    arrays, meta = gen.read_arrays("bm25")
    made = meta["gen"]
    assert made <= n
    expected_arrays = arrays_for(made)
    assert arrays.keys() == expected_arrays.keys()
    for name, array in expected_arrays.items():
        np.testing.assert_array_equal(arrays[name], array)
        assert arrays[name].dtype == array.dtype
    blob, meta = gen.read_blob("live")
    assert meta == {"gen": n}
    assert BitMap.deserialize(blob) == bitmap_for(n)

    log_records, report = replay(state_dir / LOG_NAME, repair=False)
    assert report.bad_lines == []
    logged = [r["gen"] for r in log_records]
    assert logged == sorted(set(logged)), logged
    assert not logged or logged[-1] <= n  # a log record follows its commit
    assert acked is None or acked in logged

    names = set(os.listdir(state_dir))
    orphans = {x for x in names if GEN_FILE_RE.match(x)} - _referenced(store, names)
    if not reopen:
        return Checked(n, len(orphans))

    reopened = GenerationStore(state_dir, mirror_root=mirror_root).open()
    assert reopened is not None and reopened.number == n and reopened.ok
    assert reopened.mirror_errors == {}
    names = set(os.listdir(state_dir))
    assert not [x for x in names if TEMP_RE.match(x)], names
    manifests = [x for x in names if MANIFEST_RE.match(x)]
    assert 1 <= len(manifests) <= store.keep, manifests
    assert {x for x in names if GEN_FILE_RE.match(x)} == _referenced(store, names)

    mirror = mirror_root / MIRROR
    assert not [x for x in os.listdir(mirror.parent) if TEMP_RE.match(x)]
    entry = reopened.files["chunks"]
    assert read_records(mirror, entry) == records_for(n)
    # What a plain reader (QwenPaw/ReMe: one zstd frame of JSONL) sees.
    with mirror.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        plain = reader.read()
    assert plain.count(b"\n") == len(records_for(n))
    return Checked(n, len(orphans))


def _referenced(store: GenerationStore, names: set[str]) -> set[str]:
    """Data file names that some manifest among ``names`` lists."""
    referenced: set[str] = set()
    for name in names:
        match = MANIFEST_RE.match(name)
        if match:
            other = store.read_manifest(int(match.group(1)))
            referenced |= {e.name for e in other.files.values()}
    return referenced
