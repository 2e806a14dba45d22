"""Assembly: the daemon's services, its method table and the supervisor that runs them.

The services are composed in :mod:`recalld.daemon.services` (typed records, in start
order); the methods come from the RPC layer (:mod:`recalld.daemon.rpc.methods`).
"""

from __future__ import annotations

from recalld.daemon.config import DaemonConfig
from recalld.daemon.rpc.methods import all_methods
from recalld.daemon.services import build_daemon_services
from recalld.daemon.supervisor import Reloader, Supervisor
from recalld.daemon.systemd import SystemdEnvironment


def build_supervisor(
    cfg: DaemonConfig,
    *,
    systemd: SystemdEnvironment | None = None,
    reload: Reloader | None = None,
) -> Supervisor:
    """The daemon, ready for ``trio.run(supervisor.run)``."""
    return Supervisor(build_daemon_services(cfg), all_methods(), systemd=systemd,
                      reload=reload)
