"""The daemon's method table: every handler module of the RPC layer, merged.

The daemon's own methods (ping, status, workspaces, ...) are imported with the daemon;
every other handler module is imported on the first call of one of its methods
(:meth:`Methods.defer`), so a daemon that only searches never imports the handlers of
capture, dream, jobs, backups or the agent tools, nor what they import. The names of each
module's methods are listed here (``tests/test_rpc_methods.py`` checks them against the
modules).
"""

from __future__ import annotations

from collections.abc import Iterable

from recalld.daemon.rpc import daemon_methods
from recalld.daemon.rpc.dispatch import Methods

_PACKAGE = "recalld.daemon.rpc"

#: ``(module, table, method names)`` of each handler module imported on first use;
#: ``table`` is the module's :class:`Methods` or a function returning one.
DEFERRED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("search_methods", "METHODS", ("index.sync", "memory.search")),
    ("agent_methods", "METHODS", (
        "memory.add_note", "memory.index", "memory.interests", "memory.list",
        "memory.recall", "memory.select", "memory.topic_edit", "memory.topic_write")),
    ("job_methods", "METHODS", ("jobs.cancel", "jobs.get", "jobs.list", "jobs.submit")),
    ("ops_methods", "ops_methods", (
        "backup.create", "backup.list", "backup.restore", "backup.rollback",
        "backup.verify")),
    ("upkeep_methods", "METHODS", (
        "daemon.metrics", "index.compact", "index.verify", "remote.forget",
        "remote.release")),
    ("memory_methods", "METHODS", (
        "inbox.ack", "inbox.list", "memory.add_turns", "memory.changes")),
    ("dream_methods", "METHODS", ("dream.runs", "dream.undo")),
)


def build_methods(extra: Iterable[Methods] = ()) -> Methods:
    """The daemon's own methods (ping, status, workspaces, ...) plus ``extra`` tables."""
    methods = Methods().include(daemon_methods.METHODS)
    for more in extra:
        methods.include(more)
    return methods


def all_methods() -> Methods:
    """Every method the daemon serves, the handler modules imported on first use."""
    methods = build_methods()
    for module, table, names in DEFERRED:
        methods.defer(f"{_PACKAGE}.{module}", table, names)
    return methods
