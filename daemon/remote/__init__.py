"""Shared workspaces: a workspace replicated through PostgreSQL.

Nothing here is imported unless a workspace's settings name a ``remote``: the daemon
only registers :func:`recalld.daemon.remote.hook.remote_service`, which loads the driver
and :mod:`recalld.daemon.remote.replica` on first use.
"""
