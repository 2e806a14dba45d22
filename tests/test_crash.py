"""Crash harness (RELIABILITY 1, 2): SIGKILL committing processes, then reopen and check.

A pre-imported zygote forks each worker, so a kill costs a fork rather than a Python start.
``RECALLD_CRASH_KILLS`` sets the number of random kills (default 200).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash.harness import CHILD, Zygote, check_state

KILLS = int(os.environ.get("RECALLD_CRASH_KILLS", "200"))
MAX_DELAY_S = 0.12  # a few commits' worth: kills land in open, data writes, manifest, mirror
MIN_DELAY_S = 0.02  # the narrowest kill window the loop below adapts down to


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    try:
        yield z
    finally:
        z.close()


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "mem_metadata"
    return root / "recalld", root


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_random_sigkill_during_commit_loop(tmp_path: Path, zygote: Zygote) -> None:
    state, root = dirs(tmp_path)
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    acked: int | None = None
    progress = 0
    orphaned = 0
    # The kill window follows the machine's speed: it widens while kills keep landing
    # before the first commit and narrows while they land after one, settling where about
    # two kills in three follow a commit. Kills stay spread over opening and whole commits
    # on a slow machine, and a fast one does not sleep through many commits per kill.
    max_delay_s = MAX_DELAY_S
    for i in range(KILLS):
        pid = zygote.fork("loop", str(state), str(root))
        time.sleep(rng.uniform(0, max_delay_s))
        os.kill(pid, signal.SIGKILL)
        run = zygote.reap(pid)
        assert run.errors == [], (seed, i, run.errors)
        assert run.killed, (seed, i, run.lines, run.status)
        if run.committed:
            acked = max(run.committed)
            progress += 1
            max_delay_s = max(MIN_DELAY_S, max_delay_s * 0.95)
        else:
            max_delay_s = min(2.0, max_delay_s * 1.1)
        # Every other time the parent only reads, leaving the repair to the next worker.
        checked = check_state(state, root, acked, reopen=i % 2 == 0)
        assert acked is None or checked.generation is not None
        orphaned += checked.orphans_before_open > 0
    # The kills must not all have landed before the first commit finished, and some must
    # have hit between data files and manifest.
    assert progress >= KILLS // 10, (seed, progress)
    if KILLS >= 50:
        assert orphaned > 0, seed


@pytest.mark.slow
def test_sigkill_at_every_filesystem_call_of_a_commit(tmp_path: Path, zygote: Zygote) -> None:
    state, root = dirs(tmp_path)
    # Two clean commits first, so kills hit a commit that has a previous generation.
    acked = None
    for _ in range(2):
        run = zygote.reap(zygote.fork("killat", str(10**9), str(state), str(root)))
        assert run.errors == [] and run.committed, run.lines
        acked = run.committed[-1]
    served = check_state(state, root, acked).generation
    assert served == acked
    orphan_cases = 0
    k = 1
    while True:
        run = zygote.reap(zygote.fork("killat", str(k), str(state), str(root)))
        assert run.errors == [], (k, run.errors)
        if run.committed:
            acked = run.committed[-1]
        checked = check_state(state, root, acked)
        if not run.killed:
            assert run.ops is not None and run.ops < k, (k, run.lines)
            break
        assert served is not None and checked.generation is not None
        if checked.generation == served:  # killed before the manifest was durable
            orphan_cases += checked.orphans_before_open > 0
        else:  # killed after it: the new generation serves
            assert checked.generation == served + 1
        served = checked.generation
        k += 1
    assert k > 20, k  # the sweep covered a real commit, op by op
    # Some kills fell between data files and the manifest: previous generation served,
    # orphans present before reopen (and gone after it, checked in check_state).
    assert orphan_cases > 0


@pytest.mark.slow
def test_sigkill_fresh_processes(tmp_path: Path) -> None:
    state, root = dirs(tmp_path)
    acked: int | None = None
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), "loop", str(state), str(root)], stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert first.startswith("opened"), first
        time.sleep(random.uniform(0.01, MAX_DELAY_S))
        proc.send_signal(signal.SIGKILL)
        out = first + proc.stdout.read().decode()
        proc.wait()
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        assert "error" not in out, out
        committed = [int(x.split()[1]) for x in out.splitlines() if x.startswith("committed")]
        if committed:
            acked = committed[-1]
        check_state(state, root, acked)
