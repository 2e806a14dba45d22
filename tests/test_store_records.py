"""Record files (RELIABILITY 3, 4): verified zstd JSONL, QwenPaw-compatible bytes."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zstandard
from crash.damage import damaged, extend, flip, restore, temp_files, truncate

from recalld.daemon.store.errors import CorruptState, DiskFull
from recalld.daemon.store.failingfs import FailingFS
from recalld.daemon.store.fsio import REAL, FileEntry, checksum
from recalld.daemon.store.records import (
    iter_records,
    read_foreign_records,
    read_records,
    write_records,
    write_records_twice,
)


def chunk(i: int, *, vector: bool = True) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": f"c{i:04d}",
        "path": f"memory/2026-07-{1 + i % 28:02d}/commute.md",
        "start_line": i + 1,
        "end_line": i + 6,
        "text": f"第{i}条记忆: handleWebSocketReconnect after ECONNREFUSED ✓",
        "metadata": {"bucket": "daily", "tags": ["a", "b"], "score": i / 7},
    }
    if vector:
        raw = np.linspace(-1, 1, 8, dtype="<f2") * (i + 1)
        record["_embedding_f16_b64"] = base64.b64encode(raw.tobytes()).decode()
    return record


RECORDS = [chunk(i, vector=i % 3 != 0) for i in range(12)]


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, FileEntry]:
    path = tmp_path / "file_chunks_default_v1.jsonl.zst"
    return path, write_records(REAL, path, RECORDS)


def test_round_trip_and_entry(written: tuple[Path, FileEntry]) -> None:
    path, entry = written
    assert entry.name == path.name and entry.records == len(RECORDS)
    assert entry.size == path.stat().st_size
    assert read_records(path, entry) == RECORDS
    assert read_records(path) == RECORDS
    assert list(iter_records(path, entry)) == RECORDS


def test_frame_has_checksum_and_content_size(written: tuple[Path, FileEntry]) -> None:
    data = written[0].read_bytes()
    params = zstandard.get_frame_parameters(data)
    assert params.has_checksum
    assert params.content_size == sum(len(orjson.dumps(r)) + 1 for r in RECORDS)


def test_plain_readers_see_jsonl(written: tuple[Path, FileEntry]) -> None:
    path = written[0]
    # ReMe's reader: one frame through a stream reader, line by line.
    with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        lines = io.TextIOWrapper(reader, encoding="utf-8").readlines()
    assert [orjson.loads(line) for line in lines] == RECORDS
    if shutil.which("zstd") and shutil.which("jq"):
        out = subprocess.run(
            f"zstd -dc '{path}' | jq -c .id", shell=True, capture_output=True, check=True,
            text=True,
        ).stdout.split()
        assert out == [f'"{r["id"]}"' for r in RECORDS]


def test_empty_file_round_trips(tmp_path: Path) -> None:
    entry = write_records(REAL, tmp_path / "e.jsonl.zst", [])
    assert entry.records == 0
    assert read_records(tmp_path / "e.jsonl.zst", entry) == []


def test_large_file_spans_many_blocks(tmp_path: Path) -> None:
    many = [chunk(i) for i in range(5000)]
    entry = write_records(REAL, tmp_path / "big.jsonl.zst", many)
    assert read_records(tmp_path / "big.jsonl.zst", entry) == many
    # Damage deep inside a multi-block frame is still caught by zstd alone.
    truncate(tmp_path / "big.jsonl.zst", entry.size // 2)
    with pytest.raises(CorruptState, match="truncated"):
        read_records(tmp_path / "big.jsonl.zst")


def test_written_in_two_passes_the_file_is_the_same(tmp_path: Path) -> None:
    many = [chunk(i) for i in range(3000)]
    once = write_records(REAL, tmp_path / "once.jsonl.zst", many)
    twice = write_records_twice(REAL, tmp_path / "twice.jsonl.zst", lambda: iter(many))
    assert (twice.size, twice.checksum, twice.records) == (once.size, once.checksum, 3000)
    assert read_records(tmp_path / "twice.jsonl.zst", twice) == many


def test_two_passes_that_differ_publish_nothing(tmp_path: Path) -> None:
    passes = iter([[chunk(1), chunk(2)], [chunk(1), chunk(3, vector=False)]])
    with pytest.raises(zstandard.ZstdError):
        write_records_twice(REAL, tmp_path / "x.jsonl.zst", lambda: next(passes))
    assert list(tmp_path.iterdir()) == []


def _assert_rejected(path: Path, entry: FileEntry | None) -> None:
    got: list[dict[str, Any]] = []
    with pytest.raises(CorruptState) as info:
        got.extend(iter_records(path, entry))
    if entry is not None:
        assert got == []  # verified up front: not a single record from a damaged file
    assert info.value.path == str(path)
    with pytest.raises(CorruptState):
        read_records(path, entry)


@pytest.mark.parametrize("with_entry", [True, False])
def test_every_truncation_is_detected(written: tuple[Path, FileEntry], with_entry: bool) -> None:
    path, entry = written
    with damaged(path) as original:
        for size in range(len(original)):
            truncate(path, size)
            _assert_rejected(path, entry if with_entry else None)
            restore(path, original)


@pytest.mark.parametrize("extra", [b"\0", b"garbage\n", None])
@pytest.mark.parametrize("with_entry", [True, False])
def test_extension_is_detected(
    written: tuple[Path, FileEntry], extra: bytes | None, with_entry: bool
) -> None:
    path, entry = written
    with damaged(path):
        # None: a second complete frame appended, which a lenient reader might accept.
        extend(path, extra or zstandard.ZstdCompressor().compress(b'{"id":"x"}\n'))
        _assert_rejected(path, entry if with_entry else None)


@pytest.mark.parametrize("with_entry", [True, False])
def test_every_flipped_byte_is_detected(written: tuple[Path, FileEntry], with_entry: bool) -> None:
    path, entry = written
    with damaged(path) as original:
        for offset in range(len(original)):
            flip(path, offset)
            _assert_rejected(path, entry if with_entry else None)
            restore(path, original)


def test_record_count_is_verified(written: tuple[Path, FileEntry]) -> None:
    path, entry = written
    wrong = FileEntry(entry.name, entry.size, entry.checksum, entry.records + 1)
    with pytest.raises(CorruptState, match="records"):
        read_records(path, wrong)


def _frame(payload: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True).compress(payload)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"a":1}\n[1,2]\n', "not a JSON object"),
        (b'{"a":1}\n{"a":', "newline"),
        (b'{"a":1}\n{nope}\n', "bad JSON"),
    ],
)
def test_bad_content_in_a_valid_frame(tmp_path: Path, payload: bytes, reason: str) -> None:
    path = tmp_path / "x.jsonl.zst"
    path.write_bytes(_frame(payload))
    with pytest.raises(CorruptState, match=reason):
        read_records(path)


def test_a_bad_line_is_reported_at_its_offset_past_blank_lines_and_input_chunks(
        tmp_path: Path) -> None:
    # Lines of incompressible text, so the frame spans several of the reader's input
    # chunks; blank lines are skipped; the bad line's offset is where it starts.
    rng = np.random.default_rng(7)
    lines = [orjson.dumps({"i": i, "t": base64.b64encode(rng.bytes(600)).decode()})
             for i in range(5000)]
    good = b"\n".join(lines[:2500]) + b"\n\n" + b"\n".join(lines[2500:]) + b"\n"
    path = tmp_path / "x.jsonl.zst"
    path.write_bytes(_frame(good))
    assert len(path.read_bytes()) > 2 << 20
    assert [r["i"] for r in read_records(path)] == list(range(5000))
    payload = good + b"\n" + b'{"i": broken}\n'
    path.write_bytes(_frame(payload))
    with pytest.raises(CorruptState, match=f"bad JSON at offset {len(good) + 1}:"):
        read_records(path)


def test_our_files_require_checksum_and_size_in_the_frame(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl.zst"
    data = zstandard.ZstdCompressor(write_checksum=False).compress(b'{"a":1}\n')
    path.write_bytes(data)
    entry = FileEntry(path.name, len(data), checksum(data), 1)
    with pytest.raises(CorruptState, match="lacks"):
        read_records(path, entry)
    assert read_records(path) == [{"a": 1}]  # without an entry: any valid frame


def test_missing_and_not_zstd(tmp_path: Path) -> None:
    with pytest.raises(CorruptState, match="missing"):
        read_records(tmp_path / "nope", FileEntry("nope", 1, "00", 0))
    (tmp_path / "plain").write_bytes(b'{"a":1}\n')
    with pytest.raises(CorruptState, match="not a zstd frame"):
        read_records(tmp_path / "plain")


@pytest.mark.parametrize("persistent", [False, True])
def test_disk_full_while_writing_keeps_old_file(tmp_path: Path, persistent: bool) -> None:
    path = tmp_path / "r.jsonl.zst"
    old = write_records(REAL, path, RECORDS[:2])
    many = [chunk(i) for i in range(3000)]
    ops = ("open_write", "write", "fsync", "replace")
    k = 1
    while True:
        try:
            entry = write_records(FailingFS(k, persistent=persistent, ops=ops), path, many)
        except DiskFull:
            assert read_records(path, old) == RECORDS[:2]
            assert temp_files(tmp_path) == []
            k += 1
            continue
        break
    assert k > len(ops)  # each kind of call failed once before the write went through
    assert read_records(path, entry) == many


def test_unserializable_record_publishes_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_records(REAL, tmp_path / "r.jsonl.zst", [{"a": object()}])
    assert list(tmp_path.iterdir()) == []


# -- foreign files (an existing QwenPaw workspace) ------------------------------------


def reme_style(path: Path, payload: bytes) -> None:
    """Write like ReMe does: a stream writer, no checksum, no content size."""
    with path.open("wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as w:
        w.write(payload)


def jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def test_foreign_file_is_read_with_vectors(tmp_path: Path) -> None:
    path = tmp_path / "file_chunks_default_v1.jsonl.zst"
    reme_style(path, jsonl(RECORDS))
    got = read_foreign_records(path)
    assert got.records == RECORDS and got.bad_lines == [] and got.torn_tail is None
    assert got.stream_error is None
    vector = np.frombuffer(base64.b64decode(got.records[1]["_embedding_f16_b64"]), "<f2")
    assert vector.shape == (8,)


def test_foreign_bad_line_and_torn_tail_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl.zst"
    good = jsonl(RECORDS[:3])
    payload = good + b'{"id": broken}\n' + jsonl(RECORDS[3:5]) + b'{"id":"c9999","te'
    reme_style(path, payload)
    got = read_foreign_records(path)
    assert got.records == RECORDS[:5]
    assert [b.offset for b in got.bad_lines] == [len(good)]
    assert payload[got.bad_lines[0].offset :].startswith(b'{"id": broken}')
    assert got.torn_tail is not None
    assert payload[got.torn_tail.offset :] == b'{"id":"c9999","te'


def test_foreign_truncated_frame_keeps_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl.zst"
    many = [chunk(i) for i in range(2000)]
    reme_style(path, jsonl(many))
    truncate(path, path.stat().st_size * 2 // 3)
    got = read_foreign_records(path)
    assert got.stream_error is not None
    assert 0 < len(got.records) < len(many)
    assert got.records == many[: len(got.records)]


def test_foreign_plain_and_multi_frame(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(jsonl(RECORDS))
    assert read_foreign_records(plain).records == RECORDS
    multi = tmp_path / "multi.jsonl.zst"
    multi.write_bytes(_frame(jsonl(RECORDS[:4])) + _frame(jsonl(RECORDS[4:])))
    got = read_foreign_records(multi)
    assert got.records == RECORDS and got.stream_error is None
    # Strict reading refuses the second frame: our files are exactly one.
    with pytest.raises(CorruptState, match="trailing"):
        read_records(multi)
