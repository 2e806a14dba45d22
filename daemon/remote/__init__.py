"""Shared workspaces: a workspace replicated through PostgreSQL.

Nothing that needs the driver is imported unless a workspace's settings name a
``remote``: the daemon's workspace records hold a
:class:`recalld.daemon.remote.hook.RemoteService`, which loads
:mod:`recalld.daemon.remote.replica` (and psycopg) only for such a workspace.
"""
