"""The inbox items of a conflict: this host's version of a note lost to another host's and
was kept beside it as a conflict copy (``remote/filesync.py`` makes the copy), or this
host's deletion of a note lost to another host's edit and the note comes back."""

from __future__ import annotations

import logging

from recalld.daemon.safepath import masked
from recalld.daemon.workspaces import Workspace

log = logging.getLogger(__name__)


async def report_conflict(ws: Workspace, name: str, path: str, copy: str,
                          replayed: bool) -> None:
    """Log the conflict on ``path`` of shared workspace ``name`` and say it in ``ws``'s
    inbox, once (``replayed``: the server's answer came again after a crash, and the item
    may be there already)."""
    log.warning("shared workspace %s: %s was changed on another host first; this "
                "host's version is kept as %s", name, masked(path), masked(copy))
    try:
        inbox = ws.services.inbox
        # Listed as shown: named masked where a name looks like a credential.
        if replayed and any(i.get("details", {}).get("conflict_copy") == masked(copy)
                            for i in inbox.list(include_acked=True)):
            return  # reported before a crash interrupted the bookkeeping
        await inbox.push(
            "sync_conflict",
            f"{path} was changed on another host first; your version is kept as {copy}",
            [path, copy], details={"path": path, "conflict_copy": copy,
                                   "shared_workspace": name})
    except Exception:  # the copy is on disk either way; the inbox is a courtesy
        log.exception("inbox item for the conflict on %s not recorded", masked(path))


async def report_restored(ws: Workspace, name: str, path: str, version: int,
                          replayed: bool) -> None:
    """Log that this host's deletion of ``path`` lost to another host's edit (version
    ``version`` on the server), which comes back here, and say it in ``ws``'s inbox once:
    a note deleted on purpose reappearing unexplained is taken for a fault."""
    log.warning("shared workspace %s: %s was deleted here but changed on another host "
                "first; the note comes back with that version", name, masked(path))
    try:
        inbox = ws.services.inbox
        if replayed and any(i.get("kind") == "sync_restored"
                            and i.get("details", {}).get("path") == masked(path)
                            and i.get("details", {}).get("version") == version
                            for i in inbox.list(include_acked=True)):
            return  # reported before a crash interrupted the bookkeeping
        await inbox.push(
            "sync_restored",
            f"{path} was deleted here but changed on another host first; the note is back"
            " with that version (delete it again to delete it everywhere)",
            [path], details={"path": path, "version": version, "shared_workspace": name})
    except Exception:  # the note comes back either way; the inbox is a courtesy
        log.exception("inbox item for the restored note %s not recorded", masked(path))
