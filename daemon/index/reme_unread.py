"""ReMe stores in a workspace that the import does not read, for its report.

The import reads ReMe 0.4.2's chunk store and embedding cache (:mod:`reme_import`). Other
stores of ReMe are there too in a workspace moved in from an older QwenPaw (CoPaw 1.0
ran ReMe 0.3 with the workspace folder as ReMe's working folder, store name ``copaw``):

- ``file_store/<store name>_chunks.jsonl``: ReMe 0.3's ``local`` chunk store (CoPaw's
  choice on Windows, or where chromadb does not load), plain JSONL, one chunk a line
  with its vector as a list of floats and no model named;
- ``file_store/chroma.sqlite3``, ``file_store/reme.db``, ``file_store/chunks_<name>/``:
  ReMe 0.3's ``chroma``, ``sqlite`` and ``zvec`` chunk stores;
- ``embedding_cache/embedding_cache.jsonl``: ReMe 0.3's embedding cache;
- ``<metadata_dir>/file_store/file_chunks_<name>_<version>.jsonl.zst`` other than the one
  read: a ReMe 0.4 configured with another store name or ``store_version``, or a later
  release;
- ``<metadata_dir>/embedding_store/<name>_<version>.npz``: the embedding cache of ReMe
  0.4.0 and 0.4.1, whose name (and keys) give no vector space, so which model made its
  vectors is not known (0.4.2 adds the space to the name; those are read).

None of them is read: their notes are chunked and embedded anew, and the provider is paid
for their vectors again. The report names each with its size and why, so that cost is
not a surprise. Only names and sizes are read, never through a symbolic link (one in
place of a folder is passed by). Blocking; call from worker threads.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Final, TypedDict

from recalld.daemon import safepath
from recalld.daemon.index.reme_import import CHUNK_STORE, EMBEDDING_DIR
from recalld.daemon.store import confine


class StoreNotRead(TypedDict):
    bytes: int
    why: str


_ANEW: Final = "its notes are chunked and embedded anew (the provider is paid again)"
_OLDER: Final = f"ReMe 0.3's {{}} (an older QwenPaw's), whose format recalld does not read: {_ANEW}"
_OTHER_V04: Final = ("a ReMe chunk store under another store name or store_version, or of a "
                     f"later ReMe, whose format is not known to be 0.4.2's: {_ANEW}")
#: ReMe 0.3's stores in its working folder ``file_store/``, by name: what they are.
_OLDER_FILE_STORE: Final = (
    (re.compile(r"^[A-Za-z0-9_]+_chunks\.jsonl$"), "chunk store of its local backend"),
    (re.compile(r"^chroma\.sqlite3$"), "chunk store of its chroma backend"),
    (re.compile(r"^reme\.db$"), "chunk store of its sqlite backend"),
    (re.compile(r"^chunks_[A-Za-z0-9_]+$"), "chunk store of its zvec backend"),
)
_OLDER_CACHE: Final = "embedding_cache/embedding_cache.jsonl"
#: ReMe 0.4.0's and 0.4.1's embedding cache (0.4.2's name ends with the space id).
_NO_SPACE_NPZ: Final = re.compile(r"^[^/]+_v\d+\.npz$")
_NO_SPACE_WHY: Final = ("the embedding cache of ReMe 0.4.0 or 0.4.1, which names no vector "
                        "space: which model made its vectors is not known, so none is used "
                        "(the chunk store's vectors are)")
#: A folder store's size counts at most this many of its entries.
_MAX_ENTRIES: Final = 10_000


def stores_not_read(root: Path, metadata_dir: str) -> dict[str, StoreNotRead]:
    """ReMe's stores below ``root`` that the import does not read: workspace-relative
    path -> its size in bytes (a folder's: of the files in it) and why it is not read.
    ReMe 0.3's are looked for in ``root`` (CoPaw's working folder for ReMe) and in
    ``metadata_dir`` (a ReMe 0.3 given that folder)."""
    out: dict[str, StoreNotRead] = {}
    for base in dict.fromkeys(("", metadata_dir.strip("/"))):
        folder = root / base if base else root
        prefix = f"{base}/" if base else ""
        for name in _folder_names(folder / "file_store"):
            for pattern, what in _OLDER_FILE_STORE:
                if pattern.match(name):
                    _add(out, root, f"{prefix}file_store/{name}", _OLDER.format(what))
        cache = Path(_OLDER_CACHE)
        if cache.name in _folder_names(folder / cache.parent):
            _add(out, root, f"{prefix}{_OLDER_CACHE}", _OLDER.format("embedding cache"))
    store = Path(CHUNK_STORE)
    for name in _folder_names(root / metadata_dir / store.parent):
        if (name.startswith("file_chunks_") and name.endswith(".jsonl.zst")
                and name != store.name):
            _add(out, root, f"{metadata_dir.strip('/')}/{store.parent}/{name}", _OTHER_V04)
    for name in _folder_names(root / metadata_dir / EMBEDDING_DIR):
        if _NO_SPACE_NPZ.match(name):
            _add(out, root, f"{metadata_dir.strip('/')}/{EMBEDDING_DIR}/{name}", _NO_SPACE_WHY)
    return dict(sorted(out.items()))


def other_chunk_stores(found: dict[str, StoreNotRead], metadata_dir: str) -> list[str]:
    """Of ``found``, ReMe 0.4's chunk stores under other names, relative to
    ``metadata_dir`` (as the report's ``reme_stores_not_read`` has always named them)."""
    prefix = f"{metadata_dir.strip('/')}/"
    return [rel.removeprefix(prefix) for rel in found
            if rel.startswith(prefix) and Path(rel).name.startswith("file_chunks_")]


def _add(out: dict[str, StoreNotRead], root: Path, rel: str, why: str) -> None:
    """``rel`` with its size and ``why``, named as a report shows a path: bytes that are
    not UTF-8 as ``\\xNN``, a name that looks like a credential masked."""
    size = _size(root / rel)
    if size is not None:
        out[safepath.shown_masked(rel)] = {"bytes": size, "why": why}


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _folder_names(folder: Path) -> list[str]:
    """The names in ``folder``; none when it is not a folder (a link in its place, say)
    or cannot be listed. Listed through the workspace folder's handles."""
    st = _lstat(folder)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return []
    try:
        return sorted(confine.listdir(folder))
    except OSError:
        return []


def _size(path: Path) -> int | None:
    """The size of the file ``path``, or of the files in the folder ``path`` (links not
    followed); None when it is neither, or gone."""
    st = _lstat(path)
    if st is None:
        return None
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    if not stat.S_ISDIR(st.st_mode):
        return None
    total = seen = 0
    for top, _, files in os.walk(path):
        for name in files:
            seen += 1
            found = _lstat(Path(top) / name)
            if found is not None and stat.S_ISREG(found.st_mode):
                total += found.st_size
            if seen >= _MAX_ENTRIES:
                return total
    return total


__all__ = ["StoreNotRead", "other_chunk_stores", "stores_not_read"]
