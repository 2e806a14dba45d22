"""The notes an index read in another encoding than UTF-8, as ``daemon.status`` and the
import report tell them: how many, in which encodings, the first few by path, and the
lines of ``reasons`` that say so. Reads state; changes nothing."""

from __future__ import annotations

from typing import TypedDict

from recalld.daemon.index.state import IndexState
from recalld.daemon.memory.secret_names import mask_path
from recalld.daemon.notetext import UNDECODED

__all__ = ["NotUtf8Notes", "not_utf8_notes", "not_utf8_reasons"]

#: Paths listed per report (counts are always complete).
MAX_NAMED = 20


class NotUtf8Notes(TypedDict):
    count: int  # indexed notes not read as UTF-8
    encodings: dict[str, int]  # encoding -> how many ("unknown": read with U+FFFD)
    notes: dict[str, str]  # the first few: path (shown masked) -> encoding


def not_utf8_notes(state: IndexState) -> NotUtf8Notes:
    """The summary of ``state``'s notes not read as UTF-8. Safe beside an apply in a
    worker thread (it looks paths up, it never iterates ``files``)."""
    found: dict[str, str] = {}
    for path in sorted(state.not_utf8):
        info = state.files.get(path)
        if info is not None and info.encoding:
            found[path] = info.encoding
    counts: dict[str, int] = {}
    for encoding in found.values():
        counts[encoding] = counts.get(encoding, 0) + 1
    # Those read with U+FFFD first: they are the ones to do something about.
    named = sorted(found, key=lambda p: found[p] != UNDECODED)[:MAX_NAMED]
    return {"count": len(found), "encodings": dict(sorted(counts.items())),
            "notes": {mask_path(p): found[p] for p in named}}


def not_utf8_reasons(summary: NotUtf8Notes) -> tuple[list[str], list[str]]:
    """The lines of ``reasons`` for ``summary``: (what degrades search: notes in an
    encoding not recognised, indexed with U+FFFD; what is only told: notes read in
    another encoding, which the memory tools do not edit)."""
    undecoded = summary["encodings"].get(UNDECODED, 0)
    read = {e: n for e, n in summary["encodings"].items() if e != UNDECODED}
    first = {enc: path for path, enc in reversed(summary["notes"].items())}
    bad = [f"{undecoded} note(s) in an encoding recalld does not recognise are indexed "
           f"with U+FFFD where their bytes are not UTF-8, unsearchable there (first: "
           f"{first[UNDECODED]}); save them as UTF-8"] if undecoded else []
    # (The listed notes are those read with U+FFFD first: they may all be.)
    shown = next((p for p, e in summary["notes"].items() if e != UNDECODED), None)
    told = [f"{sum(read.values())} note(s) not in UTF-8 are read as "
            + ", ".join(f"{e} ({n})" for e, n in read.items())
            + (f" (first: {shown})" if shown else "")
            + "; the memory tools do not edit them"] if read else []
    return bad, told
