"""Generations and the manifest commit point (RELIABILITY 1, 2, 3, 7)."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from crash.damage import damaged, extend, flip, restore, temp_files, truncate

from recalld.daemon.store.arrays import write_arrays, write_blob
from recalld.daemon.store.errors import CorruptState, DiskFull, StorageError
from recalld.daemon.store.failingfs import FailingFS
from recalld.daemon.store.fsio import REAL, FileEntry, checksum, temp_name
from recalld.daemon.store.generation import manifest_name
from recalld.daemon.store.manifest import GenerationStore
from recalld.daemon.store.records import read_records, write_records

MIRROR = "file_store/file_chunks_default_v1.jsonl.zst"


def chunks(n: int) -> list[dict[str, Any]]:
    return [{"id": f"{n}-{i}", "path": "memory/a.md", "start_line": i, "end_line": i,
             "text": f"generation {n} chunk {i}", "metadata": {}} for i in range(1, 4)]


def postings(n: int) -> np.ndarray[Any, Any]:
    return np.arange(10, dtype=np.int32) + n


def make_store(tmp_path: Path, fs: Any = REAL, keep: int = 2) -> GenerationStore:
    root = tmp_path / "mem_metadata"
    return GenerationStore(root / "recalld", fs, mirror_root=root, keep=keep)


def commit(store: GenerationStore, *, carry_chunks: bool = False) -> int:
    n = store.next_number
    with store.transaction() as txn:
        if carry_chunks:
            txn.carry("chunks")
        else:
            entry = write_records(store.fs, txn.path("chunks", ".jsonl.zst"), chunks(n))
            txn.add("chunks", entry, mirror=MIRROR)
        txn.add("bm25", write_arrays(store.fs, txn.path("bm25", ".arr"), {"p": postings(n)},
                                     {"gen": n}))
    assert txn.generation is not None and txn.generation.number == n
    return n


def state_names(store: GenerationStore) -> list[str]:
    return sorted(os.listdir(store.state_dir))


def test_fresh_directory_has_no_generation(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    assert store.load() is None
    assert store.cleanup() == []  # nothing to clean, no directory yet
    assert store.open() is None
    assert store.state_dir.is_dir()
    assert store.next_number == 1


def test_commit_then_reopen(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    assert commit(store) == 1
    assert commit(store) == 2
    gen = make_store(tmp_path).open()
    assert gen is not None and gen.number == 2 and gen.ok
    assert gen.read_records("chunks") == chunks(2)
    arrays, meta = gen.read_arrays("bm25")
    np.testing.assert_array_equal(arrays["p"], postings(2))
    assert meta == {"gen": 2}
    assert list(gen.iter_records("chunks")) == chunks(2)


def test_manifest_is_json_with_sizes_checksums_and_counts(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    commit(store)
    doc = orjson.loads((store.state_dir / manifest_name(1)).read_bytes())
    body = doc["manifest"]
    assert body["generation"] == 1 and body["version"] == 1
    entry = body["files"]["chunks"]
    data = (store.state_dir / entry["name"]).read_bytes()
    assert entry["size"] == len(data) and entry["checksum"] == checksum(data)
    assert entry["records"] == 3 and entry["mirror"] == MIRROR
    assert len(doc["blake2b"]) == 64


def test_keep_two_generations_and_remove_orphans(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    for _ in range(4):
        commit(store)
    assert state_names(store) == [
        "MANIFEST-000003.json", "MANIFEST-000004.json",
        "bm25.g000003.arr", "bm25.g000004.arr",
        "chunks.g000003.jsonl.zst", "chunks.g000004.jsonl.zst",
    ]
    commit(store, carry_chunks=True)  # generation 5 lists chunks.g000004 again
    assert "chunks.g000004.jsonl.zst" in state_names(store)
    assert "chunks.g000003.jsonl.zst" not in state_names(store)
    gen = make_store(tmp_path).open()
    assert gen is not None and gen.files["chunks"].name == "chunks.g000004.jsonl.zst"
    assert gen.read_records("chunks") == chunks(4)


def test_open_removes_leftovers_but_nothing_foreign(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    commit(store)
    leftovers = ["bm25.g000002.arr", temp_name("MANIFEST-000002.json"), "chunks.g000009.jsonl.zst"]
    foreign = ["notes.txt", "bm25_default_v1.pkl", "MANIFEST-x.json"]
    for name in leftovers + foreign:
        (store.state_dir / name).write_bytes(b"x")
    mirror_dir = store.mirror_root / "file_store"
    (mirror_dir / temp_name("file_chunks_default_v1.jsonl.zst")).write_bytes(b"x")
    gen = make_store(tmp_path).open()
    assert gen is not None and gen.number == 1
    names = state_names(store)
    assert not set(leftovers) & set(names)
    assert set(foreign) <= set(names)
    assert temp_files(mirror_dir) == []


# -- mirrors (fixed QwenPaw names) -------------------------------------------------------


def test_mirror_is_a_link_to_the_generation_file(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    commit(store)
    gen = store.current
    assert gen is not None
    mirror = gen.mirror_path("chunks")
    assert mirror == tmp_path / "mem_metadata" / MIRROR
    assert os.stat(mirror).st_ino == os.stat(gen.path("chunks")).st_ino
    assert read_records(mirror, gen.files["chunks"]) == chunks(1)
    commit(store, carry_chunks=True)
    commit(store)
    assert read_records(mirror) == chunks(3)


@pytest.mark.parametrize("damage", ["missing", "stale", "garbage"])
def test_open_repairs_a_stale_mirror(tmp_path: Path, damage: str) -> None:
    store = make_store(tmp_path)
    store.open()
    commit(store)
    commit(store)
    mirror = store.mirror_root / MIRROR
    old = (store.state_dir / "chunks.g000001.jsonl.zst").read_bytes()
    mirror.unlink()
    if damage == "stale":  # a crash between the manifest and the mirror publish
        mirror.write_bytes(old)
    elif damage == "garbage":
        mirror.write_bytes(b"not zstd")
    gen = make_store(tmp_path).open()
    assert gen is not None and gen.ok
    assert gen.mirrors_repaired == ["chunks"]
    assert read_records(mirror, gen.files["chunks"]) == chunks(2)
    assert make_store(tmp_path).open().mirrors_repaired == []  # type: ignore[union-attr]


def test_mirror_falls_back_to_a_copy(tmp_path: Path) -> None:
    store = make_store(tmp_path, FailingFS(1, persistent=True, ops=["link"], err=errno.EXDEV))
    store.open()
    commit(store)
    gen = store.current
    assert gen is not None and gen.mirror_errors == {}
    mirror = gen.mirror_path("chunks")
    assert mirror is not None
    assert os.stat(mirror).st_ino != os.stat(gen.path("chunks")).st_ino
    assert read_records(mirror, gen.files["chunks"]) == chunks(1)
    assert make_store(tmp_path).open().mirrors_repaired == []  # type: ignore[union-attr]


def test_mirror_failure_does_not_fail_the_commit(tmp_path: Path) -> None:
    fs = FailingFS(1, persistent=True, ops=["link"], err=errno.EIO)
    store = make_store(tmp_path, fs)
    store.open()
    commit(store)
    gen = store.current
    assert gen is not None and "chunks" in gen.mirror_errors
    repaired = make_store(tmp_path).open()
    assert repaired is not None and repaired.mirrors_repaired == ["chunks"]


# -- corruption ---------------------------------------------------------------------------


def two_generations(tmp_path: Path) -> GenerationStore:
    store = make_store(tmp_path)
    store.open()
    commit(store)
    commit(store)
    return store


def test_every_damage_to_the_newest_manifest_falls_back(tmp_path: Path) -> None:
    store = two_generations(tmp_path)
    path = store.state_dir / manifest_name(2)
    with damaged(path) as original:
        cases = [("truncate", n) for n in range(len(original))]
        cases += [("flip", n) for n in range(len(original))]
        cases += [("extend", 0)]
        for kind, n in cases:
            if kind == "truncate":
                truncate(path, n)
            elif kind == "flip":
                flip(path, n)
            else:
                extend(path, b" ")
            with pytest.raises(CorruptState):
                store.read_manifest(2)
            gen = make_store(tmp_path).load()
            assert gen is not None and gen.number == 1 and gen.ok, (kind, n)
            assert gen.skipped[0][0] == manifest_name(2)
            restore(path, original)


def test_manifest_with_valid_checksum_but_wrong_content_is_refused(tmp_path: Path) -> None:
    store = two_generations(tmp_path)
    path = store.state_dir / manifest_name(2)
    doc = orjson.loads(path.read_bytes())["manifest"]

    def rewrite(body: dict[str, Any]) -> None:
        raw = orjson.dumps(body)
        path.write_bytes(b'{"manifest":' + raw + b',"blake2b":"' + checksum(raw).encode()
                         + b'"}\n')

    for change, reason in [
        ({"version": 2}, "version"),
        ({"generation": 7}, "generation"),
        ({"format": "other"}, "not a recalld manifest"),
        ({"files": {"x": {"name": "../escape", "size": 1, "checksum": "0"}}}, "plain name"),
        ({"files": {"x": {"name": "a", "size": "1", "checksum": "0"}}}, "malformed"),
        ({"files": {"x": {"name": "a", "size": 1, "checksum": "0", "mirror": "/etc/x"}}},
         "relative"),
    ]:
        rewrite({**doc, **change})
        with pytest.raises(CorruptState, match=reason):
            store.read_manifest(2)
        gen = make_store(tmp_path).load()
        assert gen is not None and gen.number == 1


@pytest.mark.parametrize("how", ["flip", "truncate", "extend", "delete"])
def test_damaged_data_file_falls_back_to_older_complete_generation(
    tmp_path: Path, how: str
) -> None:
    store = two_generations(tmp_path)
    path = store.state_dir / "bm25.g000002.arr"
    if how == "flip":
        flip(path, path.stat().st_size // 2)
    elif how == "truncate":
        truncate(path, 10)
    elif how == "extend":
        extend(path)
    else:
        path.unlink()
    gen = make_store(tmp_path).load()
    assert gen is not None and gen.number == 1 and gen.ok
    assert gen.skipped == [(manifest_name(2), "corrupt files: bm25")]


@pytest.mark.parametrize("how", ["flip", "delete"])
def test_a_generation_found_damaged_is_no_fallback_kept_after_the_next_commit(
        tmp_path: Path, how: str) -> None:
    # Generation 2 is damaged and 1 serves: the next commit keeps 1 as its fallback, not
    # 2, so damage to the new generation falls back to sound files, not to a rebuild.
    path = two_generations(tmp_path).state_dir / "chunks.g000002.jsonl.zst"
    if how == "flip":
        flip(path, path.stat().st_size // 2)
    else:
        path.unlink()
    store = make_store(tmp_path)
    assert store.open() is not None and store.current is not None
    assert store.current.number == 1
    assert commit(store) == 3
    assert store.manifest_numbers() == [3, 1]
    assert not any(".g000002." in name for name in state_names(store))
    flip(store.state_dir / "bm25.g000003.arr", 40)
    gen = make_store(tmp_path).load()
    assert gen is not None and gen.ok and gen.number == 1


def test_damage_shared_by_all_generations_is_reported_per_file(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    commit(store)
    commit(store, carry_chunks=True)  # both generations name chunks.g000001
    flip(store.state_dir / "chunks.g000001.jsonl.zst", 20)
    reopened = make_store(tmp_path)
    gen = reopened.open()
    # Newest generation, with the broken file named, so only that index is rebuilt...
    assert gen is not None and gen.number == 2 and not gen.ok
    assert gen.corrupt == {"chunks": "checksum mismatch"}
    with pytest.raises(CorruptState):
        gen.read_records("chunks")
    # ...while the others serve.
    np.testing.assert_array_equal(gen.read_arrays("bm25")[0]["p"], postings(2))
    with pytest.raises(CorruptState), reopened.transaction() as txn:
        txn.carry("chunks")  # a known-damaged file is never carried into a new generation
    n = reopened.next_number
    with reopened.transaction() as txn:
        txn.carry("bm25")
        txn.add("chunks", write_records(reopened.fs, txn.path("chunks", ".jsonl.zst"),
                                        chunks(n)), mirror=MIRROR)
    fixed = make_store(tmp_path).open()
    assert fixed is not None and fixed.ok and fixed.read_records("chunks") == chunks(n)


def test_a_damaged_fallback_names_only_the_newer_generations_passed_by(tmp_path: Path) -> None:
    # No generation is whole: the newest readable one serves, and what it says was passed
    # by is the newer manifest that could not be read, not the older generations tried
    # after it (they would never serve in its place).
    store = make_store(tmp_path, keep=3)
    store.open()
    commit(store)
    commit(store, carry_chunks=True)
    commit(store, carry_chunks=True)  # all three name chunks.g000001
    flip(store.state_dir / "chunks.g000001.jsonl.zst", 20)
    truncate(store.state_dir / manifest_name(3), 10)
    reopened = make_store(tmp_path, keep=3)
    gen = reopened.load()
    assert gen is not None and gen.number == 2 and gen.corrupt == {"chunks": "checksum mismatch"}
    assert [name for name, _ in gen.skipped] == [manifest_name(3)]
    assert reopened.skipped == gen.skipped


def test_size_only_load_defers_checksums_to_the_reader(tmp_path: Path) -> None:
    store = two_generations(tmp_path)
    flip(store.state_dir / "bm25.g000002.arr", 200)
    gen = make_store(tmp_path).load(verify="size")
    assert gen is not None and gen.number == 2 and gen.ok
    with pytest.raises(CorruptState):
        gen.read_arrays("bm25")
    assert "bm25" in gen.corrupt
    with pytest.raises(CorruptState):
        gen.verify("bm25")


def test_deferred_checksums_are_checked_later(tmp_path: Path) -> None:
    store = two_generations(tmp_path)
    path = store.state_dir / "bm25.g000002.arr"
    data = bytearray(path.read_bytes())
    (header_len,) = struct.unpack_from("<I", data, 12)
    (entry,) = orjson.loads(bytes(data[48:48 + header_len]))["arrays"]
    data[entry["offset"]] ^= 0x01  # array bytes: header, layout and size stay valid
    path.write_bytes(bytes(data))
    gen = make_store(tmp_path).open(defer=("bm25",))
    assert gen is not None and gen.number == 2 and gen.ok and gen.deferred == {"bm25"}
    assert "p" in gen.map_arrays("bm25").arrays  # served before its checksum is known
    assert gen.verify_deferred() == {"bm25": "checksum mismatch"}
    assert gen.corrupt == {"bm25": "checksum mismatch"} and not gen.deferred
    # A deferred file that is no file any more counts as damaged too.
    gen = make_store(tmp_path).open(defer=("chunks",))
    assert gen is not None
    chunks_path = gen.path("chunks")
    chunks_path.unlink()
    chunks_path.mkdir()  # not "missing", and not an I/O error that fails the workspace
    bad = gen.verify_deferred()
    assert bad == {"chunks": "not a regular file (a directory)"}


def test_no_valid_manifest_means_rebuild(tmp_path: Path) -> None:
    store = two_generations(tmp_path)
    for n in (1, 2):
        flip(store.state_dir / manifest_name(n), 30)
    fresh = make_store(tmp_path)
    assert fresh.open() is None
    assert fresh.next_number == 3  # numbers are never reused
    assert state_names(fresh) == []


# -- ENOSPC at every step of a commit (RELIABILITY 7) --------------------------------------

COUNTED = ("open_write", "write", "fsync", "replace", "fsync_dir", "mkdir", "link")


def full_commit(store: GenerationStore) -> int:
    """Three data files, one mirrored, and the manifest."""
    n = store.next_number
    with store.transaction() as txn:
        txn.add("chunks", write_records(store.fs, txn.path("chunks", ".jsonl.zst"), chunks(n)),
                mirror=MIRROR)
        txn.add("bm25", write_arrays(store.fs, txn.path("bm25", ".arr"), {"p": postings(n)}))
        txn.add("live", write_blob(store.fs, txn.path("live", ".roar"), b"bitmap-%d" % n))
    return n


@pytest.mark.parametrize("persistent", [False, True])
def test_disk_full_at_every_call_of_a_commit(tmp_path: Path, persistent: bool) -> None:
    store = make_store(tmp_path)
    store.open()
    full_commit(store)
    k = 1
    while True:
        fs = FailingFS(k, persistent=persistent, ops=COUNTED)
        store.fs = fs
        before = store.current
        assert before is not None
        try:
            n = full_commit(store)
        except DiskFull as exc:
            assert exc.errno == errno.ENOSPC
            assert store.current is before  # the previous generation is still current
        else:
            if fs.failures == 0:
                break
            # Only a mirror publish failed: the commit stands, the mirror is repaired later.
            assert store.current is not None and store.current.number == n
            assert store.current.mirror_errors
        assert temp_files(store.state_dir, store.mirror_root / "file_store") == []
        loaded = make_store(tmp_path).load()
        assert loaded is not None and loaded.ok
        # Either the old generation, or the new one if only the fsync after its manifest's
        # rename failed (the commit then reports an error it may have survived).
        assert loaded.number in (before.number, store.next_number - 1)
        assert loaded.read_records("chunks") == chunks(loaded.number)
        referenced = {e.name for m in store.manifest_numbers()
                      for e in store.read_manifest(m).files.values()}
        assert len(store.manifest_numbers()) <= store.keep
        generation_files = {x for x in state_names(store) if ".g0" in x}
        assert generation_files <= referenced  # failed data files were removed
        # The disk frees up: the same store commits again.
        store.fs = REAL
        n = full_commit(store)
        assert make_store(tmp_path).open().number == n  # type: ignore[union-attr]
        k += 1
    assert k > 20  # the sweep reached every call of a real commit


def test_failed_transaction_block_removes_its_files(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    commit(store)
    before = state_names(store)
    with pytest.raises(RuntimeError), store.transaction() as txn:
        txn.add("bm25", write_arrays(store.fs, txn.path("bm25", ".arr"), {"p": postings(9)}))
        raise RuntimeError("tokenizer failed")
    assert state_names(store) == before
    assert store.current is not None and store.current.number == 1


def test_commit_validates_its_input(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.open()
    entry = write_arrays(store.fs, store.gen_path("bm25", ".arr"), {"p": postings(1)})
    with pytest.raises(ValueError, match="plain name"):
        store.commit({"bm25": FileEntry("sub/x.arr", entry.size, entry.checksum)})
    with pytest.raises(ValueError, match="relative"):
        store.commit({"bm25": entry}, {"bm25": "../outside.arr"})
    with pytest.raises(ValueError, match="unknown"):
        store.commit({"bm25": entry}, {"other": "x"})
    with pytest.raises(CorruptState, match="size"):
        store.commit({"bm25": FileEntry(entry.name, entry.size + 1, entry.checksum)})
    with pytest.raises(ValueError):
        store.gen_name("bad/stem", ".arr")
    assert store.commit({"bm25": entry}).number == 1


def test_storage_errors_share_one_root() -> None:
    assert issubclass(CorruptState, StorageError) and issubclass(DiskFull, StorageError)
    err = CorruptState("/x/y", "checksum mismatch")
    assert err.reason == "checksum mismatch" and err.path == "/x/y" and "/x/y" in str(err)
    # What a client sees names the file, not where the daemon keeps it.
    assert "data" not in err.to_error() and "/x/" not in err.to_error()["message"]
