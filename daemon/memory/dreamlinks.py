"""What a dream run writes about nodes besides their integrations: their older History
entries in the archive file beside them (:func:`archive_history`), the daily notes they
cite renamed or moved (:func:`follow_moves`), and the nodes they relate to renamed by hand
(:func:`follow_renamed_nodes`). Each write goes through the run (its change
log and journal), so undo restores it. No task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from recalld.daemon.memory import digest, dreamnotes, nodefiles
from recalld.daemon.memory.fileops import WriteConflict, read_confined
from recalld.ipc.errors import RecalldError

if TYPE_CHECKING:
    from recalld.daemon.memory.dream import _Run

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


async def follow_moves(run: _Run, moves: Mapping[str, str]) -> None:
    """Daily notes renamed since they were dreamed (``moves``: new path -> old): the
    nodes citing them cite them by their new paths."""
    back = {old: new for new, old in moves.items()}
    nodes = await trio.to_thread.run_sync(nodefiles.node_paths, run.ws.root,
                                          run.digest_dir)
    for rel in nodes:
        for _ in range(WRITE_ATTEMPTS):  # read again if a person wrote it meanwhile
            try:
                before, utf8 = await trio.to_thread.run_sync(nodefiles.read_node,
                                                             run.ws.root, rel)
            except RecalldError:  # a link, or too large: not a node this run writes
                break
            text = None if before is None or not utf8 else dreamnotes.relink(
                rel, before, back)
            if before is None or text is None:
                break
            try:
                await _relink_archive(run, digest.parse_node(rel, before), back)
                await run.write(rel, before, text)
            except WriteConflict:
                continue
            cited = digest.parse_node(rel, before).sources
            await run.act({
                "action": "RELINK", "path": rel, "status": "applied", "reason": "",
                "detail": "renamed source note(s): " + ", ".join(
                    f"{old} -> {back[old]}" for old in cited if old in back),
                "sources": [back[old] for old in cited if old in back], "note": ""})
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


def _renamed_related(root: Path, digest_dir: str, names: nodefiles.NameIndex
                     ) -> dict[str, tuple[str, dict[str, str]]]:
    """``{node: (its text, {old related path: the node's path now})}`` of the nodes whose
    Related links name no file, where :func:`nodefiles.find_node` finds the node they
    meant (its file renamed by hand: found by its frontmatter name) (blocking)."""
    nodes = names.scan(root, digest_dir)
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for rel in nodes:
        try:
            text, utf8 = nodefiles.read_node(root, rel)
        except RecalldError:  # a link, or too large: not a node this run writes
            continue
        if text is None or not utf8:
            continue
        node = digest.parse_node(rel, text)
        moved = {old: new for old in node.related if old not in nodes
                 and (new := nodefiles.find_node(nodes, old, nodes)) not in (None, rel)}
        if moved and not node.unreadable:
            out[rel] = (text, moved)
    return out


def _relinked(rel: str, text: str, moved: Mapping[str, str]) -> str:
    node = digest.parse_node(rel, text)
    node.related = list(dict.fromkeys(moved.get(r, r) for r in node.related))
    node.written = {k: [dreamnotes.swap_links(ln, moved) if k == "Related" else ln for ln in v]
                    for k, v in node.written.items()}
    return digest.render_node(node)


async def follow_renamed_nodes(run: _Run) -> None:
    """Nodes renamed by hand (their file, not their name): the Related links of other
    nodes that named the old file name the node's file now."""
    for _ in range(WRITE_ATTEMPTS):  # again if a person wrote a node meanwhile
        found = await trio.to_thread.run_sync(_renamed_related, run.ws.root,
                                              run.digest_dir, run.names)
        conflicts = 0
        for rel, (before, moved) in found.items():
            try:
                await run.write(rel, before, _relinked(rel, before, moved))
            except WriteConflict:
                conflicts += 1
                continue
            await run.act({
                "action": "RELINK", "path": rel, "status": "applied", "reason": "",
                "detail": "renamed related node(s): " + ", ".join(
                    f"{old} -> {new}" for old, new in moved.items()),
                "sources": [], "note": ""})
        if not conflicts:
            return
