"""The RPC server's counters in a running daemon's status, for the server tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conftest import DaemonHandle


def server_stats(d: DaemonHandle) -> dict[str, Any]:
    return d.call("daemon.status")["queues"]["server"]  # type: ignore[no-any-return]
