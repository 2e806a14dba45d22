"""File operations on a workspace's Markdown, for models and for memory jobs.

Owns nothing long-lived and starts no task. :class:`FileOps` reads and writes files named
relative to a workspace root, confined to it: names are checked by :mod:`safepath` (NUL,
absolute, ``..`` refused) and every directory on the way is checked not to be a symbolic
link before anything is written (``PathOutsideWorkspace``). Writes are allowed only under
the folders of its :class:`WritePolicy` (by default the daily and digest folders, ``.md``
files only: a model never writes under ``metadata_dir``, ``session_dir`` or
``resource_dir``). Every write is an atomic publish (temp file, fsync, rename) and is then
made searchable: ``await sync()`` (the workspace index's ``sync``) returns once the index
has seen it. A change made from a file's text (``edit``, ``frontmatter_update``,
``daily_write``, ``replace``) is published only if the file still holds that text
(:func:`publish_if_holds`): one saved meanwhile by a person's editor or a script is read
again and the change made from it, never overwritten.

Text coming in (content, replacement text, frontmatter values, names and descriptions)
is redacted (:mod:`redact`) before it is written: whoever calls, a note never receives
a credential. Text already in a file is left as its author wrote it.

All writes of one workspace go through one lock (``fileops_for`` shares it), so two jobs
picking a unique daily-note name cannot both take the same one. Each successful change is
recorded in :attr:`FileOps.changes` (path, text before, text after): jobs use it for the
inbox and for undo.

The same operations are offered to a chat model as OpenAI tool schemas (:meth:`tools`)
with a dispatcher (:meth:`call_tool`) that turns every error into text for the model and
never raises (except cancellation); both are in :mod:`filetools`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import trio

from recalld.daemon import safepath
from recalld.daemon.config import WorkspaceSettings
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.index.frontmatter_edit import DELETE, keep_fields, render_frontmatter
from recalld.daemon.index.frontmatter_edit import update_frontmatter as _update_fm
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.confined import MAX_EDIT_BYTES as MAX_EDIT_BYTES
from recalld.daemon.memory.confined import NotUtf8 as NotUtf8
from recalld.daemon.memory.confined import WriteConflict as WriteConflict
from recalld.daemon.memory.confined import (
    made_again_on_conflict,
    publish_if_holds,
    unlink_confined,
    utf8_file,
)
from recalld.daemon.memory.confined import read_confined as read_confined
from recalld.daemon.memory.confined import saved_meanwhile as saved_meanwhile
from recalld.daemon.memory.confined import write_confined as write_confined
from recalld.daemon.memory.notenames import DAY_INDEX as DAY_INDEX
from recalld.daemon.memory.notenames import is_daily_note_name
from recalld.daemon.memory.slugs import continued_order, slug
from recalld.daemon.notetext import lf_line_ends
from recalld.daemon.spelling import spelled
from recalld.daemon.workspaces import Workspace
from recalld.daemon.writefailures import WriteFailures
from recalld.ipc.errors import InvalidParams, NotAllowed, NotFound, RecalldError

if TYPE_CHECKING:
    from recalld.daemon.providers.chat import ToolSchema

log = logging.getLogger(__name__)

MAX_WRITE_BYTES = 1 << 20
#: Room a note keeps for its frontmatter (and what redaction may add) when content is
#: added to it: one without it is continued in the next (``room_for``, :func:`has_room`).
NOTE_HEADER_BYTES = 4096
MAX_TOOL_READ_BYTES = 64 * 1024
SYNC_TIMEOUT_S = 30.0
#: Times a change is made from a file's text again when it was saved meanwhile (an editor).
WRITE_TRIES = 8
#: :meth:`FileOps.daily_write`'s ``expect`` when any text of the note will do.
ANY_TEXT: object = object()
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: Blank lines a note's content opens with (a model's answer often does): the body is
#: written without them, so a frontmatter block after them is the note's.
_LEADING_BLANKS = re.compile(r"\A(?:[ \t\r]*\n)+")

Sync = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class WritePolicy:
    """Where writes may go: top folders (relative to the root) and allowed suffixes.

    ``suffixes=None`` allows any file name (daemon-internal writes).
    """

    folders: tuple[str, ...]
    suffixes: tuple[str, ...] | None = (".md",)

    @classmethod
    def for_model(cls, settings: WorkspaceSettings) -> WritePolicy:
        """Daily notes and digest nodes, Markdown only."""
        return cls((settings.daily_dir, settings.digest_dir), (".md",))


@dataclass(frozen=True, slots=True)
class Change:
    """One file write: ``before`` is None for a created file."""

    path: str
    before: str | None
    after: str

    @property
    def created(self) -> bool:
        return self.before is None


class Written(TypedDict):
    """A :class:`WriteResult` on the wire."""

    path: str
    created: bool
    changed: bool


@dataclass(frozen=True, slots=True)
class WriteResult:
    """Where a write went; ``changed`` is False when the file already had that content;
    ``text``: what the file holds now (the content written, its secrets masked)."""

    path: str
    created: bool
    changed: bool
    text: str

    def as_dict(self) -> Written:
        return {"path": self.path, "created": self.created, "changed": self.changed}


def has_room(text: str, room_for: int) -> bool:
    """True if a note of ``text`` can grow by ``room_for`` bytes and still be written."""
    return not room_for or len(text.encode("utf-8")) + room_for <= MAX_WRITE_BYTES


def check_date(date: object, today: Callable[[], dt.date]) -> str:
    if date is None:
        return today().isoformat()
    if not isinstance(date, str) or not _DATE_RE.match(date):
        raise InvalidParams("date must be YYYY-MM-DD")
    try:
        dt.date.fromisoformat(date)
    except ValueError:
        raise InvalidParams(f"not a calendar date: {date}") from None
    return date


def source_link(settings: WorkspaceSettings, session_id: str) -> str:
    """The ``source_conversation`` wikilink of a session's dialog file."""
    return f"[[{settings.session_dir}/dialog/{session_id}.jsonl]]"


# -- the operations ------------------------------------------------------------------------


@dataclass
class FileOps:
    """File operations on one workspace; see the module docstring.

    ``session_id`` binds the ``daily_write`` tool to one conversation (jobs set it; a
    model cannot write a note as another session). ``today`` gives the local date for
    daily notes. Public async methods raise :mod:`recalld.ipc.errors` exceptions
    (PathOutsideWorkspace, InvalidParams, NotAllowed, NotFound) or a StorageError.
    Cancellation during a write leaves the old file (the publish is atomic).
    """

    root: Path
    settings: WorkspaceSettings
    policy: WritePolicy
    lock: trio.Lock = field(default_factory=trio.Lock)
    sync: Sync | None = None
    session_id: str | None = None
    today: Callable[[], dt.date] = dt.date.today
    changes: list[Change] = field(default_factory=list)
    writes: WriteFailures = field(default_factory=WriteFailures)

    # -- policy -----------------------------------------------------------------------

    def check_writable(self, path: str) -> str:
        """The normalized relative path if the policy allows writing it."""
        parts = safepath.split_file(path)
        rel = "/".join(parts)
        if not safepath.below(parts, self.policy.folders):
            allowed = ", ".join(f"{f}/" for f in self.policy.folders)
            raise NotAllowed(f"writing {rel} is not allowed (only under {allowed})")
        suffixes = self.policy.suffixes
        if suffixes is not None and not rel.endswith(suffixes):
            raise NotAllowed(f"only {', '.join(suffixes)} files may be written: {rel}")
        return rel

    async def writable(self, path: str) -> str:
        """:meth:`check_writable` of ``path`` as the disk spells it (``spelled``)."""
        return self.check_writable(await spelled(self.root, self.check_writable(path)))

    # -- primitives --------------------------------------------------------------------

    async def read_text(self, path: str, *, strict: bool = False) -> str | None:
        """Whole text of a workspace file, or None if it does not exist (``strict``:
        :class:`NotUtf8` if it is not UTF-8, see :func:`read_confined`)."""
        return await trio.to_thread.run_sync(
            lambda: read_confined(self.root, path, strict=strict))

    async def _publish(self, rel: str, before: str | None, after: str, *,
                       checked: bool = True) -> WriteResult:
        """Write ``after`` (caller holds the lock); record the change. ``checked``: only
        if the file still holds ``before`` (None: none), else
        :class:`WriteConflict` and a save made since stays (:func:`publish_if_holds`)."""
        if before == after:
            return WriteResult(rel, created=False, changed=False, text=after)
        data = after.encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise InvalidParams(f"content too large ({MAX_WRITE_BYTES} bytes max)")
        publish = partial(publish_if_holds, rel, before) if checked else None
        await self.writes.run(self.root / rel, write_confined, self.root, rel, data,
                              publish=publish)
        self.changes.append(Change(rel, before, after))
        return WriteResult(rel, created=before is None, changed=True, text=after)

    async def _searchable(self) -> None:
        if self.sync is None:
            return
        with trio.move_on_after(SYNC_TIMEOUT_S) as scope:
            await self.sync()
        if scope.cancelled_caught:
            log.warning("index sync after a write in %s took over %ss", self.root, SYNC_TIMEOUT_S)

    # -- operations --------------------------------------------------------------------

    async def read(self, path: str, start_line: int | None = None,
                   end_line: int | None = None) -> safepath.LineSlice:
        """Lines ``start_line..end_line`` (1-based, inclusive) of a workspace file."""
        start = 1 if start_line is None else start_line
        if start < 1 or (end_line is not None and end_line < start):
            raise InvalidParams("bad line range")
        path = await spelled(self.root, path)
        got = await trio.to_thread.run_sync(
            lambda: safepath.read_lines(self.root, path, start_line=start, end_line=end_line,
                                        max_bytes=MAX_TOOL_READ_BYTES))
        if "\ufffd" in got.text and not await trio.to_thread.run_sync(
                utf8_file, self.root, path):
            raise NotUtf8("/".join(safepath.split_relative(path)))
        return got

    async def write(self, path: str, content: str) -> WriteResult:
        """Create or replace a file with ``content``."""
        return await self._write(path, content, check=False, expect=None)

    async def replace(self, path: str, expect: str | None, content: str) -> WriteResult:
        """:meth:`write`, if the file still holds ``expect`` (None: there is no such file);
        else :class:`WriteConflict`: someone wrote it since the caller read it."""
        return await self._write(path, content, check=True, expect=expect)

    async def _write(self, path: str, content: str, *, check: bool,
                     expect: str | None) -> WriteResult:
        rel = self.check_writable(path)
        from recalld.daemon.memory.redact import redact_async

        content = await redact_async(content)
        async with self.lock:  # two writes of one new name in two forms make one file
            rel = await self.writable(rel)
            before = await self.read_text(rel)
            if check and before != expect:
                raise WriteConflict(f"{rel} changed since it was read")
            result = await self._publish(rel, before, content, checked=check)
        await self._searchable()
        return result

    async def remove(self, path: str, expect: str) -> None:
        """Remove the file, if it still holds ``expect``; else :class:`WriteConflict`
        (someone wrote it since the caller read it). Nothing there: nothing to do."""
        rel = await self.writable(path)
        async with self.lock:
            if await self.read_text(rel) not in (expect, None):
                raise WriteConflict(f"{rel} changed since it was read")
            await self.writes.run(self.root / rel, unlink_confined, self.root, rel, expect)
        await self._searchable()

    async def edit(self, path: str, old: str, new: str) -> WriteResult:
        """Replace the one occurrence of ``old`` by ``new`` (error if 0 or several)."""
        rel = await self.writable(path)
        if not old:
            raise InvalidParams("old text must not be empty")
        from recalld.daemon.memory.redact import redact_async, redact_inserted

        new = await redact_async(new)

        async def attempt() -> WriteResult:
            before = await self.read_text(rel, strict=True)
            if before is None:
                raise NotFound(f"no such file in the workspace: {safepath.quoted(rel)}")
            count = before.count(old)
            if count != 1:
                raise InvalidParams(
                    f"old text occurs {count} times in {rel}; it must occur exactly once")
            at = before.index(old)
            # Masked where it goes too: the index reads it with the lines around it.
            after = await trio.to_thread.run_sync(
                redact_inserted, before.replace(old, new, 1), at, at + len(new))
            return await self._publish(rel, before, after)

        async with self.lock:
            result = await made_again_on_conflict(attempt, WRITE_TRIES)
        await self._searchable()
        return result

    async def frontmatter_update(self, path: str, changes: Mapping[str, object]) -> WriteResult:
        """Set frontmatter keys (a None value removes the key); other lines stay as they are."""
        rel = await self.writable(path)
        from recalld.daemon.memory.redact import redact_value

        # Each value read with its key, as the index reads the line ("wifi_password: x").
        edits = {str(k): (DELETE if v is None else redact_value({str(k): v})[str(k)])
                 for k, v in changes.items()}

        async def attempt() -> WriteResult:
            before = await self.read_text(rel, strict=True)
            if before is None:
                raise NotFound(f"no such file in the workspace: {safepath.quoted(rel)}")
            after = _update_fm(before, edits)
            # A key that does not read back as itself ("description " next to
            # "description", "name:") can make the whole block unreadable: every field lost.
            fields = parse_frontmatter(after)[0]
            if lost := [k for k, v in edits.items() if v is not DELETE and k not in fields]:
                raise InvalidParams(
                    f"the frontmatter would not read back with the key {lost[0]!r}: keys are "
                    "words (letters, digits, _ . -), with no colon or spaces around them; "
                    "nothing was changed")
            # A value can read back as another ({"k: x": 1} as {"k": "x: 1"}, a nested
            # list as its text), or take the keys around it with it ({"": 1}).
            wanted = {**parse_frontmatter(before)[0], **edits}
            if other := [k for k, v in wanted.items()
                         if v is not DELETE and _json(fields.get(k)) != _json(v)]:
                raise InvalidParams(
                    f"the frontmatter would not read back the value of {other[0]!r} as "
                    "written: values are text, numbers, true/false, or lists or mappings "
                    "(of word keys) of those; nothing was changed")
            return await self._publish(rel, before, after)

        async with self.lock:
            result = await made_again_on_conflict(attempt, WRITE_TRIES)
        await self._searchable()
        return result

    def day_folder(self, date: str) -> str:
        return f"{'/'.join(safepath.split_relative(self.settings.daily_dir))}/{date}"

    async def session_notes(self, session_id: str, date: str) -> list[str]:
        """The paths of ``session_id``'s notes on ``date``, by name, a note's continuations
        (``-2``, ``-3``... that :meth:`daily_write` makes when it is full) after it, in
        their order."""

        def scan() -> list[str]:
            folder = self.root / self.day_folder(date)
            try:
                names = sorted(os.listdir(folder), key=continued_order)
            except (FileNotFoundError, NotADirectoryError):
                return []
            out: list[str] = []
            for name in names:
                if not is_daily_note_name(name):
                    continue
                rel = f"{self.day_folder(date)}/{name}"
                try:
                    text = read_confined(self.root, rel, strict=True)
                except RecalldError:  # too large, a link, not UTF-8: not written here
                    continue
                if text is not None and parse_frontmatter(text)[0].get("session_id") == session_id:
                    out.append(rel)
            return out

        return await trio.to_thread.run_sync(scan)

    async def daily_write(self, session_id: str, name: str, content: str,
                          date: str | None = None, description: str | None = None,
                          extra: Mapping[str, object] | None = None,
                          room_for: int = 0, dialog: bool = True,
                          expect: object = ANY_TEXT) -> WriteResult:
        """Write ``session_id``'s note ``name`` under ``<daily_dir>/<date>/``.

        The note gets frontmatter ``name``, ``description``, ``session_id`` and
        ``source_conversation`` (plus ``extra`` fields); ``content`` is its body (a
        frontmatter block at its start is merged, the daemon's fields win). If
        ``<name>.md`` belongs to another session (or to nobody: a hand-written note), a
        new unique name ``<name>-2.md``, ``-3``... is chosen; this session's own note is
        updated in place. Never overwrites another session's note. With ``room_for``,
        an own note without that many bytes of room (:func:`has_room`) is passed over
        too: the session's notes go on in the next one. Without ``dialog`` (the session's
        conversation is in no dialog log), the note gets no ``source_conversation``.

        A note saved meanwhile (a person's editor) is read again and the write made from
        that; with ``expect`` (the text ``content`` was made from, None: no note), a note
        found otherwise raises :class:`WriteConflict`: the caller makes content again.
        """
        if not session_id or not isinstance(session_id, str):
            raise InvalidParams("session_id must be a non-empty string")
        day = check_date(date, self.today)
        from recalld.daemon.memory.redact import redact, redact_async, redact_value

        stem = slug(redact(name))
        content = _LEADING_BLANKS.sub("", await redact_async(lf_line_ends(content)))
        description = redact(description) if description else description
        extra = redact_value(dict(extra)) if extra else extra
        given, body_start = parse_frontmatter(content)
        body = "\n".join(content.split("\n")[body_start:]) if body_start else content
        fields: JsonObject = {  # frontmatter: user metadata
            "name": given.get("name") or stem,
            "description": description or given.get("description") or "",
        }
        for key, value in {**given, **dict(extra or {})}.items():
            if key not in fields:
                fields[key] = value
        fields["session_id"] = session_id
        if dialog:
            fields["source_conversation"] = source_link(self.settings, session_id)
        async def attempt() -> WriteResult:
            before: str | None = None
            rel = ""
            wanted = dict(fields)  # from the note as read this time
            for n in range(1, 1000):
                rel = f"{self.day_folder(day)}/{stem if n == 1 else f'{stem}-{n}'}.md"
                rel = await self.writable(rel)
                try:
                    before = await self.read_text(rel, strict=True)
                except NotUtf8:
                    continue  # never written over, whoever's it is: another name
                if before is None:
                    break
                if parse_frontmatter(before)[0].get("session_id") == session_id and (
                        has_room(before, room_for)):
                    old_fields = parse_frontmatter(before)[0]
                    if not description and not given.get("description"):
                        wanted["description"] = old_fields.get("description") or ""
                    keep_fields(wanted, old_fields)
                    if not dialog:  # a link written before, to a file never written
                        wanted.pop("source_conversation", None)
                    break
            else:
                raise InvalidParams(f"no free note name for {stem} on {day}")
            if expect is not ANY_TEXT and before != expect:
                raise WriteConflict(f"{rel} changed since it was read")
            text = render_frontmatter(wanted) + body.lstrip("\n")
            if not text.endswith("\n"):
                text += "\n"
            return await self._publish(rel, before, text)

        async with self.lock:
            result = await (attempt() if expect is not ANY_TEXT
                            else made_again_on_conflict(attempt, WRITE_TRIES))
        await self._searchable()
        return result

    # -- tools for a chat model --------------------------------------------------------

    def tools(self, names: Iterable[str] | None = None) -> list[ToolSchema]:
        """OpenAI ``tools`` entries for the named operations (:mod:`filetools`), all of
        them by default."""
        from recalld.daemon.memory import filetools

        return filetools.schemas(filetools.ALL_TOOLS if names is None else names)

    async def call_tool(self, name: str, arguments: Mapping[str, object]) -> str:
        """Run one tool call and describe the outcome as text; errors become text too
        (:func:`filetools.call`)."""
        from recalld.daemon.memory import filetools

        return await filetools.call(self, name, arguments)


def fileops_for(ws: Workspace, *, policy: WritePolicy | None = None,
                session_id: str | None = None,
                today: Callable[[], dt.date] = dt.date.today) -> FileOps:
    """FileOps on an open workspace: its shared write lock, its index's ``sync``, its
    failing writes. ``policy`` defaults to :meth:`WritePolicy.for_model`."""
    services = ws.services
    return FileOps(
        root=ws.root, settings=ws.settings,
        policy=policy if policy is not None else WritePolicy.for_model(ws.settings),
        lock=services.write_lock, sync=services.index.sync, writes=ws.writes,
        session_id=session_id, today=today,
    )


def _json(value: object) -> str:
    """``value`` as canonical JSON, for comparing values by type as well (1 is not true)."""
    return json.dumps(value, sort_keys=True, default=str)
