"""A real daemon and a note its owner made unreadable (`chmod 000`): it counts as no note,
so it leaves the index, and nothing says the index is behind the disk (status, verify)
while it stays so; once readable again, it is indexed again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hooks import start_hook
from test_watcher_roots import _reads_everything
from waits import wait_value, workspace_status

OPEN = "memory/2026-07-01/open.md"
LOCKED = "memory/2026-07-01/locked.md"


#: Start hook: the daemon (root here, which reads everything) without the capabilities
#: that read a file of mode 000 (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), as ``setpriv
#: --bounding-set=-dac_override,-dac_read_search --inh-caps=...`` starts it: gone from its
#: bounding set (so from the processes it starts) and from its own sets.
DROP_READ_EVERYTHING = "\n".join([
    "import ctypes",
    "libc = ctypes.CDLL(None, use_errno=True)",
    "for cap in (1, 2):",
    "    if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP",
    "        raise OSError(ctypes.get_errno(), 'PR_CAPBSET_DROP')",
    "header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3",
    "sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice",
    "if libc.capget(header, sets) != 0:",
    "    raise OSError(ctypes.get_errno(), 'capget')",
    "for i in range(3):",
    "    sets[i] &= ~0b110",
    "if libc.capset(header, sets) != 0:",
    "    raise OSError(ctypes.get_errno(), 'capset')"])


def _paths(d: Any, query: str) -> list[str]:
    hits = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": 10,
                                    "sync": True}, timeout=60.0)["results"]
    return sorted(h["path"] for h in hits)


@pytest.mark.timeout(120)
def test_a_note_made_unreadable_leaves_the_index_and_nothing_waits_for_it(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / OPEN).parent.mkdir(parents=True)
    (root / OPEN).write_text("# Open\n\nthe heron nests by the lake\n", encoding="utf-8")
    (root / LOCKED).write_text("# Locked\n\nthe heron keeps a secret\n", encoding="utf-8")
    hook = start_hook(tmp_path, DROP_READ_EVERYTHING) if _reads_everything() else {}
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n', **hook)
    assert _paths(d, "heron") == [LOCKED, OPEN]
    (root / LOCKED).chmod(0)
    try:
        assert _paths(d, "heron") == [OPEN]
        # Every scan passes it by as the read does: verify finds nothing to catch up on,
        # and health (which verify has scan again) is clean, not pending for ever.
        before = time.time()
        verify = d.call("index.verify", {"agent_id": "w"}, timeout=60.0)
        assert verify["ok"] is True and verify["files_on_disk"] == 1, verify
        health = wait_value(lambda: (workspace_status(d, "w") or {})["health"],
                            lambda h: (h["scanned_at"] or 0) >= before, "a health scan")
        assert health["state"] == "clean", health
    finally:
        (root / LOCKED).chmod(0o644)
    # Readable again (the chmod is an event): indexed again.
    assert _paths(d, "heron") == [LOCKED, OPEN]
    verify = d.call("index.verify", {"agent_id": "w"}, timeout=60.0)
    assert verify["ok"] is True and verify["files_on_disk"] == 2, verify
