"""Array and blob files (RELIABILITY 3, 6): verified before numpy or a native loader sees them."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np
import orjson
import pytest
from crash.damage import damaged, extend, flip, restore, temp_files, truncate
from pyroaring import BitMap

from recalld.daemon.store.arrays import (
    MAGIC,
    MAX_ARRAY_BYTES,
    ByteParts,
    map_arrays,
    read_arrays,
    read_blob,
    write_arrays,
    write_blob,
)
from recalld.daemon.store.errors import CorruptState, DiskFull, UnsupportedVersion
from recalld.daemon.store.failingfs import FailingFS
from recalld.daemon.store.fsio import REAL, FileEntry, adopt_file, checksum, temp_name
from recalld.daemon.store.manifest import GenerationStore

ARRAYS: dict[str, np.ndarray[Any, Any]] = {
    "postings": np.arange(100, dtype=np.int64) * 3,
    "weights": np.linspace(0, 1, 30, dtype=np.float32).reshape(5, 6),
    "vectors": np.ones((4, 8), dtype=np.float16),
    "flags": np.array([True, False, True]),
    "scalar": np.array(2.5, dtype=np.float64),
    "empty": np.zeros((0, 384), dtype=np.float16),
    "big_endian": np.arange(5, dtype=">u4"),
    "terms": np.array([b"handle", b"ws", b""], dtype="S6"),
    "complex": np.array([1 + 2j], dtype=np.complex128),
    "bytes": np.frombuffer(b"\x00\x01\x02", dtype=np.uint8),
}
META = {"tokenizer": "cjk-bigram", "docs": 7, "avgdl": 12.5}


def assert_same(got: dict[str, np.ndarray[Any, Any]]) -> None:
    assert got.keys() == ARRAYS.keys()
    for name, array in ARRAYS.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / "bm25.g000001.arr"
    entry = write_arrays(REAL, path, ARRAYS, META, compress=compress)
    assert entry.size == path.stat().st_size and entry.checksum == checksum(path.read_bytes())
    for expected in (entry, None):
        arrays, meta = read_arrays(path, expected)
        assert_same(arrays)
        assert meta == META
    assert not arrays["postings"].flags.writeable  # views over verified bytes


def test_non_contiguous_input_is_written_in_logical_order(tmp_path: Path) -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    entry = write_arrays(REAL, tmp_path / "a.arr", {"t": base.T, "s": base[:, ::2]})
    arrays, _ = read_arrays(tmp_path / "a.arr", entry)
    np.testing.assert_array_equal(arrays["t"], base.T)
    np.testing.assert_array_equal(arrays["s"], base[:, ::2])


def test_byte_parts_are_written_as_one_array(tmp_path: Path) -> None:
    parts = (b"abc", bytearray(b""), memoryview("周末".encode()), bytearray(b"xyz" * 100))
    joined = np.frombuffer(b"".join(parts), dtype=np.uint8)
    other = np.arange(5, dtype=np.int64)
    a = write_arrays(REAL, tmp_path / "a.arr", {"x": other, "blob": ByteParts(parts)})
    b = write_arrays(REAL, tmp_path / "b.arr", {"x": other, "blob": joined})
    assert (a.size, a.checksum) == (b.size, b.checksum)
    arrays, _ = read_arrays(tmp_path / "a.arr", a)
    assert arrays["blob"].tobytes() == joined.tobytes()


def test_each_array_is_hashed_once_however_the_header_is_laid_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A commit writes hundreds of MB of arrays: their checksums for the header are taken
    # once each, not again at every layout of the header (whose length moves offsets).
    import recalld.daemon.store.arrays as arrays_mod

    hashed: list[int] = []
    real_new_hash = arrays_mod.new_hash

    class Counting:
        def __init__(self) -> None:
            self.h = real_new_hash()

        def update(self, data: Any) -> None:
            hashed.append(len(memoryview(data).cast("B")))
            self.h.update(data)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(arrays_mod, "new_hash", Counting)
    monkeypatch.setattr(arrays_mod, "checksum", lambda data: (c := Counting(), c.update(data),
                                                              c.hexdigest())[2])
    # Names and shapes long enough that the header's length takes more than two layouts.
    big = {f"column_{i:03d}_" + "n" * 40: np.arange(10_000 + i, dtype=np.int64)
           for i in range(40)}
    parts = ByteParts((b"x" * 5000, bytearray(b"y" * 3000)))
    entry = write_arrays(REAL, tmp_path / "a.arr", {**big, "blob": parts})
    stored = sum(a.nbytes for a in big.values()) + len(parts)
    # Besides the arrays, only the header (about 9 kB here) is hashed, once.
    assert stored <= sum(hashed) < stored + 16_000
    arrays, _ = read_arrays(tmp_path / "a.arr", entry)  # the checksums are the right ones
    np.testing.assert_array_equal(arrays["column_039_" + "n" * 40], np.arange(10_039))
    assert arrays["blob"].tobytes() == b"x" * 5000 + b"y" * 3000


@pytest.mark.parametrize(
    "array",
    [
        np.array([{"a": 1}, None], dtype=object),
        np.array(["text"]),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
        np.array(["2026-01-01"], dtype="datetime64[D]"),
        np.zeros(2, dtype="V8"),
    ],
)
def test_disallowed_dtypes_are_refused_before_writing(tmp_path: Path, array: Any) -> None:
    with pytest.raises(TypeError, match="dtype"):
        write_arrays(REAL, tmp_path / "x.arr", {"a": array})
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small(tmp_path: Path) -> tuple[Path, FileEntry]:
    path = tmp_path / "small.arr"
    arrays = {"ids": np.arange(6, dtype=np.uint16), "w": np.ones(3, dtype=np.float32)}
    return path, write_arrays(REAL, path, arrays, {"n": 1}, compress=True)


@pytest.mark.parametrize("with_entry", [True, False])
def test_every_truncation_flip_and_extension_is_detected(
    small: tuple[Path, FileEntry], with_entry: bool
) -> None:
    path, entry = small
    expected = entry if with_entry else None
    with damaged(path) as original:
        for size in range(len(original)):
            truncate(path, size)
            with pytest.raises(CorruptState):
                read_arrays(path, expected)
            restore(path, original)
        for offset in range(len(original)):
            flip(path, offset)
            with pytest.raises(CorruptState):
                read_arrays(path, expected)
            restore(path, original)
        extend(path, b"\0" * 64)
        with pytest.raises(CorruptState):
            read_arrays(path, expected)


# -- crafted files: a consistent header that lies ------------------------------------


DATA_AT = 1024  # crafted files put their payload here, after the padded header


def craft(path: Path, header: dict[str, Any], payload: bytes, version: int = 1) -> None:
    """An array file whose header checksum and size are right but whose content lies."""
    header["file_size"] = DATA_AT + len(payload)
    body = orjson.dumps(header)
    prefix = struct.pack("<8sII32s", MAGIC, version, len(body), bytes.fromhex(checksum(body)))
    assert len(prefix) + len(body) <= DATA_AT
    data = prefix + body
    path.write_bytes(data + b"\0" * (DATA_AT - len(data)) + payload)


def entry(name: str, dtype: str, shape: Any, payload: bytes, **extra: Any) -> dict[str, Any]:
    item = {"name": name, "dtype": dtype, "shape": shape, "codec": "raw", "offset": DATA_AT,
            "length": len(payload), "checksum": checksum(payload)}
    item.update(extra)
    return item


PAYLOAD = bytes(range(64))


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (entry("o", "|O", [8], PAYLOAD), "not allowed"),
        (entry("o", "O", [8], PAYLOAD), "not allowed"),
        (entry("u", "<U4", [4], PAYLOAD), "not allowed"),
        (entry("s", "[('a', '<i4')]", [16], PAYLOAD), "not allowed"),
        (entry("v", "|V8", [8], PAYLOAD), "not allowed"),
        (entry("m", "<M8", [8], PAYLOAD), "not allowed"),
        (entry("f", "<f4", [2**40, 2**40], PAYLOAD), "shape"),
        (entry("f", "<f4", [-1, 16], PAYLOAD), "bad shape"),
        (entry("f", "<f4", [1.5], PAYLOAD), "bad shape"),
        (entry("f", "<f4", [1] * 64, PAYLOAD), "bad shape"),
        (entry("f", "<f4", [15], PAYLOAD), "shape"),
        (entry("f", "<f4", [16], PAYLOAD, offset=64), "out of bounds"),
        (entry("f", "<f4", [16], PAYLOAD, offset=DATA_AT + 64), "out of bounds"),
        (entry("f", "<f4", [16], PAYLOAD, offset=DATA_AT + 2), "out of bounds"),
        (entry("f", "<f4", [16], PAYLOAD, length=10**12), "out of bounds"),
        (entry("f", "<f4", [16], PAYLOAD, codec="lz4"), "codec"),
        (entry("f", "<f4", [16], PAYLOAD, checksum="00" * 32), "checksum"),
        (entry("f", "<f4", [2**40], PAYLOAD, codec="zstd"), "claims"),
        (entry("f", "<f4", [16], PAYLOAD, codec="zstd"), "zstd|frame"),
    ],
)
def test_crafted_headers_are_refused(tmp_path: Path, item: dict[str, Any], reason: str) -> None:
    path = tmp_path / "crafted.arr"
    craft(path, {"kind": "arrays", "meta": {}, "arrays": [item]}, PAYLOAD)
    with pytest.raises(CorruptState, match=reason):
        read_arrays(path)


def test_crafted_overlap_and_duplicates_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "crafted.arr"
    a = entry("a", "<f4", [16], PAYLOAD)
    craft(path, {"kind": "arrays", "meta": {}, "arrays": [a, dict(a, name="b")]}, PAYLOAD)
    with pytest.raises(CorruptState, match="out of bounds"):
        read_arrays(path)
    a = entry("a", "|u1", [0], b"", length=0)
    craft(path, {"kind": "arrays", "meta": {}, "arrays": [a, a]}, PAYLOAD)
    with pytest.raises(CorruptState, match="twice"):
        read_arrays(path)


def test_crafted_prefix_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "crafted.arr"
    craft(path, {"kind": "arrays", "meta": {}, "arrays": []}, b"", version=2)
    with pytest.raises(UnsupportedVersion):
        read_arrays(path)
    path.write_bytes(struct.pack("<8sII32s", MAGIC, 1, 2**31, b"\0" * 32))
    with pytest.raises(CorruptState, match="header length"):
        read_arrays(path)
    path.write_bytes(b"\x93NUMPY" + b"\0" * 100)  # an .npy file is not accepted either
    with pytest.raises(CorruptState, match="magic"):
        read_arrays(path)
    craft(path, {"kind": "arrays", "meta": [], "arrays": []}, b"")
    with pytest.raises(CorruptState, match="meta"):
        read_arrays(path)


def test_max_array_bytes_is_sane() -> None:
    assert MAX_ARRAY_BYTES >= 1 << 30


# -- blobs and native loaders ----------------------------------------------------------


def test_bitmap_blob_round_trip_and_kind_check(tmp_path: Path) -> None:
    live = BitMap([1, 5, 99, 100_000])
    path = tmp_path / "live.g000001.roar"
    entry = write_blob(REAL, path, live.serialize(), {"count": len(live)})
    blob, meta = read_blob(path, entry)
    assert BitMap.deserialize(blob) == live and meta == {"count": 4}
    with pytest.raises(CorruptState, match="expected 'arrays'"):
        read_arrays(path)
    write_arrays(REAL, tmp_path / "a.arr", {"x": np.ones(2)})
    with pytest.raises(CorruptState, match="expected 'blob'"):
        read_blob(tmp_path / "a.arr")


def test_crafted_bitmap_bytes_never_reach_pyroaring(tmp_path: Path) -> None:
    path = tmp_path / "live.roar"
    good = BitMap(range(0, 5000, 7)).serialize()
    entry = write_blob(REAL, path, good)
    data = bytearray(path.read_bytes())
    # Overwrite the payload with a roaring header claiming absurd container counts.
    start = data.index(good)
    data[start : start + 8] = struct.pack("<II", 12347, 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    loaded: list[bytes] = []
    for expected in (entry, None):
        with pytest.raises(CorruptState):
            blob, _ = read_blob(path, expected)
            loaded.append(blob)  # what would go to BitMap.deserialize
    assert loaded == []


def test_hnswlib_index_is_verified_before_load(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    vectors = rng.random((50, 16), dtype=np.float32)
    index = hnswlib.Index(space="cosine", dim=16)
    index.init_index(max_elements=50, ef_construction=50, M=8)
    index.add_items(vectors, np.arange(50))
    store = GenerationStore(tmp_path / "state")
    store.open()
    path = store.gen_path("vectors", ".hnsw")
    tmp = path.with_name(temp_name(path.name))
    index.save_index(str(tmp))
    gen = store.commit({"vectors": adopt_file(store.fs, tmp, path)})

    loaded = hnswlib.Index(space="cosine", dim=16)
    loaded.load_index(str(gen.verified_path("vectors")), max_elements=50)
    labels, _ = loaded.knn_query(vectors[:3], k=1)
    assert labels.ravel().tolist() == [0, 1, 2]

    size = path.stat().st_size
    with damaged(path) as original:
        flip(path, size // 2, 0xFF)
        with pytest.raises(CorruptState, match="checksum"):
            gen.verified_path("vectors")
        restore(path, original)
        truncate(path, size - 100)
        with pytest.raises(CorruptState, match="size"):
            gen.verified_path("vectors")
    assert gen.corrupt == {"vectors": f"size {size - 100} != expected {size}"}


@pytest.mark.parametrize("persistent", [False, True])
def test_disk_full_while_writing_arrays(tmp_path: Path, persistent: bool) -> None:
    path = tmp_path / "a.arr"
    old = write_arrays(REAL, path, {"x": np.zeros(3)})
    k = 1
    while True:
        try:
            write_arrays(FailingFS(k, persistent=persistent), path, ARRAYS, META)
        except DiskFull:
            arrays, _ = read_arrays(path, old)
            np.testing.assert_array_equal(arrays["x"], np.zeros(3))
            assert temp_files(tmp_path) == []
            k += 1
            continue
        break
    assert k > len(ARRAYS)  # every one of the many writes failed once
    assert_same(read_arrays(path)[0])


def test_mapped_arrays_match_read_arrays_and_are_read_only(tmp_path: Path) -> None:
    arrays = {"a": np.arange(1000, dtype=np.int32), "b": np.linspace(0, 1, 7),
              "c": np.frombuffer(b"text", dtype=np.uint8)}
    path = tmp_path / "x.arr"
    entry = write_arrays(REAL, path, arrays, {"k": 1})
    got = map_arrays(path, entry)
    assert got.meta == {"k": 1}
    for name, arr in arrays.items():
        assert np.array_equal(got.arrays[name], arr)
        with pytest.raises(ValueError):
            got.arrays[name][:1] = 0
    got.evict()
    assert int(got.arrays["a"].sum()) == sum(range(1000))  # pages come back after eviction
    data = bytearray(path.read_bytes())
    data[-70] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptState):
        map_arrays(path, entry)
    path.write_bytes(b"")
    with pytest.raises(CorruptState):
        map_arrays(path)
