"""Peak memory of a process tree, sampled from ``/proc`` (Linux).

RSS counts a shared page in every process that maps it, so summing the RSS of a daemon
and its worker processes counts the shared libraries several times; PSS divides each
shared page among its users, so a tree's summed PSS is what it really costs. Used by the
index bench for recalld (daemon + indexing workers) and for ReMe's driver alike.
"""

from __future__ import annotations

import os
import threading
from typing import Any


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", encoding="ascii") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def rollup_mb(pid: int) -> tuple[float, float] | None:
    """(RSS, PSS) of one process in MB from ``/proc/<pid>/smaps_rollup``; None if gone."""
    rss = pss = None
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) / 1024
    except OSError:
        return None
    return None if rss is None or pss is None else (rss, pss)


class TreeMemory:
    """Peak memory of a process and all its descendants (worker processes included),
    sampled every ``interval_s`` in a thread: the peaks of the tree's summed PSS (each
    shared page divided among its users, so nothing counts twice), of its summed RSS,
    and of the root process's own RSS and PSS. ``VmHWM`` (exact, but the root alone)
    is read by ``bench_index.Daemon.peak_rss_mb``."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak: dict[str, float] = {"tree_pss_mb": 0.0, "tree_rss_mb": 0.0,
                                       "root_pss_mb": 0.0, "root_rss_mb": 0.0}
        self.samples = 0
        self.max_children = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sample(self) -> None:
        kids = _children(self.pid)
        root = rollup_mb(self.pid)
        if root is None:
            return
        tree_rss, tree_pss = root
        for k in kids:
            got = rollup_mb(k)
            if got is not None:
                tree_rss += got[0]
                tree_pss += got[1]
        now = {"tree_pss_mb": tree_pss, "tree_rss_mb": tree_rss,
               "root_rss_mb": root[0], "root_pss_mb": root[1]}
        for k, v in now.items():
            self.peak[k] = max(self.peak[k], v)
        self.samples += 1
        self.max_children = max(self.max_children, len(kids))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> dict[str, Any]:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        return self.result()

    def result(self) -> dict[str, Any]:
        return {**{k: round(v, 1) for k, v in self.peak.items()}, "samples": self.samples,
                "max_children": self.max_children, "interval_s": self.interval_s}
