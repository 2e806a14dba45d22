"""Topic files and ``<digest_dir>/MEMORY.md``, AgentScope's Agentic Memory layout.

A topic file is a digest Markdown file whose frontmatter has ``name``, ``description``
and a ``type`` of ``user``, ``feedback``, ``project`` or ``reference``; agents write and
edit their own through ``memory.topic_write`` / ``memory.topic_edit`` (confined to the
digest folder, frontmatter checked). ``MEMORY.md`` in the digest folder is the index of
them: one line per topic file (link and description), grouped by type. The
:class:`MemoryFile` service rewrites it whenever the index applies a change (after a
large pass such as a first build, once; and at start, once the index's startup reconcile
applied what changed while the daemon was down, so a restart puts it right), only when its
text differs; it is created once the first topic file exists. Markdown links, not
``[[wikilinks]]``: the index adds no edges to the link graph.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import trio

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import block_problem, parse_frontmatter
from recalld.daemon.index.frontmatter_edit import render_frontmatter
from recalld.daemon.index.records import note_stamp
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.state import IndexState
from recalld.daemon.memory.fileops import read_confined, write_confined
from recalld.daemon.memory.slugs import names_nothing
from recalld.daemon.watchpaths import IGNORE_DIRS, passed_by
from recalld.daemon.workspaces import Workspace
from recalld.ipc.answers import TopicEntry
from recalld.ipc.errors import InvalidParams, RecalldError
from recalld.ipc.textcut import cut_text
from recalld.ipc.types import visible

log = logging.getLogger(__name__)

TYPES: Final = ("user", "feedback", "project", "reference")
INDEX_FILE: Final = "MEMORY.md"
INDEX_TITLE: Final = "# Memory index"
MAX_TOPIC_CHARS: Final = 64_000
MAX_DESCRIPTION_CHARS: Final = 300
#: A topic's name is a title on one line of MEMORY.md, before its description.
MAX_NAME_CHARS: Final = 100
MAX_TOPICS: Final = 2_000
_HEAD_BYTES: Final = 8 * 1024


def digest_folder(ws: Workspace) -> str:
    return "/".join(safepath.split_relative(ws.settings.digest_dir))


def topic_path(digest: str, path: str) -> str:
    """Workspace-relative path of a topic file given as ``name.md``, ``sub/name.md`` or
    ``<digest>/...``; only Markdown inside the digest folder, never the index itself."""
    rel = "/".join(safepath.split_relative(path))
    if visible(rel) != rel:  # it would break the line MEMORY.md lists it on
        raise InvalidParams(f"a topic file's path has no control characters, not {rel!r}")
    from recalld.daemon.memory.redact import masked_in  # imported with its first use

    # A file name is shown, indexed and logged; MEMORY.md links to it.
    if masked_in(rel, "- [name]({})"):
        raise InvalidParams("a topic file's path looks like a credential; use another name")
    if passed_by(rel):  # the index passes it by, so MEMORY.md could not list it
        raise InvalidParams(f"a topic file's path has no hidden parts and no "
                            f"{', '.join(IGNORE_DIRS)}, not {path!r}")
    if not (rel + "/").startswith(digest + "/"):
        rel = f"{digest}/{rel}"
    if not rel.endswith(".md") or rel == f"{digest}/{INDEX_FILE}":
        raise InvalidParams(f"a topic file is a .md file in {digest}/ other than "
                            f"{INDEX_FILE}, not {path!r}")
    return rel


def check_fields(fields: Mapping[str, object], where: str) -> None:
    """``name``, ``description`` (one line each) and ``type`` (one of :data:`TYPES`)."""
    for key in ("name", "description"):
        value = fields.get(key)
        # Blank, or only what shows nothing (a zero-width space), is no name.
        if not isinstance(value, str) or names_nothing(value) or "\n" in value:
            raise InvalidParams(f"{where}: frontmatter {key!r} must be one non-empty line")
    for key, most in (("name", MAX_NAME_CHARS), ("description", MAX_DESCRIPTION_CHARS)):
        if len(str(fields[key])) > most:
            raise InvalidParams(f"{where}: {key} is longer than {most} characters")
    if fields.get("type") not in TYPES:
        raise InvalidParams(f"{where}: frontmatter 'type' must be one of {', '.join(TYPES)}")


def render_topic(name: str, description: str, type_: str, body: str) -> str:
    fields = {"name": name.strip(), "description": description.strip(), "type": type_}
    check_fields(fields, "topic")
    text = f"{render_frontmatter(fields)}\n{body.strip()}\n"
    if len(text) > MAX_TOPIC_CHARS:
        raise InvalidParams(f"a topic file is at most {MAX_TOPIC_CHARS} characters")
    return text


def checked_topic(text: str, where: str) -> str:
    """``text`` if its frontmatter makes it a valid topic file (else InvalidParams)."""
    fields, start = parse_frontmatter(text)
    if not start:
        # A block that is there but does not parse is said so, with what is wrong in it.
        why = block_problem(text)
        raise InvalidParams(f"{where}: its frontmatter block does not parse ({why})" if why
                            else f"{where}: a topic file starts with a frontmatter block")
    check_fields(fields, where)
    if len(text) > MAX_TOPIC_CHARS:
        raise InvalidParams(f"a topic file is at most {MAX_TOPIC_CHARS} characters")
    return text


def read_topic(root: Path, rel: str) -> tuple[TopicEntry | None, tuple[int, int] | None]:
    """The entry of ``rel`` (workspace-relative) if it is a topic file (a regular file,
    read within the workspace, whose frontmatter has a topic ``type``), and the
    (mtime_ns, size) the file had (None: not read)."""
    try:
        st = os.lstat(root / rel)
        if not stat.S_ISREG(st.st_mode):
            return None, None
        head = read_confined(root, rel, _HEAD_BYTES)
    except (OSError, RecalldError):
        return None, None
    seen = note_stamp(st)
    fields, _ = parse_frontmatter(head or "")
    if fields.get("type") not in TYPES:
        return None, seen
    name = rel.rsplit("/", 1)[-1]
    from recalld.daemon.memory.redact import redact  # imported with its first use

    # Masked as the index masks them: MEMORY.md and memory.select show what a person may
    # have typed into the frontmatter.
    description = redact(" ".join(str(fields.get("description") or "").split()))
    # Longer ones are written by hand (the tools refuse them): one file's name and hook
    # do not take the room of the others in a bounded snapshot.
    description = _shortened(description, MAX_DESCRIPTION_CHARS)
    title = redact(" ".join(str(fields.get("name") or name[:-3]).split()))
    return ({"path": rel, "type": str(fields["type"]),
             "name": _shortened(title, MAX_NAME_CHARS), "description": description}, seen)


def _shortened(text: str, most: int) -> str:
    """``text``, cut with ``…`` to ``most`` characters if longer."""
    return text if len(text) <= most else cut_text(text, most - 1) + "…"


def _walk_order(rel: str) -> tuple[tuple[int, str], ...]:
    """A sort key giving the order a walk of the folder lists files in: folders and files
    sorted by name, a folder's files before its subfolders'."""
    *folders, name = rel.split("/")
    return (*((1, f) for f in folders), (0, name))


_LINK_TEXT_RE: Final = re.compile(r"([\\\[\]])")
_BARE_TARGET_RE: Final = re.compile(r"[\s()<>]")


def index_line(name: str, target: str, description: str) -> str:
    """``- [name](target) — description``: one line of an index of notes. Each part is
    shown escaped (:func:`visible`: none adds a line or reorders one), brackets and
    backslashes in the name are escaped and a target holding spaces, parentheses or angle
    brackets is put in ``<>`` (CommonMark), so the line links to the file it names and to
    nothing else (a name written ``[x](../y)`` is text)."""
    # Escaped before :func:`visible` adds its own backslashes (``\\n``, ``\\u202e``).
    text = visible(_LINK_TEXT_RE.sub(r"\\\1", name))
    target = visible(target)
    if _BARE_TARGET_RE.search(target):
        target = "<" + target.replace("<", "\\<").replace(">", "\\>") + ">"
    hook = f" — {visible(description)}" if description else ""
    return f"- [{text}]({target}){hook}"


def render_memory_md(entries: list[TopicEntry], digest: str) -> str:
    """``MEMORY.md``: a title, then per type a heading and one line per topic file."""
    lines = [INDEX_TITLE, ""]
    for type_ in TYPES:
        group = [e for e in entries if e["type"] == type_]
        if not group:
            continue
        lines.append(f"## {type_}")
        for e in group:
            # A file named with a line break (made by hand) cannot add lines of its own.
            lines.append(index_line(e["name"], e["path"].removeprefix(digest + "/"),
                                    e["description"]))
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


class MemoryFile:
    """Keeps ``<digest_dir>/MEMORY.md`` in line with the topic files (module docstring)."""

    def __init__(self, ws: Workspace, index: WorkspaceIndex) -> None:
        self.ws = ws
        self.index = index
        self._lock = trio.Lock()
        # What refreshes read of each note the index holds in the digest folder: path ->
        # (the index's digest of the content read, None if the file was not as the index
        # last read it, and its entry if it is a topic file).
        self._read: dict[str, tuple[str | None, TopicEntry | None]] = {}

    def _entries(self, held: dict[str, tuple[str, int, int] | None]) -> list[TopicEntry]:
        """The topic files, in :func:`_walk_order`, among ``held``: the notes the
        index holds in the digest folder, each with its (digest, mtime_ns, size) there,
        and those written just now (None: perhaps not applied yet). A note is read again
        only when the index's digest of it changed since it was read as the index had it:
        every index change refreshes, and reading every digest note each time cost
        0.18-0.23 s at 2,000 of them."""
        read: dict[str, tuple[str | None, TopicEntry | None]] = {}
        for path, info in held.items():
            known = self._read.get(path)
            if info is not None and known is not None and known[0] == info[0]:
                read[path] = known
                continue
            entry, seen = read_topic(self.ws.root, path)
            # Kept under the index's digest only if the file was what the index read:
            # else (changed since, not applied yet) it is read again next time, so an
            # edit undone before the index saw it is not listed as it was meanwhile.
            read[path] = (info[0] if info is not None and seen == info[1:] else None, entry)
        self._read = read
        found = sorted(((path, entry) for path, (_, entry) in read.items() if entry is not None),
                       key=lambda found: _walk_order(found[0]))
        return [entry for _, entry in found[:MAX_TOPICS]]

    def _refresh_sync(self, held: dict[str, tuple[str, int, int] | None]) -> bool:
        digest = digest_folder(self.ws)
        rel = f"{digest}/{INDEX_FILE}"
        entries = self._entries(held)
        current = read_confined(self.ws.root, rel)
        if current is None and not entries:
            return False
        text = render_memory_md(entries, digest)
        if text == current:
            return False
        write_confined(self.ws.root, rel, text.encode("utf-8"))
        log.info("workspace %s: %s rewritten (%d topic files)", self.ws.agent_id, rel,
                 len(entries))
        return True

    async def refresh(self, touched: Iterable[str] = ()) -> bool:
        """Rewrite ``MEMORY.md`` if it differs from the topic files; True if written.
        ``touched``: files just written (read again, whether the index has them yet)."""
        async with self._lock:
            return await trio.to_thread.run_sync(self._refresh_sync,
                                                 await self._held(touched))

    async def entries(self) -> list[TopicEntry]:
        """The topic files, as :meth:`refresh` finds them (``memory.select``'s)."""
        async with self._lock:
            return await trio.to_thread.run_sync(self._entries, await self._held(()))

    async def _held(self, touched: Iterable[str]) -> dict[str, tuple[str, int, int] | None]:
        """What :meth:`_entries` takes: the notes the index holds in the digest folder
        with their (digest, mtime_ns, size), and ``touched`` with None."""
        digest = digest_folder(self.ws)
        prefix, skip = f"{digest}/", f"{digest}/{INDEX_FILE}"

        def notes(state: IndexState) -> dict[str, tuple[str, int, int] | None]:
            # Under the index lock: applies change the dict in worker threads.
            return {path: (info.digest, info.mtime_ns, info.size)
                    for path, info in state.files.items()
                    if path.startswith(prefix) and path != skip}

        held = await self.index.locked(notes)
        held.update(dict.fromkeys(set(touched) - {skip}, None))
        return held

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        task_status.started()
        if not self.index.state.files:
            # Nothing indexed yet: a first build is about to list and read every note, and
            # its applies will announce the topic files; the refresh follows the build
            # instead of reading the digest folder beside its scan.
            await self.index.changed.wait()
            await self.index.passes_ended()
        else:
            # A warm start: until the startup reconcile (which waits for the daemon's start)
            # applied what changed while the daemon was down, the index holds the notes as
            # they were. A refresh before it read every topic file and imported the
            # redaction rules beside the first answers (some 20 ms of the daemon's CPU
            # up to its first answer at 3,000 notes), and again what the reconcile changed.
            await self.index.watcher.wait_reconciled()
        while True:
            changed = self.index.changed
            try:
                await self.refresh()
            except (OSError, RecalldError) as exc:
                log.warning("workspace %s: MEMORY.md not updated: %s", self.ws.agent_id, exc)
            await changed.wait()
            # A first build changes the index at every apply of its pass; reading every
            # topic file each time would take the daemon's CPU from the build. Once after.
            await self.index.passes_ended()
