"""The workspace registry's record book: what ``<data>/state/workspaces.json`` holds.

:class:`RecordBook` keeps, by agent id, every workspace the daemon served (its path, its
overrides, the owner's name, the secrets a restore left out) in memory and saves it with
:func:`recalld.daemon.remembered.save` after each change, one save at a time and shielded
from cancellation. A save that fails is logged and shown (``write_failure``); the
workspaces serve on and the next change saves again. It starts no task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import trio

from recalld.daemon import remembered
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.statefiles import WriteFailure
from recalld.ipc.errors import RecalldError

log = logging.getLogger("recalld.daemon.workspaces")


class RecordBook:
    """The recorded workspaces by agent id (``entries``), saved to ``path`` (None: kept
    in memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.write_failure = WriteFailure(path)
        self.entries: dict[str, remembered.Remembered] = {}
        # One save at a time, each of the entries as they are when it writes: saves of
        # opens under different agents' locks could finish out of order.
        self._save_lock = trio.Lock()

    async def load(self) -> None:
        """Read the file (a copy that did not verify is set aside and shown)."""
        if self.path is None:
            return
        self.entries = await trio.to_thread.run_sync(remembered.load, self.path)
        self.write_failure.set_aside = await trio.to_thread.run_sync(
            remembered.set_aside_copy, self.path)

    def config_at(self, agent_id: str, root: Path) -> JsonObject | None:
        """The ``config`` ``agent_id``'s workspace is recorded with at ``root`` (None:
        not recorded there, or with none)."""
        record = self.entries.get(agent_id)
        return record["config"] if record is not None and record["path"] == str(root) else None

    async def remember(self, agent_id: str, root: Path,
                       overrides: Mapping[str, object] | None, name: str | None) -> None:
        """Record ``agent_id``'s workspace as opened at ``root`` with ``overrides``."""
        if self.path is None:
            return
        old = self.entries.get(agent_id)
        config = dict(overrides) if overrides else None
        name = name or (old.get("name") if old is not None else None)
        if (old is not None and old["path"] == str(root) and old["config"] == config
                and old.get("name") == name):
            return
        entry = remembered.Remembered(
            path=str(root), config=config,
            registered_at=old["registered_at"] if old is not None else time.time())
        if name:
            entry["name"] = name
        # Secrets a restore left out stay missing until a client hands them over again.
        before = old.get("left_out", []) if old is not None else []
        missing = [k for k in before if not remembered.has_value(config, k)]
        if missing:
            entry["left_out"] = missing
        self.entries[agent_id] = entry
        await self.save()

    async def forget(self, agent_id: str) -> None:
        """Drop ``agent_id``'s record, saved."""
        del self.entries[agent_id]
        await self.save()

    async def note_left_out(self, agent_id: str, keys: list[str]) -> None:
        """Record that the secrets ``keys`` of ``agent_id``'s overrides were left out of
        the backup it was restored from (shown in status until handed over again)."""
        entry = self.entries.get(agent_id)
        if self.path is None or entry is None:
            return
        missing = [k for k in keys if not remembered.has_value(entry["config"], k)]
        if missing == entry.get("left_out", []):
            return
        if missing:
            entry["left_out"] = missing
        else:
            entry.pop("left_out", None)
        await self.save()

    def hands_back(self, agent_id: str, overrides: Mapping[str, object] | None) -> bool:
        """Whether ``overrides`` bring back a secret a restore left out."""
        missing = self.left_out(agent_id)
        return bool(missing) and any(remembered.has_value(overrides, k) for k in missing)

    def left_out(self, agent_id: str) -> list[str]:
        """The secrets of ``agent_id``'s overrides a restore could not put back."""
        entry = self.entries.get(agent_id)
        return list(entry.get("left_out", [])) if entry is not None else []

    async def save(self) -> None:
        """Write the entries as they are now (shielded: a record is never half-kept)."""
        assert self.path is not None
        with trio.CancelScope(shield=True):
            async with self._save_lock:
                entries = dict(self.entries)  # as they are now, not when it was asked
                try:
                    await trio.to_thread.run_sync(remembered.save, self.path, entries)
                except RecalldError as exc:  # the workspace serves; the record waits
                    log.error("recording the workspaces in %s failed: %s",
                              self.path, exc.message)
                    self.write_failure.record(exc.message)
                else:
                    self.write_failure.clear()
