"""Record files: JSON records as one zstd frame of JSONL (``*.jsonl.zst``).

The bytes are exactly what QwenPaw/ReMe write for ``file_chunks_default_v1.jsonl.zst``: one
zstd frame whose content is one JSON object per ``\\n``-terminated line. A plain
``zstd -d | jq`` (or ReMe's own reader) reads our files. The frame is written with zstd's
content checksum and content size; our own integrity data (file size, blake2b of the file
bytes, record count) lives outside the stream, in the generation manifest (``FileEntry``).

Readers never return partial data: ``read_records`` verifies size and checksum first (when
the manifest entry is given), then decompresses with a decompression object and requires
the frame end (a truncated frame decodes without error up to the cut; ``stream_reader``
would even hide that), no trailing bytes, the content size, zstd's content checksum, one
JSON object per line, and the record count. Any failure raises ``CorruptState``.

``read_foreign_records`` is the lenient reader for a file we did not write (an existing
QwenPaw workspace): it keeps every good line, reports bad lines with their offsets and
tolerates a torn tail, so existing vectors can be reused.

Everything here blocks (file I/O, zstd, JSON): run it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

import orjson
import zstandard

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.errors import CorruptState
from recalld.daemon.store.fsio import FS, FileEntry, atomic_writer, read_verified

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_LEVEL = 3
#: Refuse to inflate a record file beyond this (a frame can claim any content size).
MAX_RECORD_BYTES = 8 << 30
_IN_CHUNK = 1 << 20  # compressed bytes fed per decompress call: bounds each output burst
_OUT_BATCH = 1 << 20  # uncompressed bytes handed to the compressor per write


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that could not be used: byte ``offset`` in the uncompressed stream, why."""

    offset: int
    reason: str


@dataclass(slots=True)
class ForeignRecords:
    """What the lenient reader recovered from a foreign record file."""

    records: list[JsonObject] = field(default_factory=list)
    bad_lines: list[BadLine] = field(default_factory=list)
    #: The unterminated, unparsable last line (a torn write), if any.
    torn_tail: BadLine | None = None
    #: Why decoding stopped early (truncated or damaged frame), if it did.
    stream_error: str | None = None

    def damage(self) -> str | None:
        """What kept part of the file from being read, if anything."""
        bad = len(self.bad_lines) + (self.torn_tail is not None)
        parts = [self.stream_error] if self.stream_error else []
        if bad:
            parts.append(f"{bad} unreadable record(s)")
        return "; ".join(parts) or None


def _compressor(threads: int = 0) -> zstandard.ZstdCompressor:
    # threads=0: single-threaded; the daemon limits CPU-heavy concurrency itself.
    return zstandard.ZstdCompressor(
        level=ZSTD_LEVEL, write_checksum=True, write_content_size=True, threads=threads
    )


def write_records(
    fs: FS, path: Path, records: Iterable[Mapping[str, object]], *, threads: int = 0
) -> FileEntry:
    """Atomically write ``records`` to ``path`` as one zstd JSONL frame; return its entry.

    Records are serialized first (the frame header carries the content size), then
    compressed straight into the temp file. A record orjson cannot serialize raises
    ``TypeError`` and nothing is published; I/O failures raise StorageIOError / DiskFull.
    """
    lines = [orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records]
    return _write_lines(fs, path, lambda: lines, sum(len(line) for line in lines), len(lines),
                        threads)


def write_records_twice(
    fs: FS, path: Path, records: Callable[[], Iterable[Mapping[str, object]]], *,
    threads: int = 0,
) -> FileEntry:
    """:func:`write_records` for many records: ``records()`` is called twice and must give
    the same records both times. The first pass only measures the content size (which the
    frame header carries), the second streams; no more than a batch of serialized records
    is held at once, where :func:`write_records` holds them all."""
    total = count = 0
    for r in records():
        total += len(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE))
        count += 1

    def lines() -> Iterator[bytes]:
        for r in records():
            yield orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE)

    return _write_lines(fs, path, lines, total, count, threads)


def _write_lines(fs: FS, path: Path, lines: Callable[[], Iterable[bytes]], total: int,
                 count: int, threads: int) -> FileEntry:
    with atomic_writer(fs, path) as out:
        # AtomicFile is file-like enough for zstd (write/flush); the stubs want IO[bytes].
        sink = cast("IO[bytes]", out)
        # A pass that differs from the one measured fails here (zstd checks the pledged
        # size), and nothing is published.
        writer = _compressor(threads).stream_writer(sink, size=total, closefd=False)
        batch: list[bytes] = []
        pending = 0
        for line in lines():
            batch.append(line)
            pending += len(line)
            if pending >= _OUT_BATCH:
                writer.write(b"".join(batch))
                batch.clear()
                pending = 0
        if batch:
            writer.write(b"".join(batch))
        writer.flush(zstandard.FLUSH_FRAME)
    return out.entry(count)


def read_records(
    path: Path, expected: FileEntry | None = None, *, trusted: bool = False
) -> list[JsonObject]:
    """Every record of ``path``, verified; raise CorruptState on any defect.

    With ``expected`` (the manifest entry) size, checksum and record count are checked too
    (``trusted``: the checksum was just verified; see ``fsio.read_verified``).
    """
    return list(iter_records(path, expected, trusted=trusted))


def iter_records(
    path: Path, expected: FileEntry | None = None, *, trusted: bool = False
) -> Iterator[JsonObject]:
    """Stream the records of ``path`` with the same checks as ``read_records``.

    The compressed bytes are read and (with ``expected``) verified before the first record
    is yielded, so with a manifest entry nothing is yielded from a damaged file. Without
    one, a truncated frame or bad line can only be detected as it is reached: the
    CorruptState comes after some records, and the caller must discard what it got.
    """
    data = read_verified(path, expected, trusted=trusted)
    count = 0
    for offset, line in _verified_lines(path, data, strict=expected is not None):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CorruptState(path, f"bad JSON at offset {offset}: {exc}") from exc
        if not isinstance(record, dict):
            raise CorruptState(path, f"line at offset {offset} is not a JSON object")
        count += 1
        yield record
    if expected is not None and expected.records is not None and count != expected.records:
        raise CorruptState(path, f"{count} records != expected {expected.records}")


def _verified_lines(path: Path, data: bytes, *, strict: bool) -> Iterator[tuple[int, bytes]]:
    """The complete lines of the single verified frame in ``data``, with their offsets."""
    if not data.startswith(ZSTD_MAGIC):
        raise CorruptState(path, "not a zstd frame")
    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as exc:
        raise CorruptState(path, f"bad zstd frame header: {exc}") from exc
    content_size: int | None = params.content_size
    if content_size == zstandard.CONTENTSIZE_UNKNOWN:
        content_size = None
    if strict and (content_size is None or not params.has_checksum):
        raise CorruptState(path, "frame lacks content size or checksum")
    if content_size is not None and content_size > MAX_RECORD_BYTES:
        raise CorruptState(path, f"frame claims {content_size} bytes")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    view = memoryview(data)
    carry = b""
    produced = 0
    for start in range(0, len(view), _IN_CHUNK):
        try:
            out = dobj.decompress(view[start : start + _IN_CHUNK])
        except zstandard.ZstdError as exc:
            raise CorruptState(path, f"zstd: {exc}") from exc
        produced += len(out)
        if produced > MAX_RECORD_BYTES or (content_size is not None and produced > content_size):
            raise CorruptState(path, "frame inflates beyond its declared size")
        if dobj.eof:
            if dobj.unused_data or start + _IN_CHUNK < len(view):
                raise CorruptState(path, "trailing bytes after the zstd frame")
        # Split in C: a catalog holds thousands of short lines, and a find per line
        # in Python cost as much as their JSON.
        lines = (carry + out).split(b"\n")
        carry = lines.pop()
        offset = produced - len(carry) - sum(map(len, lines)) - len(lines)
        for line in lines:
            if line:
                yield offset, line
            offset += len(line) + 1
    if not dobj.eof:
        raise CorruptState(path, "truncated zstd frame (no frame end)")
    if content_size is not None and produced != content_size:
        raise CorruptState(path, f"content size {produced} != declared {content_size}")
    if carry:
        raise CorruptState(path, "last record is not newline-terminated")


def read_foreign_records(path: Path) -> ForeignRecords:
    """Leniently recover the records of a record file written by someone else.

    Accepts a zstd frame (or several, or a plain JSONL file), keeps every line that parses
    as a JSON object, reports others as ``bad_lines`` with their uncompressed byte offsets,
    and treats an unterminated unparsable last line as a torn write (``torn_tail``). A
    truncated or damaged frame stops decoding at the damage (``stream_error``) and keeps
    what came before. Raises StorageIOError only if the file cannot be read at all.
    """
    data = read_verified(path, None)
    result = ForeignRecords()
    stream, result.stream_error = _inflate_leniently(data)
    pos = 0
    while pos < len(stream):
        nl = stream.find(b"\n", pos)
        end = len(stream) if nl < 0 else nl
        line = stream[pos:end]
        if line.strip():
            reason = _parse_into(line, result.records)
            if reason is not None:
                bad = BadLine(pos, reason)
                if nl < 0:
                    result.torn_tail = bad
                else:
                    result.bad_lines.append(bad)
        pos = end + 1
    return result


def _inflate_leniently(data: bytes) -> tuple[bytes, str | None]:
    if not data.startswith(ZSTD_MAGIC):
        return data, None  # plain JSONL
    parts: list[bytes] = []
    rest = data
    total = 0
    while rest:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        view = memoryview(rest)
        for start in range(0, len(view), _IN_CHUNK):
            try:
                out = dobj.decompress(view[start : start + _IN_CHUNK])
            except zstandard.ZstdError as exc:
                return b"".join(parts), f"zstd: {exc}"
            parts.append(out)
            total += len(out)
            if total > MAX_RECORD_BYTES:
                return b"".join(parts), "stream too large"
            if dobj.eof:
                break
        if not dobj.eof:
            return b"".join(parts), "truncated zstd frame (no frame end)"
        rest = dobj.unused_data
        if rest and not rest.startswith(ZSTD_MAGIC):
            return b"".join(parts), f"{len(rest)} trailing bytes after the zstd frame"
    return b"".join(parts), None


def _parse_into(line: bytes, records: list[JsonObject]) -> str | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"bad JSON: {exc}"
    if not isinstance(record, dict):
        return "not a JSON object"
    records.append(record)
    return None
