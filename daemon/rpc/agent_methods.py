"""RPC methods that agent integrations (framework middleware, the MCP bridge) need besides
search and read: ``memory.add_note``, ``memory.index``, ``memory.list`` and
``memory.recall`` (the block an agent puts before its reply, :mod:`recalld.daemon.memory.recall`).

``memory.add_note`` writes what an agent chose to remember into its own note of the day
through the workspace file operations (confined, atomic, searchable before the answer).
``memory.index`` is a short table of contents of the long-term nodes (name and one-line
description from each node's frontmatter), ``memory.list`` the Markdown files of a
workspace. Both read methods accept ``as_agent`` like ``memory.read`` (see
:mod:`recalld.daemon.sharing`). Nothing here starts a task; file walks run in worker
threads and are bounded in entries and bytes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TypedDict

import trio

from recalld.daemon import safepath, sharing
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.index.search import MAX_RESULTS_CAP, search
from recalld.daemon.memory import note_retry, topics
from recalld.daemon.memory.confined import read_checked
from recalld.daemon.memory.dreamruns import INTERESTS_FILE
from recalld.daemon.memory.fileops import (
    NOTE_HEADER_BYTES,
    WRITE_TRIES,
    WriteConflict,
    check_date,
    fileops_for,
    has_room,
    read_confined,
    saved_meanwhile,
)
from recalld.daemon.memory.interests import parse_interests
from recalld.daemon.memory.markdown_files import walk_markdown
from recalld.daemon.memory.recall import (
    DEFAULT_BUDGET_CHARS,
    MAX_BUDGET_CHARS,
    build_recall,
    query_of,
)
from recalld.daemon.memory.redact import masked_in, redact, redact_async
from recalld.daemon.memory.selection import MAX_SELECT, select_topics
from recalld.daemon.memory.slugs import has_name, names_nothing, slug
from recalld.daemon.memory.turns import check_request_id, check_session_id
from recalld.daemon.notetext import lf_line_ends, note_text
from recalld.daemon.rpc.dispatch import CallContext, JsonObject, Methods, Params
from recalld.daemon.spelling import on_disk, spelled
from recalld.daemon.store.errors import StorageError
from recalld.daemon.workspaces import Workspace, check_agent_id
from recalld.ipc.answers import (
    FileEntry,
    IndexEntry,
    Interests,
    MemoryIndex,
    NoteAdded,
    Recall,
    Selected,
    TopicWritten,
)
from recalld.ipc.errors import LOOKS_LIKE_A_CREDENTIAL, InvalidParams, NotFound, RecalldError
from recalld.ipc.textcut import cut_text
from recalld.ipc.types import visible

log = logging.getLogger(__name__)

METHODS = Methods()

MAX_NOTE_CHARS = 32_000
DEFAULT_NOTE_SESSION = "agent-notes"
DEFAULT_NOTE_NAME = "agent-notes"
MAX_LIST_FILES = 10_000
DEFAULT_INDEX_ENTRIES = 200
MAX_INDEX_ENTRIES = 2_000
# Only the head of a node is read for its frontmatter: an index must not read every byte.
FRONTMATTER_HEAD_BYTES = 8 * 1024
MAX_DESCRIPTION_CHARS = 200


class FileList(TypedDict):
    agent_id: str
    files: list[FileEntry]
    truncated: bool


def _caller(p: Params, agent_id: str) -> str:
    return check_agent_id(p.text("as_agent", agent_id))


# ------------------------------------------------------------------------ memory.add_note


@METHODS.add("memory.add_note")
async def add_note(ctx: CallContext, params: JsonObject) -> NoteAdded:
    """Append ``content`` to the agent's note of the day for ``session_id``.

    The note is ``<daily_dir>/<today>/<name>.md`` owned by that session (another
    session's note of the same name is never touched: the file operations pick a free
    name). Secrets are redacted; the answer comes once the note is searchable. A call
    sent again is known by its ``request_id`` (its answer is given again, nothing added);
    without one, by its content, which the note then holds already (not a content
    redaction changed: masked secrets read alike). A text written in
    parts gives each its id: a part that repeats an earlier one is appended too.
    A note of no named session links no dialog log unless ``dialog`` is sent true.
    """
    p = Params(params)
    agent_id = p.agent_id()
    content = lf_line_ends(p.text("content"))  # as the note holds it: a repeat is seen
    named = p.text("session_id", None)
    session_id = check_session_id(DEFAULT_NOTE_SESSION if named is None else named)
    name = p.text("name", DEFAULT_NOTE_NAME)
    description = p.text("description", None)
    author = p.text("author", None)
    request_id = check_request_id(p.text("request_id", None))
    # The default session is no conversation: no dialog log of it is ever written.
    dialog = p.boolean("dialog", named is not None)
    p.done()
    if request_id is not None:
        # Kept beside memory.add_turns' ids (whose session ids hold no space); the same id
        # from another session is another request.
        request_id = f"note {session_id}/{request_id}"
    if "\x00" in content + (description or ""):  # a NUL makes the note a binary file
        raise InvalidParams("params 'content' and 'description' must not contain NUL")
    if author is not None and not has_name(author):
        raise InvalidParams("param 'author' must contain letters or digits")
    if author is not None and masked_in(author, "author: {}"):
        # Kept masked, the note would never be found by the author filter.
        raise InvalidParams("param 'author' looks like a credential; use another name",
                            {LOOKS_LIKE_A_CREDENTIAL: "author"})
    # The bound is on what the caller sent: redaction may make it longer ("u:p@" of a
    # URL masked), and a caller cannot know by how much.
    if len(content.strip()) > MAX_NOTE_CHARS:
        raise InvalidParams(f"param 'content' is longer than {MAX_NOTE_CHARS} characters")
    text = (await redact_async(content, limiter=ctx.state.services.cpu)).strip()
    masked = text != content.strip()
    if names_nothing(text):  # blank, or only what shows nothing (a zero-width space)
        raise InvalidParams("param 'content' must not be empty")
    if not has_name(name):
        raise InvalidParams("param 'name' must contain letters or digits")
    async with ctx.writable(agent_id) as ws:
        ops = fileops_for(ws, session_id=session_id)
        day = check_date(None, ops.today)
        # A note that cannot take the content and a new frontmatter is continued in the
        # next one: a busy day of notes would have every later call refused as too large.
        room_for = len(text.encode()) + len((description or "").encode()) + NOTE_HEADER_BYTES
        async with ws.services.note_lock:  # appending reads the note and writes it back
            if (now := ctx.workspace(agent_id)) is not ws:
                # Closed and opened again while this waited for the lock: write through
                # the one open now (the lock is the agent's, that one's too).
                ws, ops = now, fileops_for(now, session_id=session_id)
            answers = ws.services.sessions
            prior = answers.answer_for(request_id)
            if prior is not None and (began := note_retry.planned_day(prior)) is None:
                return prior  # type: ignore[return-value]  # recorded from a NoteAdded below
            if prior is not None and began is not None and (done := note_retry.done_before(
                    prior, await _own_notes(ws, ops.day_folder(began), slug(name),
                                            session_id), text)) is not None:
                # Written before the daemon stopped, unanswered: answered now, not again.
                found: NoteAdded = {"agent_id": agent_id, "session_id": session_id,
                                    "date": began, "path": done[0], "created": done[1],
                                    "changed": True}
                await answers.remember(request_id, found)
                return found
            for tries_left in range(WRITE_TRIES - 1, -1, -1):
                notes = await _own_notes(ws, ops.day_folder(day), slug(name), session_id)
                # Masked, two secrets read alike: a content redaction changed is no
                # repeat one can tell from the note (it holds no secret to compare).
                held = None if request_id is not None or masked else next(
                    (rel for rel, _, body in notes
                     if f"\n\n{text}\n\n" in f"\n\n{body}\n\n"), None)
                rel, whole, body = next(((rel, whole, body) for rel, whole, body in notes
                                         if has_room(whole, room_for)), ("", None, ""))
                if held is not None and held != rel:  # in a note that is full now
                    return {"agent_id": agent_id, "session_id": session_id, "date": day,
                            "path": held, "created": False, "changed": False}
                if held is not None:
                    # Already said in this note, word for word: a call sent again after
                    # its answer was lost (a restart, a dropped connection) adds nothing.
                    new_body = f"{body}\n"
                else:
                    new_body = f"{body}\n\n{text}\n" if body else f"{text}\n"
                if request_id is not None:
                    # Where the text goes, before it goes there: a retry after a stop
                    # between the write and its answer finds it there, adds it not again.
                    await answers.remember(request_id, note_retry.writing(
                        day, rel, body, [n for n, _, _ in notes]))
                try:
                    # Written only over the note as read here: one saved meanwhile (a
                    # person's editor) is read again and the content added to that.
                    result = await ops.daily_write(
                        session_id, name, new_body, date=day, description=description,
                        extra={"author": author} if author else None, room_for=room_for,
                        dialog=dialog, expect=whole)
                    break
                except WriteConflict as exc:
                    if not tries_left:
                        raise saved_meanwhile(exc, WRITE_TRIES) from None
            added: NoteAdded = {"agent_id": agent_id, "session_id": session_id, "date": day,
                                "path": result.path, "created": result.created,
                                "changed": result.changed}
            try:
                await answers.remember(request_id, added)
            except StorageError as exc:  # written: a retry finds it where it was to go
                log.warning("%s: the answer to %s was not saved: %s", agent_id, request_id,
                            exc)
    return added


async def _own_notes(ws: Workspace, folder: str, stem: str,
                     session_id: str) -> list[tuple[str, str, str]]:
    """``session_id``'s notes ``stem``, ``stem-2``... in ``folder``, in order (but those
    not in UTF-8): each as its path (as the disk spells it: a name typed in the other
    Unicode form names the note the writes go to), its text and its body (stripped)."""

    def scan() -> list[tuple[str, str, str]]:
        out: list[tuple[str, str, str]] = []
        for n in range(1, 1000):
            rel = on_disk(ws.root, f"{folder}/{stem if n == 1 else f'{stem}-{n}'}.md")
            text, utf8 = read_checked(ws.root, rel)
            if text is None:
                break
            if not utf8:  # saved in another encoding: never written over (daily_write)
                continue
            fields, body_start = parse_frontmatter(text)
            if fields.get("session_id") == session_id:
                body = "\n".join(text.split("\n")[body_start:]).strip()
                out.append((rel, text, body))
        return out

    return await trio.to_thread.run_sync(scan)


# ---------------------------------------------------------------------------- memory.list


@METHODS.add("memory.list", positional=("agent_id",))
async def memory_list(ctx: CallContext, params: JsonObject) -> FileList:
    """The Markdown files of a workspace (daily notes and digest nodes), by path."""
    p = Params(params)
    agent_id = p.agent_id()
    prefix = p.text("prefix", "")
    limit = p.integer("limit", MAX_LIST_FILES, minimum=1)
    caller = _caller(p, agent_id)
    p.done()
    if prefix:
        # Written as a shell would (./memory, memory//2026-07-23; "." or "./" the whole
        # workspace): the same prefix, as a search's path_prefix takes it. NUL, absolute
        # (including "/") and .. refused.
        parts = safepath.split_relative(prefix, root_ok=True)
        prefix = "/".join(parts) + ("/" if parts and prefix.endswith("/") else "")
    ws = sharing.readable(ctx.state.registry, caller, agent_id)
    s = ws.settings
    tops = ["/".join(safepath.split_relative(d)) for d in (s.daily_dir, s.digest_dir)]
    files, truncated = await trio.to_thread.run_sync(
        walk_markdown, ws.root, tops, prefix, min(limit, MAX_LIST_FILES))
    files.sort(key=lambda f: str(f["path"]))
    return {"agent_id": agent_id, "files": files, "truncated": truncated}


# --------------------------------------------------------------------------- memory.index


def _head(root: Path, rel: str) -> str:
    fd = safepath.open_confined(root, rel)
    try:
        data = os.read(fd, FRONTMATTER_HEAD_BYTES)
    finally:
        os.close(fd)
    return note_text(data, prefix=len(data) == FRONTMATTER_HEAD_BYTES)


def _one_line(value: object) -> str:
    """A frontmatter field as one line, secrets masked (as the index masks them)."""
    text = redact(" ".join(str(value).split())) if value is not None else ""
    if len(text) > MAX_DESCRIPTION_CHARS:
        text = cut_text(text, MAX_DESCRIPTION_CHARS - 1) + "…"
    return text


def _index_entries(root: Path, digest_dir: str, limit: int) -> tuple[list[IndexEntry], int]:
    files, _ = walk_markdown(root, [digest_dir], "", MAX_LIST_FILES)
    # MEMORY.md is the index of the topic files the daemon keeps, not a node of its own.
    kept_index = f"{digest_dir}/{topics.INDEX_FILE}"
    files = [f for f in files if f["path"] != kept_index]
    entries: list[IndexEntry] = []
    for f in files[:limit]:
        rel = f["path"]
        try:
            fields, _ = parse_frontmatter(_head(root, rel))
        except (OSError, RecalldError):
            continue  # gone or swapped for a link since the walk
        parts = rel.split("/")
        bucket = parts[-2] if len(parts) >= 3 else ""
        entries.append({
            "path": rel,
            "name": _one_line(fields.get("name")) or parts[-1].removesuffix(".md"),
            "description": _one_line(fields.get("description")),
            "bucket": bucket,
        })
    return entries, len(files)


def render_index(entries: list[IndexEntry]) -> str:
    """A ``MEMORY.md``-like index: one line per node, grouped by bucket."""
    lines: list[str] = []
    bucket: str | None = None
    for e in sorted(entries, key=lambda e: (e["bucket"], e["path"])):
        if e["bucket"] != bucket:
            bucket = e["bucket"]
            lines.append(f"## {visible(bucket) or 'other'}")
        # Names and descriptions come from the files (a name from a file name, fields as
        # written by hand): none breaks or reorders a line, nor adds a link.
        lines.append(topics.index_line(e["name"], e["path"], e["description"]))
    return "\n".join(lines)


@METHODS.add("memory.index", positional=("agent_id",))
async def memory_index(ctx: CallContext, params: JsonObject) -> MemoryIndex:
    """Names and one-line descriptions of the long-term nodes (digest), as entries and
    as Markdown text ready for a system prompt."""
    p = Params(params)
    agent_id = p.agent_id()
    limit = p.integer("max_entries", DEFAULT_INDEX_ENTRIES, minimum=1)
    caller = _caller(p, agent_id)
    p.done()
    ws = sharing.readable(ctx.state.registry, caller, agent_id)
    digest = "/".join(safepath.split_relative(ws.settings.digest_dir))
    entries, total = await trio.to_thread.run_sync(
        _index_entries, ws.root, digest, min(limit, MAX_INDEX_ENTRIES))
    return {"agent_id": agent_id, "entries": entries, "total": total,
            "truncated": total > len(entries), "rendered": render_index(entries)}


# -------------------------------------------------------------------------- memory.recall


@METHODS.add("memory.recall", positional=("agent_id", "query"))
async def memory_recall(ctx: CallContext, params: JsonObject) -> Recall:
    """The recall block for a query (or the last user messages), in ``budget_chars``."""
    p = Params(params)
    agent_id = p.agent_id()
    query = query_of(p.text("query", None), p.array("messages", None))
    max_results = min(p.integer("max_results", 5, minimum=1), MAX_RESULTS_CAP)
    budget = p.integer("budget_chars", DEFAULT_BUDGET_CHARS, minimum=1)
    include_index = p.boolean("include_index", False)
    include_interests = p.boolean("include_interests", False)
    p.done()
    if budget > MAX_BUDGET_CHARS:
        raise InvalidParams(f"param 'budget_chars' must be at most {MAX_BUDGET_CHARS}")
    ws = ctx.workspace(agent_id)
    answer = await search(ws.services.index, query, max_results=max_results, min_score=None,
                          filters=Filters(), config=ws.settings.search, agent_id=agent_id)
    index_text = None
    if include_index:
        digest = "/".join(safepath.split_relative(ws.settings.digest_dir))
        entries, _ = await trio.to_thread.run_sync(
            _index_entries, ws.root, digest, DEFAULT_INDEX_ENTRIES)
        index_text = render_index(entries)
    interests = (await read_interests(ws))[:RECALL_INTERESTS] if include_interests else None
    shown = await redact_async(query, limiter=ctx.state.services.cpu)  # as the index has it
    return build_recall(agent_id, shown, answer, budget_chars=budget, index_text=index_text,
                        interests=interests)


# ------------------------------------------------------------------------ memory.interests

RECALL_INTERESTS = 5
DEFAULT_INTERESTS = 20


async def read_interests(ws: Workspace) -> list[tuple[str, float]]:
    """The workspace's interest topics (``<digest>/interests.yaml``), heaviest first."""
    rel = f"{topics.digest_folder(ws)}/{INTERESTS_FILE}"
    text = await trio.to_thread.run_sync(read_confined, ws.root, rel)
    weights = parse_interests(text or "")
    return sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))


@METHODS.add("memory.interests", positional=("agent_id",))
async def memory_interests(ctx: CallContext, params: JsonObject) -> Interests:
    """The weighted interest topics each dream refreshes, heaviest first."""
    p = Params(params)
    agent_id = p.agent_id()
    limit = p.integer("limit", DEFAULT_INTERESTS, minimum=1)
    p.done()
    found = await read_interests(ctx.workspace(agent_id))
    return {"agent_id": agent_id, "total": len(found),
            "topics": [{"topic": t, "weight": w} for t, w in found[:limit]]}


# ------------------------------------------------------- memory.topic_write / topic_edit


async def _topic_done(ws: Workspace, rel: str, created: bool, changed: bool,
                      action: str) -> TopicWritten:
    # The index file follows at once (the service would also catch it on the next change).
    await ws.services.memory_file.refresh(touched=(rel,))
    log.info("workspace %s: topic file %s %s", ws.agent_id, safepath.masked(rel),
             action if changed else "unchanged")
    return {"agent_id": ws.agent_id, "path": rel, "created": created, "changed": changed,
            "memory_md": f"{topics.digest_folder(ws)}/{topics.INDEX_FILE}"}


@METHODS.add("memory.topic_write")
async def topic_write(ctx: CallContext, params: JsonObject) -> TopicWritten:
    """Create or replace a topic file of the digest folder (frontmatter ``name``,
    ``description``, ``type``); answers once it is searchable and listed in MEMORY.md."""
    p = Params(params)
    agent_id = p.agent_id()
    path = p.text("path")
    name = p.text("name")
    description = p.text("description")
    type_ = p.text("type")
    body = p.text("body")
    p.done()
    async with ctx.writable(agent_id) as ws:
        # Over a file whose name the disk spells otherwise (composed or decomposed).
        rel = await spelled(ws.root, topics.topic_path(topics.digest_folder(ws), path))
        body = await redact_async(body, limiter=ctx.state.services.cpu)  # long: a worker
        text = topics.render_topic(name, description, type_, body)
        result = await fileops_for(ws).write(rel, text)  # rel as spelled on disk by then
        return await _topic_done(ws, result.path, result.created, result.changed, "written")


@METHODS.add("memory.topic_edit")
async def topic_edit(ctx: CallContext, params: JsonObject) -> TopicWritten:
    """Replace the one occurrence of ``old`` by ``new`` in a topic file; the result must
    still be a valid topic file."""
    p = Params(params)
    agent_id = p.agent_id()
    path = p.text("path")
    old = p.text("old")
    new = p.text("new")
    p.done()
    async with ctx.writable(agent_id) as ws:
        rel = await spelled(ws.root, topics.topic_path(topics.digest_folder(ws), path))
        if not old:
            raise InvalidParams("param 'old' must not be empty")
        before = await trio.to_thread.run_sync(read_confined, ws.root, rel)
        if before is None:
            raise NotFound(f"no such topic file: {rel}")
        count = before.count(old)
        if count != 1:
            raise InvalidParams(f"'old' occurs {count} times in {rel}; it must occur "
                                "exactly once")
        new = await redact_async(new, limiter=ctx.state.services.cpu)
        topics.checked_topic(before.replace(old, new, 1), rel)
        # The file operations apply the edit under the workspace write lock, against the
        # file as it is then (so a write in between is never lost).
        result = await fileops_for(ws).edit(rel, old, new)
        return await _topic_done(ws, rel, False, result.changed, "edited")


# -------------------------------------------------------------------------- memory.select


@METHODS.add("memory.select", positional=("agent_id", "query"))
async def memory_select(ctx: CallContext, params: JsonObject) -> Selected:
    """Up to ``limit`` topic files for ``query``, chosen by the workspace's chat model,
    else by the search (:mod:`recalld.daemon.memory.selection`)."""
    p = Params(params)
    agent_id = p.agent_id()
    query = p.text("query").strip()
    limit = min(p.integer("limit", 5, minimum=1), MAX_SELECT)
    p.done()
    if not query:
        raise InvalidParams("param 'query' must not be empty")
    ws = ctx.workspace(agent_id)
    digest = topics.digest_folder(ws)
    entries = await ws.services.memory_file.entries()

    async def search_paths() -> list[str]:
        answer = await search(
            ws.services.index, query, max_results=min(3 * limit, MAX_RESULTS_CAP),
            min_score=None, filters=Filters(path_prefixes=(digest,)),
            config=ws.settings.search, agent_id=agent_id)
        index_file = f"{digest}/{topics.INDEX_FILE}"
        return [r["path"] for r in answer["results"] if r["path"] != index_file]

    return await select_topics(agent_id, query, limit, entries,
                               ws.services.chat.client_or_none(), search_paths)
