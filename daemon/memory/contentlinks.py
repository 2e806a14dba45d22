"""The ``[[wikilinks]]`` the model writes in a node's content: one that names no file of
the workspace is written as its text, without brackets, or, naming a node by its name
rather than its file's, as a link to that node's path (:func:`unlink`), so that no link
of a node points at nothing (ADR 0006). A link is resolved as the index resolves it
(``IndexState.resolve``: by name or path, ``.md`` optional, any case or Unicode
form), and also against the nodes and files on disk the index may not hold yet (made
earlier in the same run). Links the node held before are a person's (a note not
written yet, as Obsidian allows) and stay as they are.
"""

from __future__ import annotations

import os
import posixpath
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from recalld.daemon.index.codelines import visible_lines
from recalld.daemon.index.links import (
    link_target,
    name_key,
    normalize_target,
    note_name,
    pick_note,
    wikilinks,
)
from recalld.daemon.memory import nodefiles
from recalld.daemon.memory.digest import Integration, node_path
from recalld.daemon.watchpaths import passed_by
from recalld.ipc.errors import UnknownWorkspace

if TYPE_CHECKING:
    from recalld.daemon.memory.dream import _Run


def _key(target: str) -> str:
    """How two targets are told the same (``Ghost``, ``ghost.md``, ``/ghost``)."""
    name = name_key(target.replace("\\", "/").lstrip("/"))
    return name.removesuffix(".md")


def _links(text: str) -> Iterable[tuple[int, str, str]]:
    """(line index, link as written, target) of each visible wikilink to a note in
    ``text`` (not in code, a comment or escaped; no embedded attachment)."""
    for number, line in visible_lines(text):
        for m in wikilinks(line):
            name, _ = link_target(m)
            ext = posixpath.splitext(name)[1].lower()
            if name and not (m.group(1) and ext and ext != ".md"):
                yield number - 1, m.group(0), name


def targets(text: str) -> set[str]:
    """The targets of the wikilinks of ``text``."""
    return {name for _, _, name in _links(text)}


def _on_disk(root: Path, wanted: Collection[str]) -> list[str]:
    """The files of the workspace (not hidden, not the daemon's own) whose name is one of
    ``wanted`` (:func:`note_name`s): notes outside the folders the index holds, and
    files that are no note, name what a link names as much as an indexed note does."""
    found: list[str] = []
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root).replace(os.sep, "/")
        rel = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if not passed_by(rel + d)]
        found += (rel + f for f in files if note_name(f) in wanted)
    return found


def _pick(target: str, paths: Sequence[str], at: str) -> str | None:
    """The file of ``paths`` the link ``target`` names, as the index picks a note; a
    file that is no note (``resource/a.txt``) by its path or the end of it."""
    near = [p for p in paths if note_name(p) == note_name(target)]
    found = pick_note(target, near, at)
    if found is None and "/" in target:
        want = name_key(target.lstrip("/"))
        found = next((p for p in near if name_key(p) == want
                      or name_key(p).endswith("/" + want)), None)
    return found


def unresolved(names: Iterable[str], src: str,
               resolve: Callable[[str, str], str | None]) -> set[str]:
    """Of the link targets ``names`` written in node ``src``, those ``resolve`` finds no
    file for."""
    return {n for n in names if not normalize_target(n, resolve, src)[1]}


def not_on_disk(root: Path, names: Collection[str], src: str) -> set[str]:
    """Of ``names`` (:func:`unresolved` by the index), those that name no other file of
    the workspace ``root`` either (blocking: it lists the workspace)."""
    disk = _on_disk(root, {note_name(normalize_target(n)[0]) for n in names})
    return unresolved(names, src, lambda t, at: _pick(t, disk, at))


async def dangling_in(run: _Run, proposal: Integration) -> dict[str, str | None]:
    """The targets of the links of ``proposal``'s content that name no file (not a note
    of the index, nor of the nodes on disk and the files the run wrote, which the index
    may not hold yet, nor another file of the workspace), each with the node it names by
    its name (``[[Harbour wall]]``: ``digest/wiki/harbour-wall.md``, found as ``related``
    finds it), if any. None while the workspace's index is not there to tell."""
    names = targets("\n".join(getattr(proposal, f) for f in WORDS))
    if not names:
        return {}
    try:
        index = run.ws.services.index
    except UnknownWorkspace:
        return {}
    nodes = await trio.to_thread.run_sync(run.names.scan, run.ws.root, run.digest_dir)
    local = [*nodes, run.note, proposal.path,
             *(p for p, sha in run.log.after.items() if sha is not None)]
    left = await index.locked(lambda state: unresolved(
        names, proposal.path, lambda t, at: state.resolve(t, at) or _pick(t, local, at)))
    named = {t: nodefiles.find_node(nodes, node_path(
        proposal.bucket, t[:-3] if t.lower().endswith(".md") else t, run.digest_dir), nodes)
        for t in left if "/" not in t}
    left = {t for t in left if named.get(t) is None}
    if left:  # listed off the index lock: searches and applies do not wait for it
        left = await trio.to_thread.run_sync(not_on_disk, run.ws.root, left, proposal.path)
    return {t: found for t, found in named.items() if found is not None} | dict.fromkeys(
        left)


def _shown(link: str, node: str | None = None) -> str:
    """What a link shows as text: its alias, else its target (and heading); with
    ``node``, a link to that node showing the same."""
    inner = link.lstrip("!")[2:-2]
    target, _, alias = inner.partition("|")
    name, _, part = target.removesuffix("\\").partition("#")
    if node is not None:
        heading = f"#{part.strip()}" if part.strip() else ""
        return f"[[{node.removesuffix('.md')}{heading}|{alias.strip() or name.strip()}]]"
    if alias.strip():
        return alias.strip()
    return f"{name.strip()} > {part.strip()}" if part.strip() else name.strip()


#: The words of a proposal a node shows: its content, its name (its title), its
#: description (a frontmatter line, whose links the index reads as the body's) and its
#: reason (in the History of a REFINE or CORRECT).
WORDS: Final = ("content", "name", "description", "reason")


def _unlinked(text: str, drop: Collection[str], missing: Mapping[str, str | None],
              done: dict[str, None]) -> str:
    """``text`` with its links to ``drop`` rewritten (see :func:`unlink`)."""
    lines = text.split("\n")
    found = Counter((index, link, name) for index, link, name in _links(text)
                    if name in drop)
    # The longer first: ``[[x]]`` is counted again once ``![[x]]`` is replaced.
    for (index, link, name), count in sorted(found.items(), key=lambda e: -len(e[0][1])):
        # A code span is removed from the visible line: a link that stands in one too
        # (``[[x]]`` and `` `[[x]]` ``) cannot be told apart there, and stays.
        if lines[index].count(link) == count:
            lines[index] = lines[index].replace(link, _shown(link, missing[name]))
            if missing[name] is None:
                done[name] = None
    return "\n".join(lines)


def unlink(proposal: Integration, missing: Mapping[str, str | None], before: str | None
           ) -> tuple[Integration, list[str]]:
    """``proposal`` with each link of its :data:`WORDS` to a target of ``missing``
    written as the text it shows (or, to the node ``missing`` names for it, as a link by
    that node's path), unless the node held a link to that target ``before``; and the
    targets so written as text."""
    kept = {_key(t) for t in targets(before or "")}
    drop = {t for t in missing if _key(t) not in kept}
    if not drop:
        return proposal, []
    done: dict[str, None] = {}
    return replace(
        proposal, content=_unlinked(proposal.content, drop, missing, done),
        reason=_unlinked(proposal.reason, drop, missing, done),
        description=_unlinked(proposal.description, drop, missing, done),
        # A node's name is no place for a link to a path (it names the node's file, and
        # the node is found by it): text there, whatever the link named.
        name=_unlinked(proposal.name, drop, dict.fromkeys(missing), {})), list(done)
