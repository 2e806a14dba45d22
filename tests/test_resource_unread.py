"""Resource files that are there but are not read (not a regular file, a link), files of
every suffix a text format is saved with, and a file deleted while its note is written:
a real daemon and the scripted chat model (see test_resource.py), and one catalog driven
in this process."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, chat_config, fake, write
from test_resource import catalog, open_ws, wait_state
from waits import workspace_status

from recalld.daemon.config import ChatModelConfig
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.memory import resource
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat import ChatClient
from recalld.daemon.workspaces import Workspace, WorkspaceSettings

__all__ = ["fake"]  # the fixture, shared with test_dream


def chat_calls(fake: FakeProvider) -> int:
    return sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))


def test_a_file_that_cannot_be_read_is_skipped_with_why_not_removed(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A processed file replaced by a FIFO, or by a link, is there but not read: skipped
    with the reason (listed in status), its note not marked as of a removed file; back
    with the bytes its note was written from, it is processed again without the model."""
    root = tmp_path / "ws"
    ScriptedModel(fake)
    plan = "resource/plan.txt"
    write(root, plan, "Launch on May 3.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, plan, "processed")
    note = root / catalog(root)[plan]["note"]
    written = note.read_text()
    calls = chat_calls(fake)
    for swap, why in ((lambda p: os.mkfifo(p), "not a regular file"),
                      (lambda p: p.symlink_to(root / "elsewhere.txt"), "symbolic link")):
        (root / plan).unlink()
        swap(root / plan)
        wait_state(root, plan, "skipped")
        entry = catalog(root)[plan]
        assert why in entry["reason"] and entry["note"] == str(note.relative_to(root))
        skipped = workspace_status(daemon, "res")["resource"]["skipped"]  # type: ignore[index]
        assert {"path": plan, "reason": entry["reason"]} in skipped, skipped
        (root / plan).unlink()
        write(root, plan, "Launch on May 3.\n")
        wait_state(root, plan, "processed")
        assert note.read_text() == written
        assert "source_removed" not in parse_frontmatter(note.read_text())[0]
    assert chat_calls(fake) == calls


def test_every_suffix_of_a_text_format_is_read(daemon: DaemonHandle, fake: FakeProvider,
                                               tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    files = {"resource/conf.yml": "port: 8080\n", "resource/conf.yaml": "port: 8081\n",
             "resource/page.htm": "<p>Hello</p>\n", "resource/read.markdown": "# Read\n",
             "resource/UPPER.YML": "host: a\n"}
    for rel, text in files.items():
        write(root, rel, text)
    open_ws(daemon, "res", root, fake)
    for rel in files:
        wait_state(root, rel, "processed", "skipped", "failed")
        assert catalog(root)[rel]["state"] == "processed", catalog(root)[rel]


@pytest.fixture
async def bridge(nursery: trio.Nursery) -> ProviderBridge:
    b = ProviderBridge()
    await nursery.start(b.run)
    return b


async def test_a_file_deleted_while_its_note_is_written_gets_its_note_marked(
        fake: FakeProvider, bridge: ProviderBridge, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher catalogs the deletion while the job writes the file's note: the file
    ends removed with its note marked, not processed with a note of a file that is gone."""
    ScriptedModel(fake)
    rel = "resource/brief.txt"
    write(tmp_path, rel, "Budget: 10k.\n")
    ws = Workspace("w", tmp_path, WorkspaceSettings())

    pushed: list[list[str]] = []

    async def indexed() -> None:  # no index here: the note is written, nothing to wait for
        return None

    async def push(kind: str, summary: str, changes: list[str], **_: Any) -> None:
        pushed.append(changes)

    ws.provide(cast(Any, SimpleNamespace(
        write_lock=trio.Lock(), index=SimpleNamespace(sync=indexed),
        inbox=SimpleNamespace(is_open=True, push=push))))
    cat = resource.ResourceCatalog(ws)
    await cat.apply_paths({rel})
    real_write = resource.write_note

    async def deleted_meanwhile(*args: Any, **kwargs: Any) -> str:
        (tmp_path / rel).unlink()
        await cat.apply_paths({rel})  # what the watcher does on the deletion's event
        return await real_write(*args, **kwargs)

    monkeypatch.setattr(resource, "write_note", deleted_meanwhile)
    config = chat_config(fake)
    chat = ChatClient(ChatModelConfig(base_url=config["base_url"], model_name="m"), bridge,
                      environ={})
    result = await cat.process(chat)
    entry = cat.records[rel]
    assert entry["state"] == "removed" and entry.get("marked"), (entry, result)
    note = tmp_path / str(entry["note"])
    assert parse_frontmatter(note.read_text())[0].get("source_removed"), note.read_text()
    assert result["notes"] == [entry["note"]] and pushed == [[entry["note"]]]
