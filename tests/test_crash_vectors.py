"""Crash harness with vectors (RELIABILITY 1-5, 21): a daemon that embeds through a fake
OpenAI-compatible provider is SIGKILLed at chosen filesystem calls of its backfill and
commits (the embedding cache append and its compaction, the vector graph and window
files, the manifest, the cleanup, the parked-texts log and its rewrite), then at random
calls after a run's first commit, each time after new notes were written; after each
kill the generation left on disk is read as it is (the next killed daemon reopens it),
and a real daemon reopens the whole state at the end.

Checked: the generation that loads is complete and verified, every vector it holds is
the one its text embeds to (the fake embeds deterministically from the text; a chunk's
vector is the normalised mean of its windows'), no temp file or orphan outlives a
reopen, no text the embedding cache held durably (nor a parked one) is sent to the
provider again, and the backfill resumes to full coverage.

The killed daemons are forks of ``crash/vecdaemon.py``, a fork server whose filesystem
seam kills the process at the ``n``-th call of one kind on a matching file name.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import STOP_DEADLINE_S, DaemonFactory, DaemonHandle
from crash.vecdaemon import KillingForks
from fakes.provider_server import FakeProvider, Reply, fake_vector
from test_vectors_daemon import fake_config, vectors_status, write
from waits import wait_value, workspace_status

from recalld.daemon.index.embedcache import decode_f16, encode_f16, text_hash
from recalld.daemon.index.vectors import VectorIndex, WindowVectors, mean_unit, normalize
from recalld.daemon.index.windows import SLOTS, embed_units
from recalld.daemon.store.applog import AppendLog, replay
from recalld.daemon.store.fsio import TEMP_RE
from recalld.daemon.store.manifest import GEN_FILE_RE, MANIFEST_RE, GenerationStore
from recalld.ipc.errors import RecalldError

DIMS = 8
WINDOW_CHARS = 400  # the default vector_window_chars
REFUSED = "REFUSED-BY-THE-PROVIDER"
CACHE_KEEPS = 10

#: Where each killed daemon dies: the n-th call of an op on a file name glob, counted
#: after the first call of the optional op and glob that follow (see crash/vecdaemon.py).
KILLS = [
    "write openai-*.log 1",  # a torn append of the embedding cache
    "fsync openai-*.log 1 write openai-*.log",  # appended, not yet fsynced
    "replace vectors.g*.hnsw 1",  # a generation's vector graph published, no manifest
    "write .windows.g*.tmp-* 1",  # a torn window-vectors file
    "replace MANIFEST-* 1 replace windows.g*.arr",  # the commit point of new vectors
    "fsync_dir index 2 replace windows.g*.arr",  # that manifest renamed, not yet fsynced
    "unlink *.g0* 1 replace MANIFEST-*",  # the cleanup after a commit
    "write parked.log 1",  # a torn record of a refused text
    "fsync parked.log 1 write parked.log",
    "replace parked.log 1",  # the refused notes deleted: their texts unparked
    "replace openai-*.log 1",  # the embedding cache compacted
]
#: Then kills at a random mutating call among the first this many after the run's first
#: commit (its backfill, its vector commits); a run that gets through them all and
#: settles is killed there.
RANDOM_KILLS = 3
RANDOM_WITHIN = 120


def note(step: int) -> tuple[str, str]:
    """A note of several windows, its words unlike any other step's."""
    lines = [f"Step {step} line {j}: the ferry to island {step * 31 + j} left at {j}:{step:02d} "
             f"with {step + j} crates of lemons aboard." for j in range(14)]
    return f"memory/2026-03-{step + 1:02d}/ferry.md", f"# Ferry {step}\n\n" + "\n".join(lines)


def expected(text: str) -> np.ndarray[Any, Any]:
    """The vector of a chunk of ``text``: the normalised mean of its windows' vectors."""
    rows = normalize(np.stack([fake_vector(u, DIMS) for u in embed_units(text, WINDOW_CHARS)]))
    return mean_unit(rows)


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> bool:
    return bool(np.allclose(normalize(got)[0], want, atol=5e-3))


def check_generation(meta_dir: Path, scratch: Path) -> int:
    """What a crash left: the generation that loads is whole, and each vector in it is
    its text's. Read only (the next daemon's open does the cleanup). How many chunks
    have a vector."""
    store = GenerationStore(meta_dir / "index", mirror_root=meta_dir, publish_mirrors=False)
    gen = store.load()
    if gen is None:
        return 0
    assert gen.ok and gen.skipped == [], (gen.corrupt, gen.skipped)
    texts: dict[int, str] = {}
    with_vec: list[int] = []
    for rec in gen.read_records("chunks"):
        key = int(rec["metadata"]["key"])
        texts[key] = rec["text"]
        if "_embedding_f16_b64" in rec:
            assert close(decode_f16(rec["_embedding_f16_b64"]), expected(rec["text"])), rec
            with_vec.append(key)
    if "vectors" in gen.files:
        blob, meta = gen.read_blob("vectors")
        assert meta["count"] == len(with_vec), (meta, len(with_vec))
        graph = VectorIndex.from_bytes(blob, dim=DIMS, live=with_vec, tmp_dir=scratch)
        for key, vec in zip(with_vec, graph.vectors(with_vec), strict=True):
            assert close(vec, expected(texts[key])), key
    if "windows" in gen.files:
        arrays, meta = gen.read_arrays("windows")
        wins = WindowVectors.from_arrays(arrays, dim=DIMS, tmp_dir=scratch)
        for key in wins.keys():
            units = embed_units(texts[key], WINDOW_CHARS)
            assert wins.count(key) == len(units) > 1, (key, units)
            labels = list(range(key * SLOTS, key * SLOTS + len(units)))
            got = wins._index.vectors(labels)
            for row, unit_text in zip(got, units, strict=True):
                assert close(row, normalize(fake_vector(unit_text, DIMS))[0]), (key, unit_text)
    return len(with_vec)


def settled(d: DaemonHandle) -> int | None:
    """How many chunks ``d`` holds once its backfill has nothing left to do and every
    change it applied is committed; None before (or while it does not answer)."""
    try:
        ws = workspace_status(d, "w")
    except (OSError, EOFError, RecalldError):
        return None
    if ws is None:
        return None
    index, st = ws["index"], ws["index"]["vectors"]
    if st["pending"] is None or st["pending"] != st["parked"] or st["state"] not in (
            "idle", "waiting"):
        return None
    if index["pending_changes"] or index["preparing"] or index["uncommitted_changes"]:
        return None
    return int(st["total"])


def wait_killed(d: DaemonHandle, root: Path, step: int) -> int | None:
    """``d``'s exit status once it reached its kill point, None if it settled without.
    How many commits a start makes depends on how fast the backfill keeps up with the
    index (one commit, or one for the keyword side and one for the vectors), and a point
    such as the clean-up of a generation two commits back needs a second one: a daemon
    that settles first gets another note, which makes another commit. A nudge counts
    once the daemon holds its chunk and has committed it (one seen idle before it read
    the new note would get the next nudge at once, and its commit would take them all)."""
    held = -1
    for nudge in range(4):
        dead, chunks = wait_value(
            lambda: (d.proc.poll() is not None, settled(d)),
            lambda got, held=held: got[0] or (got[1] is not None and got[1] > held),
            "the daemon to die, or to settle holding the last nudge")
        if dead:
            return d.proc.wait()
        if nudge == 3:
            return None
        assert chunks is not None
        held = chunks
        write(root, f"memory/2026-05-{step + 1:02d}/nudge{nudge}.md",
              f"# Nudge {step} {nudge}\n\nA pelican counted {step * 7 + nudge} herring.\n")
    return None


def grow_cache(log: Path) -> None:
    """Add old vectors of texts gone by to the cache ``log``, past the size its daemon
    compacts at (the next idle backfill rewrites it)."""
    rows = np.random.default_rng(7).standard_normal((2 * 1000, DIMS)).astype("<f2")
    with AppendLog(log) as cache:
        cache.append({"h": text_hash(f"gone {i}"), "v": encode_f16(row)}
                     for i, row in enumerate(rows))


def durable_hashes(log: Path) -> set[str]:
    """The text hashes a log (the embedding cache, the parked texts) holds as it is."""
    records, _ = replay(log, repair=False)
    return {str(r["h"]) for r in records}


def temp_and_orphans(meta_dir: Path, cache_dir: Path) -> list[str]:
    index = meta_dir / "index"
    names = set(os.listdir(index))
    referenced: set[str] = set()
    store = GenerationStore(index, mirror_root=meta_dir, publish_mirrors=False)
    for name in names:
        if (m := MANIFEST_RE.match(name)):
            referenced |= {e.name for e in store.read_manifest(int(m.group(1))).files.values()}
    orphans = {x for x in names if GEN_FILE_RE.match(x)} - referenced
    temps = [p.name for d in (index, meta_dir / "vectors", cache_dir) if d.is_dir()
             for p in d.iterdir() if TEMP_RE.match(p.name)]
    return sorted(orphans) + temps


@pytest.fixture
def killing_factory(tmp_path: Path, pycache: Path) -> Iterator[DaemonFactory]:
    forks = KillingForks()
    factory = DaemonFactory(tmp_path / "killed", pycache, forks)  # type: ignore[arg-type]
    try:
        yield factory
    finally:
        factory.cleanup()
        forks.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_during_backfill_and_vector_commits(
        daemon_factory: DaemonFactory, killing_factory: DaemonFactory, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    meta_dir = root / "mem_metadata"
    data_home = tmp_path / "data"
    cache_dir = data_home / "recalld" / "state" / "embeddings"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    write(root, "digest/personal/food.md", "# Food\n\nRamen and dumplings.\n")
    # Each kill point once: a durable cache (or parked) entry and the requests made after.
    durable: list[tuple[int, set[str]]] = []
    with FakeProvider(dims=DIMS, api_key="k") as fake:
        fake.reply_for = lambda body: (Reply(status=400) if any(
            REFUSED in t for t in body.get("input", [])) else None)
        # A cache of a few entries beyond the live ones: compacted at 2,000 lines.
        config = fake_config(root, fake).replace("dimensions = 8", "dimensions = 8, "
                                                 f"max_cache_size = {CACHE_KEEPS}")
        served: list[int] = []
        seed = int.from_bytes(os.urandom(4), "big")
        rng = random.Random(seed)
        kills = KILLS + [f"* * {rng.randint(1, RANDOM_WITHIN)} replace MANIFEST-*"
                         for _ in range(RANDOM_KILLS)]
        for step, kill in enumerate(kills):
            write(root, *note(step))
            if kill.startswith(("write parked", "fsync parked")):
                write(root, f"memory/2026-04-{step:02d}/refused.md",
                      f"# Refused {step}\n\n{REFUSED} {step}\n")
            elif kill.startswith("replace parked"):
                for path in (root / "memory").glob("2026-04-*/refused.md"):
                    path.unlink()
            elif kill.startswith("replace openai"):
                grow_cache(next(cache_dir.glob("*.log")))
            d = killing_factory(config, wait=False, XDG_DATA_HOME=str(data_home),
                                CRASH_AT=kill)
            if kill in KILLS:
                status = wait_killed(d, root, step)
                if status is None:
                    d.kill()
                    pytest.fail(f"kill point {kill!r} never reached (step {step}, seed "
                                f"{seed}); the daemon's log ends:\n{d.log()[-3000:]}")
            else:
                wait_value(lambda d=d: d.proc.poll() is not None or settled(d) is not None,
                           lambda done: done, "the daemon to die or to settle")
                d.kill()
                status = d.proc.wait()
            assert status == -9, (seed, kill, status, d.log())
            served.append(check_generation(meta_dir, scratch))
            held = set().union(*(durable_hashes(p) for p in cache_dir.glob("*.log")))
            if (meta_dir / "vectors/parked.log").exists():
                held |= durable_hashes(meta_dir / "vectors/parked.log")
            durable.append((len(fake.requests), held))

        d = daemon_factory(config, XDG_DATA_HOME=str(data_home))
        st = wait_value(lambda: vectors_status(d), lambda st: st["coverage"] == 1.0,
                        "the backfill to finish")
        assert st["embedded"] == st["total"] - st["parked"], st
        # The harness reached a state that serves vectors, and kills after it.
        assert max(served) > 0 and served[-1] > 0, served
        # Read once it stopped: while it serves, a commit under way has written files no
        # manifest names yet (under load, caught between them).
        assert d.stop(STOP_DEADLINE_S) == 0
        assert temp_and_orphans(meta_dir, cache_dir) == []
        assert check_generation(meta_dir, scratch) == st["embedded"]
        for mark, held in durable:
            again = [t for r in fake.requests[mark:] for t in r.json.get("input", [])
                     if text_hash(t) in held]
            assert again == [], again
