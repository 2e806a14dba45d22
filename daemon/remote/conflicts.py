"""The inbox item of a conflict: this host's version of a note lost to another host's and
was kept beside it as a conflict copy (``remote/filesync.py`` makes the copy)."""

from __future__ import annotations

import logging

from recalld.daemon.workspaces import Workspace

log = logging.getLogger(__name__)


async def report_conflict(ws: Workspace, name: str, path: str, copy: str,
                          replayed: bool) -> None:
    """Log the conflict on ``path`` of shared workspace ``name`` and say it in ``ws``'s
    inbox, once (``replayed``: the server's answer came again after a crash, and the item
    may be there already)."""
    log.warning("shared workspace %s: %s was changed on another host first; this "
                "host's version is kept as %s", name, path, copy)
    try:
        inbox = ws.services.inbox
        if replayed and any(i.get("details", {}).get("conflict_copy") == copy
                            for i in inbox.list(include_acked=True)):
            return  # reported before a crash interrupted the bookkeeping
        await inbox.push(
            "sync_conflict",
            f"{path} was changed on another host first; your version is kept as {copy}",
            [path, copy], details={"path": path, "conflict_copy": copy,
                                   "shared_workspace": name})
    except Exception:  # the copy is on disk either way; the inbox is a courtesy
        log.exception("inbox item for the conflict on %s not recorded", path)
