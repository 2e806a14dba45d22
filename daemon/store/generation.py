"""A committed generation as loaded: its files, what is known to be wrong, verified readers.

Built by ``manifest.GenerationStore``; holds no open files and starts nothing. Every reader
verifies the bytes it reads against the manifest entry and records a failure in
``corrupt`` before raising CorruptState, so the caller can rebuild that one file while the
others keep serving. Readers block: run them in a worker thread.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store import arrays as arrays_mod
from recalld.daemon.store import confine
from recalld.daemon.store import records as records_mod
from recalld.daemon.store.errors import CorruptState, StorageError
from recalld.daemon.store.fsio import FileEntry, read_verified, verify_file

_T = TypeVar("_T")

#: The key the manifest's own stat and damage go by, beside the logical file names.
MANIFEST = "manifest"


def manifest_name(gen: int) -> str:
    return f"MANIFEST-{gen:06d}.json"


@dataclass
class Generation:
    """One committed generation: its files, and what is known to be wrong with them.

    ``corrupt`` maps logical names to reasons; ``skipped`` lists newer manifests passed
    over at load and why; ``mirrors_repaired`` and ``mirror_errors`` report fixed-name
    publishing. Readers below verify the bytes they read and raise CorruptState (and
    record it in ``corrupt``) on a mismatch.
    """

    number: int
    created: float
    files: dict[str, FileEntry]
    mirrors: dict[str, str]
    state_dir: Path
    mirror_root: Path
    corrupt: dict[str, str] = field(default_factory=dict)
    #: Files whose checksum was verified on opening: reads check their size only.
    verified: set[str] = field(default_factory=set)
    #: Files opened with a size check only, their checksums left to ``verify_deferred``
    #: (large mapped arrays a warm start serves from at once; see ``map_arrays``).
    deferred: set[str] = field(default_factory=set)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: (inode, size, mtime_ns) of each file as opened or written. Generation files are
    #: never rewritten in place, so another stat later means someone else changed it.
    stats: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: The private copies ``map_arrays`` serves arrays from, by logical name, while the
    #: state that mapped them holds them.
    served: weakref.WeakValueDictionary[str, arrays_mod.Mapped] = field(
        default_factory=weakref.WeakValueDictionary)
    mirrors_repaired: list[str] = field(default_factory=list)
    mirror_errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.corrupt

    def path(self, logical: str) -> Path:
        """The file of ``logical``, or the generation's manifest for ``MANIFEST``."""
        if logical == MANIFEST:
            return self.state_dir / manifest_name(self.number)
        return self.state_dir / self.files[logical].name

    def mirror_path(self, logical: str) -> Path | None:
        rel = self.mirrors.get(logical)
        return None if rel is None else self.mirror_root / rel

    def verify(self, logical: str) -> None:
        """Check ``logical``'s size and checksum now; CorruptState (and recorded) if wrong.
        A file served from a private copy (``map_arrays``) is checked in that copy: those
        are the bytes in use."""
        served = self.served.get(logical)
        if served is None:
            self._guard(logical, lambda: verify_file(self.path(logical), self.files[logical]))
        else:
            self._guard(logical, lambda: self._check_served(logical, served))
        self.verified.add(logical)
        self.deferred.discard(logical)

    def _check_served(self, logical: str, served: arrays_mod.Mapped) -> None:
        try:
            if not served.matches(self.files[logical]):
                raise CorruptState(self.path(logical), "checksum mismatch")
        finally:
            served.evict()  # hashing read every page; searches need few of them

    def remember_stats(self) -> None:
        """Record each good file's stat, and the manifest's, as it is now (just opened
        or written)."""
        for logical in [*self.files, MANIFEST]:
            if logical in self.corrupt:
                continue
            try:
                st = confine.stat_file(self.path(logical))
            except OSError:
                continue
            self.stats[logical] = (st.st_ino, st.st_size, st.st_mtime_ns)

    def changed_on_disk(self) -> dict[str, str]:
        """The files (``MANIFEST`` for the manifest) whose stat is no longer the one
        :meth:`remember_stats` recorded, with why; each is recorded in ``corrupt``. A few
        ``stat`` calls: cheap enough to ask on every status."""
        found: dict[str, str] = {}
        for logical, (ino, size, mtime_ns) in self.stats.items():
            if logical in self.corrupt:
                continue
            try:
                st = confine.stat_file(self.path(logical))
            except FileNotFoundError:
                why = "missing"
            except OSError as exc:
                why = f"unreadable: {exc.strerror}"
            else:
                if st.st_size != size:
                    why = f"size {st.st_size} != expected {size} (truncated or extended)"
                elif st.st_ino != ino:
                    why = "replaced by another file"
                elif st.st_mtime_ns != mtime_ns:
                    why = "written to in place"
                else:
                    continue
            self.corrupt[logical] = found[logical] = f"changed on disk: {why}"
        return found

    def verify_deferred(self) -> dict[str, str]:
        """Check the checksums ``open`` left for later; returns the files found corrupt."""
        bad: dict[str, str] = {}
        for logical in sorted(self.deferred):
            try:
                self.verify(logical)
            except CorruptState as exc:
                bad[logical] = exc.reason
            except StorageError as exc:  # unreadable (EIO): as untrustworthy as damaged
                self.corrupt[logical] = bad[logical] = f"unreadable: {exc}"
        self.deferred.clear()
        return bad

    def read_records(self, logical: str) -> list[JsonObject]:
        return self._guard(
            logical, lambda: records_mod.read_records(self.path(logical), self.files[logical],
                                              trusted=logical in self.verified)
        )

    def iter_records(self, logical: str) -> Iterator[JsonObject]:
        """Stream records; the file is verified before the first one is yielded."""
        entry = self.files[logical]
        try:
            yield from records_mod.iter_records(self.path(logical), entry,
                                                trusted=logical in self.verified)
        except CorruptState as exc:
            self.corrupt[logical] = exc.reason
            raise

    def read_arrays(self, logical: str) -> tuple[dict[str, arrays_mod.StoredArray], JsonObject]:
        return self._guard(
            logical, lambda: arrays_mod.read_arrays(self.path(logical), self.files[logical],
                                            trusted=logical in self.verified)
        )

    def map_arrays(self, logical: str) -> arrays_mod.Mapped:
        """``logical`` mapped read-only. A deferred file is mapped after its structural
        checks (header checksum, layout, size) only: its data bytes are served before
        ``verify_deferred`` has read them."""
        trusted = logical in self.verified or logical in self.deferred
        mapped = self._guard(
            logical, lambda: arrays_mod.map_arrays(self.path(logical), self.files[logical],
                                                   trusted=trusted)
        )
        self.served[logical] = mapped
        return mapped

    def read_blob(self, logical: str) -> tuple[bytes, JsonObject]:
        return self._guard(
            logical, lambda: arrays_mod.read_blob(self.path(logical), self.files[logical],
                                          trusted=logical in self.verified)
        )

    def read_bytes(self, logical: str) -> bytes:
        return self._guard(logical, lambda: read_verified(self.path(logical), self.files[logical],
                                                        trusted=logical in self.verified))

    def verified_path(self, logical: str) -> Path:
        """The path of ``logical`` after checking it, for loaders that take a path (hnswlib)."""
        self.verify(logical)
        return self.path(logical)

    def _guard(self, logical: str, read: Callable[[], _T]) -> _T:
        if logical not in self.files:
            raise KeyError(logical)
        try:
            return read()
        except CorruptState as exc:
            self.corrupt[logical] = exc.reason
            raise
