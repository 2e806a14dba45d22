"""The journal of a restore under way: ``backups/restore-journal.json`` says which
archive a restore (or rollback) puts in place of which workspaces, and the pre-restore
snapshot it took, before it changes anything; it goes once every workspace is restored.

A journal found at the start means the daemon stopped (a SIGKILL, a lost machine) while
a restore changed files: some workspaces, or some files of one, from the archive, the
rest as they were. Before any workspace opens, :func:`recover` finishes that restore from
the archive if it is still there and whole, else puts the snapshot back (the state from
before); ``daemon.status`` says which (``restore_recovery``), as the log and ``recalld
doctor`` do, so a client whose restore call got no answer learns the outcome. One that
could do neither (``unresolved``) is kept in ``backups/restore-unresolved.json`` and
said again at every start, until a restore of those workspaces ends or an operator
removes the file.

Reading and writing block on the file system; the RPC layer runs them in worker threads.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import trio

from recalld.daemon.rpc.dispatch import DaemonState, JsonObject
from recalld.daemon.rpc.restore_record import backups_dir, drop_record, read_record
from recalld.daemon.store.errors import StorageError
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir, read_verified

if TYPE_CHECKING:  # the archive modules load only when a journal is found
    from recalld.daemon.backup import ProgressSink

log = logging.getLogger(__name__)

JOURNAL = "restore-journal.json"
#: An interrupted restore a start could neither finish nor roll back, until resolved.
UNRESOLVED = "restore-unresolved.json"


def write_journal(state: DaemonState, archive: Path, agents: list[str],
                  snapshot: str | None, rolling_back: bool) -> None:
    """Record, durably (fsynced file and folder), the restore about to change files."""
    folder = backups_dir(state)
    ensure_dir(REAL, folder)
    entry = {"archive": str(archive), "agents": agents, "snapshot": snapshot,
             "rolling_back": rolling_back, "started": time.time()}
    atomic_write(REAL, folder / JOURNAL, orjson.dumps(entry, option=orjson.OPT_INDENT_2))


def read_journal(state: DaemonState, name: str = JOURNAL) -> JsonObject | None:
    """The journal of a restore that did not end (or, ``name`` UNRESOLVED, the outcome
    of one no start could resolve), or None (none, or unreadable)."""
    try:  # a FIFO or device in its place must not stall the start
        entry = orjson.loads(read_verified(backups_dir(state) / name, None))
    except (StorageError, orjson.JSONDecodeError):
        return None
    agents = entry.get("agents") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("archive"), str) or (
            not isinstance(agents, list) or not all(isinstance(a, str) for a in agents)):
        return None
    return entry


def drop_journal(state: DaemonState, name: str = JOURNAL) -> None:
    """The restore ended (or failed while the daemon ran, which said so): no journal."""
    path = backups_dir(state) / name
    if path.is_file() and not path.is_symlink():
        path.unlink(missing_ok=True)
        REAL.fsync_dir(path.parent)


def restore_ended(state: DaemonState, agents: list[str]) -> None:
    """A restore of ``agents`` ended: its journal goes, and so does an unresolved
    outcome of an interrupted one whose workspaces it all put in place again."""
    drop_journal(state)
    kept = read_journal(state, UNRESOLVED)
    if kept is not None and set(kept["agents"]) <= set(agents):
        drop_journal(state, UNRESOLVED)


def _keep_unresolved(state: DaemonState, outcome: JsonObject) -> None:
    """Record ``outcome`` for the starts to come (logged if it cannot be written)."""
    path = backups_dir(state) / UNRESOLVED
    outcome["acknowledge"] = f"remove {path} once the workspaces are whole again"
    try:
        atomic_write(REAL, path, orjson.dumps(outcome, option=orjson.OPT_INDENT_2))
    except (OSError, StorageError) as exc:
        del outcome["acknowledge"]
        log.error("could not record the unresolved restore in %s: %s", path, exc)


def unresolved_shown(state: DaemonState) -> bool:
    """Whether ``state.restore_recovery`` is still to be shown: not an unresolved one
    whose record was removed (acknowledged, or resolved by a restore)."""
    r = state.restore_recovery
    return r is not None and (r.get("outcome") != "unresolved" or "acknowledge" not in r
                              or (backups_dir(state) / UNRESOLVED).exists())


async def recover(state: DaemonState, progress: ProgressSink) -> JsonObject | None:
    """Finish or roll back the restore a journal says did not end (see the module),
    reporting its steps to ``progress``; returns what was done (also kept as
    ``state.restore_recovery``), None if no journal.
    The journal stays until one of the two succeeds: a stop meanwhile tries again."""
    entry = await trio.to_thread.run_sync(read_journal, state)
    if entry is None:
        kept = await trio.to_thread.run_sync(read_journal, state, UNRESOLVED)
        if kept is not None:
            state.restore_recovery = kept
            log.error("the interrupted restore of %s from %s is still unresolved: the "
                      "workspaces may hold files of both; %s", ", ".join(kept["agents"]),
                      kept["archive"], kept.get("acknowledge"))
        return kept
    from recalld.daemon.rpc.ops_methods import drop_added_config, restore  # its imports

    archive, agents = Path(entry["archive"]), list(entry["agents"])
    snapshot = entry.get("snapshot") if isinstance(entry.get("snapshot"), str) else None
    what = "rollback" if entry.get("rolling_back") else "restore"
    outcome: JsonObject = {"archive": str(archive), "agents": agents, "snapshot": snapshot,
                           "interrupted": what, "started": entry.get("started")}
    log.warning("a %s of %s from %s was interrupted: finishing it", what,
                ", ".join(agents), archive)
    try:
        await restore(state, archive, agents, snapshot=False, resuming=True,
                      overwrite_shared=True, progress=progress)
        outcome["outcome"] = "finished"
        record = await trio.to_thread.run_sync(read_record, state)
        if entry.get("rolling_back") and record is not None:  # done as a rollback ends
            await drop_added_config(state, record)
            # A second rollback would undo what came since.
            await trio.to_thread.run_sync(drop_record, state)
    except Exception as exc:
        outcome["finish_error"] = str(exc)
        if snapshot is None:
            outcome["outcome"] = "unresolved"
            log.error("the interrupted %s of %s could not be finished (%s) and no snapshot "
                      "was taken before it: the workspaces may hold files of both; restore "
                      "a backup of them", what, ", ".join(agents), exc)
        else:
            log.warning("the interrupted %s of %s could not be finished (%s): putting back "
                        "the state from before it (%s)", what, ", ".join(agents), exc,
                        snapshot)
            try:
                await restore(state, Path(snapshot), agents, snapshot=False,
                              rolling_back=True, resuming=True, overwrite_shared=True,
                              progress=progress)
            except Exception as again:
                outcome["outcome"] = "unresolved"
                outcome["rollback_error"] = str(again)
                log.error("the state from before the interrupted %s of %s could not be put "
                          "back either (%s): the workspaces may hold files of both; restore "
                          "a backup of them", what, ", ".join(agents), again)
            else:
                outcome["outcome"] = "rolled_back"
                await trio.to_thread.run_sync(drop_record, state)
    outcome["ended"] = time.time()
    state.restore_recovery = outcome
    if outcome["outcome"] != "unresolved":
        log.warning("the interrupted %s of %s was %s", what, ", ".join(agents),
                    str(outcome["outcome"]).replace("_", " "))
        await trio.to_thread.run_sync(restore_ended, state, agents)
    else:  # said at every start until resolved: before the journal goes
        await trio.to_thread.run_sync(_keep_unresolved, state, outcome)
        await trio.to_thread.run_sync(drop_journal, state)
    return outcome
