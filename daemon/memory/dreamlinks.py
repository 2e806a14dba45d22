"""What a dream run writes about nodes besides their integrations: their older History
entries in the archive file beside them (:func:`archive_history`), the daily notes they
cite renamed or moved (:func:`follow_moves`) or deleted (:func:`follow_deleted`), and
with them those notes' catalog records (:func:`follow_notes`), and the nodes they relate
to renamed or deleted by hand (:func:`follow_renamed_nodes`), whose History archive
follows them.
Each write goes through the run (its change log and journal), so undo restores it. No
task; it keeps, per open workspace, the node files seen when links were last followed
(:func:`renamed_nodes`), in memory only.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

import trio

from recalld.daemon import safepath
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import digest, dreamnotes, nodefiles
from recalld.daemon.memory.dreamnotes import DELETED_AT
from recalld.daemon.memory.fileops import WriteConflict, read_confined
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import RecalldError

if TYPE_CHECKING:
    from recalld.daemon.memory.dream import _Run

log = logging.getLogger(__name__)

WRITE_ATTEMPTS: Final = 3


async def archive_history(run: _Run, rel: str, entries: Sequence[str]) -> None:
    """Append the History ``entries`` moved out of node ``rel`` to its archive file (made
    with a title if there is none), before the node is written: a run cut short between
    the two keeps them in one place at least. Entries the file holds already (written by
    an attempt whose node write then met a person's edit) are not appended twice.
    WriteConflict if the file changed while it was read: the caller integrates again."""
    path = digest.history_archive(rel)
    before = await trio.to_thread.run_sync(read_confined, run.ws.root, path)
    text = before or f"# Older History of {rel}, oldest first\n\n"
    held = set(text.splitlines())
    more = [e for e in entries if e not in held]
    if more:
        await run.write(path, before, text + "".join(f"{e}\n" for e in more))


async def follow_notes(run: _Run, catalog: dict[str, JsonObject],
                       read: Mapping[str, tuple[str, str, str]], moves: Mapping[str, str],
                       gone: Collection[str], back: Collection[str], when: str) -> None:
    """The daily notes renamed or moved since they were dreamed (``moves``: new path ->
    old; ``read``: each new path, digest and text), deleted (``gone``: their claims
    stay) or there again (``back``): the nodes citing them follow (nothing is dreamed),
    then their records in ``catalog`` (each change kept for undo); ``when``: the time of
    the run."""
    if moves:
        await follow_moves(run, moves)
        for new, old in moves.items():
            rec = catalog[old]
            _, sha, text = read[new]  # a resource's note moved is rewritten as it moves
            await run.set_catalog(catalog, old, None)
            await run.set_catalog(catalog, new, {k: v for k, v in rec.items()
                                                 if k not in (DELETED_AT, dreamnotes.SAYS)}
                                  | {"path": new, "digest": sha, **dreamnotes.says(text)})
    if gone or back:
        await follow_deleted(run, gone, back)
        for rel in gone:
            await run.set_catalog(catalog, rel, {**catalog[rel], DELETED_AT: when})
        for rel in back:
            await run.set_catalog(catalog, rel, {k: v for k, v in catalog[rel].items()
                                                 if k != DELETED_AT})


async def follow_moves(run: _Run, moves: Mapping[str, str]) -> None:
    """Daily notes renamed since they were dreamed (``moves``: new path -> old): the
    nodes citing them cite them by their new paths."""
    back = {old: new for new, old in moves.items()}

    def told(node: digest.Node) -> tuple[str, list[str]]:
        cited = [s for s in [*node.sources, *node.deleted_sources,
                             *node.overturned_sources] if s in back]
        return "renamed source note(s): " + ", ".join(
            f"{old} -> {back[old]}" for old in cited), [back[old] for old in cited]

    await _each_node(run, lambda rel, text: dreamnotes.relink(rel, text, back), told,
                     lambda node: _relink_archive(run, node, back))


async def follow_deleted(run: _Run, gone: Collection[str], back: Collection[str]) -> None:
    """Daily notes deleted since they were dreamed (``gone``), and deleted ones there
    again (``back``): the nodes citing them keep them as deleted sources (still counted,
    no longer linked), and link those back again."""

    def told(node: digest.Node) -> tuple[str, list[str]]:
        dead = [s for s in [*node.sources, *node.overturned_sources] if s in gone]
        alive = [s for s in [*node.deleted_sources, *node.overturned_sources] if s in back]
        said = [f"{what}: {', '.join(notes)}" for what, notes in (
            ("deleted source note(s)", dead), ("source note(s) there again", alive)) if notes]
        return "; ".join(said), [*dead, *alive]

    async def archive(node: digest.Node) -> None:
        # The History entries archived beside it cite them as its own History does.
        dead = [s for s in [*node.sources, *node.overturned_sources] if s in gone]
        alive = [s for s in [*node.deleted_sources, *node.overturned_sources] if s in back]
        path = _archive_of(node)
        before = await trio.to_thread.run_sync(read_confined, run.ws.root, path)
        if before is not None and (text := "\n".join(
                dreamnotes.unlinked(ln, dead, alive) for ln in before.split("\n"))) != before:
            await run.write(path, before, text)

    await _each_node(run, lambda rel, text: dreamnotes.mark_deleted(rel, text, gone, back),
                     told, archive)


async def _each_node(run: _Run, change: Callable[[str, str], str | None],
                     told: Callable[[digest.Node], tuple[str, list[str]]],
                     first: Callable[[digest.Node], Awaitable[None]] | None = None) -> None:
    """Every node that ``change`` (its path and text -> its new text, None: no change)
    changes written so, after ``first`` (what goes with it, written before), each with a
    RELINK action ``told`` describes (its detail and sources, from the node before)."""
    nodes = await trio.to_thread.run_sync(nodefiles.node_paths, run.ws.root,
                                          run.digest_dir)
    for rel in nodes:
        for _ in range(WRITE_ATTEMPTS):  # read again if a person wrote it meanwhile
            try:
                before, utf8 = await trio.to_thread.run_sync(nodefiles.read_node,
                                                             run.ws.root, rel)
            except RecalldError:  # a link, or too large: not a node this run writes
                break
            text = None if before is None or not utf8 else change(rel, before)
            if before is None or text is None:
                break
            node = digest.parse_node(rel, before)
            try:
                if first is not None:
                    await first(node)
                await run.write(rel, before, text)
            except WriteConflict:
                continue
            detail, sources = told(node)
            await run.act({"action": "RELINK", "path": rel, "status": "applied",
                           "reason": "", "detail": detail, "sources": sources, "note": ""})
            break


async def _relink_archive(run: _Run, node: digest.Node, back: Mapping[str, str]) -> None:
    """The History entries archived beside ``node`` cite the renamed notes of ``back``
    (old path -> new) by their new paths, as its own History does. WriteConflict if the
    archive changed while it was read."""
    path = _archive_of(node)
    before = await trio.to_thread.run_sync(read_confined, run.ws.root, path)
    if before is not None and (text := dreamnotes.swap_links(before, back)) != before:
        await run.write(path, before, text)


def _archive_of(node: digest.Node) -> str:
    """Where the older History of ``node`` is: the archive its History names, else the
    one beside it."""
    return node.archive_named or digest.history_archive(node.path)


class Relink(NamedTuple):
    """What a node's links need (:func:`_renamed_related`): its text, ``{old related path:
    the node's path now}``, the archive its History names if it is another node's, the
    related nodes deleted by hand and those there again."""

    text: str
    moved: dict[str, str]
    left: str | None
    gone: tuple[str, ...] = ()
    back: tuple[str, ...] = ()


class Renamed(NamedTuple):
    """What :func:`renamed_nodes` found: the node files there were, and the nodes to
    write (:func:`_renamed_related`)."""

    nodes: frozenset[str]
    found: dict[str, Relink]


#: The node files each workspace had when its links were last followed: a node renamed
#: since shows as a file gone. Forgotten with the workspace (closed, or the daemon stopped).
_SEEN: weakref.WeakKeyDictionary[Workspace, frozenset[str]] = weakref.WeakKeyDictionary()
#: The related nodes each workspace's runs found deleted by hand: one a run makes again is
#: not counted among the files seen, so the next run links it again where it was named.
_GONE: weakref.WeakKeyDictionary[Workspace, frozenset[str]] = weakref.WeakKeyDictionary()


def renamed_nodes(ws: Workspace, names: nodefiles.NameIndex) -> Renamed:
    """The nodes whose links or History archive name a node renamed or deleted by hand,
    or one there again (blocking). The nodes are read only when the node files changed
    but for those a run made since the links were last followed (or not yet followed
    since the workspace opened): a run has them all read once instead of at every run."""
    nodes = frozenset(nodefiles.node_paths(ws.root, ws.settings.digest_dir))
    seen = _SEEN.get(ws)
    found = {} if seen is not None and seen == nodes else _renamed_related(
        ws.root, ws.settings.digest_dir, names)
    if not found:
        _SEEN[ws] = nodes
    return Renamed(nodes, found)


def _renamed_related(root: Path, digest_dir: str, names: nodefiles.NameIndex
                     ) -> dict[str, Relink]:
    """The :class:`Relink` of each node whose Related links name no file: where
    :func:`nodefiles.find_node` finds the node they meant (its file renamed by hand:
    found by its frontmatter name), or where nothing is left of it (deleted by hand); of
    each node whose Related lines name a node deleted that is there again; and of each
    node renamed by hand, whose History names the archive beside its old file
    (blocking)."""
    nodes = names.scan(root, digest_dir)
    out: dict[str, Relink] = {}
    for rel in nodes:
        try:
            text, utf8 = nodefiles.read_node(root, rel)
        except RecalldError:  # a link, or too large: not a node this run writes
            continue
        if text is None or not utf8:
            continue
        node = digest.parse_node(rel, text)
        missing = {old: nodefiles.find_node(nodes, old, nodes) for old in node.related
                   if old not in nodes}
        moved = {old: new for old, new in missing.items() if new not in (None, rel)}
        # Only a node's path: a link by a bare name may be to a page elsewhere.
        gone = tuple(old for old, new in missing.items() if new is None
                     and _node_shaped(old, digest_dir) and not os.path.lexists(root / old))
        back = tuple(x for x in nodes if x != rel and x not in node.related and any(
            f"{x} (deleted)" in line for line in node.written.get("Related", [])))
        left = _left_behind(root, node, digest_dir, nodes)
        if (moved or left or gone or back) and not node.unreadable:
            out[rel] = Relink(text, moved, left, gone, back)
    return out


def _node_shaped(path: str, digest_dir: str) -> bool:
    """Whether ``path`` is where a node would be (``<digest>/<bucket>/<name>.md``)."""
    folder, _, name = path.rpartition("/")
    return folder in {f"{digest_dir}/{b}" for b in digest.BUCKETS} and name.endswith(".md")


def _left_behind(root: Path, node: digest.Node, digest_dir: str,
                 nodes: Mapping[str, str]) -> str | None:
    """The archive ``node``'s History names if it is there, beside a node file that is
    gone (the node's own, before a person renamed its file), else None. One elsewhere (a
    hand edit: another folder, a hidden name) is left alone."""
    archive = _archive_of(node)
    folder, _, name = archive.rpartition("/")
    was = f"{archive.removesuffix('.history.txt')}.md"
    ours = folder in {f"{digest_dir}/{b}" for b in digest.BUCKETS} and not name.startswith(".")
    return archive if ours and archive != digest.history_archive(node.path) \
        and was not in nodes and digest.visible_text(name) == name \
        and os.path.lexists(root / archive) else None


def _relinked(rel: str, links: Relink) -> str:
    """The node's text with its Related links to renamed nodes naming their files now,
    those to deleted nodes as ``<path> (deleted)`` (no longer related: a link to nothing)
    and those to deleted nodes there again linked again."""
    node = digest.parse_node(rel, links.text)
    node.related = list(dict.fromkeys([*(links.moved.get(r, r) for r in node.related
                                          if r not in links.gone), *links.back]))

    def line(ln: str) -> str:
        return dreamnotes.unlinked(dreamnotes.swap_links(ln, links.moved), links.gone,
                                   links.back)

    node.written = {k: [line(ln) if k == "Related" else ln for ln in v]
                    for k, v in node.written.items()}
    return digest.render_node(node)


async def follow_renamed_nodes(run: _Run, renamed: Renamed) -> None:
    """Nodes renamed by hand (their file, not their name; ``renamed``: what
    :func:`renamed_nodes` found): the Related links of other nodes that named the old
    file name the node's file now, and the node's History archive follows it (a copy
    beside each node that names it, a node copied by hand too; then the old one goes).
    Nodes deleted by hand: the other nodes no longer relate to them, and name them
    ``<path> (deleted)``, linked again if they come back."""
    found = renamed.found
    for _ in range(WRITE_ATTEMPTS):  # again if a person wrote a node meanwhile
        conflicts = 0
        copied: dict[str, str | None] = {}  # old archive -> its text (None: keep it)
        for rel, links in found.items():
            before, moved, archive = links.text, links.moved, links.left
            try:
                if archive is not None:
                    read = await _copy_archive(run, archive, rel)
                    copied[archive] = read if read is not None \
                        and copied.get(archive, read) == read else None
                await run.write(rel, before, _relinked(rel, links))
            except (WriteConflict, RecalldError) as exc:
                if archive is not None:
                    copied[archive] = None  # still named by a node not written
                if isinstance(exc, WriteConflict):
                    conflicts += 1
                else:  # the archive a link, a folder: left as it is
                    log.warning("dream of %s: %s not relinked: %s", run.ws.agent_id,
                                safepath.masked(rel), exc.message)
                continue
            done = ["renamed related node(s): " + ", ".join(
                f"{old} -> {new}" for old, new in moved.items())] if moved else []
            if links.gone:
                done.append("related node(s) deleted: " + ", ".join(links.gone))
            if links.back:
                done.append("related node(s) there again: " + ", ".join(links.back))
            if archive is not None:
                done.append(f"History archive {archive} -> {digest.history_archive(rel)}")
            await run.act({
                "action": "RELINK", "path": rel, "status": "applied", "reason": "",
                "detail": "; ".join(done), "sources": [], "note": ""})
        for archive, text in copied.items():
            if text is not None:
                try:
                    await run.remove(archive, text)
                except WriteConflict:  # written meanwhile: kept, its copies made
                    continue
        if not conflicts:
            _SEEN[run.ws] = renamed.nodes
            _GONE[run.ws] = _GONE.get(run.ws, frozenset()).union(
                *(links.gone for links in found.values())).difference(renamed.nodes)
            return
        found = await trio.to_thread.run_sync(_renamed_related, run.ws.root,
                                              run.digest_dir, run.names)


def forget_seen(ws: Workspace) -> None:
    """The node files of ``ws`` changed under the runs (an undo): the next run reads the
    nodes, as at the first run since the workspace opened."""
    _SEEN.pop(ws, None)


def remember_made(run: _Run) -> None:
    """The nodes ``run`` made count among the node files seen (:func:`renamed_nodes`):
    one renamed before the next run shows as gone. Not one that other nodes name as
    deleted: made again, the next run links it there again."""
    seen = _SEEN.get(run.ws)
    gone = _GONE.get(run.ws, frozenset())
    if seen is not None:
        _SEEN[run.ws] = seen | {p for p, before in run.log.before.items()
                                if before is None and p.endswith(".md") and p not in gone}


async def _copy_archive(run: _Run, old: str, rel: str) -> str | None:
    """The archive ``old`` of node ``rel``, named by the node's old file name, copied
    beside it (titled by its path now; not if the node has an archive of its own
    already); returns what ``old`` held once copied (None: not copied, ``old`` stays).
    WriteConflict if the copy was made meanwhile."""
    new = digest.history_archive(rel)
    before = await trio.to_thread.run_sync(read_confined, run.ws.root, old)
    if before is None or await trio.to_thread.run_sync(read_confined, run.ws.root, new) \
            is not None:
        return None
    head = f"# Older History of {old.removesuffix('.history.txt')}.md, oldest first\n"
    text = f"# Older History of {rel}, oldest first\n{before.removeprefix(head)}" \
        if before.startswith(head) else before
    await run.write(new, None, text)
    return before
