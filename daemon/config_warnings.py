"""What a configuration the daemon accepts yet should not hold, with the fix.

The daemon still starts on such a file (an older one that worked keeps working), but
``serve --check-config`` prints each warning (``recalld: warning: ...``, exit 0),
``recalld doctor`` shows them as a WARN of the config file, and the start logs them:

* a ``[workspaces.X]`` table whose id looks like a credential (a key pasted as the
  table's name), which ``workspace.open`` refuses for a new workspace: the id names the
  workspace's folder and shows in every log line and status. The id is never shown.
"""

from __future__ import annotations

from recalld.daemon.config import DaemonConfig
from recalld.ipc.agent_ids import workspace_table

#: The redaction rules take no id under 16 characters for a credential: an id shorter
#: than this is not looked at, so a start whose ids are all short (most) does not import
#: them (some 28 ms).
_SHORTEST_KEY = 12


def _looks_like_a_key(agent_id: str) -> bool:
    if len(agent_id) < _SHORTEST_KEY:
        return False
    from recalld.daemon.memory.redact import masked_in

    return masked_in(agent_id)


def config_warnings(cfg: DaemonConfig) -> list[str]:
    """One line per warning, each naming the table and the fix."""
    out = []
    for agent_id in sorted(cfg.workspaces.keys() | cfg.workspace_paths.keys()):
        if _looks_like_a_key(agent_id):
            from recalld.daemon.memory.redact import redact

            out.append(
                f"{cfg.config_path}: {workspace_table(redact(agent_id))}: the agent id looks "
                "like a credential (workspace.open refuses such an id; it names the "
                "workspace's folder and shows in the log and status): rename the table to "
                "another agent id, with path set to the workspace's folder to keep its memory")
    return out
