"""The watcher tests' harness: a consumer that re-reads each path it is given, as the real
index does (FakeIndex), a watcher over it and a scripted change source (make), and the
helpers that write notes, list what the index should hold and wait under trio."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import ScriptedChangeSource

ROOTS = ("memory", "digest")


class FakeIndex:
    """A consumer that re-reads each path it is given, as the real index does."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.docs: dict[str, tuple[int, int, str]] = {}
        self.batches: list[set[str]] = []
        self.fail_next = 0
        #: What the failures of ``fail_next`` raise (a full disk unless set).
        self.failure: Exception = OSError(28, "No space left on device")

    def known(self) -> dict[str, tuple[int, int]]:
        return {p: (m, s) for p, (m, s, _) in self.docs.items()}

    async def apply(self, paths: set[str]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise self.failure
        self.batches.append(set(paths))
        for rel in paths:
            path = self.workspace / rel
            try:
                st = path.stat()
                text = path.read_text(encoding="utf-8")
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                self.docs.pop(rel, None)  # no note, as the real index has it
                continue
            self.docs[rel] = (st.st_mtime_ns, st.st_size, text)

    def texts(self) -> dict[str, str]:
        return {p: t for p, (_, _, t) in self.docs.items()}

    def applied_paths(self) -> set[str]:
        return set().union(*self.batches) if self.batches else set()


def disk_notes(workspace: Path) -> dict[str, str]:
    """What the index should hold: visible *.md files under the roots."""
    out = {}
    for root in ROOTS:
        for path in (workspace / root).rglob("*.md"):
            rel = path.relative_to(workspace).as_posix()
            parts = rel.split("/")
            if path.is_file() and not any(p.startswith(".") or p == "mem_metadata" for p in parts):
                out[rel] = path.read_text(encoding="utf-8")
    return out


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


async def eventually(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not pred():
            await trio.sleep(max(0.01, timeout_s / 1000))


async def inline(fn: Callable[..., Any], *args: Any, limiter: object = None) -> Any:
    # The autojump clock jumps while a real thread runs; scripted tests stay in one thread.
    await trio.lowlevel.checkpoint()
    return fn(*args)


def make(
    tmp_path: Path, source: object | None = None,
    background: trio.CapacityLimiter | None = None, **cfg: object
) -> tuple[Watcher, FakeIndex, ScriptedChangeSource]:
    index = FakeIndex(tmp_path)
    src = source if source is not None else ScriptedChangeSource()
    config = WatcherConfig(**{"reconcile_interval_s": 300.0, **cfg})  # type: ignore[arg-type]
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=src, config=config, wall=trio.current_time,  # type: ignore[arg-type]
                      background=background, run_sync=inline)
    return watcher, index, src  # type: ignore[return-value]
