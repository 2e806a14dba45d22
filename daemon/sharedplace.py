"""Which shared workspace a ``remote`` setting names, and under which host name: the
check at load that no two workspaces of one daemon replicate one shared workspace under
one host (:func:`shared_twice`), and the machine's name taken when ``host`` is not set
(:func:`default_host`).

Nothing here imports the driver or the rest of the daemon: the config module imports
this one; psycopg's DSN parser is imported when a DSN is read (``daemon/dsn.py``).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from typing import Protocol

from recalld.daemon.config_rules import shown
from recalld.daemon.dsn import UnusableDsn, params
from recalld.ipc.agent_ids import workspace_table


def default_host() -> str:
    """This machine's short host name as the ``host`` setting's rule takes it (it names
    conflict copies and the server's rows): other characters dropped, at most 64 of
    them; ``host`` when none is left."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "", socket.gethostname().split(".")[0])[:64]
    return name.strip(".") or "host"


class SharedPlace(Protocol):
    """What names a shared workspace and this replica in it (``RemoteConfig``)."""

    @property
    def dsn(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...


def shared_twice(remotes: Mapping[str, SharedPlace | None]) -> str | None:
    """Why two workspaces (agent id to its ``remote``) cannot both replicate: they name
    one shared workspace on one server (host, port, database, service as the DSNs say)
    under one ``host`` (unset: both the machine's name). The server holds a replica's
    host name for its session, so the second one would never connect. None: none do."""
    seen: dict[tuple[str, ...], str] = {}
    for agent_id, remote in remotes.items():
        if remote is None:
            continue
        try:
            found = params(remote.dsn)
        except UnusableDsn:
            continue  # refused with its own message
        place = (remote.name, remote.host, *(found.get(key, "") for key in (
            "host", "hostaddr", "port", "dbname", "service")))
        if place in seen:
            host = (f"host {shown(remote.host)}" if remote.host
                    else "host (the machine's name: no host is set)")
            return (f"{workspace_table(agent_id)[:-1]}.remote]: shared workspace {remote.name} on "
                    f"that server is replicated by {workspace_table(seen[place])} too, under "
                    f"the same {host}: a daemon's two replicas of one shared workspace "
                    "need a host each (or share one workspace between the agents with "
                    "shared_with)")
        seen[place] = agent_id
    return None
