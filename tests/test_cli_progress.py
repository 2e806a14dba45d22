"""Progress of the plain calls the daemon answers only when done (backup create, backup
restore, import-qwenpaw): phase and elapsed time as a bar on a terminal, lines when piped,
JSON lines with --json; and the note on stderr when a search reads an index still being
built."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from conftest import DaemonHandle
from test_cli import recalld
from test_progress import Clock

from recalld.ipc.cli import _index_incomplete_note
from recalld.ipc.client import Client
from recalld.ipc.progress import LINE_INTERVAL_S, CallProgress


def test_call_progress_lines_json_and_bar() -> None:
    out, clock = io.StringIO(), Clock()
    p = CallProgress(out, "backup create", "writing the archive", mode="lines", clock=clock)
    p.tick()
    clock.now += 1.0
    p.tick()  # too soon for another line
    clock.now += LINE_INTERVAL_S
    p.tick()
    assert out.getvalue().splitlines() == [
        "backup create: writing the archive (0:00 elapsed)",
        "backup create: writing the archive (0:06 elapsed)"]

    out, clock = io.StringIO(), Clock()
    p = CallProgress(out, "backup restore", "restoring", mode="json", clock=clock)
    p.tick()
    clock.now += LINE_INTERVAL_S + 0.5
    p.tick()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["elapsed_s"] for r in records] == [0.0, LINE_INTERVAL_S + 0.5]
    assert all(r["event"] == "progress" and r["kind"] == "backup restore"
               and r["phase"] == "restoring" and r["done"] is None and r["job_id"] is None
               for r in records)

    out, clock = io.StringIO(), Clock()
    with CallProgress(out, "import-qwenpaw", "opening", mode="bar", clock=clock) as p:
        clock.now += 75.0
        p.tick()
    drawn = out.getvalue()
    assert drawn.startswith("\r") and "import-qwenpaw: opening… 1:15 elapsed" in drawn
    assert drawn.endswith("\n")  # the result starts on its own line


def _note_file(daemon: DaemonHandle) -> None:
    note = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-01" / "n.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("# Note\nthe lighthouse keeper is Orla\n", encoding="utf-8")


def test_backup_and_restore_say_their_phase_piped_and_as_json(daemon: DaemonHandle,
                                                              tmp_path: Path) -> None:
    _note_file(daemon)
    out = tmp_path / "b.zip"
    created = recalld("backup", "create", "--out", str(out), env=daemon.env)
    assert created.returncode == 0, created.stderr
    assert created.stderr.startswith("backup create: writing the archive (0:0")
    assert "\r" not in created.stderr and created.stdout.startswith(f"wrote {out}")

    as_json = recalld("backup", "create", "--out", str(tmp_path / "c.zip"), "--json",
                      env=daemon.env)
    assert as_json.returncode == 0, as_json.stderr
    records = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert records and records[0]["kind"] == "backup create"
    assert records[0]["phase"] == "writing the archive" and "elapsed_s" in records[0]
    assert json.loads(as_json.stdout)["file"] == str(tmp_path / "c.zip")

    restored = recalld("backup", "restore", str(out), "--yes", env=daemon.env)
    assert restored.returncode == 0, restored.stderr
    lines = restored.stderr.splitlines()
    assert lines[0].startswith("backup restore: checking the archive (")
    assert any(line.startswith("backup restore: taking a snapshot, then restoring (")
               for line in lines), lines


def test_import_says_its_phase(daemon: DaemonHandle, tmp_path: Path) -> None:
    ws = tmp_path / "qw"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-07-01.md").write_text("# Day\nthe ferry Marrowind\n")
    proc = recalld("import-qwenpaw", str(ws), "--agent", "qw", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(f"import-qwenpaw: opening and indexing {ws} (0:")


def test_search_notes_an_index_still_being_built(daemon: DaemonHandle,
                                                 tmp_path: Path) -> None:
    root = tmp_path / "big"
    for day in range(30):
        folder = root / "memory" / f"2026-06-{day + 1:02d}"
        folder.mkdir(parents=True)
        for i in range(100):
            (folder / f"n{i}.md").write_text(f"# Note {day}-{i}\nword{i} lighthouse\n")
    seen_pending = False
    with Client(daemon.socket_path, timeout_s=300) as client:
        client.workspace_open("big", path=str(root))
        deadline = time.monotonic() + 300
        while True:
            note = _index_incomplete_note(client, "big")
            if note is None:
                break
            seen_pending = True
            assert note.startswith("recalld: note: the index of big is still being built (")
            assert "results may be incomplete" in note
            assert time.monotonic() < deadline, note
            time.sleep(0.2)
        # A first build of 3,000 files is still running right after the open returns.
        assert seen_pending
        client.index_sync("big")
        assert _index_incomplete_note(client, "big") is None
    proc = recalld("search", "lighthouse", "--agent", "big", env=daemon.env)
    assert proc.returncode == 0 and "still being built" not in proc.stderr, proc.stderr
