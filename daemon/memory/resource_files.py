"""A resource file as auto_resource sees it: its date, its note's name (and the line that
marks that note once the file is removed), its digest, its text (read leniently, secrets
masked) and what makes it no text to summarize; the limits of reading and summarising
(:class:`ResourceConfig`). Pure functions and blocking reads (callers run those in a
worker thread).

Dates: a file under ``resource/YYYY-MM-DD/`` (a real date, directly inside ``resource/``;
the file at any depth below it) belongs to that date; any other (directly under
``resource/``, or under folders none of which is such a date folder) to the day it was
first cataloged (:func:`resource_date`)."""

from __future__ import annotations

import codecs
import errno
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date as Date
from pathlib import Path
from typing import Final
from urllib.parse import quote

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import body_of, parse_frontmatter
from recalld.daemon.index.frontmatter_edit import render_frontmatter
from recalld.daemon.memory.slugs import names_nothing, slugify
from recalld.daemon.notetext import decode_note
from recalld.daemon.store.fsio import fit_name
from recalld.daemon.textcost import chars_within
from recalld.ipc.errors import PathOutsideWorkspace
from recalld.ipc.textcut import cut_text
from recalld.ipc.types import visible

log = logging.getLogger(__name__)

#: The suffixes of HTML pages, read as their text (``resource_html``), not as markup.
HTML_SUFFIXES: Final = (".html", ".htm")
#: Of a page, the bytes read at most: its text may start past tens of kilobytes of
#: styles and scripts (parsing stops once the text wanted is found).
HTML_READ_BYTES: Final = 4 << 20
_DATE_RE: Final = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_HAS_TEXT: Final = re.compile(r"[^\W_]")
_NOT_REGULAR: Final = "not a regular file (a FIFO, a socket or a device): it is not read"
_MD_FENCE: Final = re.compile(r"^```(?:markdown|md)?[ \t]*\n(.*?)\n?```$", re.DOTALL | re.I)
#: The fields of a resource's note that name its file and its day, or mark it (the file
#: removed, or no longer text): what changes when the file is renamed, moved or removed.
_PLACE_FIELDS: Final = frozenset({"name", "source_resource", "date", "source_removed",
                                  "source_changed"})
#: What ends a ``[[wikilink]]``'s target as the index reads links (``index/links.py``): a
#: bracket, ``|`` (an alias follows), ``#`` (a heading follows).
_NOT_IN_WIKILINK: Final = re.compile(r"[\[\]|#]")
#: The body lines that do the same: its title is the file's name, its link names the file,
#: a mark says the file was removed or no longer held what the note says.
_PLACE_LINE: Final = re.compile(
    r"^(?:# .*|Source: (?:\[\[.*\]\]|\[.*\]\(<.*>\))|> The source file .* was removed on .*"
    r"|> On \S+ the source file .* no longer held what this note says.*)$")


@dataclass(frozen=True, slots=True)
class ResourceConfig:
    """The limits of reading and summarising resource files."""
    max_input_chars: int = 16_000
    summary_max_tokens: int = 1024
    max_summary_chars: int = 32_000
    reconcile_interval_s: float = 300.0


def _date_folder(parts: list[str]) -> str | None:
    """The first component if it is a real calendar date and a folder (not the file)."""
    if len(parts) >= 2 and _DATE_RE.match(parts[0]):
        try:
            Date.fromisoformat(parts[0])
        except ValueError:
            return None
        return parts[0]
    return None


def iso_date(value: object) -> str | None:
    """``value`` as a ``YYYY-MM-DD`` date if it is a real one (a frontmatter's ``date``)."""
    text = str(value)
    return text if _date_folder([text, ""]) else None


def resource_date(rel_in_resource: str, first_seen: str) -> str:
    """The day a file belongs to (``rel_in_resource``: its path inside ``resource/``):
    that of a folder named by a real date directly inside ``resource/``, the file at any
    depth below it (``2026-03-02/scans/a.txt``: 2026-03-02); else ``first_seen``, the day
    it was first cataloged (``a.txt``, ``clients/2026-03-02/a.txt``, ``2026-02-30/a.txt``,
    ``2026-03-02.txt``). Day folders are where a day's files go, as ``memory/<date>/`` is
    for notes: a date deeper down is a name among others, which a file's day does not
    follow."""
    return _date_folder(rel_in_resource.split("/")) or first_seen


def note_stem(rel_in_resource: str) -> str:
    parts = rel_in_resource.split("/")
    if _date_folder(parts):
        parts = parts[1:]
    # As a node's name: a letter keeps its marks (a vowel sign: without it, another
    # word), an accent saved apart is the same letter, what shows nothing is left out.
    stem = slugify("/".join(parts), 80)
    # 80 characters of four bytes each would not make a file name: cut to what fits
    # with the prefix and a "-99.md" a name taken already adds.
    stem = fit_name(stem, safepath.MAX_NAME_BYTES - len("resource--99.md")).strip("-_")
    return f"resource-{stem or 'file'}"


def file_digest(root: Path, rel: str) -> tuple[str, int, int] | str | None:
    """``(sha256, mtime_ns, size)`` of the regular file ``root/rel``; None if it is gone
    (or a folder); why it is not read if it is there but cannot be, or must not be: not
    a regular file, reached through a link out of ``root``, refused by the system
    (EACCES, EIO) (blocking). A file not read is not a file deleted: its note stays."""
    try:
        with os.fdopen(safepath.open_inside(root, rel), "rb") as fh:
            st = os.fstat(fh.fileno())
            if stat.S_ISDIR(st.st_mode):  # a folder in the file's place: the file is gone
                return None
            if not stat.S_ISREG(st.st_mode):
                # A FIFO or a device: reading it would take another's bytes.
                return _NOT_REGULAR
            h = hashlib.sha256()
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except PathOutsideWorkspace:
        return "a link out of the workspace: it is not read"
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the name is a link, which is never followed
            return "a symbolic link: it is not read"
        if exc.errno == errno.ENXIO:  # a socket (or a device with no driver): not opened
            return _NOT_REGULAR
        # The system's words only: the exception's text names the file by its full path,
        # unmasked, and the name may hold what redaction masks.
        why = exc.strerror or type(exc).__name__
        log.warning("resource %s unreadable: %s", safepath.masked(rel), why)
        return f"cannot be read: {why}"
    return h.hexdigest(), st.st_mtime_ns, st.st_size


def read_head(root: Path, rel: str, limit_chars: int) -> tuple[str, bool, str]:
    """The first characters of ``root/rel`` that cost at most ``limit_chars``
    (:mod:`~recalld.daemon.textcost`: that many characters of English, a ninth as many of
    Chinese, so a file of any script is about as many tokens) and if cut: read in the
    encoding it was saved in, as notes are (notetext.py: UTF-8, UTF-16 or UTF-32 with a
    byte order mark, GBK, Big5, Shift_JIS, EUC-KR, EUC-JP, Windows-1252; a UTF-8 byte
    order mark left out), the bytes of none of these as U+FFFD; of an HTML page, its
    text as a reader sees it (``resource_html``; from its first :data:`HTML_READ_BYTES`);
    secrets masked (one the cut falls inside too); if cut; and the SHA-256 of the whole
    file as read (to tell whether these are the bytes the catalog has: a file written
    again since it was cataloged holds others). A file outside ``root`` raises
    PathOutsideWorkspace."""
    from recalld.daemon.memory.redact import redact_prefix  # imported with its first use

    page = rel.lower().endswith(HTML_SUFFIXES)
    if page:  # the HTML parser and its patterns: with the first page read
        from recalld.daemon.memory.resource_html import declared_charset, html_text
    most = HTML_READ_BYTES if page else limit_chars * 4
    with os.fdopen(safepath.open_inside(root, rel), "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # replaced since cataloged
            raise OSError(errno.EINVAL, "not a regular file")
        data = fh.read(most + 1)
        h = hashlib.sha256(data)
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    cut = len(data) > most
    data = data.removeprefix(codecs.BOM_UTF8)
    text, read_as = decode_note(data, prefix=cut)
    if page and read_as not in ("", "utf-16", "utf-32") and (
            charset := declared_charset(data)):
        # Not UTF-8 and no byte order mark: the encoding the page names beats a guess.
        text = data.decode(charset, errors="replace")
    if page and not_text(text) is None:  # binary or undecodable: said so as it is
        text, left = html_text(text, limit_chars * 4)
        cut = cut or left
    shown = chars_within(text, limit_chars)
    return redact_prefix(text, shown), len(text) > shown or cut, h.hexdigest()


def not_text(text: str) -> str | None:
    """Why the model is not asked about a file read as ``text``: empty (nothing to sum
    up, only to invent), binary (NUL characters: an image or archive given a text
    suffix), or in an encoding :func:`read_head` does not read (Windows-1251, say: mostly
    undecodable bytes, which the model could only guess at; a few are summed up
    around); None for text."""
    if names_nothing(text):  # blank, or only what shows nothing (zero-width spaces)
        return "the file is empty"
    if "\x00" in text:
        return "the file is not text (it holds NUL bytes)"
    if text.count("\ufffd") * 4 > sum(map(len, text.split())):  # a quarter of its letters
        return ("the file is not UTF-8 text (its encoding is unknown): save it as UTF-8, "
                "or UTF-16 with a byte order mark")
    return None


def unfenced(answer: str) -> str:
    """The model's note ``answer``, stripped, without the code fence some models wrap a
    whole Markdown answer in (```markdown ... ```): the note is the Markdown, not a code
    block of it; and without a frontmatter block of its own (a model imitating a memory
    note): the note has one, written by the daemon, and a second would be its body."""
    fenced = _MD_FENCE.match(answer.strip())
    if fenced is not None and "\n```" not in f"\n{fenced.group(1)}":  # one block
        answer = fenced.group(1)
    answer = answer.strip()
    if answer.startswith("---"):
        answer = body_of(answer)[0].strip()
    return answer


def name_fields(rel: str, rel_in_resource: str) -> dict[str, object]:
    """The fields of a resource's note that carry its name: its title and its link."""
    return {"name": f"Resource {rel_in_resource}", "source_resource": f"[[{rel}]]"}


def name_masked(rel: str, rel_in_resource: str) -> bool:
    """Would redaction mask a part of the resource's name as its note carries it (a key,
    or a value after a credential word: ``db password Hx8kQ2mZ9pLw4Rt7.txt``), leaving a
    link that no longer names the file (and the part unmasked in the note's own name)?"""
    from recalld.daemon.memory.redact import has_secret  # imported with its first use

    return has_secret(render_frontmatter(name_fields(rel, rel_in_resource)))


def description(summary: str) -> str:
    """The note's description: the summary's first line of text (a rule, a fence or a
    table border holds none), without its heading marks, at most 200 characters."""
    first = next((ln for ln in summary.splitlines() if _HAS_TEXT.search(ln)), "")
    return cut_text(first.strip().strip("#").strip(), 200)


def folders_among(root: Path, paths: set[str]) -> set[str]:
    """Which of the workspace-relative ``paths`` are folders now (blocking)."""
    return {rel for rel in paths if (root / rel).is_dir()}


def folders_of(rel: str) -> Iterator[str]:
    """The folders ``rel`` lies in, outermost first: ``a``, ``a/b`` for ``a/b/c.txt``."""
    end = rel.find("/")
    while end != -1:
        yield rel[:end]
        end = rel.find("/", end + 1)


def files_below(root: Path, rel: str) -> list[str]:
    """The files below the folder ``rel`` (none if it is a link) (blocking)."""
    out: list[str] = []
    if (root / rel).is_symlink() or not safepath.is_inside(root / rel, root, str(root)):
        # A folder link is not descended, as the watcher's scans do not: one into the
        # workspace's own notes (``resource/x -> ../memory``) would have each note
        # summarised into another note; one out of the workspace reads another's files.
        return out
    for dirpath, dirnames, filenames in os.walk(root / rel):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith("."):
                full = os.path.join(dirpath, name)
                out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return out


def note_says(text: str) -> str | None:
    """A digest of what the resource note ``text`` says, whatever the name, place and day
    of its file and its marks: the same for the note of a file renamed, moved to another
    day's folder, removed or emptied since (:mod:`resource_notes` rewrites those), another
    once its summary, its file's digest or a line a person wrote changed. None for a note
    that names no resource and its digest (a note of the day, ReMe's)."""
    fields, start = parse_frontmatter(text)
    if not fields.get("resource_digest") or not fields.get("source_resource"):
        return None
    lines = text.replace("\r\n", "\n").split("\n")[start:]
    title = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    said = [ln.rstrip() for i, ln in enumerate(lines)
            if ln.strip() and not (_PLACE_LINE.match(ln) and (i == title or ln[0] != "#"))]
    kept = {k: v for k, v in fields.items() if k not in _PLACE_FIELDS}
    return hashlib.sha256(json.dumps([kept, said], sort_keys=True, default=str)
                          .encode()).hexdigest()


def source_link(rel: str) -> str:
    """The link to the resource file ``rel`` in its note: ``[[rel]]``; for a name that a
    wikilink cannot hold as the index reads links (``[``, ``]``, ``|``, ``#``; a line
    break or another control character, which would show escaped), a Markdown link whose
    target is the name, percent-encoded where it must be (``%``, ``<``, ``>``, ``\\``,
    control characters): ``[resource/a\\]\\]b.txt](<resource/a]]b.txt>)``. Either
    parses back to the file, not to another."""
    if _NOT_IN_WIKILINK.search(rel) is None and visible(rel) == rel:
        return f"[[{rel}]]"
    shown = re.sub(r"([\\\[\]])", r"\\\1", visible(rel))
    target = "".join(quote(c, safe="") if c in "%<>\\" or visible(c) != c else c
                     for c in rel)
    return f"[{shown}](<{target}>)"


def removed_line(path: str, removed_on: object) -> str:
    """What the note of a resource file that was removed ends with."""
    return (f"\n\n> The source file {visible(path)} was removed on {removed_on}; this note "
            "is kept as the memory of it.\n")


def changed_line(path: str, changed_on: object, why: str) -> str:
    """What the note of a resource file that no longer holds text (emptied, made binary,
    saved in an encoding not read) ends with: the note says what the file held before."""
    return (f"\n\n> On {changed_on} the source file {visible(path)} no longer held what "
            f"this note says ({why}); this note is kept as the memory of what it held.\n")


def without_changed_line(text: str, path: str, changed_on: object) -> str:
    """``text`` without the line :func:`changed_line` added on ``changed_on``."""
    start = text.find(f"\n\n> On {changed_on} the source file {visible(path)} no longer held ")
    if start == -1:
        return text
    end = text.find("\n", start + 2)
    return text[:start] + (text[end:] if end != -1 else "\n")
