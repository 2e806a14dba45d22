"""What a dream run writes about nodes besides their integrations: their older History
entries in the archive file beside them (:func:`archive_history`), and the daily notes they
cite renamed or moved (:func:`follow_moves`). Each write goes through the run (its change
log and journal), so undo restores it. No task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
