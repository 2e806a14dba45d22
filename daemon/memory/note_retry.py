"""A note write known by its ``request_id`` is done once, even if the daemon stops between
writing the note and recording its answer.

``memory.add_note`` records, before it writes, where the text goes: the day, the note it
is appended to and the length of that note's body then, or that a new note is made (the
session's notes of that name then). The answer replaces that record once the note is
written. A call sent again after a stop in between (SIGKILL, a power cut) finds the
record instead of an answer, and looks at the notes: the text where it was to go means
the write was done, and its answer is given without appending it again; else it is
written now.
"""

from __future__ import annotations

from collections.abc import Sequence

from recalld.daemon.jsontypes import JsonObject

#: The key of a recorded write not yet answered (an answer never has it).
WRITING = "writing"


def writing(day: str, path: str, body: str, notes: Sequence[str]) -> JsonObject:
    """The record of a write about to append to ``path`` (whose body is ``body``; ``""``:
    a new note after ``notes``, the session's notes of that name on ``day``)."""
    return {WRITING: {"date": day, "path": path, "body_chars": len(body),
                      "notes": list(notes)}}


def planned_day(prior: JsonObject | None) -> str | None:
    """The day of the write ``prior`` records, if it is such a record."""
    plan = prior.get(WRITING) if prior is not None else None
    return str(plan["date"]) if isinstance(plan, dict) and "date" in plan else None


def done_before(prior: JsonObject, notes: Sequence[tuple[str, str, str]],
                text: str) -> tuple[str, bool] | None:
    """``(path, created)`` when ``notes`` (path, text, stripped body of each of the
    session's notes of the recorded day) show that the write ``prior`` records was done,
    else None."""
    plan = prior.get(WRITING)
    if not isinstance(plan, dict):
        return None
    path, known = plan.get("path"), plan.get("notes")
    start = plan.get("body_chars")
    if not isinstance(path, str) or not isinstance(start, int) or not isinstance(known, list):
        return None
    for rel, _, body in notes:
        if path and rel == path:
            added = body[start:]
            if body[:start].strip() and added.startswith("\n\n"):
                added = added[2:]
            elif start:
                return None  # the note changed before the place the text went
            return (rel, False) if _leads(added, text) else None
        if not path and rel not in known and _leads(body, text):
            return rel, True
    return None


def _leads(body: str, text: str) -> bool:
    """Whether ``body`` begins with ``text`` as whole paragraphs."""
    return body == text or body.startswith(text + "\n\n")
