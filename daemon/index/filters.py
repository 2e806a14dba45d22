"""Search filters, and the date of a daily note that they compare.

Owns :class:`Filters` (path prefixes, daily-note date range, digest buckets, authors),
:func:`note_date`, :func:`authors_of`, and :func:`passing`, the files that pass filters
(``IndexState.allowed`` turns them into the doc keys that pass). Plain data, no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from recalld.daemon.index.records import FileInfo

__all__ = ["CALENDAR_DAY", "Filters", "author_names", "authors_of", "composed", "note_date",
           "passing"]

#: A calendar day ``YYYY-MM-DD`` of years 0001 to 9999, as a regular expression both
#: Python and PostgreSQL read (the server's search applies it too): a month that has that
#: day, and 29 February of leap years only. ASCII digits, as a filter's dates are written:
#: other digits (full-width, Arabic-Indic) compared as text with those dates sort after
#: every one of them. A name shaped like a date that is none (``2026-13-01``,
#: ``2026-02-29``, ``0000-01-01``) compared as text passed a ``date_from`` or a
#: ``date_to`` it is no day of.
CALENDAR_DAY = (
    r"(?:(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)-"
    r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
    r"|(?:0[13578]|1[02])-31)"
    r"|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
    r"-02-29)")
# A day's folder (memory/2026-07-23/...), or a day's note named by its date
# (memory/2026-07-23.md, as in ReMe's file-based memory layout).
_DAILY_RE = re.compile(rf"(?:^|/)({CALENDAR_DAY})(?:/|\.md\Z|\Z)")


@dataclass(frozen=True, slots=True)
class Filters:
    """Search filters: path prefixes, daily-note date range, digest buckets, and the
    ``author`` a note's frontmatter names (the agent that wrote it)."""

    path_prefixes: tuple[str, ...] = ()
    date_from: str | None = None
    date_to: str | None = None
    buckets: tuple[str, ...] = ()
    authors: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.path_prefixes or self.date_from or self.date_to or self.buckets
                    or self.authors)


def composed(path: str) -> str:
    """``path`` in NFC form, as path filters compare paths: a folder named decomposed on
    disk (macOS, a synced folder) and one typed composed, or the other way round, are one
    folder to the person naming it."""
    return path if path.isascii() else unicodedata.normalize("NFC", path)


def note_date(path: str) -> str | None:
    """The ``YYYY-MM-DD`` of a daily note's folder (or of a note named by its date), if
    the path has one that is a calendar day (see ``CALENDAR_DAY``)."""
    m = _DAILY_RE.search(path)
    return m.group(1) if m else None


def authors_of(fields: object) -> tuple[str, ...]:
    """The authors a note's frontmatter ``fields`` name: its ``author``, one name or a
    list of them (``author: [alice, bob]``, or ``- alice`` lines), in NFC form; none
    otherwise."""
    value = fields.get("author") if isinstance(fields, Mapping) else None
    if isinstance(value, str):
        return author_names((value,))
    if isinstance(value, list):
        return author_names(v for v in value if isinstance(v, str))
    return ()


def author_names(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as the ``author`` filter compares them: in NFC form, so that a name
    typed composed and one written decomposed (macOS, some keyboards) are one author."""
    return tuple(unicodedata.normalize("NFC", n) for n in names)


def passing(files: Mapping[str, FileInfo], filters: Filters, *, daily_dir: str,
            digest_dir: str, authors: Callable[[str], tuple[str, ...]]) -> Iterator[FileInfo]:
    """The files of ``files`` that pass ``filters`` (every one when they are empty), in
    their order; ``authors(path)``: the authors a file's frontmatter names."""
    # Sets, matched against each path's folders: a client may name thousands, and
    # each path is then looked up a few times, not compared with every one.
    # Names compared composed (NFC), whichever form the disk or the client has.
    prefixes = frozenset(composed(p.strip("/")) for p in filters.path_prefixes)
    buckets = frozenset(composed(f"{digest_dir}/{b.strip('/')}") for b in filters.buckets)
    wanted = frozenset(filters.authors)
    for path, info in files.items():
        named = composed(path)
        if prefixes and named not in prefixes and prefixes.isdisjoint(_folders(named)):
            continue
        if buckets and buckets.isdisjoint(_folders(named)):
            continue
        if filters.date_from or filters.date_to:
            day = note_date(path) if path.startswith(daily_dir + "/") else None
            if day is None:
                continue
            if filters.date_from and day < filters.date_from:
                continue
            if filters.date_to and day > filters.date_to:
                continue
        if wanted and wanted.isdisjoint(authors(path)):
            continue
        yield info


def _folders(path: str) -> Iterator[str]:
    """The folders ``path`` lies in, outermost first (``a``, ``a/b`` for ``a/b/c.md``)."""
    end = path.find("/")
    while end >= 0:
        yield path[:end]
        end = path.find("/", end + 1)
