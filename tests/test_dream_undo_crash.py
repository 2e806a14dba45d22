"""A dream undo killed (SIGKILL) at any of its writes is never left half done: killed
before it is decided, nothing changed and it can be asked again; after, the next undo of
the run, a listing of the runs or the next dream finishes it (its files, its change log
and the dream catalog), and the next dream reads the run's notes again."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, chat_config, dream, open_ws, run_job, write

from recalld.daemon.memory import changelog, dreamundo
from recalld.daemon.memory.catalog import load_catalog
from recalld.daemon.memory.changelog import DamagedRecord
from recalld.ipc.errors import InvalidParams, NotAllowed

CAT = "digest/personal/cat.md"
NOTE, OTHER = "memory/2026-05-02/tortoise.md", "memory/2026-05-03/bins.md"
CATALOG = "mem_metadata/catalog/dream.jsonl.zst"
RUNS = "mem_metadata/dream/runs"

# Undoes a run in a workspace, killing itself (SIGKILL) just before its k-th replace or
# unlink: each file it publishes or removes.
KILLED_UNDO = """
import os, signal, sys
from pathlib import Path
from recalld.daemon.memory import dreamundo
from recalld.daemon.store import fsio

root, run_id, k = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
calls = 0

def killing(op):
    def at(self, *args):
        global calls
        calls += 1
        if calls == k:
            os.kill(os.getpid(), signal.SIGKILL)
        return op(self, *args)
    return at

fsio.FS.replace = killing(fsio.FS.replace)
fsio.FS.unlink = killing(fsio.FS.unlink)
dreamundo.undo_run(root, root / "mem_metadata/dream/runs", run_id, digest_dir="digest",
                   now="2026-05-04T00:00:00+00:00",
                   catalog=root / "mem_metadata/catalog/dream.jsonl.zst",
                   derived=frozenset({"digest/interests.yaml"}))
"""


def killed_undo(root: Path, run_id: str, k: int) -> int:
    return subprocess.run([sys.executable, "-c", KILLED_UNDO, str(root), run_id, str(k)],
                          check=False, timeout=60).returncode


def open_copy(daemon: DaemonHandle, root: Path, agent: str, fake: FakeProvider) -> None:
    daemon.call("workspace.open", {"agent_id": agent, "path": str(root), "config": {
        "dream_cron_enabled": False, "chat_model_config": chat_config(fake)}})


def test_an_undo_killed_at_any_write_is_finished_and_the_notes_dreamed_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Killed between the record marked undone and the catalog put back, the notes were
    # never dreamed again, and the undo could not be asked again ("already undone").
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    write(root, NOTE, "The tortoise, Gus, hibernates in the fridge from November.\n")
    model.plan[NOTE] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                        "name": "Cat", "content": "- Gus hibernates",
                                        "reason": "fact"})]]
    open_ws(daemon, root, fake)
    first = dream(daemon)
    write(root, OTHER, "Bins go out on Wednesday night.\n")
    assert dream(daemon)["notes"] == 1
    daemon.call("workspace.close", {"agent_id": AGENT})  # nothing writes there meanwhile
    template = tmp_path / "template"
    shutil.copytree(root, template)

    copies: list[tuple[int, Path]] = []
    for k in range(1, 40):
        copy = tmp_path / f"k{k}"
        shutil.copytree(template, copy)
        status = killed_undo(copy, first["run_id"], k)
        if status == 0:  # no k-th write: every point was killed once
            break
        assert status == -signal.SIGKILL, status
        copies.append((k, copy))
    assert len(copies) >= 5, copies  # the marker, the record, the node, the log, the catalog

    decided = 0
    for k, copy in copies:
        agent = f"undo{k}"
        open_copy(daemon, copy, agent, fake)
        record = orjson.loads((copy / RUNS / f"{first['run_id']}.json").read_bytes())
        # Killed before the undo was decided, nothing was undone: it is asked again.
        decided += bool(record["undone"])
        how = ("dream.undo", "dream.runs", "auto_dream")[k % 3 if record["undone"] else 0]
        if "undo_pending" not in record and record["undone"]:  # killed as it ended
            with pytest.raises(InvalidParams, match="already undone"):
                daemon.call("dream.undo", {"agent_id": agent, "run_id": first["run_id"]})
        elif how == "dream.undo":
            answer: dict[str, Any] = daemon.call("dream.undo", {"agent_id": agent,
                                                                "run_id": first["run_id"]})
            assert CAT in answer["removed"] and answer["dreamed_again"] == [NOTE], (k, answer)
        elif how == "dream.runs":
            daemon.call("dream.runs", {"agent_id": agent})
        if how != "auto_dream":
            assert NOTE not in load_catalog(copy / CATALOG), k
            assert not (copy / CAT).exists(), k
        again = run_job(daemon, "auto_dream", agent=agent)
        assert again["state"] == "succeeded", (k, again)
        assert again["result"]["notes"] == 1 and again["result"]["actions"] == {"CREATE": 1}, (
            k, again["result"])
        assert load_catalog(copy / CATALOG)[NOTE]["run_id"] == again["result"]["run_id"], k
        log = (copy / RUNS / f"{first['run_id']}.md").read_text(encoding="utf-8")
        assert log.count("Undone at") == 1, (k, log)
        assert not list((copy / RUNS).glob("*.undoing")), k
        (listed,) = [r for r in daemon.call("dream.runs", {"agent_id": agent})["runs"]
                     if r["run_id"] == first["run_id"]]
        assert listed["undone"], (k, listed)
    assert 0 < decided < len(copies), decided


def test_a_damaged_or_stray_undo_marker_stops_no_dream(tmp_path: Path) -> None:
    # What finishes undos runs before every dream: a record edited by hand, or a marker
    # of no run, must neither fail it nor stop it for good.
    runs = tmp_path / RUNS
    run = changelog.RunLog("20261204T050000Z-abcdef", "2026-12-04T05:00:00+00:00", "cron",
                           notes=[NOTE])
    run.record_write(CAT, None, b"- Gus\n")
    changelog.write_run(runs, run)
    (tmp_path / "digest/personal").mkdir(parents=True)
    (tmp_path / CAT).write_bytes(b"- Gus\n")
    record = orjson.loads((runs / f"{run.run_id}.json").read_bytes())
    record["undone"], record["undo_pending"] = "t", {"restored": 5}
    (runs / f"{run.run_id}.json").write_bytes(orjson.dumps(record))
    for name in (f"{run.run_id}.undoing", "20261204T040000Z-000000.undoing", "x.undoing"):
        (runs / name).write_bytes(b"")
    (runs / "20261204T040000Z-111111.undoing").mkdir()  # a folder: cannot be removed
    catalog = tmp_path / CATALOG
    assert dreamundo.finish_pending(tmp_path, runs, digest_dir="digest", catalog=catalog) == []
    assert sorted(p.name for p in runs.glob("*.undoing")) == [
        "20261204T040000Z-111111.undoing", f"{run.run_id}.undoing"]
    (runs / "20261204T040000Z-111111.undoing").rmdir()
    with pytest.raises(DamagedRecord, match="undo_pending"):
        dreamundo.undo_run(tmp_path, runs, run.run_id, digest_dir="digest", now="t2",
                           catalog=catalog)
    assert (tmp_path / CAT).exists()
    # Named in full again, the undo is finished.
    record["undo_pending"] = {"restored": [], "removed": [CAT], "forced_over": [],
                              "forced": False, "shared": False}
    (runs / f"{run.run_id}.json").write_bytes(orjson.dumps(record))
    (done,) = dreamundo.finish_pending(tmp_path, runs, digest_dir="digest", catalog=catalog)
    assert done["run_id"] == run.run_id and "undo_pending" not in done
    assert not (tmp_path / CAT).exists() and not list(runs.glob("*.undoing"))


def test_an_undo_names_a_note_named_by_a_credential_masked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The log and the errors of an undo name the notes of its record as search shows them.
    token = "ghp_" + "Zq8" * 12
    secret = f"digest/personal/{token}.md"
    runs = tmp_path / RUNS
    run = changelog.RunLog("20261204T060000Z-abcdef", "2026-12-04T06:00:00+00:00", "cron",
                           notes=[NOTE])
    run.record_write(secret, None, b"- Gus\n")
    changelog.write_run(runs, run)
    (tmp_path / secret).mkdir(parents=True)  # a folder in its place: it cannot be read
    with pytest.raises(NotAllowed) as refused:
        dreamundo.undo_run(tmp_path, runs, run.run_id, digest_dir="digest", now="t")
    assert "digest/personal/[REDACTED].md cannot be read" in refused.value.message
    record = orjson.loads((runs / f"{run.run_id}.json").read_bytes())
    record["undone"] = "t"
    record["undo_pending"] = {"restored": [f"digest/wiki/{token}.md"], "removed": []}
    (runs / f"{run.run_id}.json").write_bytes(orjson.dumps(record))
    (runs / f"{run.run_id}.undoing").write_bytes(b"")
    with caplog.at_level(logging.WARNING, "recalld"):
        assert dreamundo.finish_pending(tmp_path, runs, digest_dir="digest",
                                        catalog=tmp_path / CATALOG) == []
    assert "names 'digest/wiki/[REDACTED].md', a file the run did not write" in caplog.text
    assert token not in caplog.text + refused.value.message
