"""A job that runs on one host of a shared workspace at a time (``Replica.job_lock``)
hands its work over to the next host through the server: the job lock alone orders the
runs, but what a run wrote travels as file changes, up through this host's outbox and
down through the other host's change feed, a moment after the run ended.

So a run begins once this host has applied the feed up to the version the server had
given out when the lock was taken (what the last run, on any host, wrote), and ends, the
lock still held, once what it wrote is on the server. Without both, the next host would
dream on digest nodes older than the last run's: a node it made anew would crash into
the one the last run made (a conflict copy), a fact the last run added would be taken
for new, a node an undo removed for one still there.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from recalld.daemon.remote import db
from recalld.daemon.remote.calls import on_conn
from recalld.daemon.remote.filesync import FileSync
from recalld.ipc.errors import ProviderUnavailable

log = logging.getLogger(__name__)

# How long a job waits for this host's replica to have the last run's changes, and then
# for its own to be on the server.
HANDOVER_WAIT_S = 60.0


@asynccontextmanager
async def turn(files: FileSync, conn: db.Conn, workspace_id: int, name: str, kind: str,
               online: Callable[[], bool]) -> AsyncIterator[None]:
    """Around a job's run, its lock held on ``conn``: first wait until this host's
    replica has applied the feed up to the server's last version (ProviderUnavailable
    when it cannot within :data:`HANDOVER_WAIT_S`: the job would run on what the other
    hosts changed before it), then, after the run (failed too: it may have written
    nodes), until what this host changed is on the server (not within the wait: logged,
    the lock is let go all the same)."""
    head = await on_conn(conn, db.last_version, workspace_id)
    if not await files.wait_pulled(head, HANDOVER_WAIT_S, online):
        raise ProviderUnavailable(
            f"shared workspace {name}: this host has not yet applied the other hosts' "
            f"changes up to version {head} (it is at {files.read_upto}): {kind} runs "
            "once it has them, so it does not work on notes older than the last run's")
    cancelled = False
    try:
        yield
    except trio.Cancelled:
        cancelled = True
        raise
    finally:
        if not cancelled and not await files.wait_uploaded(HANDOVER_WAIT_S, online):
            log.warning("shared workspace %s: what this host's %s changed is not yet on "
                        "the server; the next host may run on what came before it", name,
                        kind)
