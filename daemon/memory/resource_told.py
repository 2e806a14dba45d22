"""The notes an auto_resource job wrote that its workspace's inbox has not been told of.

A job tells the inbox of the notes it wrote when it ends (cancelled or failed too). A
daemon killed before that would leave them untold for good: the catalog already has
their files ``processed``, so no later job writes or tells them again. So each note is
marked in its file's catalog record (``untold``: the job's id) as it is written, before
the catalog is saved, and unmarked once told; the notes still marked when the catalog is
loaded are told then, in one item per job, ``details`` ``{cut_short: true}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Final

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.inbox import push_inbox

if TYPE_CHECKING:
    from recalld.daemon.workspaces import Workspace

UNTOLD: Final = "untold"


def mark(records: Mapping[str, JsonObject], rel: str, note: str, job_id: str | None) -> None:
    """``note``, written for ``rel`` by job ``job_id``, waits to be told."""
    rec = records.get(rel)
    if rec is None or rec.get("note") != note:  # given to the file moved meanwhile
        rec = next((r for r in records.values() if r.get("note") == note), None)
    if rec is not None:
        rec[UNTOLD] = job_id or ""


def untold(records: Mapping[str, JsonObject]) -> dict[str, list[str]]:
    """The notes waiting to be told, by the id of the job that wrote them."""
    out: dict[str, list[str]] = {}
    for rel in sorted(records):
        rec = records[rel]
        if UNTOLD in rec and rec.get("note"):
            note = str(rec["note"])
            notes = out.setdefault(str(rec[UNTOLD]), [])
            if note not in notes:
                notes.append(note)
    return out


def unmark(records: Mapping[str, JsonObject], notes: Collection[str],
           job_id: str | None) -> bool:
    """``notes`` of job ``job_id`` were told (or are no longer the job's): unmark them;
    also a mark whose record lost its note. Whether any mark went."""
    changed = False
    for rec in records.values():
        if UNTOLD in rec and (not rec.get("note") or (
                rec[UNTOLD] == (job_id or "") and rec.get("note") in notes)):
            del rec[UNTOLD]
            changed = True
    return changed



async def tell_of(ws: Workspace, records: Mapping[str, JsonObject], notes: list[str],
                  job_id: str | None, details: Mapping[str, object],
                  save: Callable[[], Awaitable[None]]) -> bool:
    """Tell ``ws``'s inbox of ``notes``, written by job ``job_id``; once told, unmark
    them in ``records`` and ``save`` the catalog. Whether they were told."""
    if not await push_inbox(ws, "auto_resource",
                            f"resources: {len(notes)} note(s) written or updated", notes,
                            job_id=job_id, details=details):
        return False
    if unmark(records, notes, job_id):
        await save()
    return True


async def tell(ws: Workspace, records: Mapping[str, JsonObject],
               save: Callable[[], Awaitable[None]]) -> None:
    """Tell ``ws``'s inbox of the notes still marked in ``records`` (its catalog as
    loaded), one item per job that wrote them (``save``: see :func:`tell_of`)."""
    for job_id, notes in untold(records).items():
        await tell_of(ws, records, notes, job_id or None, {"cut_short": True}, save)
