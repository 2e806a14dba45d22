"""The writes of each agent that a backup restore waits for, and that wait for it.

A restore replaces an agent's files from its snapshot on: a write that lands after the
snapshot and before the restored files is in neither, and one made through a workspace
the restore closed goes to files no longer served. So a call that writes to an agent's
workspace (a note, turns, a topic file, an inbox acknowledgment) passes a gate: while a
restore has it closed (:meth:`WriteGates.closed`) the call waits, at most ``wait_s``,
then resolves the workspace open after it; a restore closing the gate first waits for
the writes already passed to end. No task and no timer: events only.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from recalld.ipc.errors import UnknownWorkspace

#: How long a write waits for a restore: less than a client's 30 s call timeout, so the
#: caller hears why nothing was written rather than a timeout.
RESTORE_WAIT_S = 25.0


class WriteGates:
    """One gate per agent: writes pass it together, a restore alone."""

    def __init__(self) -> None:
        #: Agents a restore has the gate of closed: set once it opens again.
        self._closed: dict[str, trio.Event] = {}
        #: Writes past the gate, by agent.
        self._writers: dict[str, int] = {}
        #: Set when an agent's last write past its gate ends (a restore waits on it).
        self._drained: dict[str, trio.Event] = {}

    def is_closed(self, agent_id: str) -> bool:
        return agent_id in self._closed

    @contextlib.asynccontextmanager
    async def writing(self, agent_id: str, wait_s: float = RESTORE_WAIT_S,
                      ) -> AsyncIterator[None]:
        """Pass ``agent_id``'s gate for one write: at once unless a restore has it
        closed, else once the restore ended. UnknownWorkspace after ``wait_s`` (nothing
        was written). Cancelled while waiting: nothing passed."""
        with trio.move_on_after(wait_s):
            while (closed := self._closed.get(agent_id)) is not None:
                await closed.wait()
        if agent_id in self._closed:
            raise UnknownWorkspace(
                f"workspace {agent_id!r} is being restored from a backup, still after "
                f"{wait_s:g} s: nothing was written; write again once the restore answered")
        self._writers[agent_id] = self._writers.get(agent_id, 0) + 1
        try:
            yield
        finally:
            self._writers[agent_id] -= 1
            if not self._writers[agent_id]:
                del self._writers[agent_id]
                if (drained := self._drained.pop(agent_id, None)) is not None:
                    drained.set()

    @contextlib.asynccontextmanager
    async def closed(self, agent_id: str) -> AsyncIterator[None]:
        """Hold ``agent_id``'s writes (a restore): new ones wait, and this waits for
        those under way to end first. Opened again on exit, cancellation included."""
        while (busy := self._closed.get(agent_id)) is not None:
            await busy.wait()
        done = self._closed[agent_id] = trio.Event()
        try:
            while self._writers.get(agent_id):
                drained = self._drained.setdefault(agent_id, trio.Event())
                await drained.wait()
            yield
        finally:
            del self._closed[agent_id]
            done.set()
