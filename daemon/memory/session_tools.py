"""The tools a chat model gets in an auto_memory run: this session's note of one day.

A rewrite never loses a fact: a ``daily_write`` or ``edit`` of the note that would drop
one of its bullet points or lines of prose (what ``memory.add_note`` wrote as sentences:
headings, rules and code fences aside) is refused, and the model is told which, so it
can write again keeping them. A model that does not (it answers, or runs out of steps)
would leave the new facts of the turns in the dialog file only, though the turns are
committed: so at the end of its run the last refused version of the note is written
after all, with the dropped lines put back at its end (:meth:`SessionTools.keep_refused`).
Neither the old facts nor the new ones are lost; a refused rewrite that adds no line of
its own is left as it is, and a note changed since (by the agent, by a person) stands
with the rewrite's new lines added.

``daily_append`` (given in place of ``daily_write`` for a note too long to write again
in one answer, :mod:`capture_long`) adds the lines of its content that the note lacks at
the note's end, after the headings of its content they are under that the note lacks too
(or makes the note of them, when there is none yet): nothing of the note
is written by the model, so nothing can be dropped, and a line the note holds already is
not written twice.

Every other write the model asked for that did not happen is a write failure
(:attr:`SessionTools.write_failures`): the disk's, arguments it got wrong, a tool it may
not use, a file that is not this session's note, a daemon field it tried to change, or a
frontmatter block the daemon cannot read at the start of its content (a duplicate key, a
quote or a block left open: kept as body text, its lines would be facts no rewrite may
drop). The model is told why and may write again; if it writes nothing, the job fails
and the turns stay pending, rather than being committed with their facts in no note.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

import orjson
import trio

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import (
    body_of,
    has_body,
    open_fields,
    parse_frontmatter,
    unreadable_block,
)
from recalld.daemon.memory import capture_log, filetools
from recalld.daemon.memory.fileops import (
    NOTE_HEADER_BYTES,
    FileOps,
    has_room,
    read_confined,
)
from recalld.daemon.memory.redact import redact
from recalld.daemon.memory.slugs import continued_from
from recalld.daemon.memory.textlines import dropped_bullets, with_headings
from recalld.ipc.errors import InvalidParams, NotAllowed

log = logging.getLogger(__name__)

#: Frontmatter fields of a session's note that the daemon sets: which conversation the
#: note is of. A model that changed them would hand the note to another session.
DAEMON_FIELDS = ("session_id", "source_conversation")
_KEEP_FIELDS = (f"{' and '.join(DAEMON_FIELDS)} are set by the daemon and cannot be "
                "changed; leave those lines as they are")
_BROKEN_FRONTMATTER = (
    "the content starts with a frontmatter block (---) that cannot be read (a duplicate "
    "key, a quote or the block left open); nothing was written. Give name and "
    "description as arguments and write only the Markdown body in content")
#: The name of a note ``daily_append`` makes when the model names none.
NEW_NOTE_NAME = "conversation"
#: What some models put before a tool's name: ``functions.`` (models trained on OpenAI's
#: harmony and Codex formats), ``tools.``, ``default_api.`` (Gemini's code-style calls).
TOOL_NAMESPACES = ("functions", "tools", "default_api")
_NO_TEXT = ("error: the content holds no text; nothing was written. Write the facts as "
            "Markdown bullet points; if nothing is worth remembering, call no tool")
_BROKEN_BY_EDIT = ("this edit would leave the note's frontmatter unreadable (a duplicate "
                   "key, a quote or the block left open); nothing was changed")


def _drops(before: str, after: str) -> list[str]:
    """The bullet points of ``before``'s body that ``after`` drops, both masked as the
    model was shown the note (a secret typed into a bullet comes back masked, which is no
    drop; and a refusal quotes bullets as the model and the records see them)."""
    return dropped_bullets(redact(body_of(before)[0]), redact(body_of(after)[0]), prose=True)


def _new_lines(content: str, held: str) -> list[str]:
    """The lines of ``content`` that ``held`` (a note) lacks (:func:`_drops`), after the
    headings of ``content`` they are under that it lacks too (:func:`with_headings`)."""
    return with_headings(redact(body_of(content)[0]), _drops(content, held), held)


@dataclass(frozen=True, slots=True)
class _Refused:
    """A refused rewrite: the note's text then, what the model asked it to become (a
    ``daily_write`` content, or the whole note after an ``edit``), the bullets it dropped."""

    before: str
    wanted: str
    dropped: list[str]


class SessionTools:
    """The tools a model gets in auto_memory: only this session's note of one day."""

    NAMES = ("daily_write", "daily_append", "read", "edit", "frontmatter_update")

    def __init__(self, ops: FileOps, session_id: str, date: str,
                 note_lock: trio.Lock | None = None) -> None:
        self.ops = ops
        #: Held from the read of the note to its write (``memory.add_note`` holds it
        #: too): an append made in between would be written over, or this write.
        self.note_lock = note_lock if note_lock is not None else trio.Lock()
        self.session_id = session_id
        self.date = date
        #: Rewrites refused because they dropped bullet points of the note.
        self.refused: list[capture_log.Refusal] = []
        #: The last refused rewrite of each note not written since (see keep_refused).
        self._unsettled: dict[str, _Refused] = {}
        #: Writes the model asked for that did not happen: for the disk's sake (full,
        #: read-only, I/O errors) or for the model's (bad arguments, a tool it may not
        #: use, another file, a daemon field, an unreadable frontmatter block). Not the
        #: refusals of rewrites that drop bullet points: keep_refused writes those.
        self.write_failures: list[str] = []
        #: Writes of the note that were made, whether they changed it or it held them.
        self.writes_made = 0

    def _fail(self, name: str, why: str) -> str:
        """Record a write the model asked for that is not made; its answer."""
        self.write_failures.append(f"{name}: {why}")
        log.warning("auto_memory: refused a %s: %s", name, why)
        return f"error: {why}"

    async def _text(self, rel: str) -> str:
        return await trio.to_thread.run_sync(read_confined, self.ops.root, rel) or ""

    def _refuse(self, tool: str, rel: str, refused: _Refused) -> str:
        dropped = refused.dropped
        self.refused.append({"tool": tool, "path": rel, "dropped": dropped})
        self._unsettled[rel] = refused
        log.warning("auto_memory: refused a %s of %s that dropped %d line(s)",
                    tool, safepath.masked(rel), len(dropped))
        listed = "\n".join(dropped[:20])
        return (f"error: refused: this would drop {len(dropped)} line(s) (bullet points or "
                f"sentences) the note already holds. Write the whole note again keeping "
                f"them (correct a fact by rewording it, never by removing it):\n{listed}")

    async def _check_edit(self, rel: str, old: str, new: str) -> _Refused | None:
        """The edit as a refused rewrite if it drops bullet points, judged on the whole
        note: an edit of part of a line (``green tea`` to nothing) can empty a bullet too."""
        rel = "/".join(safepath.split_relative(rel))  # checked by _own
        text = await self._text(rel)
        if not old or text.count(old) != 1:
            return None  # the edit itself is refused, and says why
        after = text.replace(old, new, 1)
        dropped = await trio.to_thread.run_sync(_drops, text, after)
        return _Refused(text, after, dropped) if dropped else None

    async def _keeps_fields(self, rel: str, old: str, new: str) -> str | None:
        """Why the edit may not be made if it changes the note's :data:`DAEMON_FIELDS` or
        leaves its frontmatter unreadable; None if it may (an edit that cannot apply is
        refused by the edit itself)."""
        text = await self._text("/".join(safepath.split_relative(rel)))  # checked by _own
        if not old or text.count(old) != 1:
            return None
        after = text.replace(old, new, 1)
        (before, _), (fields, body_start) = parse_frontmatter(text), parse_frontmatter(after)
        if not body_start:  # the note's block (_own read it) would no longer parse
            return _BROKEN_BY_EDIT
        if any(before.get(key) != fields.get(key) for key in DAEMON_FIELDS):
            return _KEEP_FIELDS
        return None

    async def _own(self, path: str) -> str | None:
        """Why the model may not change ``path``, or None if it is this session's note."""
        try:
            parts = safepath.split_relative(path)
        except InvalidParams as exc:
            return exc.message
        rel = "/".join(parts)
        if PurePosixPath(rel).parent.as_posix() != self.ops.day_folder(self.date):
            return f"only notes under {self.ops.day_folder(self.date)}/ may be changed"
        text = await trio.to_thread.run_sync(read_confined, self.ops.root, rel)
        if text is None or parse_frontmatter(text)[0].get("session_id") != self.session_id:
            return f"{rel} is not this conversation's note"
        return None

    def tool_name(self, name: str) -> str:
        """The tool ``name`` means: one of :attr:`NAMES` after one of
        :data:`TOOL_NAMESPACES` is that tool; any other name is itself."""
        namespace, dot, bare = name.partition(".")
        return bare if dot and namespace in TOOL_NAMESPACES and bare in self.NAMES else name

    async def __call__(self, name: str, arguments: Mapping[str, object]) -> str:
        name = self.tool_name(name)
        if name == "read":
            return await self._call(name, arguments)
        try:
            async with self.note_lock:
                return await self._call(name, arguments)
        except Exception as exc:  # told to the model by the tool loop; no write was made
            self.write_failures.append(f"{name}: {type(exc).__name__}: {exc}")
            raise

    async def _call(self, name: str, arguments: Mapping[str, object]) -> str:
        # What the model writes is redacted by the file operations themselves.
        args = dict(arguments)
        if name == "daily_write":
            args["date"] = self.date  # the job decides the day
            content = args.get("content")
            if isinstance(content, str) and (unreadable_block(content.lstrip("\n"))
                                             or open_fields(content.lstrip("\n"))):
                return self._fail(name, _BROKEN_FRONTMATTER)
            if isinstance(content, str) and not has_body(content):
                # An empty note is no memory (nor a failure: nothing was to be saved).
                return _NO_TEXT
            existing = await self.current_note()
            if existing is not None:  # one note per session per day: update it
                args["name"] = PurePosixPath(existing).stem
                before = await self._text(existing)
                content = str(args.get("content", ""))
                dropped = await trio.to_thread.run_sync(_drops, before, content)
                if dropped:
                    return self._refuse(name, existing, _Refused(before, content, dropped))
        elif name == "daily_append":
            appended = await self._appended(args)
            if isinstance(appended, str):
                return appended
            name, args = "daily_write", appended  # the whole note, with the new lines
        elif name in ("edit", "frontmatter_update"):
            refusal = await self._own(str(args.get("path", "")))
            if refusal is not None:
                return self._fail(name, refusal)
            changes = args.get("changes")
            if name == "frontmatter_update" and isinstance(changes, Mapping) and any(
                    str(key).strip() in DAEMON_FIELDS for key in changes):
                return self._fail(name, _KEEP_FIELDS)
            if name == "edit":
                kept = await self._keeps_fields(str(args.get("path", "")),
                                                str(args.get("old", "")),
                                                str(args.get("new", "")))
                if kept is not None:
                    return self._fail(name, kept)
                path = str(args.get("path", ""))
                refused = await self._check_edit(path, str(args.get("old", "")),
                                                 str(args.get("new", "")))
                if refused is not None:
                    return self._refuse(name, "/".join(safepath.split_relative(path)),
                                        refused)
        elif name == "read":
            # Notes only: not other sessions' dialogs, resources or derived state.
            try:
                self.ops.check_writable(str(args.get("path", "")))
            except (InvalidParams, NotAllowed) as exc:
                return f"error: {exc.message}"
        else:
            return self._fail(name, f"unknown tool {name!r}; the tools are "
                                    f"{', '.join(self.NAMES)}")
        changes = len(self.ops.changes)
        storage: list[str] = []
        answer = await filetools.call(self.ops, name, args, storage_errors=storage)
        if name != "read" and answer.startswith("error:"):
            self.write_failures.append(storage[-1] if storage else f"{name}: {answer[7:]}")
        elif name != "read":
            self.writes_made += 1
        for change in self.ops.changes[changes:]:
            self._unsettled.pop(change.path, None)  # written since its refusal
        return answer

    async def _appended(self, args: Mapping[str, object]) -> str | dict[str, object]:
        """``daily_append``: the ``daily_write`` arguments of the note with the lines of
        ``content`` it lacks added at its end (the model does not write the note again,
        so none of its lines can be dropped, and one it holds is not written twice), or
        of a new note of them when there is none yet; or the answer, when there is
        nothing to write."""
        name, content = "daily_append", args.get("content")
        if not isinstance(content, str):
            return self._fail(name, "argument 'content' must be a string")
        if unreadable_block(content.lstrip("\n")) or open_fields(content.lstrip("\n")):
            return self._fail(name, _BROKEN_FRONTMATTER)
        if not has_body(content):
            return _NO_TEXT
        notes = await self.continued_notes()
        if not notes:  # the first facts of the day: the note is made of them
            return {"name": args.get("name") or NEW_NOTE_NAME, "date": self.date,
                    "description": args.get("description"), "content": content}
        texts = [await self._text(rel) for rel in notes]
        # Against the note and those it continues: a line a full note holds is not
        # written again in the note that continues it.
        new = await trio.to_thread.run_sync(_new_lines, content, "\n".join(texts))
        if not new:
            self.writes_made += 1  # what it asked for is there
            return orjson.dumps({"ok": True, "path": notes[-1], "changed": False,
                                 "note": "the note holds every one of these lines"}).decode()
        added = "\n".join(new) + "\n"
        room_for = len(added.encode()) + NOTE_HEADER_BYTES
        if has_room(texts[-1], room_for):
            return {"name": PurePosixPath(notes[-1]).stem, "date": self.date,
                    "content": texts[-1].rstrip("\n") + "\n" + added}
        # The note is full (MAX_WRITE_BYTES): its facts go on in the next one, found by
        # session_notes after it and listed in the day's index like it. Its name is one
        # no file has (another conversation's ``-2`` is passed over, never continued as
        # ``-2-2``, which would no longer read as this note's continuation).
        base, n = continued_from(PurePosixPath(notes[-1]).stem)
        folder = self.ops.root / self.ops.day_folder(self.date)
        while await trio.to_thread.run_sync(os.path.lexists, folder / f"{base}-{n + 1}.md"):
            n += 1
        description = parse_frontmatter(texts[0])[0].get("description")
        return {"name": f"{base}-{n + 1}", "date": self.date, "content": added,
                "description": f"{description} (continued)" if description else None}

    async def continued_notes(self) -> list[str]:
        """The session's note of the day (the first by name) and the notes that continue
        it (``-2``, ``-3``..., made when it was full: :meth:`_appended`), in order."""
        notes = await self.ops.session_notes(self.session_id, self.date)
        base = continued_from(PurePosixPath(notes[0]).stem)[0] if notes else ""
        return [rel for rel in notes if continued_from(PurePosixPath(rel).stem)[0] == base]

    async def current_note(self) -> str | None:
        """The session's note of the day that is added to (the last of
        :meth:`continued_notes`), or None."""
        notes = await self.continued_notes()
        return notes[-1] if notes else None

    async def keep_refused(self) -> None:
        """Write each note's last refused rewrite that the model did not follow with a
        write of its own, with the lines it dropped added back at its end: the turns are
        committed after the run, so the new lines would be lost otherwise. Skipped when
        the rewrite adds no line the note lacks (it only dropped or shortened some). A
        note changed since it was refused (the agent added to it, a person edited it)
        stands as it is now, with the rewrite's new lines it lacks added at its end."""
        unsettled, self._unsettled = self._unsettled, {}
        for rel, refused in unsettled.items():
            async with self.note_lock:
                await self._keep(rel, refused)

    async def _keep(self, rel: str, refused: _Refused) -> None:
        new = await trio.to_thread.run_sync(_drops, refused.wanted, refused.before)
        if not new:
            return  # no line of its own: it only dropped or shortened
        now = await self._text(rel)
        if now != refused.before:  # what is there now stands, and the new lines
            missing = await trio.to_thread.run_sync(_drops, "\n".join(new), now)
            if not missing:
                return
            merged = now.rstrip("\n") + "\n" + "\n".join(missing) + "\n"
        else:
            merged = refused.wanted.rstrip("\n") + "\n" + "\n".join(refused.dropped) + "\n"
        await self.ops.daily_write(self.session_id, PurePosixPath(rel).stem, merged,
                                   date=self.date)
        log.info("auto_memory: kept the new lines of the refused rewrite of %s; no line of "
                 "the note was dropped", safepath.masked(rel))
