"""The daemon's method table: every handler module of the RPC layer, merged."""

from __future__ import annotations

from collections.abc import Iterable

from recalld.daemon.rpc import (
    agent_methods,
    daemon_methods,
    dream_methods,
    job_methods,
    memory_methods,
    ops_methods,
    search_methods,
)
from recalld.daemon.rpc.dispatch import Methods


def build_methods(extra: Iterable[Methods] = ()) -> Methods:
    """The daemon's own methods (ping, status, workspaces, ...) plus ``extra`` tables."""
    methods = Methods().include(daemon_methods.METHODS)
    for more in extra:
        methods.include(more)
    return methods


def all_methods() -> Methods:
    """Every method the daemon serves."""
    return build_methods([
        search_methods.METHODS, agent_methods.METHODS, job_methods.METHODS,
        ops_methods.ops_methods(), memory_methods.METHODS, dream_methods.METHODS,
    ])
