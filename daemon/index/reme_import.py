"""Reading what ReMe (QwenPaw's memory) stored under ``<metadata_dir>/``, to reuse it.

ReMe 0.4.2 keeps, beside the Markdown:

- its chunk store ``file_store/file_chunks_default_v1.jsonl.zst``: one JSON object per
  chunk (``path``, 1-based inclusive ``start_line``/``end_line``, ``text``, ``metadata``,
  the vector as ``_embedding_f16_b64``; ReMe 0.4.0 and 0.4.1 wrote it as ``embedding``,
  a list of numbers, in the same file). Its chunk text is Markdown *rendered* by its own
  chunker (heading breadcrumb, ``[Part X/N]``), so recalld's chunker never produces the
  same texts and no vector could be reused by text: ReMe's boundaries and texts are kept
  for a note as long as the note still says what those chunks say (``reme_chunks.py``);
- its embedding cache ``embedding_store/<name>_<version>_<space id>.npz`` per vector space:
  ``keys`` (SHA-256 of the text as ReMe truncated it) and ``embeddings`` (float16 rows).
  It is read with ``allow_pickle=False``; an archive with other members, dtypes or shapes
  is refused as a whole.

Vectors in the chunk store carry no vector space. They are reused only when ReMe's cache
holds a file for the configured space (its vectors were made there) or holds no file at
all; when ReMe's cache only knows other spaces, the chunk store's vectors are of one of
those and are not used. Nor are they when one of them differs from the vector ReMe's
cache of the configured space holds for the same text, or is the one its cache of another
space holds (ReMe changed its model and has not re-indexed yet): then only the stored
vectors the cache of the configured space confirms are used.

Nothing here writes: ReMe's files stay as ReMe wrote them. They are listed, looked at and
read through the workspace folder's handles (:mod:`confine`) and opened as state files
are (:func:`~recalld.daemon.store.fsio.open_state`): a link in place of one of ReMe's
folders reads nothing of another folder, and a FIFO or a device named like one of its
files is passed by, never waited on. Blocking; call from worker threads.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
import orjson
import zstandard

from recalld.daemon import safepath
from recalld.daemon.arraytypes import F32
from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.index.embedcache import decode_f16, encode_f16
from recalld.daemon.index.reme_chunks import ReMeChunk
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.providers.embedding_formats import DEFAULT_BASE_URLS
from recalld.daemon.store import confine
from recalld.daemon.store.errors import CorruptState, StorageError
from recalld.daemon.store.fsio import REAL, open_state
from recalld.daemon.store.records import ZSTD_MAGIC, read_foreign_records
from recalld.ipc.errors import RecalldError

if TYPE_CHECKING:
    import zipfile

log = logging.getLogger(__name__)

CHUNK_STORE: Final = "file_store/file_chunks_default_v1.jsonl.zst"
EMBEDDING_DIR: Final = "embedding_store"
# The endpoint ReMe 0.4.2 records in a vector space when its config names none (what
# QwenPaw writes for an empty ``base_url``), by backend: its wrapper's default, or the
# default of the AgentScope credential (DashScope's OpenAI-compatible URL; Gemini's
# credential has no endpoint at all). ReMe prefers OPENAI_BASE_URL / OLLAMA_HOST when
# set; recalld's provider does not read them, so its vectors come from these.
_REME_ENDPOINTS: Final = {
    "openai": "https://api.openai.com/v1",
    "ollama": "http://127.0.0.1:11434",
    "dashscope": "https://dashscope.aliyuncs.com/compatible-mode/v1",
    "dashscope_multimodal": "https://dashscope.aliyuncs.com/compatible-mode/v1",
    "gemini": "",
}
_NPZ_NAME: Final = re.compile(r"^(?P<name>.+)_(?P<version>v\d+)_(?P<space>[0-9a-f]{12})\.npz$")
# An archive bigger than this is not an embedding cache of a workspace (1 GB: ~500k
# vectors of 1,024 dimensions).
MAX_NPZ_BYTES: Final = 1 << 30
#: A vector as ReMe's cache keeps it.
F16 = npt.NDArray[np.float16]


@dataclass(slots=True)
class ReMeStore:
    """What ReMe's chunk store holds: chunk boundaries by note, and every stored vector."""

    chunks: dict[str, list[ReMeChunk]] = field(default_factory=dict)
    #: ``(text, _embedding_f16_b64)`` of every record with both.
    vectors: list[tuple[str, str]] = field(default_factory=list)
    records: int = 0
    #: Records that give no chunk boundaries (malformed, recalld's own former mirrors, or
    #: one chunk again: its ``id``, or its note, lines and text, on a later line).
    skipped: int = 0
    #: Why part of the file could not be read (its notes are chunked and embedded anew).
    damaged: str | None = None

    def __len__(self) -> int:
        return sum(len(cs) for cs in self.chunks.values())

    def summary(self) -> dict[str, int | str]:
        """Its counts, as the import report gives them (and the damage, if any)."""
        out: dict[str, int | str] = {"records": self.records, "chunks": len(self),
                                     "notes": len(self.chunks), "skipped": self.skipped,
                                     "vectors": len(self.vectors)}
        if self.damaged is not None:
            out["damaged"] = self.damaged
        return out


def read_store(metadata_dir: Path) -> ReMeStore | None:
    """ReMe's chunk store under ``metadata_dir``; None when there is none or it cannot be
    read. Records that are not ReMe chunks (recalld's own former mirrors carry a ``key``)
    or are malformed give no boundaries (counted in ``skipped``); their vectors count.
    A chunk on several lines is read once, from its last (the others are ``skipped``)."""
    path = metadata_dir / CHUNK_STORE
    if not path.is_file():
        return None
    try:
        found = read_foreign_records(path)
    except (OSError, StorageError) as exc:
        log.warning("cannot read ReMe's chunk store %s: %s", path, exc)
        return None
    store = ReMeStore(records=len(found.records), damaged=found.damage())
    if store.damaged is not None:
        log.warning("ReMe's chunk store %s is damaged (%s): the notes it lost are chunked "
                    "and embedded anew", path, store.damaged)
    records = _last_of_each(found.records)
    store.skipped = len(found.records) - len(records)
    for rec in records:
        text, emb = rec.get("text"), _vector_of(rec)
        if isinstance(text, str) and emb is not None:
            store.vectors.append((text, emb))
        chunk = _chunk_of(rec)
        if chunk is None:
            store.skipped += 1
            continue
        store.chunks.setdefault(chunk[0], []).append(chunk[1])
    for chunks in store.chunks.values():
        chunks.sort(key=lambda c: (c.start_line, c.end_line))
    return store


def _last_of_each(records: Sequence[JsonObject]) -> list[JsonObject]:
    """``records`` with each chunk once, at its last line: a record repeats an earlier one
    with the same ``id`` (ReMe loads its store by id, the last record of an id winning)
    or the same note, lines and text. Two of one chunk would make their note's lines say
    its text twice, which no note does: none of its chunks would be kept."""
    ids: set[str] = set()
    chunks: set[tuple[object, ...]] = set()
    out: list[JsonObject] = []
    for rec in reversed(records):
        rid = rec.get("id")
        same = (rec.get("path"), rec.get("start_line"), rec.get("end_line"), rec.get("text"))
        if (isinstance(rid, str) and rid in ids) or (
                all(isinstance(v, str | int) for v in same) and same in chunks):
            continue
        if isinstance(rid, str):
            ids.add(rid)
        chunks.add(same)
        out.append(rec)
    out.reverse()
    return out


def _names(folder: Path) -> list[str]:
    """The names in ReMe's ``folder`` (none when it cannot be listed), listed through
    the workspace folder's handles."""
    try:
        return sorted(confine.listdir(folder))
    except OSError:
        return []


def _chunk_of(rec: Mapping[str, object]) -> tuple[str, ReMeChunk] | None:
    path, text = rec.get("path"), rec.get("text")
    start, end = rec.get("start_line"), rec.get("end_line")
    if not (isinstance(path, str) and path and isinstance(text, str)
            and type(start) is int and type(end) is int and 1 <= start <= end):
        return None
    if _mirrored_chunk(rec):
        return None  # written by recalld, not ReMe
    try:
        safepath.split_relative(path)
    except RecalldError:  # a NUL byte, absolute, ``..``, a name too long: no note's chunk
        return None
    return path, ReMeChunk(start, end, text, _vector_of(rec))


def _vector_of(rec: Mapping[str, object]) -> str | None:
    """A record's vector as ``_embedding_f16_b64`` (ReMe 0.4.2's); ReMe 0.4.0 and 0.4.1
    wrote ``embedding``, a list of numbers, which ReMe still reads. None: no vector, or one
    with a value that is no number, out of float16's range, or all zeros."""
    value = rec.get("_embedding_f16_b64")
    if isinstance(value, str):
        return value
    value = rec.get("embedding")
    if not (isinstance(value, list) and value
            and all(type(v) in (int, float) for v in value)):
        return None
    with np.errstate(over="ignore"):
        row = np.asarray(value, dtype="<f2")
    if not np.isfinite(row).all() or not row.any():
        return None
    return encode_f16(row)


# ------------------------------------------------------ what older recalld versions wrote


def _mirrored_chunk(rec: Mapping[str, object]) -> bool:
    """Whether ``rec`` is a chunk an older recalld wrote: its metadata holds its int
    ``key`` and its ``heading``, and it has none of the ``scores`` every chunk ReMe
    writes has. A ``key`` alone is no sign: a ReMe set to copy each note's frontmatter
    into its chunks' metadata (``include_frontmatter_in_metadata``) puts a note's
    ``key:`` field there, and such a store is ReMe's, never to be removed."""
    meta = rec.get("metadata")
    return (isinstance(meta, Mapping) and type(meta.get("key")) is int
            and isinstance(meta.get("heading"), str) and "scores" not in rec)


#: Files older recalld versions wrote under ReMe's names (copies of their own index
#: state), each with what only recalld's records hold.
OWN_MIRRORS: Final[dict[str, Callable[[Mapping[str, object]], bool]]] = {
    CHUNK_STORE: _mirrored_chunk,
    "file_graph/default.jsonl.zst": lambda r: "src" in r and "dst" in r and "kind" in r,
    "file_catalog/default.jsonl.zst": lambda r: "mtime_ns" in r and "keys" in r,
}


def first_record(path: Path, limit: int = 1 << 16) -> JsonObject | None:
    """The first JSON record of a (zstd) JSONL file, reading at most ``limit`` bytes of
    it; None when empty or unreadable."""
    try:
        with open_state(path) as f:
            head = f.read(4)
            f.seek(0)
            if head == ZSTD_MAGIC:
                data = zstandard.ZstdDecompressor().stream_reader(f).read(limit)
            else:
                data = f.read(limit)
        rec = orjson.loads(data.split(b"\n", 1)[0])
    except (OSError, StorageError, zstandard.ZstdError, orjson.JSONDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def remove_own_mirrors(metadata_dir: Path) -> list[str]:
    """Delete what an older recalld version wrote under ReMe's names (ReMe loads none of
    it; reading it again at every start would cost as much as the index itself). ReMe's
    own files are told apart by their records and left alone. Returns what was removed."""
    removed: list[str] = []
    for rel, ours in OWN_MIRRORS.items():
        path = metadata_dir / rel
        rec = first_record(path) if path.is_file() else None
        if rec is not None and ours(rec):
            try:
                REAL.unlink(path)
                removed.append(rel)
            except OSError as exc:
                log.warning("cannot remove %s: %s", path, exc)
    return removed


# ---------------------------------------------------------------------- vector spaces


def space_id(config: EmbeddingModelConfig) -> str:
    """The id ReMe gives the vector space of ``config`` (its cache file name): a digest of
    backend, model, dimensions and endpoint. No endpoint, or the one recalld calls when
    none is named, is the one ReMe records for none: the same service."""
    endpoint = config.base_url.strip().rstrip("/")
    if config.backend in _REME_ENDPOINTS and endpoint in ("", DEFAULT_BASE_URLS[config.backend]):
        endpoint = _REME_ENDPOINTS[config.backend]
    parts = (config.backend, config.model_name, str(config.dimensions), endpoint)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


def text_key(text: str, max_input_length: int) -> str:
    """ReMe's cache key of an input: SHA-256 of the text cut to its character budget
    (ASCII: ``max_input_length`` characters; otherwise wide characters count 1.5, others
    1, against 92 % of the budget)."""
    return hashlib.sha256(_cut(text, max_input_length).encode()).hexdigest()


def mostly_embedded(text: str, max_input_length: int) -> bool:
    """Whether ReMe's vector of ``text`` covers at least half of it (ReMe cuts what it
    sends to ``max_input_length``, see :func:`text_key`)."""
    return 2 * len(_cut(text, max_input_length)) >= len(text)


def _cut(text: str, limit: int) -> str:
    limit = max(0, limit)
    if text.isascii():
        return text[:limit]
    budget = limit * 2 * 92 // 100  # in half units
    used = 0
    for i, ch in enumerate(text):
        used += 3 if unicodedata.east_asian_width(ch) in ("W", "F") else 2
        if used > budget:
            return text[:i]
    return text


def seed_key(metadata_dir: Path, config: EmbeddingModelConfig, space: str) -> JsonObject:
    """What a seeding of recalld's vector ``space`` from ReMe's files depends on besides
    the chunk store: the space, how ReMe keys and cuts texts for ``config``, and the size,
    mtime and inode of each of ReMe's cache files (which vouch for the store's vectors)."""
    files: list[list[object]] = []
    folder = metadata_dir / EMBEDDING_DIR
    for name in _names(folder):
        if not name.endswith(".npz"):
            continue
        try:
            st = confine.stat_file(folder / name)
        except OSError:
            continue
        files.append([name, st.st_size, st.st_mtime_ns, st.st_ino])
    return {"space": space, "reme_space": space_id(config), "dims": config.dimensions,
            "max_input_length": config.max_input_length, "npz": files}


@dataclass(slots=True)
class ReMeEmbeddings:
    """ReMe's embedding cache for one space: ReMe text key -> float16 vector."""

    space: str
    vectors: dict[str, F16] = field(default_factory=dict)
    #: ReMe cache files found for other spaces.
    other_spaces: list[str] = field(default_factory=list)
    #: The vectors of those of the same dimensions (key -> vector, one dict a file): what
    #: tells the chunk store's vectors of a former model apart.
    others: list[dict[str, F16]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def space_known(self) -> bool:
        """Whether ReMe's cache has a file for this space, or none for any space."""
        return bool(self.vectors) or not self.other_spaces


def read_embeddings(metadata_dir: Path, config: EmbeddingModelConfig) -> ReMeEmbeddings:
    """ReMe's cached vectors of ``config``'s space (empty when ReMe has none)."""
    sid = space_id(config)
    out = ReMeEmbeddings(sid)
    folder = metadata_dir / EMBEDDING_DIR
    for path in (folder / name for name in _names(folder)):
        m = _NPZ_NAME.match(path.name)
        if m is None:
            continue
        if m["space"] != sid:
            out.other_spaces.append(m["space"])
            try:
                out.others.append(load_npz(path, config.dimensions))
            except ValueError:
                pass  # other dimensions (or unreadable): no vector of this space to confuse
            continue
        try:
            out.vectors.update(load_npz(path, config.dimensions))
        except ValueError as exc:
            out.refused[path.name] = str(exc)
            log.warning("ReMe embedding cache %s refused: %s", path, exc)
    return out


def load_npz(path: Path, dims: int) -> dict[str, F16]:
    """``keys`` -> row of ``embeddings`` from one of ReMe's cache files. Only an archive of
    exactly those two plain arrays is read (no pickled objects: ``allow_pickle=False``);
    anything else raises ValueError, as does an archive with no finite vector (one with
    some gives those; rows of zeros are left out)."""
    import zipfile  # only an import with ReMe's caches reads one
    import zlib

    try:
        # Opened as a state file is: a FIFO in its place is not waited on, a link there
        # is not followed (both are refused as damage).
        with open_state(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_NPZ_BYTES:
                raise ValueError(f"{size} bytes is more than an embedding cache holds")
            with zipfile.ZipFile(f) as zf:
                members = sorted(zf.namelist())
                if members != ["embeddings.npy", "keys.npy"]:
                    raise ValueError(f"unexpected members {members[:5]}")
                _check_sizes(zf)
            f.seek(0)
            with np.load(f, allow_pickle=False) as data:
                keys, emb = data["keys"], data["embeddings"]
    except CorruptState as exc:
        raise ValueError(exc.reason) from None
    except (OSError, StorageError, zipfile.BadZipFile, zlib.error, EOFError,
            KeyError) as exc:
        raise ValueError(f"not a readable archive: {exc}") from None
    if keys.dtype.kind != "U" or keys.ndim != 1:
        raise ValueError(f"keys of dtype {keys.dtype} and shape {keys.shape}")
    if emb.dtype.kind != "f" or emb.ndim != 2 or emb.shape[0] != keys.shape[0]:
        raise ValueError(f"embeddings {emb.dtype}{list(emb.shape)} for {len(keys)} keys")
    if emb.shape[1] != dims:
        raise ValueError(f"vectors of {emb.shape[1]} dimensions, expected {dims}")
    rows = emb.astype("<f2")
    finite = np.isfinite(rows).all(axis=1)
    if len(rows) and not finite.any():
        raise ValueError("non-finite values")
    usable = finite & rows.any(axis=1)
    if not usable.all():  # past float16's range, or no direction: that vector is left out
        log.warning("ReMe embedding cache %s: %d vector(s) with non-finite values or all "
                    "zeros left out", path, int((~usable).sum()))
    return {str(k): rows[i] for i, k in enumerate(keys) if usable[i]}


def _check_sizes(zf: zipfile.ZipFile) -> None:
    """ValueError unless the archive's arrays unpack to at most ``MAX_NPZ_BYTES`` and each
    array's header declares no more data than its member holds: numpy allocates what a
    header declares before it reads (a damaged one asked for terabytes, and the
    MemoryError failed the whole workspace)."""
    total = sum(info.file_size for info in zf.infolist())
    if total > MAX_NPZ_BYTES:
        raise ValueError(f"{total} bytes unpacked is more than an embedding cache holds")
    for info in zf.infolist():
        with zf.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise ValueError(f"{info.filename}: .npy format {version} not read")
        declared = math.prod(shape) * dtype.itemsize
        if declared > info.file_size:
            raise ValueError(f"{info.filename} declares {declared} bytes of data, "
                             f"more than its {info.file_size}")


#: Two vectors of one text closer than this (cosine) are of one space: a provider's own
#: noise and float16 rounding stay far above it, another model's vectors far below.
SAME_SPACE_COSINE: Final = 0.98


def stored_vectors(found: Sequence[tuple[str, str]], cache: ReMeEmbeddings, dims: int,
                   max_input_length: int) -> tuple[list[tuple[str, F32]], int, int]:
    """The chunk store's vectors that can serve ``cache``'s space, as ``(text, vector)``,
    how many of them were shown to be of another space, and how many have other
    dimensions than ``dims``.

    None when ReMe's cache names only other spaces. A vector whose text ReMe's cache of
    this space also holds is checked against it; one that differs from it, or that
    matches what ReMe's cache of another space holds for its text, is of another space
    (ReMe changed its embedding model and the store still holds the former model's
    vectors). Once one is, only the vectors shown to agree are used. Malformed vectors
    and other dimensions are skipped.
    """
    if not cache.space_known:
        return [], 0, 0
    agreed: list[tuple[str, F32]] = []
    unchecked: list[tuple[str, F32]] = []
    other = other_dims = 0
    for text, value in found:
        try:
            vec = decode_f16(value)
        except ValueError:
            continue
        if vec.shape[0] != dims:
            other_dims += 1
            continue
        key = text_key(text, max_input_length)
        row = cache.vectors.get(key)
        if row is not None:
            if _same(vec, row):
                agreed.append((text, vec))
            else:
                other += 1
        elif any(key in o and _same(vec, o[key]) for o in cache.others):
            other += 1
        else:
            unchecked.append((text, vec))
    if other:
        log.warning("ReMe's chunk store holds %d vector(s) of another embedding space; "
                    "only the %d its cache of this space confirms are reused", other,
                    len(agreed))
        return agreed, other, other_dims
    return agreed + unchecked, 0, other_dims


def _same(vec: F32, row: F16) -> bool:
    """Whether two vectors of one text come from one space."""
    b = row.astype(np.float32)
    norm = float(np.linalg.norm(vec) * np.linalg.norm(b))
    return norm > 0 and float(np.dot(vec, b)) / norm >= SAME_SPACE_COSINE


__all__ = ["CHUNK_STORE", "OWN_MIRRORS", "ReMeChunk", "ReMeEmbeddings", "ReMeStore",
           "first_record", "load_npz", "mostly_embedded",
           "read_embeddings", "read_store",
           "remove_own_mirrors", "seed_key", "space_id", "stored_vectors", "text_key"]
