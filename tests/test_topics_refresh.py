"""``MEMORY.md`` follows the topic files without reading every digest note at each change:
the refresh reads a note again only when the index's digest of it changed (or it was
just written), and lists what a walk of the folder would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
import trio.testing

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.memory import topics
from recalld.daemon.memory.topics import MemoryFile
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import InvalidParams


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


_READ_TOPIC = topics.read_topic  # the test counts the daemon's reads: not this one's


def topic_entries(root: Path, digest: str) -> list[topics.TopicEntry]:
    """What a walk of the digest folder finds (folders and files sorted, a folder's files
    first, links skipped): what MEMORY.md must list."""
    out: list[topics.TopicEntry] = []
    for folder, dirs, files in os.walk(root / digest):
        dirs[:] = sorted(d for d in dirs if not (Path(folder) / d).is_symlink())
        for name in sorted(files):
            rel = (Path(folder) / name).relative_to(root).as_posix()
            if name.endswith(".md") and rel != f"{digest}/{topics.INDEX_FILE}":
                entry, _ = _READ_TOPIC(root, rel)
                if entry is not None:
                    out.append(entry)
    return out[:topics.MAX_TOPICS]


def _topic(name: str, type_: str = "project") -> str:
    return f"---\nname: {name}\ndescription: about {name}\ntype: {type_}\n---\nBody of {name}.\n"


async def test_a_refresh_reads_only_the_digest_notes_that_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    # Topic files and plain notes, at the top of the digest folder and in subfolders
    # (a folder's files come before its subfolders' in MEMORY.md, as a walk lists them).
    for i in range(12):
        _write(root, f"digest/wiki/n{i:02d}.md", f"# Note {i}\n\nplain words\n")
    _write(root, "digest/zeta.md", _topic("Zeta"))
    _write(root, "digest/personal/me.md", _topic("Me", "user"))
    _write(root, "digest/personal/deep/more.md", _topic("More", "reference"))
    _write(root, "digest/wiki/b-topic.md", _topic("B topic", "feedback"))
    _write(root, "digest/a/b.md", _topic("A B"))  # after zeta.md, though sorted before it
    _write(root, "memory/2026-07-01/day.md", "# Day\n\nnot a digest note\n")
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    ws = Workspace("w", root, WorkspaceSettings())
    index = WorkspaceIndex(ws, cfg, cpu=trio.CapacityLimiter(2),
                           watcher_config=WatcherConfig(reconcile_interval_s=3600.0))
    reads: list[str] = []
    real = topics.read_topic

    def read_topic(at: Path, rel: str) -> tuple[topics.TopicEntry | None,
                                                 tuple[int, int] | None]:
        reads.append(rel)
        return real(at, rel)

    memory = MemoryFile(ws, index)
    memory_md = root / "digest" / topics.INDEX_FILE
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await index.sync()
        monkeypatch.setattr(topics, "read_topic", read_topic)
        assert await memory.refresh()
        assert len(reads) == 17  # every digest note once; not the daily note
        walked = topic_entries(root, "digest")
        assert [e["path"] for e in walked] == [
            "digest/zeta.md", "digest/a/b.md", "digest/personal/me.md",
            "digest/personal/deep/more.md", "digest/wiki/b-topic.md"]
        assert memory_md.read_text(encoding="utf-8") == topics.render_memory_md(
            walked, "digest")
        # An edit of one note, a new topic file, a removed one: only those are read.
        reads.clear()
        _write(root, "digest/wiki/n03.md", _topic("Now a topic"))
        _write(root, "digest/personal/new.md", _topic("New", "user"))
        (root / "digest/zeta.md").unlink()
        await index.sync()
        assert await memory.refresh()
        assert sorted(reads) == ["digest/personal/new.md", "digest/wiki/n03.md"]
        walked = topic_entries(root, "digest")
        assert memory_md.read_text(encoding="utf-8") == topics.render_memory_md(
            walked, "digest")
        reads.clear()
        assert not await memory.refresh() and reads == []  # nothing changed
        assert await memory.entries() == walked and reads == []  # memory.select's
        # A topic file written just now, before the index applied it, is listed at once.
        _write(root, "digest/wiki/fresh.md", _topic("Fresh"))
        assert await memory.refresh(touched=["digest/wiki/fresh.md"])
        assert reads == ["digest/wiki/fresh.md"]
        assert "Fresh" in memory_md.read_text(encoding="utf-8")
        assert memory_md.read_text(encoding="utf-8") == topics.render_memory_md(
            topic_entries(root, "digest"), "digest")
        # A note changed and changed back before the index saw it, read meanwhile (as
        # a start's first refresh reads every note): not listed as it was meanwhile, since
        # what was read did not match what the index held, so it is read again.
        await index.sync()
        starting = MemoryFile(ws, index)
        _write(root, "digest/wiki/n05.md", _topic("Briefly a topic with a longer name"))
        assert await starting.refresh()
        assert "Briefly" in memory_md.read_text(encoding="utf-8")
        _write(root, "digest/wiki/n05.md", "# Note 5\n\nplain words\n")
        await index.sync()
        assert await starting.refresh()
        assert "Briefly" not in memory_md.read_text(encoding="utf-8")
        # At most MAX_TOPICS, the first in the walk's order.
        monkeypatch.setattr(topics, "MAX_TOPICS", 2)
        assert await memory.refresh()
        assert memory_md.read_text(encoding="utf-8") == topics.render_memory_md(
            topic_entries(root, "digest"), "digest")
        assert "A B" in memory_md.read_text(encoding="utf-8")
        nursery.cancel_scope.cancel()



async def test_a_warm_start_reads_the_topic_files_once_after_its_startup_reconcile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # At a warm start the index holds the notes as they were before the stop until its
    # startup reconcile, which waits for the daemon's start to let background work go.
    # MEMORY.md's first refresh waits for that reconcile: it neither reads the topic
    # files beside the first answers nor lists what changed while the daemon was down
    # as it was.
    root = tmp_path / "ws"
    for i in range(4):
        _write(root, f"digest/wiki/n{i}.md", _topic(f"Topic {i}"))
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    ws = Workspace("w", root, WorkspaceSettings())
    watching = WatcherConfig(reconcile_interval_s=3600.0)
    memory_md = root / "digest" / topics.INDEX_FILE
    async with trio.open_nursery() as nursery:
        index = WorkspaceIndex(ws, cfg, cpu=trio.CapacityLimiter(2), watcher_config=watching)
        await nursery.start(index.run)
        await index.sync()
        nursery.cancel_scope.cancel()  # the index commits as it closes
    assert index.state.files
    # While the daemon is down: a topic renamed, one added, one no longer a topic.
    _write(root, "digest/wiki/n1.md", _topic("Renamed while down"))
    _write(root, "digest/wiki/new.md", _topic("Added while down"))
    _write(root, "digest/wiki/n2.md", "# Plain now\n")
    reads: list[str] = []

    def read_topic(at: Path, rel: str) -> tuple[topics.TopicEntry | None,
                                                 tuple[int, int] | None]:
        reads.append(rel)
        return _READ_TOPIC(at, rel)

    monkeypatch.setattr(topics, "read_topic", read_topic)
    released = trio.Event()
    async with trio.open_nursery() as nursery:
        # As the daemon's start holds it: the startup reconcile comes after the hold.
        index = WorkspaceIndex(ws, cfg, cpu=trio.CapacityLimiter(2), hold=released.wait)
        memory = MemoryFile(ws, index)
        await nursery.start(index.run)  # loaded: it serves searches
        await nursery.start(memory.run)
        await trio.testing.wait_all_tasks_blocked()
        async with memory._lock:  # a refresh begun meanwhile (it holds the lock) ended
            assert reads == []
            assert not memory_md.exists()
        released.set()
        await index.sync()
        await trio.testing.wait_all_tasks_blocked()
        # The refresh (under way or done: it holds the lock entries() takes) read each
        # note of the digest folder once, as the reconcile left them.
        assert await memory.entries() == topic_entries(root, "digest")
        assert sorted(reads) == [f"digest/wiki/{n}.md"
                                 for n in ("n0", "n1", "n2", "n3", "new")]
        text = memory_md.read_text(encoding="utf-8")
        assert "Renamed while down" in text and "Added while down" in text
        assert "Topic 2" not in text and "Topic 1" not in text
        nursery.cancel_scope.cancel()


def test_a_topic_file_is_not_hidden_where_the_index_would_pass_it_by() -> None:
    for path in (".draft.md", "digest/.drafts/x.md", "sub/.x.md", "mem_metadata/x.md"):
        with pytest.raises(InvalidParams, match="hidden"):
            topics.topic_path("digest", path)
    assert topics.topic_path("digest", "sub/x.md") == "digest/sub/x.md"
