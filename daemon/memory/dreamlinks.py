"""What a dream run does to nodes whose links point at files that moved: the daily notes
they cite renamed or moved (:func:`follow_moves`). Each write goes through the run (its
change log and journal), so undo restores it. No task.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import trio

from recalld.daemon.memory import digest, dreamnotes, nodefiles
from recalld.daemon.memory.fileops import WriteConflict
from recalld.ipc.errors import RecalldError

if TYPE_CHECKING:
    from recalld.daemon.memory.dream import _Run

WRITE_ATTEMPTS: Final = 3


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
