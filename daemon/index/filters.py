"""Search filters, and the date of a daily note that they compare.

Owns :class:`Filters` (path prefixes, daily-note date range, digest buckets, authors),
:func:`note_date` and :func:`authors_of`; ``IndexState.allowed`` turns filters into the
doc keys that pass them. Plain data, no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Filters", "author_names", "authors_of", "composed", "note_date"]

# A day's folder (memory/2026-07-23/...), or a day's note named by its date
# (memory/2026-07-23.md, as in ReMe's file-based memory layout).
_DAILY_RE = re.compile(r"(?:^|/)(\d{4}-\d{2}-\d{2})(?:/|\.md\Z|\Z)")


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
    the path has one."""
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
