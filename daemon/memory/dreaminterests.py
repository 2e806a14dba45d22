"""The interest topics a dream run leaves in ``<digest_dir>/interests.yaml``: those of
the nodes it wrote and those the model noted, folded into what the file held (see
:mod:`interests`). No task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import trio

from recalld.daemon.memory import interests
from recalld.daemon.memory.dreamruns import INTERESTS_FILE
from recalld.daemon.memory.fileops import WriteConflict, read_confined

if TYPE_CHECKING:
    from recalld.daemon.memory.dream import _Run

log = logging.getLogger(__name__)

WRITE_ATTEMPTS: Final = 3


async def refresh(run: _Run) -> None:
    """Fold the topics of ``run`` into ``digest/interests.yaml`` (written through the run:
    its change log and journal), unless it has none."""
    if not run.topics:
        return
    rel = f"{run.digest_dir}/{INTERESTS_FILE}"
    for _ in range(WRITE_ATTEMPTS):
        before = await trio.to_thread.run_sync(read_confined, run.ws.root, rel)
        topics = interests.refresh(interests.parse_interests(before or ""), run.topics)
        text = interests.render_interests(topics, run.today)
        if text == before:
            return
        try:
            await run.write(rel, before, text)
            return
        except WriteConflict:
            continue
    log.warning("dream of %s: %s kept changing; interests not refreshed", run.ws.agent_id, rel)
