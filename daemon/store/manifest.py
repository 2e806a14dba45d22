"""Generations of derived state; the manifest file is the only commit point.

A state directory holds immutable data files named per generation
(``bm25.g000042.arr``, from ``gen_name``) and ``MANIFEST-<gen>.json`` files. A manifest
lists every data file of its generation with size, blake2b checksum and record count, and
carries a checksum of its own body. Committing a generation is: write the data files (each
atomically), then write the manifest atomically. A crash before the manifest's rename
leaves the previous generation in charge and the new data files as orphans, removed by the
next ``cleanup`` (run by ``open`` and after every commit). A data file is never rewritten
while a manifest names it, because each generation writes new names; a file that did not
change is simply listed again by the next manifest.

Fixed names (the QwenPaw chunk store ``file_store/file_chunks_default_v1.jsonl.zst``)
are mirrors: the manifest names the generation file as the authority and records the fixed
path; right after the manifest is durable the fixed path is atomically replaced by a hard
link to the generation file (a copy where links are unsupported). A crash between the two
leaves a stale mirror, which ``open`` detects (different inode and checksum) and
re-publishes; if the generation file itself is bad the logical file is reported corrupt,
and the caller rebuilds it. See docs/adr/0004-storage-generations.md.

``load`` picks the newest manifest that verifies and whose files all verify; failing that
an older fully valid one; failing that the newest valid manifest with a per-file report
(``Generation.corrupt``) so the caller rebuilds only what is broken while the rest serves.
A generation passed by for a sound older one is never kept by ``cleanup`` as a fallback.

One writer per state directory (the caller holds the lock); nothing here is thread-safe.
Everything blocks: run it in a worker thread.
"""

from __future__ import annotations

import re
import stat
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Literal, NotRequired, TypedDict

import orjson

from recalld.daemon.store import confine
from recalld.daemon.store.errors import (
    CorruptState,
    StorageError,
    UnsupportedVersion,
    translate_os_error,
)
from recalld.daemon.store.fsio import (
    FS,
    REAL,
    FileEntry,
    atomic_write,
    checksum,
    ensure_dir,
    publish_copy,
    read_verified,
    remove_temp_files,
    verify_file,
)
from recalld.daemon.store.generation import Generation, manifest_name

FORMAT = "recalld-manifest"
VERSION = 1
MANIFEST_RE = re.compile(r"^MANIFEST-(\d{6,})\.json$")
GEN_FILE_RE = re.compile(r"^[A-Za-z0-9_-]+\.g(\d{6,})(?:\.[A-Za-z0-9]+)*$")
_STEM_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_SUFFIX_RE = re.compile(r"^(?:\.[A-Za-z0-9]+)*$")
_HEAD = b'{"manifest":'
_TAIL_RE = re.compile(rb',"blake2b":"([0-9a-f]{64})"\}\n\Z')

Verify = Literal["size", "checksum"]


class GenerationStore:
    """The generations of one state directory (see the module docstring).

    ``keep`` is how many manifests survive a cleanup (the newest ones, and always the
    current one). Mirror paths are relative to ``mirror_root`` (default: ``state_dir``).
    """

    def __init__(
        self,
        state_dir: Path,
        fs: FS = REAL,
        *,
        mirror_root: Path | None = None,
        keep: int = 2,
        publish_mirrors: bool = True,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.state_dir = Path(state_dir)
        self.mirror_root = Path(mirror_root) if mirror_root is not None else self.state_dir
        self.fs = fs
        self.keep = keep
        #: False: ``open`` does not re-publish the mirrors an older generation lists.
        self.publish_mirrors = publish_mirrors
        self.current: Generation | None = None
        #: Manifests the last ``load`` passed by, newest first: (name, why).
        self.skipped: list[tuple[str, str]] = []
        #: Generations a load passed by for a sound older one: never kept as a fallback.
        self._damaged: set[int] = set()
        self._next = 1

    # -- naming ---------------------------------------------------------------------

    @property
    def next_number(self) -> int:
        """The number the next commit will get (data files should carry it)."""
        return self._next

    def gen_name(self, stem: str, suffix: str) -> str:
        """A data file name for the next generation: ``gen_name("bm25", ".arr")``."""
        if not _STEM_RE.match(stem) or not _SUFFIX_RE.match(suffix):
            raise ValueError(f"bad data file stem or suffix: {stem!r} {suffix!r}")
        return f"{stem}.g{self._next:06d}{suffix}"

    def gen_path(self, stem: str, suffix: str) -> Path:
        """``state_dir / gen_name(stem, suffix)``; creates the state directory if needed."""
        ensure_dir(self.fs, self.state_dir)
        return self.state_dir / self.gen_name(stem, suffix)

    # -- opening --------------------------------------------------------------------

    def open(self, *, verify: Verify = "checksum",
             defer: Collection[str] = ()) -> Generation | None:
        """Load the best generation, remove leftovers, re-publish stale mirrors.

        Returns None when no valid manifest exists (a fresh or wholly corrupt directory:
        the caller builds generation 1 from the Markdown). Files named in ``defer`` get a
        size check only; their checksums wait for ``Generation.verify_deferred``.
        """
        ensure_dir(self.fs, self.state_dir)
        gen = self.load(verify=verify, defer=defer)
        if gen is not None:
            gen.remember_stats()
        self.current = gen
        self.cleanup()
        if gen is not None and self.publish_mirrors:
            self._publish_mirrors(gen, only_stale=True)
        return gen

    def load(self, *, verify: Verify = "checksum",
             defer: Collection[str] = ()) -> Generation | None:
        """The best generation on disk (no changes to the disk; see module docstring)."""
        numbers = self.manifest_numbers()
        if numbers:
            self._next = max(self._next, numbers[0] + 1)
        fallback: Generation | None = None
        skipped: list[tuple[str, str]] = []
        passed: list[int] = []
        self.skipped = skipped
        for number in numbers:
            try:
                gen = self.read_manifest(number)
            except CorruptState as exc:
                skipped.append((manifest_name(number), exc.reason))
                continue
            self._check_files(gen, verify, defer)
            if gen.ok:
                gen.skipped = skipped
                self._damaged.update(passed)
                return gen
            if fallback is None:
                # What it passed by are the newer ones; older ones tried after it would
                # never serve in its place.
                gen.skipped = list(skipped)
                fallback = gen
            skipped.append((manifest_name(number), "corrupt files: " + ", ".join(gen.corrupt)))
            passed.append(number)
        if fallback is not None:
            self.skipped = fallback.skipped
        return fallback

    def manifest_numbers(self) -> list[int]:
        """Manifest generation numbers on disk, newest first."""
        try:
            names = self.fs.listdir(self.state_dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _io(exc, self.state_dir) from exc
        found = (MANIFEST_RE.match(name) for name in names)
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def read_manifest(self, number: int) -> Generation:
        """Parse and verify ``MANIFEST-<number>.json`` (not its files); CorruptState if bad."""
        path = self.state_dir / manifest_name(number)
        data = read_verified(path, None)
        tail = _TAIL_RE.search(data)
        if not data.startswith(_HEAD) or tail is None:
            raise CorruptState(path, "not a manifest (bad framing)")
        body = data[len(_HEAD) : tail.start()]
        if checksum(body) != tail.group(1).decode():
            raise CorruptState(path, "manifest checksum mismatch")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise CorruptState(path, f"bad manifest JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CorruptState(path, "not a recalld manifest")
        if doc.get("version") != VERSION:
            raise UnsupportedVersion(path, f"manifest version {doc.get('version')!r}")
        if doc.get("generation") != number:
            raise CorruptState(path, f"names generation {doc.get('generation')!r}")
        created, files = doc.get("created"), doc.get("files")
        if not isinstance(created, int | float) or not isinstance(files, dict):
            raise CorruptState(path, "manifest lacks created or files")
        entries: dict[str, FileEntry] = {}
        mirrors: dict[str, str] = {}
        for logical, raw in files.items():
            entry, mirror = _parse_entry(path, logical, raw)
            entries[logical] = entry
            if mirror is not None:
                mirrors[logical] = mirror
        return Generation(number, float(created), entries, mirrors, self.state_dir,
                          self.mirror_root)

    def _check_files(self, gen: Generation, verify: Verify, defer: Collection[str]) -> None:
        for logical, entry in gen.files.items():
            path = gen.path(logical)
            try:
                if verify == "checksum" and logical not in defer:
                    verify_file(path, entry)
                    gen.verified.add(logical)
                else:
                    _check_size(path, entry)
                    if verify == "checksum":
                        gen.deferred.add(logical)
            except CorruptState as exc:
                gen.corrupt[logical] = exc.reason

    # -- committing -----------------------------------------------------------------

    def commit(
        self, files: Mapping[str, FileEntry], mirrors: Mapping[str, str] | None = None
    ) -> Generation:
        """Make ``files`` (already written, in ``state_dir``) the current generation.

        ``mirrors`` maps logical names to fixed paths (relative to ``mirror_root``) that
        get a replica of the file once the manifest is durable. Raises StorageError /
        DiskFull if the manifest cannot be written: then the previous generation stays
        current, and data files no manifest names are removed. Mirror failures do not fail
        the commit; they are reported in ``Generation.mirror_errors`` and retried by
        ``open``.
        """
        mirrors = dict(mirrors or {})
        for logical, entry in files.items():
            _check_name(entry.name)
            _check_size(self.state_dir / entry.name, entry)
            if logical in mirrors:
                _check_rel(mirrors[logical])
        unknown = set(mirrors) - set(files)
        if unknown:
            raise ValueError(f"mirrors for unknown files: {sorted(unknown)}")
        number = self._next
        # Never reuse a number, even if this attempt fails after its manifest got visible.
        self._next += 1
        gen = Generation(number, time.time(), dict(files), mirrors, self.state_dir,
                         self.mirror_root)
        try:
            ensure_dir(self.fs, self.state_dir)
            atomic_write(self.fs, self.state_dir / manifest_name(number), _encode(gen))
        except BaseException:
            self._quiet_cleanup()
            raise
        gen.verified.update(files)  # their checksums were taken as they were written
        gen.remember_stats()
        self.current = gen
        self._publish_mirrors(gen, only_stale=False)
        self._quiet_cleanup()
        return gen

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Write data files and commit them as one generation.

        ``with store.transaction() as txn: txn.add("bm25", write_arrays(store.fs,
        txn.path("bm25", ".arr"), ...))``. Files of the current generation not added
        again are dropped unless ``txn.carry(logical)`` is called. On a clean exit the
        generation is committed (``txn.generation``); if the block raises, the files it
        wrote are removed and the previous generation stays current.
        """
        txn = Transaction(self)
        try:
            yield txn
        except BaseException:
            self._quiet_cleanup()
            raise
        txn.generation = self.commit(txn.files, txn.mirrors)

    # -- cleanup --------------------------------------------------------------------

    def cleanup(self, keep: int | None = None) -> list[str]:
        """Remove temp files, manifests beyond ``keep`` (default: the store's) and
        unreferenced generation files.

        Returns the removed names. Only names this module produces are ever removed.
        """
        keep = self.keep if keep is None else max(1, keep)
        removed = remove_temp_files(self.fs, self.state_dir)
        kept: list[Generation] = [] if self.current is None else [self.current]
        doomed: list[str] = []
        for number in self.manifest_numbers():
            if self.current is not None and number == self.current.number:
                continue
            if len(kept) < keep and number not in self._damaged:
                try:
                    kept.append(self.read_manifest(number))
                    continue
                except CorruptState:
                    pass
            doomed.append(manifest_name(number))
        # Manifests go first: a data file is only removed once no manifest on disk names it.
        referenced = {e.name for g in kept for e in g.files.values()}
        for name in doomed:
            self._unlink(self.state_dir / name)
        removed += doomed
        try:
            names = self.fs.listdir(self.state_dir)
        except FileNotFoundError:
            names = []
        except OSError as exc:
            raise _io(exc, self.state_dir) from exc
        for name in names:
            if GEN_FILE_RE.match(name) and name not in referenced:
                self._unlink(self.state_dir / name)
                removed.append(name)
        for parent in {(self.mirror_root / rel).parent for g in kept for rel in g.mirrors.values()}:
            removed += remove_temp_files(self.fs, parent)
        return removed

    def _quiet_cleanup(self) -> None:
        try:
            self.cleanup()
        except StorageError:
            pass  # best effort: the next open cleans up again

    def _unlink(self, path: Path) -> None:
        try:
            self.fs.unlink(path)
        except (FileNotFoundError, IsADirectoryError):
            pass  # a directory of that name was not written here: it is left alone
        except OSError as exc:
            raise _io(exc, path) from exc

    # -- mirrors --------------------------------------------------------------------

    def _publish_mirrors(self, gen: Generation, *, only_stale: bool) -> None:
        for logical, rel in gen.mirrors.items():
            if logical in gen.corrupt:
                continue
            src, dst = gen.path(logical), self.mirror_root / rel
            try:
                if only_stale and _same_file(src, dst, gen.files[logical]):
                    continue
                ensure_dir(self.fs, dst.parent)
                publish_copy(self.fs, src, dst)
            except StorageError as exc:
                gen.mirror_errors[logical] = exc.message
                continue
            gen.mirror_errors.pop(logical, None)
            if only_stale:
                gen.mirrors_repaired.append(logical)


class Transaction:
    """Files being assembled into the next generation (see ``GenerationStore.transaction``)."""

    def __init__(self, store: GenerationStore) -> None:
        self._store = store
        self.files: dict[str, FileEntry] = {}
        self.mirrors: dict[str, str] = {}
        self.generation: Generation | None = None

    def path(self, stem: str, suffix: str) -> Path:
        """Where to write a new data file of this generation."""
        return self._store.gen_path(stem, suffix)

    def add(self, logical: str, entry: FileEntry, *, mirror: str | None = None) -> None:
        self.files[logical] = entry
        if mirror is not None:
            self.mirrors[logical] = mirror
        else:
            self.mirrors.pop(logical, None)

    def carry(self, logical: str) -> None:
        """Keep the current generation's ``logical`` file (and its mirror) unchanged.

        Raises KeyError if there is none and CorruptState if it is known to be damaged.
        """
        current = self._store.current
        if current is None or logical not in current.files:
            raise KeyError(logical)
        if logical in current.corrupt:
            raise CorruptState(current.path(logical), current.corrupt[logical])
        self.add(logical, current.files[logical], mirror=current.mirrors.get(logical))


class ManifestFile(TypedDict):
    """One logical file of a generation, as the manifest names it."""

    name: str
    size: int
    checksum: str
    records: int | None
    mirror: NotRequired[str]


def _encode(gen: Generation) -> bytes:
    files: dict[str, ManifestFile] = {}
    for logical, entry in gen.files.items():
        item: ManifestFile = {
            "name": entry.name, "size": entry.size, "checksum": entry.checksum,
            "records": entry.records,
        }
        if logical in gen.mirrors:
            item["mirror"] = gen.mirrors[logical]
        files[logical] = item
    body = orjson.dumps(
        {"format": FORMAT, "version": VERSION, "generation": gen.number,
         "created": gen.created, "files": files},
        option=orjson.OPT_INDENT_2,
    )
    return _HEAD + body + b',"blake2b":"' + checksum(body).encode() + b'"}\n'


def _parse_entry(path: Path, logical: object, raw: object) -> tuple[FileEntry, str | None]:
    if not isinstance(raw, dict):
        raise CorruptState(path, f"entry {logical!r} is not an object")
    name, size, digest = raw.get("name"), raw.get("size"), raw.get("checksum")
    records, mirror = raw.get("records"), raw.get("mirror")
    if (
        not isinstance(name, str)
        or type(size) is not int
        or not isinstance(digest, str)
        or not (records is None or type(records) is int)
        or not (mirror is None or isinstance(mirror, str))
    ):
        raise CorruptState(path, f"entry {logical!r} is malformed")
    try:
        _check_name(name)
        if mirror is not None:
            _check_rel(mirror)
    except ValueError as exc:
        raise CorruptState(path, str(exc)) from exc
    return FileEntry(name, size, digest, records), mirror


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or name.startswith(".") or "\0" in name:
        raise ValueError(f"data file name {name!r} must be a plain name in the state dir")


def _check_rel(rel: str) -> None:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise ValueError(f"mirror path {rel!r} must be relative and stay inside the root")


def _check_size(path: Path, entry: FileEntry) -> None:
    try:
        st = confine.stat_file(path)
    except FileNotFoundError as exc:
        raise CorruptState(path, "missing") from exc
    except OSError as exc:
        raise _io(exc, path) from exc
    if not stat.S_ISREG(st.st_mode):
        raise CorruptState(path, "not a regular file")
    if st.st_size != entry.size:
        raise CorruptState(path, f"size {st.st_size} != expected {entry.size}")


def _same_file(src: Path, dst: Path, entry: FileEntry) -> bool:
    """Whether the mirror ``dst`` already holds the generation file's bytes."""
    try:
        a, b = confine.stat_file(src), confine.stat_file(dst)
    except FileNotFoundError:
        return False
    if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
        return True
    try:
        verify_file(dst, entry)  # a copy (no hard links here)
    except CorruptState:
        return False
    return True


def _io(exc: OSError, path: Path) -> StorageError:
    return translate_os_error(exc, path)
