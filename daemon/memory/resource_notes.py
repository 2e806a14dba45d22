"""The daily notes auto_resource writes for resource files: their name, their text, the
mark a note gets when its file is removed and the change when its file is renamed.

A note is ``<daily_dir>/<date>/resource-<slug>.md`` with frontmatter ``resource_digest``,
``name``, ``source_resource: [[resource/...]]``, ``date``, ``truncated_input`` and
``description``, a title, the model's summary and a ``Source:`` link (a Markdown link for
a name a wikilink cannot hold: :func:`resource_files.source_link`). Every write goes
through the workspace's file operations (atomic, searchable at once).
"""

from __future__ import annotations

import logging

import trio

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.index.frontmatter_edit import DELETE, render_frontmatter
from recalld.daemon.index.frontmatter_edit import update_frontmatter as update_fm
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.fileops import WriteConflict, fileops_for, read_confined
from recalld.daemon.memory.resource_files import (
    changed_line,
    description,
    name_fields,
    note_stem,
    removed_line,
    source_link,
    without_changed_line,
)
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import RecalldError
from recalld.ipc.types import visible

log = logging.getLogger(__name__)


def _inside(ws: Workspace, rel: str) -> str:
    """``rel`` (``resource/...``) as a path inside the resource folder."""
    return rel[len(ws.settings.resource_dir) + 1:]


async def note_path(ws: Workspace, rec: JsonObject) -> str:
    """The note of catalog record ``rec``: the one it has, else a free name (or the name
    of a note that names this file as its source)."""
    if rec.get("note"):
        return str(rec["note"])
    base = f"{ws.settings.daily_dir}/{rec['date']}/{note_stem(_inside(ws, rec['path']))}"
    link = f"[[{rec['path']}]]"
    for n in range(1, 100):
        candidate = f"{base}.md" if n == 1 else f"{base}-{n}.md"
        try:
            existing = await trio.to_thread.run_sync(read_confined, ws.root, candidate)
        except RecalldError:
            continue  # unreadable (too large, a link): not ours, take another name
        if existing is None or parse_frontmatter(existing)[0].get("source_resource") == link:
            return candidate
    raise RecalldError(f"no free note name for {rec['path']}")


async def write_note(ws: Workspace, rec: JsonObject, summary: str, *, truncated: bool) -> str:
    """Write the note of ``rec`` with ``summary``; its path."""
    note = await note_path(ws, rec)
    inside = _inside(ws, rec["path"])
    # The note is redacted as one text when written: a credential word in the name
    # or the summary masks a random-looking value near it. The digest leads, the
    # name and link (checked alone: ``name_masked``) follow, the description (the
    # model's words) comes last: none is near a word of another.
    fields: dict[str, object] = {
        "resource_digest": rec["digest"], **name_fields(rec["path"], inside),
        "date": rec["date"], "truncated_input": truncated,
        "description": description(summary),
    }
    text = (render_frontmatter(fields) + f"# {visible(inside)}\n\n{summary}\n\n"
            f"Source: {source_link(rec['path'])}\n")
    await fileops_for(ws).write(note, text)
    return note


async def mark_removed(ws: Workspace, rec: JsonObject, removed_on: str) -> str | None:
    """Mark the note of ``rec``, whose file was removed on ``removed_on``; the note's path,
    None if there is none to mark (or it is marked already)."""
    note = rec.get("note")
    if not note:
        return None
    files = fileops_for(ws)
    text = await files.read_text(note)
    if text is None or parse_frontmatter(text)[0].get("source_removed"):
        return None
    updated = update_fm(text, {"source_removed": removed_on})
    updated = updated.rstrip("\n") + removed_line(str(rec["path"]), removed_on)
    await files.write(str(note), updated)
    return str(note)


async def mark_changed(ws: Workspace, rec: JsonObject, why: str, changed_on: str) -> str | None:
    """Mark the note of ``rec``, whose file no longer holds text (``why``: emptied, made
    binary) since ``changed_on``: frontmatter ``source_changed`` and a line saying so (one
    mark, the newest); the note's path, None if there is none."""
    note = rec.get("note")
    if not note:
        return None
    files = fileops_for(ws)
    text = await files.read_text(str(note))
    if text is None:
        return None
    updated = unmark_changed(text, str(rec["path"]))
    updated = update_fm(updated, {"source_changed": changed_on})
    updated = updated.rstrip("\n") + changed_line(str(rec["path"]), changed_on, why)
    await files.write(str(note), updated)
    return str(note)


def unmark_changed(text: str, path: str) -> str:
    """The note ``text`` without the mark :func:`mark_changed` gave it (as it was)."""
    on = parse_frontmatter(text)[0].get("source_changed")
    if not on:
        return text
    return update_fm(without_changed_line(text, path, on), {"source_changed": DELETE})


async def renamed_in_note(ws: Workspace, note: str, old: str, new: str,
                          marked_on: object = None, *, date: str | None = None) -> str:
    """Have ``note`` name its file ``new`` instead of ``old`` (and no longer say it was
    removed, if it was marked so on ``marked_on``); the note's path now. A file that now
    belongs to another day (``date``: moved into, out of or between date folders) has
    its note moved to that day's folder, as a note written for it now would be, and
    dated so: a note left under the old day would be recalled for a day the file is not
    of."""
    files = fileops_for(ws)
    text = await files.read_text(note)
    if text is None:  # moved already by a run that stopped before the catalog was saved
        return note if date is None else await note_path(
            ws, {"path": new, "date": date, "note": None})
    original = text
    inside = (_inside(ws, old), _inside(ws, new))
    if marked_on is not None:
        text = text.replace(removed_line(old, marked_on), "\n")
    text = unmark_changed(text, old)  # back as the bytes it was written from
    fields: dict[str, object] = {"name": f"Resource {inside[1]}",
                                 "source_resource": f"[[{new}]]", "source_removed": DELETE}
    day = f"{ws.settings.daily_dir}/{date}/"
    if date is not None and not note.startswith(day):
        fields["date"] = date
    updated = update_fm(text, fields)
    # The link as written now, or as it was before a name no wikilink can hold was
    # linked otherwise.
    for link in dict.fromkeys((source_link(old), f"[[{visible(old)}]]")):
        updated = updated.replace(link, source_link(new))
    updated = updated.replace(f"\n# {visible(inside[0])}\n", f"\n# {visible(inside[1])}\n", 1)
    if "date" not in fields:
        await files.write(note, updated)
        return note
    # Written at its new place first: a stop between the two leaves the note twice,
    # never lost, and the catalog (saved after) still names the old one, which the
    # move is made from again.
    target = await note_path(ws, {"path": new, "date": date, "note": None})
    await files.write(target, updated)
    if target != note:
        try:
            await files.remove(note, original)
        except WriteConflict:  # edited by hand meanwhile: that text is not ours to drop
            log.warning("%s changed while it moved to %s: left in place",
                        safepath.masked(note), safepath.masked(target))
    return target
