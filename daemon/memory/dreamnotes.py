"""The daily notes a dream reads: which changed since they were dreamed, which ReMe's
dream consolidated already, which were only renamed or moved; a long note in the parts
the model reads; and a node's sources following a renamed note. Blocking functions (run
them in a thread) and pure ones.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final

from recalld.daemon import safepath
from recalld.daemon.index.filters import note_date
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import digest, dreamretry, reme_dream
from recalld.daemon.memory.catalog import catalog_path, load_catalog
from recalld.daemon.memory.confined import NotUtf8, read_checked, read_confined, utf8_file
from recalld.daemon.memory.notenames import is_daily_note_name
from recalld.daemon.memory.resource_files import note_says
from recalld.daemon.textcost import pieces_within, text_cost
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import RecalldError

log = logging.getLogger(__name__)

#: In a catalog record: when the nodes citing its note, deleted, were told so.
DELETED_AT: Final = "deleted_at"
#: In a catalog record of a resource's note: what it says (:func:`note_says`).
SAYS: Final = "says"
#: In a catalog record of a note: the digest of its text as the model reads it
#: (:func:`reads`), by which a note an editor saved again, saying the same, is known.
READS: Final = "reads"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def changed_notes(root: Path, daily_dir: str,
                  catalog: Mapping[str, Mapping[str, object]]) -> list[tuple[str, str, str]]:
    """``(path, sha256, text)`` of daily notes not processed as they are now (blocking),
    day by day (a note's day folder, or its name: ``memory/2026-12-03.md``; notes of no
    day first), each day's notes in the order they were last written: what a later note
    says is integrated after what an earlier one said, so the later claim is the one that
    corrects the other (by name, ``alpha.md`` written in the evening would be read before
    ``zeta.md`` of the morning, and lose to it)."""
    out = []
    order: dict[str, tuple[str, int]] = {}  # a note's day and when it was last written
    top = root / daily_dir
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames, key=lambda n: (_mtime_ns(dirpath, n), n)):
            if not is_daily_note_name(name):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if not safepath.is_utf8(rel):  # no catalog, log or answer can hold its name
                log.warning("dream skips %s: its name is not valid UTF-8 (rename it to have "
                            "it dreamed)", safepath.masked(safepath.shown(rel)))
                continue
            if any(ord(c) < 32 or c == "\x7f" for c in rel):
                # A line break in a name splits the [[link]] that cites it in a node.
                log.warning("dream skips %r: its name holds a control character, such as a "
                            "line break (rename it to have it dreamed)", safepath.masked(rel))
                continue
            try:  # read, never written: Windows-1252 and UTF-16 read as written
                text = read_confined(root, rel)
            except RecalldError as exc:  # too large, a symbolic link: not ours
                log.warning("dream skips %s: %s", safepath.masked(rel), exc.message)
                continue
            if text is None:
                continue
            if "\ufffd" in text and not utf8_file(root, rel):  # GBK, say: garbage to a model
                shown = safepath.masked(rel)
                log.warning("dream skips %s: %s", shown, NotUtf8(shown).message)
                continue
            sha = sha256_text(text)
            rec = catalog.get(rel)
            if rec is None or rec.get("digest") != sha or rec.get("state") != "processed":
                out.append((rel, sha, text))
                order[rel] = (note_date(rel) or "", _mtime_ns(dirpath, name))
    return sorted(out, key=lambda note: order[note[0]])


def _mtime_ns(folder: str, name: str) -> int:
    try:
        return os.lstat(os.path.join(folder, name)).st_mtime_ns
    except OSError:  # gone meanwhile: skipped when read
        return 0


def node_digest(text: str | None, utf8: bool) -> str | None:
    """What node ``text`` (None: no such file; ``utf8``: saved as UTF-8) holds, as a
    digest: a note held by the node (:data:`dreamretry.WAITS_ON`) is read again once it
    differs (the same text saved again as UTF-8 too)."""
    return None if text is None else sha256_text(text) + ("" if utf8 else "/not-utf8")


def awaited_nodes(root: Path, catalog: Mapping[str, Mapping[str, object]]
                  ) -> dict[str, str | None]:
    """``{node: digest now}`` (:func:`node_digest`) of each node a failed note waits on
    (:data:`dreamretry.WAITS_ON`); blocking."""
    out: dict[str, str | None] = {}
    for rec in catalog.values():
        nodes = rec.get(dreamretry.WAITS_ON) if rec.get("state") == "failed" else None
        for rel in nodes if isinstance(nodes, dict) else ():
            if isinstance(rel, str) and rel not in out:
                try:
                    out[rel] = node_digest(*read_checked(root, rel))
                except RecalldError as exc:  # as unreadable as before, or a change
                    out[rel] = f"error: {exc.message}"
    return out


def waiting_notes(ws: Workspace) -> dict[str, str]:
    """``{path: why}`` of the notes the next dream of ``ws`` leaves out after failed tries,
    as its catalog and the notes are now (blocking; reads only the failed notes): what a
    status says before this daemon ran a dream (:func:`dreamretry.hold_back`)."""
    catalog = load_catalog(catalog_path(ws.root, ws.settings.metadata_dir, "dream"))
    todo: list[tuple[str, str, str]] = []
    for rel, rec in catalog.items():
        if rec.get("state") != "failed" or not rec.get(dreamretry.TRIES):
            continue
        try:
            text = read_confined(ws.root, rel)
        except RecalldError:
            continue
        sha = sha256_text(text) if text is not None else None
        if sha is not None and sha == rec.get("digest"):
            todo.append((rel, sha, ""))
    nodes_now = awaited_nodes(ws.root, catalog) if todo else {}
    return dreamretry.hold_back(dict(catalog), todo, retry=False, nodes_now=nodes_now)[1]


def recognise_reme_dreamed(ws: Workspace, catalog: dict[str, JsonObject]) -> int:
    """Put the notes ReMe's dream consolidated, unchanged since, into ``catalog`` as
    processed (``reme_dream.py``); returns how many (blocking)."""
    s = ws.settings
    found = reme_dream.read_reme_dreamed(ws.root, s.metadata_dir, s.daily_dir, catalog)
    if found is None:
        return 0
    for rel, text in found.unchanged:
        catalog[rel] = {"path": rel, "digest": sha256_text(text), "state": "processed",
                        "source": "reme"}
    if found.unchanged:
        log.info("%s: %d note(s) ReMe's dream consolidated are not dreamed again (%d changed "
                 "since)", ws.agent_id, len(found.unchanged), len(found.changed))
    return len(found.unchanged)


def says(text: str) -> JsonObject:
    """The fields a catalog record of a note read as ``text`` keeps besides its digest:
    what the model read in it (:data:`READS`); for a resource's note, the digest of what
    it says wherever its file is (:data:`SAYS`), by which a note rewritten as its file
    moved is known again."""
    said = note_says(text)
    return {READS: reads(text), **({} if said is None else {SAYS: said})}


def reads(text: str) -> str:
    """The digest of ``text`` but for what an editor changes when it saves a note again:
    its line ends (CRLF, CR), a byte order mark, blanks at the end of a line, blank lines
    at its ends."""
    lines = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return sha256_text("\n".join(ln.rstrip() for ln in lines.split("\n")).strip("\n"))


def renamed_notes(root: Path, catalog: Mapping[str, Mapping[str, object]],
                  todo: list[tuple[str, str, str]]) -> dict[str, str]:
    """``{new path: old path}`` of the notes of ``todo`` (:func:`changed_notes`) that are
    a processed note renamed or moved: the catalog has not seen the path, and has the
    same text under a path that is gone, or, for a resource's note, which follows its
    file to another day and name, the same :data:`SAYS`. Dreaming them again would
    count a note as a second source of what it said."""
    gone: dict[object, list[str]] = {}
    for path, rec in sorted(catalog.items()):
        if rec.get("state") == "processed" and not os.path.lexists(root / path):
            gone.setdefault(rec.get("digest"), []).append(path)
            if rec.get(SAYS):
                gone.setdefault((SAYS, rec[SAYS]), []).append(path)
    out: dict[str, str] = {}
    taken: set[str] = set()
    for rel, sha, text in todo:
        if rel in catalog:
            continue
        said = note_says(text)
        olds = [p for p in [*gone.get(sha, []), *gone.get((SAYS, said), [])]
                if p not in taken]
        if olds:  # notes alike moved together: each to the one of its own name first
            name = rel.rsplit("/", 1)[-1]
            out[rel] = min(olds, key=lambda p: p.rsplit("/", 1)[-1] != name)
            taken.add(out[rel])
    return out


def unchanged_notes(catalog: Mapping[str, Mapping[str, object]],
                    todo: list[tuple[str, str, str]]) -> dict[str, str]:
    """``{path: sha256}`` of the notes of ``todo`` processed as they say now: saved again
    as they were read but for line ends and blanks (:data:`READS` the same); resource
    notes rewritten in place as their file was renamed, removed or back (:data:`SAYS`
    the same). Read again, they would have the model say it all again."""
    out: dict[str, str] = {}
    for rel, sha, text in todo:
        rec = catalog.get(rel)
        if rec is not None and rec.get("state") == "processed" and (
                rec.get(READS) == reads(text)
                or (rec.get(SAYS) and rec.get(SAYS) == note_says(text))):
            out[rel] = sha
    return out


def copied_notes(root: Path, catalog: Mapping[str, Mapping[str, object]],
                 todo: list[tuple[str, str, str]]) -> dict[str, str]:
    """``{new path: original}`` of the notes of ``todo`` that are new copies of a processed
    note still there (the same text): what they say was integrated from it, and a copy
    dreamed again would count as a second source of it (blocking)."""
    kept: dict[object, str] = {}
    for path, rec in sorted(catalog.items()):
        if rec.get("state") == "processed" and os.path.lexists(root / path):
            kept.setdefault(rec.get("digest"), path)
    return {rel: kept[sha] for rel, sha, _ in todo if rel not in catalog and sha in kept}


def deleted_notes(root: Path, catalog: Mapping[str, Mapping[str, object]],
                  moves: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``(gone, back)`` (blocking): the notes the catalog has as processed that are gone,
    not renamed (``moves``: :func:`renamed_notes`), which the nodes citing them were not
    told yet; and those they were told of (:data:`DELETED_AT`) that are there again."""
    renamed = set(moves.values())
    gone: list[str] = []
    back: list[str] = []
    for path, rec in sorted(catalog.items()):
        if rec.get("state") != "processed":
            continue
        there = os.path.lexists(root / path)
        if rec.get(DELETED_AT) and there:
            back.append(path)
        elif not rec.get(DELETED_AT) and not there and path not in renamed:
            gone.append(path)
    return gone, back


def mark_deleted(path: str, text: str, gone: Collection[str],
                 back: Collection[str]) -> str | None:
    """The node ``text`` with its sources of ``gone`` (notes deleted) as deleted sources,
    still counted but no longer linked, and its deleted sources of ``back`` (there again)
    as sources; None if it cites none of them, or cannot be read as written."""
    node = digest.parse_node(path, text)
    if node.unreadable or not _mark(node, gone, back):
        return None
    return digest.render_node(node)


def _mark(node: digest.Node, gone: Collection[str], back: Collection[str]) -> bool:
    """:func:`mark_deleted` on ``node``; whether it changed."""
    dead = [s for s in node.sources if s in gone]
    alive = [s for s in node.deleted_sources if s in back]
    # The notes of a claim overturned are no sources; the History entry of the
    # correction names them, linked as long as they are there.
    over_dead = [s for s in node.overturned_sources if s in gone]
    over_alive = [s for s in node.overturned_sources if s in back]
    history = [unlinked(ln, [*dead, *over_dead], [*alive, *over_alive])
               for ln in node.history]
    if not dead and not alive and history == node.history:
        return False

    lines = [unlinked(ln, dead, alive) for ln in node.written.get("Sources", [])]
    node.written = {**node.written, "Sources": lines}
    # Its History cites them too (the source of a claim corrected or refined away).
    node.history = history

    def place(source: str) -> int:
        """Where its line is in the section: a source back takes its place again."""
        return next((i for i, ln in enumerate(lines) if f"[[{source}]]" in ln
                     or source in digest.section_links(ln)), len(lines))

    node.sources = sorted([s for s in node.sources if s not in dead] + alive, key=place)
    node.deleted_sources = [s for s in node.deleted_sources if s not in alive] + dead
    return True


def unlinked(line: str, dead: Collection[str], alive: Collection[str]) -> str:
    """``line`` with its links to the notes ``dead`` (deleted) as ``<path> (deleted)``, and
    those of the notes ``alive`` (there again) linked again."""
    for s in dead:  # as written for it (a name with ``]`` or ``|`` too)...
        line = line.replace(f"[[{s}]]", f"{s} (deleted)")
    line = digest.sub_links(  # ...or with an alias or a heading
        lambda m: f"{t} (deleted)" if (t := digest.link_target(m)) in dead
        else m.group(0), line)
    for s in alive:
        line = line.replace(f"{s} (deleted)", f"[[{s}]]")
    return line


def relink(path: str, text: str, moves: Mapping[str, str]) -> str | None:
    """The node ``text`` citing the notes of ``moves`` (old path -> new) under their new
    paths, in its sources, section lines and History; None if it cites none of them. A
    deleted source (:func:`mark_deleted`) that is one of them is a source again."""
    node = digest.parse_node(path, text)
    if node.unreadable or not any(s in moves for s in [
            *node.sources, *node.deleted_sources, *node.overturned_sources]):
        return None  # (a node whose frontmatter cannot be read is not written)
    _mark(node, (), moves)

    def links(line: str) -> str:
        return swap_links(line, moves)

    node.sources = list(dict.fromkeys(moves.get(s, s) for s in node.sources))
    node.overturned_sources = [s for s in dict.fromkeys(
        moves.get(s, s) for s in node.overturned_sources) if s not in node.sources]
    node.written = {k: [links(ln) for ln in v] for k, v in node.written.items()}
    node.history = [links(ln) for ln in node.history]
    return digest.render_node(node)


def swap_links(text: str, moves: Mapping[str, str]) -> str:
    """``text`` with its ``[[old]]`` links to the paths of ``moves`` (old -> new) as
    ``[[new]]``."""
    for old, new in moves.items():
        text = text.replace(f"[[{old}]]", f"[[{new}]]")
    return text


def note_parts(text: str, limit: int) -> list[str]:
    """``text`` in parts that cost at most ``limit`` each (:mod:`~recalld.daemon.textcost`:
    that many characters of English, a ninth as many of Chinese), cut between lines (at a
    blank line or a heading when one is in the part's second half; an overlong line at a
    space or after a Chinese or Japanese sentence or clause): a long note goes to the
    model part by part, nothing of it cut off."""
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        lines.extend(pieces_within(line, limit))
    parts: list[str] = []
    part: list[str] = []
    size = 0
    for line in lines:
        cost = text_cost(line)
        if part and size + cost > limit:
            cut = next((i for i in range(len(part) - 1, len(part) // 2, -1)
                        if not part[i].strip() or part[i].startswith("#")), len(part))
            parts.append("".join(part[:cut]))
            part = part[cut:]
            size = sum(map(text_cost, part))
        part.append(line)
        size += cost
    if part or not parts:
        parts.append("".join(part))
    return parts
