"""What a caller sent comes back masked where the daemon keeps it masked: the ``query``
of ``memory.recall`` and ``memory.select`` (the index and the chat model see it so), and
a path named in an error of ``memory.read`` (search and status show such a note's path
masked), from a real daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recalld.ipc.errors import InvalidParams, NotFound

TOKEN = "ghp_" + "Qz8Lm2Rt5Vx9Bn3Kc7Hw1Jd4Fg6Ps0Ya2Ue5"
PASSWORD = "Tr0ub4dor&3"


def test_queries_and_paths_sent_back_are_masked(daemon_factory: Any) -> None:
    d = daemon_factory()
    ws = Path(d.call("workspace.open", {"agent_id": "coder"})["path"])
    d.call("memory.add_note", {"agent_id": "coder", "content": "the heron fishes at dawn"})
    asked = f"where does the heron fish? my token is {TOKEN} and the password is {PASSWORD}"
    for params in ({"query": asked},
                   {"messages": [{"role": "user", "content": [{"type": "text",
                                                                 "text": asked}]}]}):
        got = d.call("memory.recall", {"agent_id": "coder", **params})
        assert TOKEN not in got["query"] and PASSWORD not in got["query"], got["query"]
        assert got["query"].startswith("where does the heron fish?")
        assert "[REDACTED]" in got["query"]
        assert got["items"] and "heron" in got["items"][0]["text"]
    chosen = d.call("memory.select", {"agent_id": "coder", "query": asked})
    assert TOKEN not in chosen["query"] and PASSWORD not in chosen["query"], chosen

    for path in (f"memory/{TOKEN}.md", f"memory/{TOKEN}/note.md", f"pw={PASSWORD}.md"):
        with pytest.raises(NotFound) as missing:
            d.call("memory.read", {"agent_id": "coder", "path": path})
        assert TOKEN not in str(missing.value) and PASSWORD not in str(missing.value)
        assert "[REDACTED]" in str(missing.value)
    (ws / "memory" / TOKEN).mkdir(parents=True)
    with pytest.raises(InvalidParams, match="not a regular file") as folder:
        d.call("memory.read", {"agent_id": "coder", "path": f"memory/{TOKEN}"})
    assert TOKEN not in str(folder.value)
    with pytest.raises(NotFound, match=r"memory/plain-name\.md"):  # other names stay named
        d.call("memory.read", {"agent_id": "coder", "path": "memory/plain-name.md"})
