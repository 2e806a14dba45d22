"""The workspace id of an agent's name, as the daemon knows it.

The id a name maps to (:func:`~recalld.ipc.agent_ids.workspace_id`) changed for a few
names: an id with a dot at either end, a name not in NFC form
(:func:`~recalld.ipc.agent_ids.earlier_ids`). The memory of such an agent is under its
earlier id, so the integrations (AgentScope middlewares, the MCP bridge) ask the daemon
once which workspaces it has (``workspace.list``) and keep using the earlier id when it
has that one. Every other name costs no call.
"""

from __future__ import annotations

from collections.abc import Iterable

from recalld.ipc import errors
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import earlier_ids, workspace_id

#: Names whose id was looked up, kept (beyond, the oldest are looked up again).
MAX_KNOWN = 10_000


def pick_id(name: str, known: Iterable[str], *, given_as_id: bool = True) -> str:
    """The id of ``name``: an earlier one among the daemon's ``known`` ids, else the
    current one. ValueError if there is neither (a name that makes no id)."""
    have = set(known)
    for earlier in earlier_ids(name, given_as_id=given_as_id):
        if earlier in have:
            return earlier
    return workspace_id(name)


def listed_ids(answer: object) -> set[str]:
    """The agent ids of a ``workspace.list`` answer (open or recorded)."""
    listed = answer.get("workspaces") if isinstance(answer, dict) else None
    return {str(ws["agent_id"]) for ws in listed or []
            if isinstance(ws, dict) and isinstance(ws.get("agent_id"), str)}


class KnownIds:
    """The ids names map to over one daemon connection, each looked up once."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._ids: dict[tuple[str, bool], str] = {}

    async def id_of(self, name: str, *, given_as_id: bool = True) -> str:
        """The workspace of ``name`` (``given_as_id``: named as an ``agent_id``, else as
        an agent's name): InvalidParams if it makes none, or if the daemon could not be
        asked (nothing is kept then: asked again next time)."""
        key = (name, given_as_id)
        if key in self._ids:
            return self._ids[key]
        known: set[str] = set()
        if earlier_ids(name, given_as_id=given_as_id):
            try:
                known = listed_ids(await self._client.call("workspace.list"))
            except (errors.RecalldError, OSError, TimeoutError) as exc:
                raise errors.InvalidParams(
                    f"which workspace is {name!r}'s is not known yet: {exc}") from exc
        try:
            found = pick_id(name, known, given_as_id=given_as_id)
        except ValueError as exc:
            raise errors.InvalidParams(str(exc)) from None
        if len(self._ids) >= MAX_KNOWN:
            del self._ids[next(iter(self._ids))]
        self._ids[key] = found
        return found


def provisional_id(name: str) -> str:
    """The id to name ``name``'s workspace by until :meth:`KnownIds.id_of` told which
    (only a name with :func:`earlier_ids` may change then): ValueError if it makes none
    and never made one."""
    if earlier_ids(name, given_as_id=True):
        return name
    return workspace_id(name)
