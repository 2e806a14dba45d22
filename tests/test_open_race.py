"""Agents opening their workspaces at the same moment, one folder inside the other's.

Each open checks its folder against the other workspaces and then registers it; the
check ran before a wait (the daemon-folder check, in a thread) and the registration
after it, so two opens at once each passed their check before the other registered:
an isolated agent's workspace opened inside another's, whose index then took in its
notes. Now exactly one of them opens. Real daemon, real socket, concurrent clients.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import DaemonFactory, DaemonHandle

from recalld.ipc import errors

ROUNDS = 4


def _open_at_once(daemon: DaemonHandle, places: dict[str, Path]) -> dict[str, Any]:
    """Every agent's ``workspace.open`` at its place, all sent at the same moment: the
    answer, or the InvalidParams refusal."""
    answers: dict[str, Any] = {}
    start = threading.Barrier(len(places))

    def open_one(agent: str, path: Path) -> None:
        start.wait()
        try:
            answers[agent] = daemon.call("workspace.open",
                                         {"agent_id": agent, "path": str(path)})
        except errors.InvalidParams as exc:
            answers[agent] = exc

    threads = [threading.Thread(target=open_one, args=item) for item in places.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_nested_folders_opened_at_once_never_both_open(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    daemon = daemon_factory()
    for n in range(ROUNDS):
        outer = tmp_path / f"w{n}"
        # The outer agent's notes folder holds the inner agent's workspace.
        places = {f"outer{n}": outer, f"inner{n}": outer / "memory" / "inner",
                  f"deeper{n}": outer / "memory" / "inner" / "memory" / "deeper"}
        answers = _open_at_once(daemon, places)
        opened = sorted(a for a, answer in answers.items() if isinstance(answer, dict))
        assert len(opened) == 1, (n, opened, answers)
        refused = [answer for answer in answers.values()
                   if isinstance(answer, errors.InvalidParams)]
        assert len(refused) == len(places) - 1
        assert all("workspace of agent" in e.message for e in refused), refused
        daemon.call("workspace.close", {"agent_id": opened[0], "forget": True})
