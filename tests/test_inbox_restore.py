"""Inbox ids after the inbox went back: a backup restored over a workspace whose inbox
had grown since. A real daemon, resource files interpreted by the scripted chat model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, write
from test_resource import open_ws, wait_state
from waits import wait_for, workspace_status


def items(daemon: DaemonHandle, **params: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = daemon.call("inbox.list", {"agent_id": "res", **params})[
        "items"]
    return found


def test_an_item_after_a_restore_is_after_the_cursor_a_client_kept(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A client reads with since=<the last id it saw> and acks what it read. After the
    # restore the inbox is the backup's; the next item must still come after that
    # cursor, and the client's ack of an item the restore took away must not hit it.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/alpha.txt", "Alpha: the first report.\n")
    open_ws(daemon, "res", root, fake)
    first = wait_for(lambda: [i["id"] for i in items(daemon)])
    backup = daemon.call("backup.create", {})["file"]
    write(root, "resource/beta.txt", "Beta: the second report.\n")
    wait_for(lambda: len(items(daemon)) == 2)
    cursor = items(daemon)[-1]["id"]
    daemon.call("backup.restore", {"file": backup}, timeout=60)
    wait_for(lambda: (workspace_status(daemon, "res") or {}).get("state") == "ready")
    assert [i["id"] for i in items(daemon)] == first
    write(root, "resource/gamma.txt", "Gamma: the third report.\n")
    wait_state(root, "resource/gamma.txt", "processed")
    gamma = wait_for(lambda: [i for i in items(daemon) if any(
        "gamma" in path for path in i["changes"])])
    assert items(daemon, since=cursor) == gamma
    acked = daemon.call("inbox.ack", {"agent_id": "res", "ids": [cursor]})
    assert acked["unknown"] == [cursor] and items(daemon, since=cursor) == gamma
