"""Which shared workspace a ``remote`` setting names, and under which host name: the
check at load that no two workspaces of one daemon replicate one shared workspace under
one host (:func:`shared_twice`), and the machine's name taken when ``host`` is not set
(:func:`default_host`).

Nothing here imports the driver or the rest of the daemon: the config module imports
this one; psycopg's DSN parser is imported when a DSN is read (``daemon/dsn.py``).
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import pwd
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
    one shared workspace on one server (:func:`server_of`) under one ``host`` (unset:
    the machine's name, :func:`default_host`). The server holds a replica's host name for
    its session, so the second one would never connect. None: none do."""
    seen: dict[tuple[object, ...], str] = {}
    for agent_id, remote in remotes.items():
        if remote is None:
            continue
        try:
            found = params(remote.dsn)
        except UnusableDsn:
            continue  # refused with its own message
        place = (remote.name, remote.host or default_host(), server_of(found))
        if place in seen:
            host = shown(remote.host or default_host()) + (
                "" if remote.host else " (the machine's name: no host is set)")
            return (f"{workspace_table(agent_id)[:-1]}.remote]: shared workspace {remote.name} on "
                    f"that server is replicated by {workspace_table(seen[place])} too, under "
                    f"the same host {host}: a daemon's two replicas of one shared workspace "
                    "need a host each (or share one workspace between the agents with "
                    "shared_with)")
        seen[place] = agent_id
    return None


def server_of(found: Mapping[str, str], environ: Mapping[str, str] | None = None
              ) -> tuple[object, ...]:
    """The servers (address or socket folder, port: each of a list) and the database or
    service that a DSN's settings (``found``, as libpq parses them) reach, the same
    however the DSN writes them: what it leaves out as libpq takes it (the ``PG...``
    variables of ``environ``, default the process's; port 5432; the database named as
    the user), a URI or keywords, ``hostaddr`` before ``host``, the loopback addresses
    ``localhost`` resolves to as ``localhost``, host names in any case and without a
    final dot, a socket folder without a final slash. Host names are not looked up: two
    names of one machine stay two (the server then refuses the second replica)."""
    env = os.environ if environ is None else environ
    got = {key: found.get(key) or env.get(var, "") for key, var in (
        ("host", "PGHOST"), ("hostaddr", "PGHOSTADDR"), ("port", "PGPORT"),
        ("dbname", "PGDATABASE"), ("user", "PGUSER"), ("service", "PGSERVICE"))}
    hosts, addrs = got["host"].split(","), got["hostaddr"].split(",")
    ports = got["port"].split(",")
    servers = []
    for i in range(max(len(hosts), len(addrs))):
        where = (addrs[i] if i < len(addrs) else "") or (hosts[i] if i < len(hosts) else "")
        port = ports[0] if len(ports) == 1 else ports[i] if i < len(ports) else ""
        servers.append((_server_host(where), int(port) if port.strip().isdigit() else
                        port.strip() or 5432))
    user = got["user"] or _os_user()
    return tuple(servers), got["dbname"] or user, got["service"]


def _server_host(host: str) -> str:
    """One entry of ``host`` or ``hostaddr`` as :func:`server_of` compares it ("": libpq's
    default socket folder)."""
    host = host.strip()
    if host.startswith("/"):
        return posixpath.normpath(host)
    name = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return "localhost" if name == "localhost" else name
    # What "localhost" resolves to; other loopback addresses (127.0.0.2) may be other
    # servers' of the machine.
    return "localhost" if address in _LOCALHOST else address.compressed


_LOCALHOST = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def _os_user() -> str:
    """The name libpq takes for the user a DSN leaves out (the process's own)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
