"""The chunks of one workspace as columns, with a chunk object built only when asked for.

Owns :class:`ChunkTable`, a read-mostly mapping ``doc key -> StoredChunk``. Keys are
appended in ascending order (the index hands them out that way), so a row is found by
bisection and no per-chunk dict entry or object exists: per chunk the table holds a few
integers in typed arrays and its text, heading and metadata (compact JSON) back to back in
one UTF-8 buffer. At 3k notes this is a fraction of the memory of one frozen dataclass per
chunk, and saving or loading it is a handful of array copies instead of a JSON record per
chunk (a warm start at 82k chunks spent 1.3 s parsing those).

Removal clears a key from the live set; rows and bytes of removed chunks are dropped by a
compaction once they make up a quarter of the table (linear, so amortized O(1) per change).
Vectors, where known, are kept as QwenPaw's ``_embedding_f16_b64`` strings by key.
The last few hundred chunk objects built are kept until their chunk changes: searches
read the same ones again and again (the hits' linked notes, the results).

A copy (what a commit saves) shares the bytes instead of copying them: the bytes added so
far are sealed (kept by both tables, never written again) and the table goes on appending
to a fresh buffer. A first build's commit then holds its chunk texts once, not three times.

Pure and synchronous; not thread-safe (the index service serializes its users).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from typing import NamedTuple, NotRequired, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt
import orjson
from pyroaring import BitMap

from recalld.daemon.index.chunker import chunk_id
from recalld.daemon.index.saved import array as checked_array
from recalld.daemon.index.saved import load_terms, terms_to_arrays
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.arrays import ByteParts

__all__ = ["ChunkTable", "StoredChunk"]

# Compaction once removed rows are this share of all rows (and at least this many).
DEAD_FRACTION = 0.25
DEAD_MIN_ROWS = 256
# How many built chunks a table keeps for the next reads (a few hundred KB of text).
BUILT_MAX = 512
_COLUMNS = ("_keys", "_ids", "_path", "_start", "_end", "_off", "_text_len", "_head_len")
_BYTES = ("_base", "_sealed", "_sealed_end", "_top", "_blob")
_S = TypeVar("_S", bound=np.generic)


class ChunkRecord(TypedDict):
    """A chunk as QwenPaw stores it (one line of its chunk records)."""

    id: str
    path: str
    start_line: int
    end_line: int
    text: str
    metadata: JsonObject
    _embedding_f16_b64: NotRequired[str]


class StoredChunk(NamedTuple):
    """A chunk as indexed; ``embedding`` is QwenPaw's ``_embedding_f16_b64`` when known.

    A named tuple: a search builds one per hit, three times faster than a frozen dataclass.
    """

    key: int
    id: str
    path: str
    start_line: int
    end_line: int
    text: str
    heading: str
    metadata: Mapping[str, object]
    embedding: str | None = None

    def to_record(self) -> ChunkRecord:
        rec: ChunkRecord = {
            "id": self.id, "path": self.path, "start_line": self.start_line,
            "end_line": self.end_line, "text": self.text,
            "metadata": {**self.metadata, "heading": self.heading, "key": self.key},
        }
        if self.embedding is not None:
            rec["_embedding_f16_b64"] = self.embedding
        return rec

    @classmethod
    def from_record(cls, rec: JsonObject) -> StoredChunk:
        meta = dict(rec.get("metadata") or {})
        key = int(meta.pop("key"))
        heading = str(meta.pop("heading", ""))
        emb = rec.get("_embedding_f16_b64")
        return cls(
            key=key, id=str(rec["id"]), path=str(rec["path"]),
            start_line=int(rec["start_line"]), end_line=int(rec["end_line"]),
            text=str(rec["text"]), heading=heading, metadata=meta,
            embedding=emb if isinstance(emb, str) else None,
        )


class _Metadata(Mapping[str, object]):
    """A chunk's metadata, parsed from its stored JSON on first use."""

    __slots__ = ("_parsed", "_raw")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._parsed: JsonObject | None = None

    def _dict(self) -> JsonObject:
        if self._parsed is None:
            value = orjson.loads(self._raw)
            self._parsed = value if isinstance(value, dict) else {}
        return self._parsed

    def __getitem__(self, name: str) -> object:
        return self._dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __repr__(self) -> str:
        return repr(self._dict())


class ChunkTable(Mapping[int, StoredChunk]):
    """Doc key -> chunk, stored column-wise (see the module docstring)."""

    def __init__(self) -> None:
        self._keys = array("I")  # row -> key, ascending
        self._ids = array("Q")  # row -> chunk id (chunker.chunk_id, as a number)
        self._path = array("i")  # row -> index into _paths
        self._start = array("i")
        self._end = array("i")
        # Row r's bytes are at _off[r]:_off[r + 1] of _base (bytes loaded or mapped with
        # the table, read-only), then the sealed buffers (bytes added before the last
        # copy, read-only; _sealed_end: where each ends), then _blob (bytes added since),
        # which starts at _top. A row's bytes never span two of them.
        self._off = array("q", [0])
        self._text_len = array("i")  # ... text first, then heading, then metadata JSON
        self._head_len = array("i")
        self._base: memoryview = memoryview(b"")
        self._sealed: list[memoryview] = []
        self._sealed_end: list[int] = []
        self._top = 0
        self._blob = bytearray()
        self.version = 0  # counts adds and removes (not vectors)
        self._paths: list[str] = []
        # path -> index into _paths; built on the first add after a load (a loaded table
        # that only answers searches does not need it).
        self._path_ids: dict[str, int] | None = {}
        self._live = BitMap()
        self._embedding: dict[int, str] = {}
        # The chunks built lately, until they change: searches read the same ones again
        # (the hits' linked notes, the exact check's and the results' chunks).
        self._built: dict[int, StoredChunk] = {}

    # -- mapping ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[int]:
        return iter(self._live)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and 0 <= key < 2**32 and key in self._live

    def __getitem__(self, key: int) -> StoredChunk:
        built = self._built
        chunk = built.get(key)
        if chunk is not None:
            return chunk
        row = self._row(key)
        text, heading, meta = self._fields(row)
        # Positional: every search builds a few of these.
        chunk = StoredChunk(key, f"{self._ids[row]:016x}", self._paths[self._path[row]],
                            self._start[row], self._end[row], text, heading, meta,
                            self._embedding.get(key))
        if len(built) >= BUILT_MAX:
            built.clear()  # whole: safe beside a reader in another thread
        built[key] = chunk
        return chunk

    def place(self, key: int) -> tuple[str, int]:
        """Only the path and first line of ``key`` (KeyError if it is not live)."""
        row = self._row(key)
        return self._paths[self._path[row]], self._start[row]

    def text(self, key: int) -> str:
        """Only the text of ``key`` (KeyError if it is not live)."""
        row = self._row(key)
        a = self._off[row]
        return str(self._bytes(a, a + self._text_len[row]), "utf-8", "replace")

    def texts(self) -> Iterator[tuple[int, str]]:
        """(key, text) of every live chunk, in key order."""
        off, tl, live = self._off, self._text_len, self._live
        for row, key in enumerate(self._keys):
            if key in live:
                a = off[row]
                yield key, str(self._bytes(a, a + tl[row]), "utf-8", "replace")

    @property
    def live(self) -> BitMap:
        """The live keys (a copy)."""
        return BitMap(self._live)

    def embeddings(self) -> dict[int, str]:
        """Key -> ``_embedding_f16_b64`` of the chunks that have a vector (a copy)."""
        return dict(self._embedding)

    # -- changes ---------------------------------------------------------------------

    def add(self, key: int, path: str, start_line: int, end_line: int, text: str,
            heading: str, metadata: Mapping[str, object]) -> None:
        """Append a chunk; ``key`` must be above every key the table has held."""
        if self._keys and key <= self._keys[-1]:
            raise ValueError(f"chunk keys must ascend: {key} after {self._keys[-1]}")
        if self._path_ids is None:
            self._path_ids = {p: i for i, p in enumerate(self._paths)}
        pid = self._path_ids.get(path)
        if pid is None:
            pid = self._path_ids[path] = len(self._paths)
            self._paths.append(path)
        t = text.encode("utf-8", "surrogatepass")
        h = heading.encode("utf-8", "surrogatepass")
        self._blob += t
        self._blob += h
        if metadata:
            self._blob += orjson.dumps(metadata if isinstance(metadata, dict) else dict(metadata))
        self._keys.append(key)
        self._ids.append(int(chunk_id(path, start_line, end_line, text), 16))
        self._path.append(pid)
        self._start.append(start_line)
        self._end.append(end_line)
        self._text_len.append(len(t))
        self._head_len.append(len(h))
        self._off.append(self._top + len(self._blob))
        self._live.add(key)
        self.version += 1

    def remove(self, key: int) -> None:
        if key not in self._live:
            return
        self._live.discard(key)
        self._embedding.pop(key, None)
        self._built.pop(key, None)
        self.version += 1
        dead = len(self._keys) - len(self._live)
        if dead >= DEAD_MIN_ROWS and dead > DEAD_FRACTION * len(self._keys):
            self._adopt(self._compacted())

    def embedding(self, key: int) -> str | None:
        """Chunk ``key``'s ``_embedding_f16_b64`` (None: no vector)."""
        return self._embedding.get(key)

    def set_embedding(self, key: int, value: str | None) -> None:
        self._built.pop(key, None)
        if value is None:
            self._embedding.pop(key, None)
        elif key in self._live:
            self._embedding[key] = value

    # -- persistence -----------------------------------------------------------------

    def records(self) -> Iterator[ChunkRecord]:
        """The QwenPaw chunk records of the live chunks, in key order.

        Made from the columns row by row (a commit writes every chunk, twice: see
        ``store/records.write_records_twice``), not through the chunks :meth:`__getitem__`
        builds and keeps for searches: no search of the whole key column per chunk, no
        metadata read key by key through its lazy mapping."""
        keys, ids, paths, path, start, end = (self._keys, self._ids, self._paths, self._path,
                                              self._start, self._end)
        row = 0
        for key in self._live:
            row = bisect_left(keys, key, row)  # both ascend: from the last row on
            text, heading, meta = self._fields(row)
            yield StoredChunk(key, f"{ids[row]:016x}", paths[path[row]], start[row], end[row],
                              text, heading, meta._dict() if isinstance(meta, _Metadata)
                              else meta, self._embedding.get(key)).to_record()

    def copy(self) -> ChunkTable:
        """An independent copy: the columns are copied, the bytes shared (sealed: see the
        module docstring); cheap enough to take under the lock."""
        self._seal()
        out = ChunkTable()
        for name in _COLUMNS:
            setattr(out, name, array(getattr(self, name).typecode, getattr(self, name)))
        out._base = self._base  # read-only: shared
        out._sealed = list(self._sealed)
        out._sealed_end = list(self._sealed_end)
        out._top = self._top
        out.version = self.version
        out._paths = list(self._paths)
        out._path_ids = None
        out._live = BitMap(self._live)
        out._embedding = dict(self._embedding)
        return out

    def to_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        """Plain numeric arrays (no objects: safe to persist without pickle). They are
        copies (a view would pin the growable columns), so the table may change afterwards."""
        arrays, blob = self._arrays()
        return {**arrays, "blob": np.frombuffer(b"".join(blob.parts), dtype=np.uint8)}

    def save_arrays(self) -> dict[str, npt.NDArray[np.generic] | ByteParts]:
        """:meth:`to_arrays` for ``write_arrays``: the bytes as the buffers they are in (a
        mapped file, sealed buffers), not joined into one copy."""
        arrays, blob = self._arrays()
        return {**arrays, "blob": blob}

    def _arrays(self) -> tuple[dict[str, npt.NDArray[np.generic]], ByteParts]:
        t = self._compacted() if len(self._keys) != len(self._live) else self
        paths_blob, paths_off = terms_to_arrays(t._paths)
        emb_keys = sorted(t._embedding)
        emb_blob, emb_off = terms_to_arrays([t._embedding[k] for k in emb_keys])
        return {
            "keys": np.array(t._keys, dtype=np.uint32),
            "ids": np.array(t._ids, dtype=np.uint64),
            "path": np.array(t._path, dtype=np.int32),
            "start": np.array(t._start, dtype=np.int32),
            "end": np.array(t._end, dtype=np.int32),
            "off": np.array(t._off, dtype=np.int64),
            "text_len": np.array(t._text_len, dtype=np.int32),
            "head_len": np.array(t._head_len, dtype=np.int32),
            "terms_blob": paths_blob, "terms_offsets": paths_off,
            "emb_keys": np.asarray(emb_keys, dtype=np.uint32),
            "emb_blob": emb_blob, "emb_offsets": emb_off,
        }, ByteParts(tuple(p for p in t._buffers() if len(p)))

    def _buffers(self) -> list[memoryview | bytearray]:
        return [self._base, *self._sealed, self._blob]

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, npt.NDArray[np.generic]]) -> ChunkTable:
        """The table saved by :meth:`to_arrays`; ValueError when the arrays disagree."""
        keys = checked_array(arrays, "keys", np.uint32)
        ids = checked_array(arrays, "ids", np.uint64)
        path = checked_array(arrays, "path", np.int32)
        start = checked_array(arrays, "start", np.int32)
        end = checked_array(arrays, "end", np.int32)
        off = checked_array(arrays, "off", np.int64)
        text_len = checked_array(arrays, "text_len", np.int32)
        head_len = checked_array(arrays, "head_len", np.int32)
        blob = checked_array(arrays, "blob", np.uint8)
        paths = load_terms(arrays)
        emb_keys = checked_array(arrays, "emb_keys", np.uint32)
        embeddings = load_terms(arrays, unique=False, prefix="emb_")
        if not _consistent(keys, (ids, start, end), path, off, text_len, head_len, len(blob),
                           len(paths)) or len(emb_keys) != len(embeddings):
            raise ValueError("chunk table arrays are inconsistent")
        t = cls()
        t._keys = array("I", keys.tobytes())
        t._ids = array("Q", ids.tobytes())
        t._path = array("i", path.tobytes())
        t._start = array("i", start.tobytes())
        t._end = array("i", end.tobytes())
        t._off = array("q", off.tobytes())
        t._text_len = array("i", text_len.tobytes())
        t._head_len = array("i", head_len.tobytes())
        t._base = blob.data  # no copy: a mapped file stays mapped
        t._top = len(blob)
        t._paths = paths
        t._path_ids = None
        t._live = BitMap(t._keys)
        live = t._live
        t._embedding = {k: v for k, v in zip(emb_keys.tolist(), embeddings, strict=True)
                        if k in live}
        return t

    def check(self) -> None:
        """ValueError unless the columns agree with each other and with the text bytes
        (keys ascending, every row's text and heading inside its byte range, the live keys
        among the rows): what a load checks, asked of the table as it is now."""
        def col(name: str, dtype: type[_S]) -> npt.NDArray[_S]:
            return np.frombuffer(getattr(self, name), dtype=dtype)

        if not _consistent(col("_keys", np.uint32), (col("_ids", np.uint64),
                           col("_start", np.int32), col("_end", np.int32)),
                           col("_path", np.int32), col("_off", np.int64),
                           col("_text_len", np.int32), col("_head_len", np.int32),
                           self._top + len(self._blob), len(self._paths)):
            raise ValueError("chunk table columns are inconsistent")
        missing = len(self._live - BitMap(self._keys))
        if missing:
            raise ValueError(f"{missing} live key(s) without a row")

    def adopt_extras(self, other: ChunkTable) -> None:
        """Take ``other``'s vectors and change count (this table stands in for it)."""
        self._embedding = {k: v for k, v in other._embedding.items() if k in self._live}
        self._built = {}
        self.version = other.version

    # -- internals -------------------------------------------------------------------

    def _row(self, key: int) -> int:
        if key not in self._live:
            raise KeyError(key)
        return bisect_left(self._keys, key)

    def _fields(self, row: int) -> tuple[str, str, Mapping[str, object]]:
        a, b = self._off[row], self._off[row + 1]
        t = a + self._text_len[row]
        h = t + self._head_len[row]
        data = self._bytes(a, b)
        # Searches never look at the metadata: parse it when something does.
        meta: Mapping[str, object] = _Metadata(bytes(data[h - a:])) if b > h else {}
        return (str(data[:t - a], "utf-8", "replace"), str(data[t - a:h - a], "utf-8", "replace"),
                meta)

    def _bytes(self, a: int, b: int) -> memoryview | bytearray:
        top = self._top
        if a >= top:
            return self._blob[a - top:b - top]  # a copy: never a view that pins the bytearray
        nb = len(self._base)
        if b <= nb:
            return self._base[a:b]
        i = bisect_right(self._sealed_end, a)
        start = self._sealed_end[i - 1] if i else nb
        return self._sealed[i][a - start:b - start]

    def _seal(self) -> None:
        """Keep the bytes added so far as a read-only buffer; append to a new one."""
        if self._blob:
            self._sealed.append(memoryview(self._blob).toreadonly())
            self._top += len(self._blob)
            self._sealed_end.append(self._top)
            self._blob = bytearray()

    def _compacted(self) -> ChunkTable:
        out = ChunkTable()
        live = self._live
        path_ids: dict[str, int] = {}
        out._path_ids = path_ids
        for row, key in enumerate(self._keys):
            if key not in live:
                continue
            a, b = self._off[row], self._off[row + 1]
            path = self._paths[self._path[row]]
            pid = path_ids.get(path)
            if pid is None:
                pid = path_ids[path] = len(out._paths)
                out._paths.append(path)
            out._blob += self._bytes(a, b)
            out._keys.append(key)
            out._ids.append(self._ids[row])
            out._path.append(pid)
            out._start.append(self._start[row])
            out._end.append(self._end[row])
            out._text_len.append(self._text_len[row])
            out._head_len.append(self._head_len[row])
            out._off.append(len(out._blob))
        out._live = BitMap(live)
        out._embedding = dict(self._embedding)
        return out

    def _adopt(self, other: ChunkTable) -> None:
        for name in (*_COLUMNS, *_BYTES, "_paths", "_path_ids", "_live", "_embedding"):
            setattr(self, name, getattr(other, name))
        self._built = {}


def _consistent(keys: npt.NDArray[np.uint32], same_length: tuple[npt.NDArray[np.generic], ...],
                path: npt.NDArray[np.int32], off: npt.NDArray[np.int64],
                text_len: npt.NDArray[np.int32], head_len: npt.NDArray[np.int32], blob_len: int,
                n_paths: int) -> bool:
    """Whether the columns of a table of ``len(keys)`` rows agree (see ``check``)."""
    n = len(keys)
    sizes = np.diff(off) if len(off) else off
    return not (
        any(len(a) != n for a in (*same_length, path, text_len, head_len))
        or len(off) != n + 1 or off[0] != 0 or off[-1] != blob_len
        or (n and (np.any(sizes < 0) or np.any(np.diff(keys.astype(np.int64)) <= 0)
                   or path.min() < 0 or path.max() >= n_paths
                   or text_len.min() < 0 or head_len.min() < 0
                   or np.any(text_len.astype(np.int64) + head_len > sizes))))
