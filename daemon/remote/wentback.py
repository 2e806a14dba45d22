"""Whether a shared workspace's server went back behind what a replica saw of it (restored
from a backup, a failover to a server that lagged): the replica then starts every host
over with it (``replica.py``). Reads only; runs its calls on the writer connection."""

from __future__ import annotations

from recalld.daemon.remote import db
from recalld.daemon.remote.calls import on_conn
from recalld.daemon.remote.state import Base, ReplicaState


async def server_went_back(state: ReplicaState, conn: db.Conn, workspace_id: int, ident: str
                           ) -> bool:
    """Whether the server of shared workspace ``ident``, the one this replica (its
    ``state``) synced with, is behind what the replica saw of it (a server restored from
    a backup, a failover to a replica that lagged): its last version is below the cursor
    or the newest version the replica agreed on, or the file of that version is not so
    on the server. New changes would get versions the other hosts already read past."""
    if state.ident != ident:
        return False  # another workspace: adopt starts over anyway
    path, base = max(state.bases.items(), key=lambda item: item[1].version,
                     default=("", Base(0, None)))
    last = await on_conn(conn, db.last_version, workspace_id)
    if last < max(state.cursor, base.version):
        return True
    if not base.version:
        return False
    row = await on_conn(conn, db.fetch, workspace_id, path)
    return (row is None or row.version < base.version
            or (row.version == base.version and row.hash != base.hash))
