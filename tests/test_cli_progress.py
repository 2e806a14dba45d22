"""Progress of the long calls (backup create, backup restore, backup rollback,
import-qwenpaw): counts of files and bytes per phase, reported by the daemon on the
call's own connection and drawn like a job's progress: a bar on a terminal, lines when
piped, JSON lines with --json; and the note on stderr when a search reads an index
still being built."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import struct
import termios
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonHandle
from ptyrun import on_a_terminal, read_chunk
from test_cli import recalld
from test_progress import Clock
from waits import wait_for

from recalld.ipc.cli_search import _index_incomplete_note
from recalld.ipc.client import Client
from recalld.ipc.progress import Progress

NOTES = 600  # more than one update per phase whatever the machine's speed


def test_call_progress_with_bytes_in_every_form() -> None:
    out, clock = io.StringIO(), Clock()
    p = Progress(out, "backup create", None, mode="lines", clock=clock)
    p.update("running", {"message": "writing the archive", "done": 0, "total": 300,
                         "bytes_done": 0, "bytes_total": 3 << 20})
    clock.now += 1.0
    p.update("running", {"message": "writing the archive", "done": 150, "total": 300,
                         "bytes_done": 3 << 19, "bytes_total": 3 << 20})  # too soon
    p.update("running", {"message": "writing the archive", "done": 300, "total": 300,
                         "bytes_done": 3 << 20, "bytes_total": 3 << 20})  # phase done
    assert out.getvalue().splitlines() == [
        "backup create: 0/300 (0%) 0 B/3.0 MiB writing the archive (running)",
        "backup create: 300/300 (100%) 3.0 MiB/3.0 MiB writing the archive (running) "
        "300.0/s ETA 0:00"]
    out = io.StringIO()
    p = Progress(out, "backup restore", None, mode="json", clock=clock)
    p.update("running", {"message": "checking the archive", "done": 2, "total": 5,
                         "bytes_done": 10, "bytes_total": 50})
    p.update("running", {"message": "checking the archive", "done": 2, "total": 5,
                         "bytes_done": 10, "bytes_total": 50})  # nothing new: no record
    (record,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert record["job_id"] is None and record["bytes_total"] == 50 and record["done"] == 2


@pytest.mark.parametrize("columns", [40, 72, 90, 200])
def test_the_bar_stays_within_the_terminal_width(columns: int) -> None:
    # A bar wider than the terminal wraps, and each redraw (a carriage return goes back
    # to the last row only) leaves a line behind. On a real terminal of each width, every
    # drawn line fits; the counts and the rate are kept before the drawn bar.
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    with open(slave, "w", encoding="utf-8", closefd=True) as term:
        p = Progress(term, "backup create", None, mode="bar", clock=Clock())
        for done in (0, 1_500, 3_002):
            p.update("running", {"message": "writing the archive", "done": done,
                                 "total": 3_002, "bytes_done": done << 10,
                                 "bytes_total": 3_002 << 10})
        p.close()
    drawn = b""
    while chunk := read_chunk(master, 0.2):  # what the terminal got, all of it
        drawn += chunk
    os.close(master)
    lines = [line for line in drawn.decode().replace("\r\n", "\n").replace("\r", "\n").split("\n")
             if line]
    assert len(lines) == 3 and all(len(line) < columns for line in lines), lines
    assert "3,002/3,002 (100%)" in lines[-1] or columns < 50, lines
    assert ("[" in lines[-1]) == (columns >= 90), lines  # the drawn bar, as it fits


def _notes(daemon: DaemonHandle, n: int = NOTES) -> Path:
    root = daemon.data_dir / "workspaces" / "default"
    for i in range(n):
        note = root / "memory" / f"2026-07-{i % 28 + 1:02d}" / f"笔记-{i}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"# Note {i}\nthe lighthouse keeper is Orla, 灯塔 {i}\n" * 20,
                        encoding="utf-8")  # about 1 KiB each
    return root


def _records(stderr: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in stderr.splitlines()]
    assert records and all(r["event"] == "progress" for r in records), stderr
    return records


def _phase(records: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    """The records of ``phase``: each time it runs (a restore checks the archive in its
    dry run, then again), counts from 0 up to its total."""
    mine = [r for r in records if r["phase"] == phase]
    assert len(mine) >= 2, (phase, records)  # its start and its end at least
    runs: list[list[dict[str, Any]]] = []
    for r in mine:
        if not runs or r["done"] < runs[-1][-1]["done"]:
            runs.append([])
        runs[-1].append(r)
    for run in runs:
        assert run[0]["done"] == 0 and run[-1]["done"] == run[-1]["total"], (phase, run)
    return mine


@pytest.mark.slow
def test_backup_and_restore_report_counts_in_every_form(daemon: DaemonHandle,
                                                        tmp_path: Path) -> None:
    # A phase's start and end are always reported: a hundred notes show every form.
    notes = 100
    _notes(daemon, notes)
    out = tmp_path / "b.zip"
    as_json = recalld("backup", "create", "--out", str(out), "--json", env=daemon.env)
    assert as_json.returncode == 0, as_json.stderr
    records = _records(as_json.stderr)
    assert records[0]["kind"] == "backup create" and records[0]["job_id"] is None
    writing = _phase(records, "writing the archive")
    assert writing[-1]["total"] >= notes and writing[-1]["bytes_total"] > notes * 1000
    assert writing[-1]["bytes_done"] == writing[-1]["bytes_total"]
    assert json.loads(as_json.stdout)["file"] == str(out)

    piped = recalld("backup", "create", "--out", str(tmp_path / "c.zip"), env=daemon.env)
    assert piped.returncode == 0, piped.stderr
    lines = piped.stderr.splitlines()
    assert "\r" not in piped.stderr and piped.stdout.startswith("wrote ")
    total = writing[-1]["total"]
    assert any(ln.startswith(f"backup create: 0/{total:,} (0%) 0 B/") and
               ln.endswith("writing the archive (running)") for ln in lines), lines
    assert any(ln.startswith(f"backup create: {total:,}/{total:,} (100%)") for ln in lines)

    code, drawn = on_a_terminal(["backup", "create", "--out", str(tmp_path / "d.zip")],
                                daemon.env, stdout_too=False)
    assert code == 0, drawn
    frames = drawn.split("\r")
    assert any(f"[{'#' * 24}] {total:,}/{total:,} (100%)" in f for f in frames), drawn
    assert any("writing the archive" in f and " KiB/" in f for f in frames), drawn

    verified = recalld("backup", "verify", str(out), "--json", env=daemon.env)
    assert verified.returncode == 0, verified.stderr
    assert _phase(_records(verified.stderr), "checking the archive")[-1]["total"] >= total

    restored = recalld("backup", "restore", str(out), "--yes", "--json", env=daemon.env)
    assert restored.returncode == 0, restored.stderr
    records = _records(restored.stderr)
    checking = _phase(records, "checking the archive")
    # The archive also holds the daemon's own files (its workspace record).
    assert checking[-1]["total"] >= total and checking[-1]["bytes_total"] > 0
    _phase(records, "writing the snapshot")
    restoring = _phase(records, "restoring default")
    assert restoring[-1]["total"] >= total
    assert any(r["phase"] == "indexing default" for r in records), records
    piped = recalld("backup", "restore", str(out), "--yes", env=daemon.env)
    assert piped.returncode == 0, piped.stderr
    assert any(ln.startswith(f"backup restore: {total:,}/{total:,} (100%)")
               and "restoring default" in ln for ln in piped.stderr.splitlines()), piped.stderr
    rolled = recalld("backup", "rollback", "--yes", "--json", env=daemon.env)
    assert rolled.returncode == 0, rolled.stderr
    _phase(_records(rolled.stderr), "restoring default")


def test_import_reports_the_files_indexed(daemon: DaemonHandle, tmp_path: Path) -> None:
    ws = tmp_path / "qw"
    for i in range(NOTES):
        note = ws / "memory" / f"2026-06-{i % 28 + 1:02d}" / f"n{i}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"# Day {i}\nthe ferry Marrowind {i}\n")
    proc = recalld("import-qwenpaw", str(ws), "--agent", "qw", "--json", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    records = _records(proc.stderr)
    assert records[0]["phase"] == "opening"
    indexing = [r for r in records if r["phase"] == "indexing"]
    assert indexing and indexing[-1]["done"] == indexing[-1]["total"] == NOTES, records
    piped = recalld("import-qwenpaw", str(ws), "--agent", "qw", env=daemon.env)
    assert piped.returncode == 0, piped.stderr
    assert f"import-qwenpaw: {NOTES}/{NOTES} (100%) indexing (running)" in piped.stderr


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


def test_ctrl_c_while_following_a_call_says_it_goes_on(daemon: DaemonHandle) -> None:
    from recalld.ipc.progress import following

    with Client(daemon.socket_path) as client:
        for after, said in (
                ("recalld backup list shows it", "interrupted; the backup create goes on in "
                 "the daemon and finishes by itself (recalld backup list shows it)"),
                (None, "interrupted; nothing was changed")):
            stream = io.StringIO()
            try:
                with following(client, "backup create", as_json=False, stream=stream,
                               after=after):
                    raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                assert str(exc) == said
            else:
                raise AssertionError("the interrupt was swallowed")
        assert client.ping()["pong"] is True  # the client stays usable


def test_ctrl_c_during_backup_create_says_where_the_archive_appears(
        daemon: DaemonHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Ctrl-C while the daemon writes the archive: `backup list` shows the data dir's
    # backups, not one written to --out elsewhere; the message names where it appears.
    from test_cli_table import cli_main

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "backup_create", interrupted)
    out = tmp_path / "kept aside.zip"
    for args, said in ((["--out", str(out)], f"the archive appears as {out} once it is "
                                             "written"),
                       ([], "recalld backup list shows the archive once it is written")):
        code, err = cli_main(["backup", "create", *args], daemon.env, monkeypatch, capsys)
        assert code == 130 and err.endswith(f"finishes by itself ({said})\n"), err


def test_a_timeout_while_following_a_call_says_it_goes_on(daemon: DaemonHandle) -> None:
    # The client's --timeout (30 s by default) ends the wait for a large backup or
    # restore, not the call: the message says what goes on, not only that none answered.
    from recalld.ipc.progress import following

    with Client(daemon.socket_path) as client:
        for after, said in (
                ("recalld backup list shows it", "backup.create: no answer within 30 s; the "
                 "backup create goes on in the daemon and finishes by itself (recalld backup "
                 "list shows it); a longer --timeout waits for it"),
                (None, "backup.create: no answer within 30 s; nothing was changed; a longer "
                 "--timeout waits for it")):
            try:
                with following(client, "backup create", as_json=False, stream=io.StringIO(),
                               after=after):
                    raise TimeoutError("backup.create: no answer within 30 s")
            except TimeoutError as exc:
                assert str(exc) == said
            else:
                raise AssertionError("the timeout was swallowed")


def test_a_restore_whose_client_went_away_finishes_and_serves(daemon: DaemonHandle) -> None:
    # Ctrl-C, a --timeout or a killed client while the restore reports progress: the
    # progress it sends next finds nobody, and the restore still runs to its end (as the
    # CLI says) instead of being cut off with its workspace closed, unserved.
    root = _notes(daemon)
    daemon.call("index.sync", {"agent_id": "default"})
    archive = daemon.call("backup.create", {"agents": ["default"]})["file"]
    changed = root / "memory" / "2026-07-01" / "笔记-0.md"
    kept = changed.read_text(encoding="utf-8")
    changed.write_text("changed after the backup\n", encoding="utf-8")
    with daemon.connect() as conn:
        conn.request("backup.restore", {"file": archive, "agents": ["default"],
                                        "progress_token": "t"})
        assert conn.recv()["params"]["topic"] == "call.progress"  # under way
    wait_for(lambda: _restores(daemon) == 1, "the restore ends", deadline_s=60)
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    assert listed["default"]["state"] == "ready", listed["default"]
    assert changed.read_text(encoding="utf-8") == kept
    assert daemon.call("memory.search", {"agent_id": "default", "query": "Orla"})["results"]


def _restores(daemon: DaemonHandle) -> float:
    families = daemon.call("daemon.metrics")["families"]
    found = [f for f in families if f["name"] == "recalld_restores_total"]
    return float(found[0]["samples"][0]["value"]) if found else 0.0


def test_a_daemon_stopping_while_a_job_is_followed_is_said_with_the_job(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    import subprocess
    import sys

    from fakes.provider_server import FakeProvider
    from test_cli import SCRIPT

    with FakeProvider() as fake:
        held = fake.gate(lambda body: True)
        root = tmp_path / "ws"
        (root / "memory" / "2026-11-30").mkdir(parents=True)
        (root / "memory" / "2026-11-30" / "a.md").write_text("The heron nests by the weir.\n")
        daemon.call("workspace.open", {"agent_id": "heron", "path": str(root), "config": {
            "dream_cron_enabled": False, "chat_model_config": {
                "backend": "openai", "base_url": fake.url + "/v1", "model_name": "fake",
                "api_key": "sk-test"}}})
        cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
        proc = subprocess.Popen([*cmd, "dream", "--agent", "heron"], env=daemon.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        try:
            assert held.entered.wait(60), "the dream never asked the model"
            assert daemon.stop() == 0
            held.released.set()
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 1, (out, err)
    line = err.strip().splitlines()[-1]  # after the progress lines
    assert line.startswith("recalld: ") and "while following the " in line, line
    job_id = line.rsplit("recalld jobs get ", 1)[1]
    assert len(job_id) == 16 and job_id in line.split("while following the ")[1], line
