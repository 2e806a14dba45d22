"""Idle cost of the change sources: wake-ups and CPU time of a process watching idle trees.

Three child processes run side by side over the same idle period, each a trio program:

- ``none``: trio asleep with no change source (the baseline: what the runtime costs);
- ``inotify``: one :class:`~recalld.daemon.inotify.InotifySource` per root (the inotify
  descriptor awaited by trio's I/O loop);
- ``watchfiles``: one :class:`~recalld.daemon.watchsource.WatchfilesSource` per root
  (``watchfiles.watch`` in a worker thread, its defaults).

Each root is a workspace-shaped tree (``memory/<day>/`` directories with a note each).
Once every source reports started and a settling second has passed, the benchmark reads
each child's context switches (voluntary and involuntary, summed over all its threads,
from ``/proc/<pid>/task/*/status``) and CPU time (``/proc/<pid>/stat``), waits
``--seconds`` with nothing changing on disk, and reads them again. Voluntary switches are
the wake-ups: a thread that sleeps and is woken again counts one each time. Figures are
per minute. Linux only.

    .venv/bin/python tests/bench/run.py idle [--seconds 60] [--roots 4] [--dirs 30]
    .venv/bin/python tests/bench/bench_idle.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("none", "inotify", "watchfiles")


async def _child(kind: str, roots: list[str]) -> None:
    import trio

    from recalld.daemon.inotify import InotifySource
    from recalld.daemon.watchsource import WatchfilesSource

    def drop(batch: object) -> None:
        print(f"change {batch!r}", file=sys.stderr, flush=True)

    async with trio.open_nursery() as nursery:
        for root in roots:
            if kind == "inotify":
                await nursery.start(InotifySource().run, [Path(root)], drop)
            elif kind == "watchfiles":
                await nursery.start(WatchfilesSource().run, [Path(root)], drop)
        print("ready", flush=True)
        await trio.sleep_forever()


def _counters(pid: int) -> dict[str, Any]:
    """Per-thread context switches (keyed by thread id) and the process's CPU seconds."""
    switches: dict[int, tuple[int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:
            continue  # a thread that ended between listing and reading
        voluntary = involuntary = 0
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary = int(line.split()[1])
        switches[int(task.name)] = (voluntary, involuntary)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu_s = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return {"switches": switches, "cpu_s": cpu_s}


def _delta(before: dict[str, Any], after: dict[str, Any], per_min: float) -> dict[str, Any]:
    """Switches made during the period by the threads alive at its end (a thread that
    exited meanwhile takes its counts with it; one born meanwhile counts in full)."""
    voluntary = involuntary = 0
    for tid, (v, i) in after["switches"].items():
        v0, i0 = before["switches"].get(tid, (0, 0))
        voluntary += v - v0
        involuntary += i - i0
    return {
        "wakeups_per_min": round(voluntary * per_min, 1),
        "involuntary_per_min": round(involuntary * per_min, 1),
        "cpu_ms_per_min": round((after["cpu_s"] - before["cpu_s"]) * 1000 * per_min, 1),
        "threads": len(after["switches"]),
    }


def _make_tree(root: Path, dirs: int) -> None:
    for i in range(dirs):
        day = root / "memory" / f"2026-07-{i % 28 + 1:02d}-{i}"
        day.mkdir(parents=True, exist_ok=True)
        (day / "note.md").write_text(f"# Note {i}\n\nidle\n", encoding="utf-8")


def run(seconds: float, n_roots: int, dirs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="recalld-idle-") as tmp:
        roots = [Path(tmp) / f"ws{i}" for i in range(n_roots)]
        for root in roots:
            _make_tree(root, dirs)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for kind in KINDS:
                procs[kind] = subprocess.Popen(
                    [sys.executable, __file__, "--child", kind, *map(str, roots)],
                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
            for kind, proc in procs.items():
                assert proc.stdout is not None
                line = proc.stdout.readline().decode().strip()
                if line != "ready":
                    raise RuntimeError(f"{kind} child did not start: {line!r}")
            time.sleep(1.0)  # let start-up work (imports, first scans) finish
            before = {kind: _counters(p.pid) for kind, p in procs.items()}
            t0 = time.monotonic()
            print(f"idle for {seconds:g} s ...", file=sys.stderr, flush=True)
            time.sleep(seconds)
            elapsed = time.monotonic() - t0
            after = {kind: _counters(p.pid) for kind, p in procs.items()}
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
    per_min = 60.0 / elapsed
    results = {kind: _delta(before[kind], after[kind], per_min) for kind in KINDS}
    base = results["none"]["wakeups_per_min"]
    return {
        "benchmark": "idle",
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "seconds": round(elapsed, 2),
        "roots": n_roots,
        "dirs_per_root": dirs,
        "results": results,
        "wakeups_above_baseline_per_min": {
            kind: round(results[kind]["wakeups_per_min"] - base, 1) for kind in KINDS[1:]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="idle period measured")
    parser.add_argument("--roots", type=int, default=4, help="watched trees (one source each)")
    parser.add_argument("--dirs", type=int, default=30, help="day directories per tree")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        import trio

        trio.run(_child, ns.child[0], ns.child[1:])
        return 0
    if not sys.platform.startswith("linux"):
        print("bench_idle needs Linux (/proc and inotify)", file=sys.stderr)
        return 2
    doc = run(ns.seconds, ns.roots, ns.dirs)
    text = json.dumps(doc, indent=2)
    if ns.out:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
