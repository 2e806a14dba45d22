"""Reading a note and turning it into what the index applies: the CPU-heavy part.

Pure functions over files, with plain-data results, so they run in worker threads and in
the worker processes of ``procpool.py`` alike (this module imports only what they need:
a worker process starts faster). :class:`~recalld.daemon.index.state.IndexState` applies
the results under the index lock.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from recalld.daemon import safepath
from recalld.daemon.index.chunker import Chunk, chunk_markdown
from recalld.daemon.index.frontmatter import recall_block
from recalld.daemon.index.links import Link, extract_links
from recalld.daemon.index.postings import Slab, Vocabulary, join_terms
from recalld.daemon.index.records import note_stamp
from recalld.daemon.index.reme_chunks import ReMeChunk, adopt_chunks, adopt_moved
from recalld.daemon.index.tokenizer import tokenize_split
from recalld.daemon.notetext import decode_as, decode_note
from recalld.ipc.errors import PathOutsideWorkspace

# Notes beyond this size are indexed up to it: a 10 MiB "note" is a pasted dump, and
# reading it whole on every save would stall its workspace. Such notes are reported
# (health ``degraded``, ``partly_indexed`` in status and index.verify), never silently cut.
MAX_NOTE_BYTES = 8 * 1024 * 1024
# Read past that limit, so that a secret the cut falls inside is still recognised (and
# masked up to the cut), not indexed as a piece too short to be found.
CUT_MARGIN_BYTES = 64 * 1024
# A worker's vocabulary over the batches of a pass (``prepare_files``'s ``vocab``) begins
# again past this many terms, so that a worker of a very large pass stays small.
VOCAB_MAX_TERMS = 1 << 18
# That vocabulary: (the pass's token, its terms' ids). One per process: a worker serves
# one call at a time, and a call of another pass begins a new one.
_vocab: tuple[str, Vocabulary] | None = None
# Errors opening a note that mean there is no note to index there (gone, a link, not a
# regular file, permission refused); others leave the note as the index has it.
_NOT_A_NOTE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENXIO, errno.EISDIR,
                         errno.ENAMETOOLONG, errno.ENODEV, errno.EACCES, errno.EPERM})


def partly_indexed(files: Mapping[str, FileSize]) -> list[str]:
    """Paths of ``files`` (path -> what the index knows of it) too large to index whole."""
    return sorted(p for p, f in files.items() if too_large(f.size))


def too_large(size: int) -> bool:
    """Is a note of ``size`` bytes indexed only up to ``MAX_NOTE_BYTES``?"""
    return size > MAX_NOTE_BYTES

class FileSize(Protocol):
    @property
    def size(self) -> int: ...


@dataclass(slots=True)
class Prepared:
    """A file read and chunked, ready to apply (``gone``: deleted; ``unchanged``: same digest;
    ``error``: there but not readable now, why: the index keeps what it had of it).

    ``links`` are extracted without a resolver: bare ``[[names]]`` are resolved on apply,
    against the files the index knows then.
    """

    path: str
    gone: bool
    mtime_ns: int = 0
    size: int = 0
    digest: str = ""
    chunks: list[Chunk] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    unchanged: bool = False
    error: str = ""
    #: A component of ``path`` holds what redaction masks (``secret_names.py``): the path
    #: is shown masked. Decided here, in the workers, once per file read.
    secret_name: bool = False
    #: The encoding the note was read in when it is not UTF-8 (``notetext.decode_note``).
    encoding: str = ""

    def __reduce__(self) -> tuple[type[Prepared], tuple[str, bool, int, int, str, list[Chunk],
                                                       list[Link], bool, str, bool, str]]:
        # One per file of a batch: its fields as the arguments of a call, not a dict of
        # slot names and values set one by one.
        return Prepared, (self.path, self.gone, self.mtime_ns, self.size, self.digest,
                          self.chunks, self.links, self.unchanged, self.error,
                          self.secret_name, self.encoding)


@dataclass(frozen=True, slots=True)
class VocabRef:
    """Where a batch's term ids come from when its worker process keeps one vocabulary
    over the batches of a pass: the pass's ``token``, the worker's ``pid``, and ``start``,
    how many terms that vocabulary held before the batch (0: it began with the batch)."""

    token: str
    pid: int
    start: int


@dataclass(slots=True)
class PreparedBatch:
    """Files prepared together: ``slab`` holds one document per chunk of ``files`` (in order),
    counted against the batch's own vocabulary ``terms`` (joined: ``postings.join_terms``).

    Built by :func:`prepare_files` in a worker thread or process (everything in it is plain
    data), applied by :meth:`IndexState.apply` under the index lock. With ``vocab``, the
    vocabulary is the worker's over the pass so far and ``terms`` are only the terms the
    batch added to it.
    """

    files: list[Prepared]
    terms: str
    slab: Slab
    vocab: VocabRef | None = None

    @property
    def docs(self) -> int:
        return len(self.slab.lens)


def _read_note(root: Path, rel: str,
               real_root: str | None = None) -> tuple[bytes, os.stat_result] | None:
    """The bytes (up to ``MAX_NOTE_BYTES`` and ``CUT_MARGIN_BYTES`` past it) and stat of
    a regular file inside ``root``; None if absent or not a note
    (a link, a socket, outside the workspace, or one its owner made unreadable). Raises
    OSError when the file is there but cannot be read now (an I/O error, no descriptors or
    memory left).

    The last component is opened without following symlinks, and a directory link that
    leads out of the workspace is refused, so a link planted in the workspace cannot make
    the daemon index (and serve) a file outside it.
    """
    try:
        fd = safepath.open_inside(root, rel, real_root)
    except PathOutsideWorkspace:
        return None
    except OSError as exc:
        if exc.errno in _NOT_A_NOTE:
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        chunks: list[bytes] = []
        remaining = MAX_NOTE_BYTES + CUT_MARGIN_BYTES
        while remaining > 0:
            data = os.read(fd, min(remaining, 1 << 20))
            if not data:
                break
            chunks.append(data)
            remaining -= len(data)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def _go_on() -> None:
    """The ``check`` of work nothing can cancel: it goes on."""


def prepare(root: Path, rel: str, *, max_chars: int, known_digest: str | None,
            reme: Sequence[ReMeChunk] | None = None,
            moved: Mapping[str, Sequence[ReMeChunk]] | None = None,
            real_root: str | None = None, check: Callable[[], None] = _go_on) -> Prepared:
    """Read and chunk ``rel`` under ``root`` (``unchanged`` when its digest is ``known_digest``);
    ``reme``: ReMe's chunks of it, kept while the note still matches them; ``moved``:
    ReMe's chunks of notes gone from where ReMe indexed them, kept where this note (one
    ReMe has no chunks of) says what they say (it was renamed or moved); ``real_root``:
    ``os.path.realpath(root)``, resolved once for many files; ``check`` is called between
    the steps (a note of megabytes takes seconds), and may raise to end the work."""
    from recalld.daemon.memory.secret_names import named_by_secret

    try:
        got = _read_note(root, rel, real_root)
    except OSError as exc:
        # One file's failure, not the pass's: the others are indexed, this one keeps what
        # the index had, and a later reconcile reads it again (its stat differs or it is
        # not indexed).
        return Prepared(path=rel, gone=False, error=exc.strerror or type(exc).__name__,
                        secret_name=named_by_secret(rel))
    if got is None:
        return Prepared(path=rel, gone=True)
    full, st = got
    data = full[:MAX_NOTE_BYTES]
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    if digest == known_digest:
        mtime_ns, size = note_stamp(st)
        return Prepared(path=rel, gone=False, mtime_ns=mtime_ns, size=size,
                        digest=digest, unchanged=True)
    check()
    text, encoding = index_text(full, st.st_size, check)
    chunks = adopt_chunks(rel, text, reme, max_chars=max_chars) if reme else None
    if reme is None and moved:
        chunks = adopt_moved(rel, text, moved, max_chars=max_chars)
    body_start = None
    if chunks is None:
        # The frontmatter block read once, for the chunks and the links alike.
        block = recall_block(text.removeprefix("\ufeff"))
        chunks, body_start = chunk_markdown(rel, text, max_chars=max_chars, block=block), block[1]
    mtime_ns, size = note_stamp(st)
    return Prepared(
        path=rel, gone=False, mtime_ns=mtime_ns, size=size, digest=digest, chunks=chunks,
        links=extract_links(rel, text, body_start=body_start),
        secret_name=named_by_secret(rel), encoding=encoding,
    )


def index_text(full: bytes, size: int, check: Callable[[], None] | None = None
               ) -> tuple[str, str]:
    """A note's text as the index holds it, and the encoding it was read in: ``full``,
    its first bytes up to ``MAX_NOTE_BYTES`` and ``CUT_MARGIN_BYTES`` past it (as
    :func:`_read_note` reads them); ``size``, the whole note's. The server's chunk rows
    are made from it too (``remote/chunks.chunk_rows``). ``check`` is called while
    masking (``redact.find_spans``)."""
    # The index never holds a credential a note contains (nor do embedding requests, made
    # from chunk texts); masks keep their line breaks, so chunks keep their file lines.
    # Loaded on the first file read: its rule set compiles hundreds of patterns, which a
    # warm start that finds nothing changed never needs.
    from recalld.daemon.memory.redact import redact_note

    # The encoding is told by the whole file: its head alone may look like another. A
    # read that stopped short of the file's end may end inside a character.
    read, encoding = decode_note(full, prefix=size > len(full))
    data = full[:MAX_NOTE_BYTES]
    if len(full) == len(data):
        text = redact_note(read, check=check)
    else:
        text = redact_note(read, len(decode_as(data, encoding, prefix=True)), check=check)
    if check is not None:
        check()
    return text, encoding


def unchanged_links(root: Path, rel: str, *, known_digest: str, redacted: bool = True,
                    real_root: str | None = None) -> list[Link] | None:
    """The links of ``rel`` as :func:`prepare` extracts them (not resolved), read from the
    disk now; None when its content is not ``known_digest`` (changed, gone, unreadable).
    ``redacted`` False: read from the text as it is, not redacted first, tens of times
    faster; they differ from the index's only where a secret touches a link."""
    try:
        got = _read_note(root, rel, real_root)
    except OSError:
        return None
    if got is None:
        return None
    full, st = got
    if hashlib.blake2b(full[:MAX_NOTE_BYTES], digest_size=16).hexdigest() != known_digest:
        return None
    if b"[" not in full:
        # No link, nor a mask that would make one (a ``[`` before the mask's own): such
        # notes are not decoded. Every encoding a note is read in (``notetext.py``) holds
        # ``[`` as the byte 0x5B.
        return []
    if redacted:
        return extract_links(rel, index_text(full, st.st_size)[0])
    read, encoding = decode_note(full, prefix=st.st_size > len(full))
    if len(full) > MAX_NOTE_BYTES:
        read = read[:len(decode_as(full[:MAX_NOTE_BYTES], encoding, prefix=True))]
    return extract_links(rel, read)


def prepare_files(
    root: Path, rels: list[str], *, max_chars: int, digests: Mapping[str, str | None],
    reme: Mapping[str, Sequence[ReMeChunk]] | None = None,
    moved: Mapping[str, Sequence[ReMeChunk]] | None = None, vocab: str | None = None,
    check: Callable[[], None] = _go_on,
) -> PreparedBatch:
    """Read, chunk, tokenize and count ``rels``: the CPU-heavy part of indexing, touching no
    shared state, so it runs in worker threads or worker processes alike.

    ``check`` (worker threads: ``trio.from_thread.check_cancelled``) is called between
    files and their steps; what it raises ends the batch, whose work is then lost (a
    stopping daemon does not wait for tens of megabytes of notes: the next start reads
    them).

    ``vocab`` (worker processes only): the token of a pass whose batches this process
    counts against one vocabulary, so that each batch hands back, and the daemon looks
    up, only the terms earlier batches of the process did not have.
    """
    global _vocab
    real_root = os.path.realpath(root)
    files = [prepare(root, rel, max_chars=max_chars, known_digest=digests.get(rel),
                     reme=(reme or {}).get(rel), moved=moved, real_root=real_root,
                     check=check)
             for rel in rels]
    split = []
    for f in files:
        check()
        split += [tokenize_split(c.index_text) for c in f.chunks]
    kept: Vocabulary | None = None
    ref: VocabRef | None = None
    if vocab is not None:
        if _vocab is None or _vocab[0] != vocab or len(_vocab[1]) > VOCAB_MAX_TERMS:
            _vocab = (vocab, Vocabulary())
        kept = _vocab[1]
        ref = VocabRef(vocab, os.getpid(), len(kept))
    try:
        slab, terms = Slab.local([words for words, _ in split], [runs for _, runs in split],
                                 vocab=kept)
        joined = join_terms(terms)
    except BaseException:
        _vocab = None  # possibly half updated: the daemon would not know its terms
        raise
    return PreparedBatch(files, joined, slab, ref)


__all__ = ["CUT_MARGIN_BYTES", "MAX_NOTE_BYTES", "VOCAB_MAX_TERMS", "Prepared",
           "PreparedBatch", "VocabRef", "index_text", "partly_indexed", "prepare",
           "prepare_files", "too_large", "unchanged_links"]
