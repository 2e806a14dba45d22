"""The client's answer types (``recalld.ipc.answers``) against what the daemon sends.

Three checks: the daemon builds these answers with the client's TypedDicts, not copies of
them; the client unwraps each list answer by the key the daemon puts it under; and
a real daemon's answers carry every required key of their type and no key the type does
not declare.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import DaemonHandle
from waits import wait_job

from recalld.daemon import workspaces as daemon_workspaces
from recalld.daemon.index import search as daemon_search
from recalld.daemon.memory import capture_log, changelog, selection, topics
from recalld.daemon.memory import inbox as daemon_inbox
from recalld.daemon.memory import recall as daemon_recall
from recalld.daemon.memory.inbox import Inbox
from recalld.daemon.rpc import (
    agent_methods,
    daemon_methods,
    dream_methods,
    job_methods,
    memory_methods,
)
from recalld.ipc import _call, _methods, answers
from recalld.ipc.client import Client
from recalld.ipc.types import SearchResponse, SearchResult


def _optional(annotation: object) -> bool:
    text = (annotation.__forward_arg__ if isinstance(annotation, typing.ForwardRef)
            else repr(annotation))
    return text.startswith(("NotRequired[", "typing.NotRequired["))


def keys(shape: type) -> tuple[frozenset[str], frozenset[str]]:
    """``(required, optional)`` keys of a TypedDict, read from its annotations (with
    postponed annotations, Python 3.11's ``__optional_keys__`` misses ``NotRequired``)."""
    hints: dict[str, object] = shape.__annotations__
    optional = frozenset(k for k, v in hints.items() if _optional(v))
    return frozenset(hints) - optional, optional


def check(answer: Mapping[str, Any], shape: type) -> None:
    """``answer`` has every required key of ``shape`` and only keys it declares."""
    required, optional = keys(shape)
    assert required <= answer.keys(), (shape.__name__, sorted(required - answer.keys()))
    extra = answer.keys() - required - optional
    assert not extra, (shape.__name__, sorted(extra))


# ------------------------------------------------------------ one declaration each

SAME_SHAPES = [
    (answers.Recall, daemon_recall.Recall),
    (answers.RecallItem, daemon_recall.RecallItem),
    (answers.Selected, selection.Selected),
    (answers.TopicEntry, topics.TopicEntry),
    (answers.InboxItem, daemon_inbox.InboxItem),
]


@pytest.mark.parametrize(("client", "daemon"), SAME_SHAPES,
                         ids=[c.__name__ for c, _ in SAME_SHAPES])
def test_the_daemon_builds_answers_with_the_client_types(client: type, daemon: type) -> None:
    assert daemon is client, f"{daemon.__module__}.{daemon.__name__} is a second copy"


@pytest.mark.parametrize(("client", "daemon"), [(SearchResult, daemon_search.SearchHit),
                                                (SearchResponse, daemon_search.SearchAnswer)])
def test_search_values_read_keys_the_daemon_sends(client: type, daemon: type) -> None:
    # Every other key of a hit or an answer is kept in ``extra``.
    fields = {f.name for f in dataclasses.fields(client)}
    assert fields - {"extra"} <= set(daemon.__annotations__)


def test_every_service_status_has_its_key_in_workspace_info() -> None:
    # A workspace's services report under the names of ``StatusName``; each is an open
    # section of the client's WorkspaceInfo, and every open section but the settings is
    # one of them.
    hints = typing.get_type_hints(answers.WorkspaceInfo, include_extras=True)
    sections = {k for k, v in hints.items()
                if typing.get_origin(v) is typing.NotRequired
                and typing.get_args(v) == (answers.JsonObject,)} - {"settings"}
    assert "settings" in hints and len(sections) > 5  # the annotations were read
    assert set(typing.get_args(daemon_workspaces.StatusName)) == sections


def test_the_keys_read_from_annotations_see_not_required() -> None:
    assert keys(answers.TurnsAdded)[1] == {"job_id"}
    assert "import" in keys(answers.WorkspaceOpened)[1]
    assert {"agent_id", "path", "state"} == keys(answers.WorkspaceOpened)[0]


# The list answers: the client's method and the daemon's TypedDict of the wrapper.
LISTS: list[tuple[Callable[..., _call.Call[Any]], tuple[str, ...], type]] = [
    (_methods.workspace_list, (), daemon_methods.WorkspaceList),
    (_methods.jobs_list, ("a",), job_methods.JobList),
    (_methods.memory_list, ("a",), agent_methods.FileList),
    (_methods.inbox_list, ("a",), memory_methods.InboxItems),
    (_methods.dream_runs, ("a",), dream_methods.DreamRuns),
    (_methods.memory_changes, ("a",), memory_methods.Changes),
]


@pytest.mark.parametrize(("builder", "args", "wrapper"), LISTS,
                         ids=[b.__name__ for b, _, _ in LISTS])
def test_list_answers_are_unwrapped_by_the_daemons_key(
        builder: Callable[..., _call.Call[Any]], args: tuple[str, ...],
        wrapper: type) -> None:
    (key,) = [k for k, v in wrapper.__annotations__.items()
              if (v.__forward_arg__ if isinstance(v, typing.ForwardRef) else str(v))
              .startswith("list[")]
    item = {"x": 1}
    assert builder(*args).parse({**dict.fromkeys(wrapper.__annotations__), key: [item]}) == [
        item]


# ------------------------------------------------------------------ a real daemon


def _dream_run(root: Path, metadata_dir: str) -> str:
    """A recorded dream run that changed nothing (so undoing it restores nothing)."""
    now = datetime.now(UTC)
    run = changelog.RunLog(run_id=changelog.new_run_id(now), started=now.isoformat(),
                           trigger="manual", notes=["memory/2026-01-01/a.md"],
                           finished=now.isoformat())
    changelog.write_run(changelog.runs_dir(root, metadata_dir), run)
    return run.run_id


def _capture_run(root: Path, metadata_dir: str) -> None:
    """An auto_memory change record, as the capture job writes it."""
    now = datetime.now(UTC)
    run_id = changelog.new_run_id(now)
    changelog.write_record(changelog.runs_dir(root, metadata_dir, capture_log.KIND), run_id,
                           {"version": 1, "kind": capture_log.KIND, "run_id": run_id,
                            "started": now.isoformat(), "outcome": "changed",
                            "agent_id": "w", "session_id": "s1", "trigger": "flush",
                            "note": "memory/2026-01-01/s1.md", "added": ["a fact"],
                            "refused": [], "files": {}}, "# run\n")


def test_a_daemons_answers_match_their_types(daemon: DaemonHandle, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory" / "2026-01-01").mkdir(parents=True)
    (root / "memory" / "2026-01-01" / "a.md").write_text(
        "# Trip\n\nThe blue bicycle is parked at the station.\n", encoding="utf-8")
    with Client(daemon.socket_path, timeout_s=60) as c:
        check(c.ping(), answers.Pong)
        opened = c.workspace_open("w", path=str(root))
        check(opened, answers.WorkspaceOpened)
        check(c.index_sync("w"), answers.Synced)
        status = c.status()
        check(status, answers.DaemonStatus)
        for ws in status["workspaces"]:
            check(ws, answers.WorkspaceInfo)
        listed = c.workspace_list()
        assert listed
        for ws in listed:
            check(ws, answers.WorkspaceInfo)
        check(c.read("w", "memory/2026-01-01/a.md"), answers.ReadResult)
        check(c.subscribe(["job.*"], "w"), answers.Subscribed)

        note = c.add_note("w", "The spare key is under the blue pot.")
        check(note, answers.NoteAdded)
        written = c.topic_write("w", "digest/bike.md", "Bike", "where the bike is", "user",
                                "The blue bicycle.")
        check(written, answers.TopicWritten)
        check(c.topic_edit("w", written["path"], "blue", "red"), answers.TopicWritten)
        index = c.memory_index("w")
        check(index, answers.MemoryIndex)
        assert index["entries"]
        for entry in index["entries"]:
            check(entry, answers.IndexEntry)
        files = c.memory_list("w")
        assert files
        for f in files:
            check(f, answers.FileEntry)
        recalled = c.recall("w", "bicycle")
        check(recalled, answers.Recall)
        assert recalled["items"]
        for item in recalled["items"]:
            check(item, answers.RecallItem)
        selected = c.select("w", "bicycle")
        check(selected, answers.Selected)
        for topic in selected["files"]:
            check(topic, answers.TopicEntry)
        check(c.interests("w"), answers.Interests)

        turns = c.add_turns("w", "s1", [{"role": "user", "content": "hello"}])
        check(turns, answers.TurnsAdded)
        check(c.inbox_ack("w", ["0000000099"]), answers.InboxAcked)

        submitted = c.jobs_submit("w", "reindex")
        check(submitted, answers.JobSubmitted)
        wait_job(daemon, submitted["job_id"])
        check(c.jobs_get("w", submitted["job_id"]), answers.JobInfo)
        for job in c.jobs_list("w"):
            check(job, answers.JobInfo)
            check(job["progress"], answers.JobProgress)
        check(c.jobs_cancel("w", submitted["job_id"]), answers.JobInfo)

        metadata_dir = str(opened["settings"]["metadata_dir"])
        run_id = _dream_run(root, metadata_dir)
        _capture_run(root, metadata_dir)
        runs = c.dream_runs("w")
        assert [r["run_id"] for r in runs] == [run_id]
        for run in runs:
            check(run, answers.DreamRun)
        changes = c.memory_changes("w")
        assert {ch["kind"] for ch in changes} == {"auto_memory", "auto_dream"}
        for change in changes:
            check(change, answers.ChangeRecord)
        check(c.dream_undo("w", run_id), answers.DreamUndone)

        made = c.backup_create(["w"], str(tmp_path / "w.zip"))
        check(made, answers.BackupSummary)
        assert "size" in made
        verified = c.backup_verify(made["file"])
        check(verified, answers.BackupSummary)
        assert verified.get("ok") is True
        check(c.backup_list(), answers.BackupList)
        compacted = c.index_compact("w")
        check(compacted, answers.IndexCompacted)
        metrics = c.metrics()
        check(metrics, answers.Metrics)
        for family in metrics["families"]:
            check(family, answers.MetricFamily)
        check(c.workspace_close("w"), answers.WorkspaceClosed)


async def test_inbox_items_match_their_type(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.jsonl", "w")
    async with trio.open_nursery() as nursery:
        await nursery.start(inbox.run)
        await inbox.push("auto_memory", "one fact", ["memory/2026-01-01/a.md"], job_id="j1",
                         details={"added": 1})
        items = inbox.list()
        nursery.cancel_scope.cancel()
    assert len(items) == 1
    check(items[0], answers.InboxItem)
