"""Array files: several numpy arrays plus JSON metadata in one self-verifying file.

Layout (little-endian)::

    0   magic   b"RCLDARR\\0"
    8   u32     format version (1)
    12  u32     header length H
    16  32 B    blake2b-256 of the header bytes
    48  H B     header: JSON {kind, meta, file_size, arrays: [{name, dtype, shape, codec,
                offset, length, checksum}]}
    ...         each array's stored bytes (raw, or one zstd frame), 64-byte aligned

Only plain numeric dtypes (bool, int, uint, float, complex) and fixed-size bytes are
accepted, written or read; object, unicode, datetime, void and structured dtypes are
refused, so nothing persisted is ever unpickled. The reader checks the header checksum,
then every field (dtype against an allow-list, shape, bounds, alignment, overlap, the
whole-file size), then each array's checksum, and only then calls ``np.frombuffer``. Any
mismatch raises ``CorruptState``; no partial result is returned. With the manifest's
``FileEntry`` the whole file's size and checksum are checked first as well.

Blobs (``write_blob`` / ``read_blob``) are the same container holding one byte string, for
native serializations (pyroaring bitmaps) so the native loader only sees verified bytes.
For loaders that take a path (hnswlib ``load_index``) use ``fsio.adopt_file`` to publish
and ``fsio.verify_file`` before loading.

Everything here blocks: run it in a worker thread.
"""

from __future__ import annotations

import errno
import logging
import math
import mmap
import os
import re
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import numpy.typing as npt
import orjson
import zstandard

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.errors import CorruptState, UnsupportedVersion, translate_os_error
from recalld.daemon.store.fsio import (
    FS,
    FileEntry,
    atomic_writer,
    checksum,
    new_hash,
    open_state,
    read_verified,
)

#: An array as read back: its dtype is the one the file declares (checked against an
#: allow-list), so readers narrow it where they know what they stored.
StoredArray = npt.NDArray[np.generic]

MAGIC = b"RCLDARR\x00"
VERSION = 1
_PREFIX = struct.Struct("<8sII32s")  # magic, version, header length, header checksum
_ALIGN = 64
_MAX_HEADER = 16 << 20
_MAX_NDIM = 32
#: Refuse to inflate a compressed array beyond this, whatever its header claims.
MAX_ARRAY_BYTES = 16 << 30
_ZSTD_LEVEL = 3
# Canonical numpy dtype strings we accept: '<f4', '|u1', '|b1', '>i8', '<c16', '|S12'.
_DTYPE_RE = re.compile(r"^(?:[<>|][biufc](?:1|2|4|8|16)|\|S[1-9][0-9]{0,8})$")
_BLOB = "blob"
_COPY_BLOCK = 1 << 20
# copy_file_range refused (old kernel, a filesystem pair it cannot copy between): copy by hand.
_NO_COPY_RANGE = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP,
                            errno.EPERM, errno.EBADF})

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ByteParts:
    """A one-dimensional uint8 array given as buffers back to back: written (and read
    back) as one array, never joined in memory first."""

    parts: tuple[bytes | bytearray | memoryview, ...]

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)


class TocEntry(TypedDict):
    """Where one array lies in the file, and what it holds."""

    name: str
    dtype: str
    shape: list[int]
    codec: str
    offset: int
    length: int
    checksum: str


@dataclass(frozen=True, slots=True)
class _Stored:
    """One array as its file is recorded: name, type, shape and checksum."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: str
    data: bytes | memoryview | ByteParts
    checksum: str


def _checksum(data: bytes | memoryview | ByteParts) -> str:
    if not isinstance(data, ByteParts):
        return checksum(data)
    h = new_hash()
    for part in data.parts:
        h.update(part)
    return h.hexdigest()


def _check_dtype(name: str, dtype: np.dtype[np.generic]) -> str:
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise TypeError(f"array {name!r}: dtype {dtype} is not a plain numeric dtype")
    text = dtype.str
    if not _DTYPE_RE.match(text):
        raise TypeError(f"array {name!r}: dtype {dtype} is not allowed (numeric or bytes only)")
    return text


def write_arrays(
    fs: FS,
    path: Path,
    arrays: Mapping[str, npt.NDArray[np.generic] | ByteParts],
    meta: Mapping[str, object] | None = None,
    *,
    compress: bool = False,
    _kind: str = "arrays",
) -> FileEntry:
    """Atomically write ``arrays`` and JSON ``meta`` to ``path``; return its entry.

    A :class:`ByteParts` value is written as a uint8 array, uncompressed.

    Raises TypeError for a disallowed dtype (before touching the disk), StorageIOError /
    DiskFull on I/O failure (nothing published).
    """
    stored: list[_Stored] = []
    for name, array in arrays.items():
        if isinstance(array, ByteParts):
            stored.append(_Stored(name, "|u1", (len(array),), "raw", array, _checksum(array)))
            continue
        dtype = _check_dtype(name, array.dtype)
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        data: bytes | memoryview = flat.data
        codec = "raw"
        if compress:
            data = zstandard.ZstdCompressor(
                level=_ZSTD_LEVEL, write_checksum=True, write_content_size=True
            ).compress(data)
            codec = "zstd"
        stored.append(_Stored(name, dtype, tuple(int(d) for d in array.shape), codec, data,
                              _checksum(data)))

    # The header names every offset, and its own length moves them: lay out with a
    # placeholder, then again with the real length (offsets are padded, so it converges).
    # Each array's checksum is taken once, above, not at every layout.
    header_len = 0
    while True:
        offset = _align(_PREFIX.size + header_len)
        toc: list[TocEntry] = []
        for item in stored:
            toc.append({
                "name": item.name, "dtype": item.dtype, "shape": list(item.shape),
                "codec": item.codec, "offset": offset, "length": len(item.data),
                "checksum": item.checksum,
            })
            offset = _align(offset + len(item.data))
        header = orjson.dumps({
            "kind": _kind, "meta": dict(meta or {}), "file_size": offset, "arrays": toc,
        })
        if len(header) == header_len:
            break
        header_len = len(header)

    with atomic_writer(fs, path) as out:
        out.write(_PREFIX.pack(MAGIC, VERSION, len(header), bytes.fromhex(checksum(header))))
        out.write(header)
        for item, entry in zip(stored, toc, strict=True):
            out.write(b"\0" * (entry["offset"] - out.size))
            for part in item.data.parts if isinstance(item.data, ByteParts) else (item.data,):
                out.write(part)
        out.write(b"\0" * (offset - out.size))
    return out.entry()


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def read_arrays(
    path: Path, expected: FileEntry | None = None, *, trusted: bool = False
) -> tuple[dict[str, StoredArray], JsonObject]:
    """The verified arrays (read-only) and meta of ``path``; CorruptState on any defect.

    With ``expected`` the whole file's checksum covers every array, so the per-array
    checksums are not computed again (``trusted``: see ``fsio.read_verified``).
    """
    data = read_verified(path, expected, trusted=trusted)
    return _parse(path, data, "arrays", whole_verified=expected is not None)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Mapped:
    """Arrays of a file mapped into memory (see :func:`map_arrays`)."""

    arrays: dict[str, StoredArray]
    meta: JsonObject
    _map: mmap.mmap | None
    #: The bytes the arrays view when the file could not be copied (read into memory).
    _data: bytes | None = None
    #: The file and the manifest entry the arrays were read from, when one was given.
    source: Path | None = None
    entry: FileEntry | None = None

    def evict(self) -> None:
        """Drop the pages read so far (checksums, checks) from this process's memory; they
        stay in the page cache and come back on first use."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)

    def matches(self, expected: FileEntry | None = None) -> bool:
        """Whether the bytes the arrays are served from have the size and checksum of
        ``expected`` (default: the entry they were read with; True without one). Reads
        every page: :meth:`evict` afterwards."""
        expected = expected or self.entry
        if expected is None:
            return True
        data: bytes | memoryview = memoryview(self._map) if self._map is not None else (
            self._data or b"")
        try:
            return len(data) == expected.size and checksum(data) == expected.checksum
        finally:
            if isinstance(data, memoryview):
                data.release()


def map_arrays(path: Path, expected: FileEntry | None = None, *,
               trusted: bool = False) -> Mapped:
    """Like :func:`read_arrays`, but raw arrays are read-only views of a memory map: their
    memory is the kernel's page cache, reclaimable, and only pages in use count as this
    process's. Compressed arrays are inflated into memory.

    What is mapped is a private copy of ``path``: an unnamed file (``O_TMPFILE``) in the
    same directory, filled by an in-kernel copy (a reflink where the filesystem shares
    extents) and checked after the copy. A mapping of the published file itself would
    kill the process with SIGBUS on the next page read once someone truncates the file,
    and show whatever is written into it; nothing outside this process can reach the
    copy. When the copy cannot be made (disk full), the file is read into memory instead.

    ``trusted`` skips the data checksums (the header's and every structural check still
    run): the caller verified the file, or verifies the copy later before relying on it
    (``Generation.deferred``, :meth:`Mapped.matches`).
    """
    mm: mmap.mmap | None = None
    data: bytes | None = None
    try:
        with open_state(path) as f:
            size = os.fstat(f.fileno()).st_size
            if expected is not None and size != expected.size:
                raise CorruptState(path, f"size {size} != expected {expected.size}")
            if size == 0:
                raise CorruptState(path, "empty")
            try:
                mm = _private_map(f.fileno(), size, path)
            except OSError as exc:
                log.warning("%s: no private copy to map (%s); reading it into memory",
                            path, exc)
                f.seek(0)
                data = f.read(size + 1)
    except FileNotFoundError as exc:
        raise CorruptState(path, "missing") from exc
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    if mm is None:
        assert data is not None
        if len(data) != size:
            raise CorruptState(path, f"size {len(data)} != {size}: changed while read")
        view = memoryview(data)
    elif len(mm) != size:
        mm.close()
        raise CorruptState(path, f"size {len(mm)} != {size}: changed while copied")
    else:
        view = memoryview(mm)
    if expected is not None and not trusted and checksum(view) != expected.checksum:
        raise CorruptState(path, "checksum mismatch")
    arrays, meta = _parse(path, view, "arrays", whole_verified=expected is not None)
    return Mapped(arrays, meta, mm, data, path, expected)


def _private_map(src: int, size: int, path: Path) -> mmap.mmap:
    """A read-only map of a copy of the first ``size`` bytes of ``src`` (open on ``path``),
    in an unnamed file of this process beside it (the mapping keeps the file alive). The copy
    may come out shorter if the source shrank meanwhile: the caller checks its size."""
    with tempfile.TemporaryFile(dir=path.parent) as dst:
        out = dst.fileno()
        done = 0
        try:
            while done < size:
                n = os.copy_file_range(src, out, size - done, done, done)
                if n == 0:
                    break
                done += n
        except OSError as exc:
            if exc.errno not in _NO_COPY_RANGE:
                raise
            while done < size:
                block = os.pread(src, min(_COPY_BLOCK, size - done), done)
                if not block:
                    break
                os.pwrite(out, block, done)
                done += len(block)
        copied = os.fstat(out).st_size
        if copied == 0:
            raise CorruptState(path, "empty: changed while copied")
        return mmap.mmap(out, copied, access=mmap.ACCESS_READ)


def write_blob(
    fs: FS, path: Path, blob: bytes | bytearray | memoryview,
    meta: Mapping[str, object] | None = None,
) -> FileEntry:
    """Atomically write one opaque byte string (e.g. ``BitMap.serialize()``) with ``meta``."""
    return write_arrays(fs, path, {_BLOB: np.frombuffer(blob, dtype=np.uint8)}, meta, _kind=_BLOB)


def read_blob(
    path: Path, expected: FileEntry | None = None, *, trusted: bool = False
) -> tuple[bytes, JsonObject]:
    """The verified byte string and meta of a blob file; CorruptState on any defect."""
    arrays, meta = _parse(path, read_verified(path, expected, trusted=trusted), _BLOB,
                          whole_verified=expected is not None)
    return arrays[_BLOB].tobytes(), meta


def _parse(
    path: Path, data: bytes | memoryview, kind: str, *, whole_verified: bool = False
) -> tuple[dict[str, StoredArray], JsonObject]:
    if len(data) < _PREFIX.size:
        raise CorruptState(path, "shorter than the array file prefix")
    magic, version, header_len, header_sum = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CorruptState(path, "not an array file (bad magic)")
    if version != VERSION:
        raise UnsupportedVersion(path, f"array file version {version} (this reads {VERSION})")
    if header_len > _MAX_HEADER or _PREFIX.size + header_len > len(data):
        raise CorruptState(path, f"header length {header_len} out of bounds")
    header_bytes = data[_PREFIX.size : _PREFIX.size + header_len]
    if checksum(header_bytes) != header_sum.hex():
        raise CorruptState(path, "header checksum mismatch")
    try:
        header = orjson.loads(header_bytes)
    except orjson.JSONDecodeError as exc:
        raise CorruptState(path, f"bad header JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CorruptState(path, "header is not an object")
    if header.get("kind") != kind:
        raise CorruptState(path, f"holds {header.get('kind')!r}, expected {kind!r}")
    if header.get("file_size") != len(data):
        raise CorruptState(path, f"size {len(data)} != declared {header.get('file_size')}")
    meta = header.get("meta")
    toc = header.get("arrays")
    if not isinstance(meta, dict) or not isinstance(toc, list):
        raise CorruptState(path, "header lacks meta or arrays")

    arrays: dict[str, StoredArray] = {}
    floor = _PREFIX.size + header_len
    for entry in toc:
        name, array, start, end = _parse_array(path, data, entry, floor, whole_verified)
        if name in arrays:
            raise CorruptState(path, f"array {name!r} listed twice")
        _check_padding(path, data, floor, start)
        arrays[name] = array
        floor = end
    _check_padding(path, data, floor, len(data))
    return arrays, meta


def _check_padding(path: Path, data: bytes | memoryview, start: int, end: int) -> None:
    # Padding is covered by no checksum; requiring zeros makes every byte verified.
    if bytes(data[start:end]).count(0) != end - start:
        raise CorruptState(path, f"nonzero padding in bytes {start}..{end}")


def _parse_array(
    path: Path, data: bytes | memoryview, entry: object, floor: int, whole_verified: bool
) -> tuple[str, StoredArray, int, int]:
    """One verified array and its byte range; ``floor`` is where the previous one ended."""
    if not isinstance(entry, dict):
        raise CorruptState(path, "array entry is not an object")
    name, dtype_s, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
    codec, offset, length = entry.get("codec"), entry.get("offset"), entry.get("length")
    digest = entry.get("checksum")
    if not isinstance(name, str) or not isinstance(digest, str):
        raise CorruptState(path, "array entry lacks name or checksum")
    where = f"array {name!r}"
    if not isinstance(dtype_s, str) or not _DTYPE_RE.match(dtype_s):
        raise CorruptState(path, f"{where}: dtype {dtype_s!r} not allowed")
    dtype = np.dtype(dtype_s)
    if dtype.hasobject or dtype.fields is not None or dtype.str != dtype_s:
        raise CorruptState(path, f"{where}: dtype {dtype_s!r} not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        raise CorruptState(path, f"{where}: bad shape {shape!r}")
    if not (type(offset) is int and type(length) is int and length >= 0):
        raise CorruptState(path, f"{where}: bad offset or length")
    if offset % _ALIGN or offset < floor or offset + length > len(data):
        raise CorruptState(path, f"{where}: bytes {offset}+{length} out of bounds")
    count = math.prod(shape)  # Python ints: an absurd shape cannot overflow
    nbytes = count * dtype.itemsize
    stored = memoryview(data)[offset : offset + length]
    if not whole_verified and checksum(stored) != digest:
        raise CorruptState(path, f"{where}: checksum mismatch")
    if codec == "raw":
        if length != nbytes:
            raise CorruptState(path, f"{where}: {length} bytes != shape {shape} × {dtype_s}")
        raw: bytes | memoryview = stored
    elif codec == "zstd":
        raw = _inflate(path, where, stored, nbytes)
    else:
        raise CorruptState(path, f"{where}: unknown codec {codec!r}")
    array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
    return name, array, offset, offset + length


def _inflate(path: Path, where: str, stored: memoryview, nbytes: int) -> bytes:
    if nbytes > MAX_ARRAY_BYTES:
        raise CorruptState(path, f"{where}: claims {nbytes} bytes")
    try:
        params = zstandard.get_frame_parameters(stored)
        if params.content_size != nbytes:
            raise CorruptState(path, f"{where}: frame size {params.content_size} != {nbytes}")
        raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=nbytes)
    except zstandard.ZstdError as exc:
        raise CorruptState(path, f"{where}: zstd: {exc}") from exc
    if len(raw) != nbytes:
        raise CorruptState(path, f"{where}: inflated to {len(raw)} bytes, not {nbytes}")
    return raw
