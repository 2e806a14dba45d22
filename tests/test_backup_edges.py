"""Backups of workspaces in odd shapes: what a backup leaves out is named, files that
change while copied, meta.json fields of the wrong type, folders a restore empties, and
closed workspaces named by the person."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import IO, Any

import orjson
import pytest
from clirun import run_recalld
from conftest import DaemonHandle
from test_backup import tree, write_tree, ws

from recalld.daemon import backup
from recalld.daemon.backup_check import BackupInvalid, BackupLimits, open_checked
from recalld.ipc.errors import InvalidBackup, InvalidParams, UnknownWorkspace

__all__ = ["ws"]  # the fixture, used by name


def test_a_backup_names_the_symlinks_and_hidden_files_it_leaves_out(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # Left out without a word: a person found their Obsidian settings and a linked
    # folder of notes missing only when restoring.
    elsewhere = tmp_path / "shared-notes"
    write_tree(elsewhere, {"team.md": "Standup at ten.\n"})
    (ws / "digest" / "team").symlink_to(elsewhere)
    (ws / "memory" / "2026-07-23" / "latest.md").symlink_to(ws / "digest" / "personal"
                                                           / "food.md")
    write_tree(ws, {"digest/.obsidian/app.json": "{}", "resource/.env": "TOKEN=1\n"})
    # The daemon's own temp files are no loss, and not worth a line.
    write_tree(ws, {"memory/.note.md.tmp-0123456789ab": "half written"})
    made = daemon.call("backup.create", {"agents": ["w"]})
    assert made["symlinks"] == {"w": ["digest/team", "memory/2026-07-23/latest.md"]}
    assert made["hidden"] == {"w": ["digest/.obsidian", "resource/.env"]}
    with zipfile.ZipFile(made["file"]) as zf:
        assert not [n for n in zf.namelist() if "team" in n or "/." in n or "latest" in n]
    proc = subprocess.run(
        [sys.executable, "-m", "recalld.ipc", "--socket", str(daemon.socket_path),
         "backup", "create", "--agent", "w"],
        env=daemon.env, capture_output=True, text=True, timeout=60, input="", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "left out of w (symlinks: what they lead to is not the workspace's): " \
           "digest/team, memory/2026-07-23/latest.md\n" in proc.stdout
    assert "left out of w (hidden: names starting with a dot): digest/.obsidian, " \
           "resource/.env\n" in proc.stdout


class _Writer:
    """A writer changing a file between the moment the backup opened it (and looked at
    how well it compresses) and its copy: runs in place of that look."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path, data: bytes,
                 append: bool) -> None:
        self.path, self.data, self.append, self.done = path, data, append, False
        real = backup._deflates_like_a_bomb

        def look(f: IO[bytes], *args: Any) -> bool:
            verdict = real(f, *args)
            if os.fstat(f.fileno()).st_ino == path.stat().st_ino and not self.done:
                self.done = True
                with path.open("ab" if append else "r+b") as w:
                    w.write(data)
            return verdict

        monkeypatch.setattr(backup, "_deflates_like_a_bomb", look)


def test_a_file_growing_while_copied_is_copied_as_far_as_it_reached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Limits were checked when the files were listed: a log growing past what a restore
    # takes of a file while it was copied made an archive no restore would take.
    monkeypatch.setattr(backup, "MAX_MEMBER_BYTES", 3 << 20)
    root = tmp_path / "ws"
    start = os.urandom(2 << 20)
    write_tree(root, {"memory/2026-07-23/a.md": "# a\n"})
    log = root / "resource" / "run.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(start)
    writer = _Writer(monkeypatch, log, os.urandom(2 << 20), append=True)
    out = tmp_path / "b.zip"
    backup.create_backup(out, [backup.AgentSource("w", root, {"daily_dir": "memory",
                                                              "resource_dir": "resource"})])
    assert writer.done and log.stat().st_size == 4 << 20
    checked = open_checked(out, BackupLimits(max_member_bytes=3 << 20))
    with zipfile.ZipFile(out) as zf:
        assert zf.read("agents/w/resource/run.log") == start
    # The time recorded is the file's after the bytes were read, not before.
    assert checked.members["agents/w/resource/run.log"]["mtime_ns"] == log.stat().st_mtime_ns


def test_a_file_turning_very_compressible_while_copied_makes_a_restorable_archive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whether to store a file uncompressed was decided before the copy: one rewritten as
    # zeros meanwhile deflated like a decompression bomb, and the archive was refused.
    root = tmp_path / "ws"
    write_tree(root, {"memory/2026-07-23/a.md": "# a\n"})
    dump = root / "resource" / "dump.bin"
    dump.parent.mkdir(parents=True)
    dump.write_bytes(os.urandom(4 << 20))
    writer = _Writer(monkeypatch, dump, bytes(4 << 20), append=False)
    out = tmp_path / "b.zip"
    made = backup.create_backup(out, [backup.AgentSource(
        "w", root, {"daily_dir": "memory", "resource_dir": "resource"})])
    assert writer.done and made["members"] == 2
    open_checked(out)
    with zipfile.ZipFile(out) as zf:
        assert zf.read("agents/w/resource/dump.bin") == bytes(4 << 20)


def _with_meta(archive: Path, out: Path, **changes: Any) -> Path:
    """A copy of ``archive`` with meta.json's fields changed as ``changes`` say
    (``agent__KEY`` changes agent w's entry)."""
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "meta.json":
                meta = orjson.loads(data)
                for key, value in changes.items():
                    if key.startswith("agent__"):
                        meta["agents"]["w"][key[len("agent__"):]] = value
                    else:
                        meta[key] = value
                data = orjson.dumps(meta)
            dst.writestr(info, data)
    return out


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("secrets", "no", "'secrets' is \"no\", not true or false"),
    ("secrets_left_out", ["w"], "'secrets_left_out' is [\"w\"], not an object"),
    ("secrets_left_out", {"w": "api_key"}, "'secrets_left_out' is"),
    ("created", "yesterday", "'created' is \"yesterday\", not a time in seconds"),
    ("note", 7, "'note' is 7, not a string"),
    ("include_derived", 1, "'include_derived' is 1, not true or false"),
    ("daemon", "config.toml", "'daemon' is \"config.toml\", not a list of daemon file"),
    ("daemon", ["../../etc/passwd"], "'daemon' is"),
    ("recalld_version", None, "'recalld_version' is null, not a string"),
    ("agent__files", "4", "agent 'w''s 'files' is \"4\", not a count of files"),
    ("agent__files", -1, "agent 'w''s 'files' is -1, not a count"),
    ("agent__path", ["/x"], "agent 'w''s 'path' is [\"/x\"], not a string"),
])
def test_meta_fields_of_the_wrong_type_are_refused_and_change_nothing(
        daemon: DaemonHandle, ws: Path, tmp_path: Path, key: str, value: object,
        reason: str) -> None:
    # Read unchecked: ``secrets: "no"`` counted as true (a config with its secrets
    # emptied replaced this machine's), a list of left-out secrets failed the restore
    # with an internal error after the snapshot.
    made = daemon.call("backup.create", {"agents": ["w"]})
    bad = _with_meta(Path(made["file"]), tmp_path / "bad.zip", **{key: value})
    before = tree(ws)
    for method in ("backup.verify", "backup.restore"):
        with pytest.raises(InvalidBackup) as info:
            daemon.call(method, {"file": str(bad)})
        assert f"refusing backup {bad}: meta.json: " in info.value.message
        assert reason in info.value.message, info.value.message
    with pytest.raises(BackupInvalid, match=r"meta\.json: "):
        open_checked(bad)
    assert tree(ws) == before
    assert daemon.call("backup.list")["rollback"] is None
    # Absent, they are an archive of old: taken.
    old = _with_meta(Path(made["file"]), tmp_path / "old.zip")
    assert daemon.call("backup.verify", {"file": str(old)})["ok"] is True


def _rewritten(archive: Path, out: Path, change: Any, keep: Any = lambda name: True) -> Path:
    """A copy of ``archive`` with ``change(meta)`` applied, the members ``keep`` keeps."""
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "meta.json":
                meta = orjson.loads(data)
                change(meta)
                data = orjson.dumps(meta)
            if keep(info.filename):
                dst.writestr(info, data)
    return out


def test_a_file_size_that_is_not_a_count_is_refused(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # true was taken as the size 1 (and false as 0): JSON's booleans are Python's ints.
    write_tree(ws, {"memory/one.md": "x", "memory/none.md": ""})
    made = Path(daemon.call("backup.create", {"agents": ["w"]})["file"])
    for name, value in (("one.md", True), ("none.md", False), ("one.md", -1), ("one.md", 1.0)):
        def change(meta: Any, name: str = name, value: object = value) -> None:
            entry = next(f for f in meta["files"] if f["path"].endswith("/" + name))
            entry["size"] = value
        bad = _rewritten(made, tmp_path / "bad.zip", change)
        with pytest.raises(InvalidBackup, match=r"meta\.json has a malformed file entry"):
            daemon.call("backup.verify", {"file": str(bad)})


def test_an_archive_of_no_workspace_verifies_and_is_not_restored(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # Its restore wrote nothing but took a snapshot of nothing, which replaced the rollback
    # point of the restore before; verify printed "agents " and a dry run an empty line.
    made = Path(daemon.call("backup.create", {"agents": ["w"]})["file"])
    daemon.call("backup.restore", {"file": str(made)})
    listed = daemon.call("backup.list")
    empty = _rewritten(made, tmp_path / "empty.zip",
                       lambda meta: meta.update(agents={}, files=[
                           f for f in meta["files"] if not f["path"].startswith("agents/")]),
                       keep=lambda name: not name.startswith("agents/"))
    checked = daemon.call("backup.verify", {"file": str(empty)})
    assert checked["agents"] == {}
    for dry_run in (True, False):
        with pytest.raises(InvalidParams) as refused:
            daemon.call("backup.restore", {"file": str(empty), "dry_run": dry_run})
        assert refused.value.message == "backup empty.zip holds no workspace: nothing to restore"
    assert daemon.call("backup.list") == listed  # the same rollback point, no new snapshot
    cli = ["--socket", str(daemon.socket_path), "backup"]
    proc = run_recalld([*cli, "verify", str(empty)], env=daemon.env)
    assert proc.stdout == (f"ok: {empty}: {checked['members']} file(s), no workspace "
                           "(nothing to restore)\n"), proc
    proc = run_recalld([*cli, "restore", str(empty), "--dry-run"], env=daemon.env)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert "recalld: backup empty.zip holds no workspace: nothing to restore" in proc.stderr


def test_a_restore_removes_the_folders_it_empties(daemon: DaemonHandle, ws: Path) -> None:
    made = daemon.call("backup.create", {"agents": ["w"]})
    write_tree(ws, {"memory/2026-08-01/trip/day1.md": "Hiked to the lake.\n",
                    "memory/2026-08-01/trip/day2.md": "Rain all day.\n",
                    "digest/projects/kiln/notes.md": "Fire at 1200 C.\n",
                    "digest/wiki/kilns.md": "A kiln is an oven.\n",
                    "resource/2026-08-01/.keep": ""})
    (ws / "memory" / "2026-08-02").mkdir()  # empty before the restore: not its to remove
    result = daemon.call("backup.restore", {"file": made["file"], "agents": ["w"]})
    assert result["restored"][0]["removed"] == 4
    assert not (ws / "memory" / "2026-08-01").exists()
    assert not (ws / "digest" / "projects").exists()
    assert (ws / "digest" / "wiki").is_dir()  # holds a file the backup has
    assert (ws / "resource" / "2026-08-01" / ".keep").exists()  # hidden: left alone
    assert (ws / "memory" / "2026-08-02").is_dir()
    # The content folders stay, emptied or not.
    shutil.rmtree(ws / "resource")
    (ws / "resource" / "2026-08-03").mkdir(parents=True)
    (ws / "resource" / "2026-08-03" / "x.txt").write_text("x\n")
    bare = daemon.call("backup.create", {"agents": ["w"]})
    write_tree(ws, {"resource/2026-08-04/y.txt": "y\n"})
    (ws / "resource" / "2026-08-03" / "x.txt").unlink()
    shutil.rmtree(ws / "resource" / "2026-08-03")
    daemon.call("backup.restore", {"file": bare["file"], "agents": ["w"]})
    assert sorted(p.name for p in (ws / "resource").iterdir()) == ["2026-08-03"]


def test_a_closed_workspace_is_backed_up_by_name(daemon: DaemonHandle, tmp_path: Path) -> None:
    # Only open workspaces could be named: a closed one, still recorded (it opens at the
    # next start), was "not open" and could not be backed up without opening it.
    root = tmp_path / "resting"
    write_tree(root, {"days/2026-07-23/trip.md": "The ferry to Lindau leaves at nine.\n",
                      "digest/wiki/ferry.md": "Ferries run every hour.\n"})
    daemon.call("workspace.open", {"agent_id": "resting", "path": str(root),
                                   "config": {"daily_dir": "days"}})
    daemon.call("workspace.close", {"agent_id": "resting"})
    expected = tree(root, ("days", "digest"))
    made = daemon.call("backup.create", {"agents": ["resting"]})
    with zipfile.ZipFile(made["file"]) as zf:
        assert {f"agents/resting/{rel}" for rel in expected} <= set(zf.namelist())
    assert made["agents"]["resting"]["path"] == str(root.resolve())
    assert made["agents"]["resting"]["dirs"]["daily_dir"] == "days"
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    assert listed["resting"]["state"] != "ready"  # backed up, not opened for it
    shutil.rmtree(root / "days")
    daemon.call("backup.restore", {"file": made["file"], "agents": ["resting"]})
    assert tree(root, ("days", "digest")) == expected
    # One never opened here, or whose folder is gone, is still refused by name.
    with pytest.raises(UnknownWorkspace, match="not open"):
        daemon.call("backup.create", {"agents": ["stranger"]})
    daemon.call("workspace.close", {"agent_id": "resting"})
    shutil.rmtree(root)
    with pytest.raises(InvalidParams, match=r"closed and its folder .* is gone"):
        daemon.call("backup.create", {"agents": ["resting"]})


def test_a_content_folder_that_is_a_symlink_is_named_and_a_restore_leaves_it_alone(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A daily folder linked to a synced folder elsewhere: the backup left its notes out
    # without a word, and a restore planned to remove them through the link, then failed
    # half done ("passes through a symlink") with the workspace's other files replaced.
    synced = tmp_path / "synced"
    write_tree(synced, {"2026-07-23/walrus.md": "Walruses haul out on ice floes.\n"})
    root = tmp_path / "linked"
    write_tree(root, {"digest/wiki/ice.md": "Sea ice melts in summer.\n"})
    (root / "memory").symlink_to(synced)
    daemon.call("workspace.open", {"agent_id": "linked", "path": str(root)})
    made = daemon.call("backup.create", {"agents": ["linked"]})
    assert made["symlinks"] == {"linked": ["memory"]}
    write_tree(root, {"digest/wiki/melt.md": "Written after the backup.\n"})
    plan = daemon.call("backup.restore", {"file": made["file"], "dry_run": True})["plans"][0]
    assert plan["removes"] == ["digest/wiki/melt.md"]
    result = daemon.call("backup.restore", {"file": made["file"]})
    assert result["restored"][0]["removed"] == 1
    assert tree(root, ("digest",)) == {"digest/wiki/ice.md": b"Sea ice melts in summer.\n"}
    assert (synced / "2026-07-23" / "walrus.md").is_file() and (root / "memory").is_symlink()


def test_a_file_named_with_a_backslash_is_named_and_the_archive_restores(
        daemon: DaemonHandle, ws: Path) -> None:
    # A backslash is a plain character in a Linux file name, but a restore refuses a
    # member holding one (a Windows path separator): one such note made every backup of
    # the workspace one that its own verify and restore refused.
    write_tree(ws, {"memory/2026-07-23/C:\\Users\\me.md": "copied from Windows\n",
                    "digest/a\\b/c.md": "in a folder named with one\n"})
    made = daemon.call("backup.create", {"agents": ["w"]})
    assert made["passed_by"] == {"w": ["digest/a\\b/c.md", "memory/2026-07-23/C:\\Users\\me.md"]}
    assert daemon.call("backup.verify", {"file": made["file"]})["ok"] is True
    before = tree(ws)
    (ws / "digest" / "wiki" / "trains.md").unlink()
    daemon.call("backup.restore", {"file": made["file"], "agents": ["w"]})
    assert tree(ws) == before  # restored, and the files it could not hold left alone


def test_fifos_and_sockets_in_the_folders_are_named_as_left_out(
        daemon: DaemonHandle, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A named pipe or a socket some tool left among the notes holds no file content: it
    # was left out without a word, unlike every other file a backup leaves out.
    os.mkfifo(ws / "memory" / "2026-07-23" / "feed.md")
    monkeypatch.chdir(ws / "resource")  # a socket's path is limited to 107 bytes
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind("tool.sock")
        made = daemon.call("backup.create", {"agents": ["w"]})
        assert made["special"] == {"w": ["memory/2026-07-23/feed.md", "resource/tool.sock"]}
        proc = subprocess.run(
            [sys.executable, "-m", "recalld.ipc", "--socket", str(daemon.socket_path),
             "backup", "create", "--agent", "w"],
            env=daemon.env, capture_output=True, text=True, timeout=60, input="", check=False)
        assert proc.returncode == 0, proc.stderr
        assert "left out of w (FIFOs, sockets and devices: no file content to copy): " \
               "memory/2026-07-23/feed.md, resource/tool.sock\n" in proc.stdout
        with zipfile.ZipFile(made["file"]) as zf:
            assert not [n for n in zf.namelist() if "feed" in n or "tool" in n]
        (ws / "digest" / "wiki" / "trains.md").unlink()
        daemon.call("backup.restore", {"file": made["file"], "agents": ["w"]})
        assert (ws / "digest" / "wiki" / "trains.md").is_file()
        assert stat.S_ISFIFO((ws / "memory" / "2026-07-23" / "feed.md").lstat().st_mode)
        assert stat.S_ISSOCK((ws / "resource" / "tool.sock").lstat().st_mode)


def _repacked(archive: Path, out: Path, extra: tuple[str, bytes, int] | None = None) -> Path:
    """``archive`` unpacked and packed again as ``zip -r`` does: an entry for every
    folder (mode drwxr-xr-x, no data) before its files; ``extra`` is one more entry."""
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w") as dst:
        folders: set[str] = set()
        for info in src.infolist():
            parts = info.filename.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                if (folder := "/".join(parts[:depth]) + "/") not in folders:
                    folders.add(folder)
                    entry = zipfile.ZipInfo(folder)
                    entry.external_attr = (stat.S_IFDIR | 0o755) << 16
                    dst.writestr(entry, b"")
            dst.writestr(info, src.read(info))
        if extra is not None:
            entry = zipfile.ZipInfo(extra[0])
            entry.external_attr = extra[2] << 16
            dst.writestr(entry, extra[1])
    return out


def test_a_backup_packed_again_with_folder_entries_restores(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # Unpacked to look inside and packed again with `zip -r`, a backup was refused for
    # its folder entries ("member 'agents/' has an empty, '.' or '..' component").
    before = tree(ws)
    made = daemon.call("backup.create", {"agents": ["w"]})
    repacked = _repacked(Path(made["file"]), tmp_path / "repacked.zip")
    (ws / "memory/2026-07-23/commute.md").unlink()
    shutil.rmtree(ws / "digest/wiki")
    daemon.call("backup.restore", {"file": str(repacked)})
    assert tree(ws) == before
    # A folder entry is skipped only when it is one: named safely, empty, a folder.
    for name, (entry, reason) in {
            "up": (("agents/w/memory/../../x/", b"", stat.S_IFDIR | 0o755), "'..'"),
            "data": (("agents/w/memory/d/", b"hidden", stat.S_IFDIR | 0o755), "not an empty"),
            "link": (("agents/w/memory/l/", b"", stat.S_IFLNK | 0o777), "not an empty"),
    }.items():
        bad = _repacked(Path(made["file"]), tmp_path / f"{name}.zip", entry)
        with pytest.raises(BackupInvalid, match=reason):
            open_checked(bad)
