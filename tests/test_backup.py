"""Backup and restore through a real daemon: round trip, hostile archives, rollback."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import DaemonFactory, DaemonHandle
from waits import wait_for

from recalld.daemon.backup_check import BackupInvalid, BackupLimits, open_checked
from recalld.daemon.backup_restore import plan_restore
from recalld.ipc.errors import InvalidBackup, InvalidParams, NotFound, UnknownWorkspace

NOTES = {
    "memory/2026-07-23/commute.md": "# Commute\n\nI take the 7:40 train to Zurich.\n"
                                    "It failed with ECONNREFUSED once.\n",
    "memory/2026-07-24/weekend.md": "# 周末\n\n周末我们去爬山，天气很好。\n",
    "digest/wiki/trains.md": "---\nname: trains\n---\nThe SBB runs every 30 minutes.\n"
                             "related:: [[memory/2026-07-23/commute.md]]\n",
    "digest/personal/food.md": "I like ramen and dumplings.\n",
    "mem_session/dialog/s1.jsonl": '{"role": "user", "content": "hello"}\n',
    "resource/2026-07-23/paper.txt": "A resource file about rail timetables.\n",
}
QUERIES = ["train Zurich", "ECONNREFUSED", "爬山", "ramen", "SBB minutes"]


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def tree(root: Path, dirs: tuple[str, ...] = ("memory", "digest", "mem_session",
                                               "resource")) -> dict[str, bytes]:
    out = {}
    for top in dirs:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def searches(d: DaemonHandle, agent: str = "w") -> list[list[tuple[str, int, int, float]]]:
    out = []
    for q in QUERIES:
        res = d.call("memory.search", {"agent_id": agent, "query": q, "sync": True})
        out.append([(r["path"], r["start_line"], r["end_line"], round(r["score"], 6))
                    for r in res["results"]])
    return out


@pytest.fixture
def ws(tmp_path: Path, daemon: DaemonHandle) -> Path:
    root = tmp_path / "ws"
    write_tree(root, NOTES)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})
    # The resource watcher catalogs paper.txt on its own schedule (index.sync waits for
    # the index alone): a backup taken before its first save holds no catalog.
    wait_for(lambda: (root / "mem_metadata/catalog/resource.jsonl.zst").is_file(),
             "the resource catalog's first save")
    return root


def test_backup_wipe_restore_is_byte_identical_and_searches_the_same(
        daemon: DaemonHandle, ws: Path) -> None:
    before_files = tree(ws)
    before_search = searches(daemon)
    assert all(before_search), before_search
    made = daemon.call("backup.create", {"agents": ["w"]})
    archive = Path(made["file"])
    assert archive.parent == daemon.data_dir / "backups" and archive.is_file()
    # The notes, the (empty) pending-turns and inbox logs, the resource catalog, and the
    # daemon's workspace record.
    assert made["agents"]["w"]["files"] == len(NOTES) + 3 and made["members"] == len(NOTES) + 4
    assert made["daemon"] == ["workspaces.json"]
    with zipfile.ZipFile(archive) as zf:
        meta = orjson.loads(zf.read("meta.json"))
        for entry in meta["files"]:
            assert hashlib.sha256(zf.read(entry["path"])).hexdigest() == entry["sha256"]
    assert daemon.call("backup.verify", {"file": archive.name})["ok"] is True
    listed = daemon.call("backup.list")
    assert archive.name in [b["name"] for b in listed["backups"]]

    # Wipe the memory (the daemon keeps running and sees the deletions).
    for top in ("memory", "digest", "mem_session", "resource"):
        shutil.rmtree(ws / top)
    daemon.call("index.sync", {"agent_id": "w"})
    assert daemon.call("memory.search", {"agent_id": "w", "query": "ramen"})["results"] == []

    result = daemon.call("backup.restore", {"file": str(archive)})
    done = result["restored"][0]  # the wiped notes written, state files left may match
    assert done["written"] + done["unchanged"] == len(NOTES) + 3 and done["unchanged"] <= 3
    assert tree(ws) == before_files
    # Answered only after the index caught up: no sync needed for the first search.
    first = daemon.call("memory.search", {"agent_id": "w", "query": "ramen"})
    assert [r["path"] for r in first["results"]] == ["digest/personal/food.md"]
    assert searches(daemon) == before_search
    status = daemon.call("daemon.status")
    health = next(w for w in status["workspaces"] if w["agent_id"] == "w")["health"]
    assert health["state"] == "clean", health
    assert health["files_on_disk"] == health["files_indexed"] == 4


def test_a_backup_of_every_workspace_holds_one_closed_that_the_next_start_opens(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # One closed without forget (still recorded, reopened at the next start) was left out
    # of "every workspace": its pending turns and notes went to no new machine, while its
    # record was in the archive.
    rest = tmp_path / "r"
    write_tree(rest, {"memory/2026-08-01/plan.md": "Ferry to Ærø at dawn.\n"})
    daemon.call("workspace.open", {"agent_id": "rest.v2", "path": str(rest)})
    daemon.call("memory.add_turns", {"agent_id": "rest.v2", "session_id": "s", "messages": [
        {"role": "user", "content": "Mein Fahrrad ist grün."}]})
    daemon.call("workspace.close", {"agent_id": "rest.v2"})
    made = daemon.call("backup.create", {})
    assert sorted(made["agents"]) == ["default", "rest.v2", "w"] and not made["not_open"]
    assert made["agents"]["rest.v2"]["path"] == str(rest)
    with zipfile.ZipFile(made["file"]) as zf:
        assert "Fahrrad" in zf.read(
            "agents/rest.v2/mem_metadata/sessions/pending.jsonl").decode()
        plan = zf.read("agents/rest.v2/memory/2026-08-01/plan.md").decode()
        assert plan == "Ferry to Ærø at dawn.\n"
    verified = daemon.call("backup.verify", {"file": made["file"]})
    assert sorted(verified["agents"]) == ["default", "rest.v2", "w"]
    plans = daemon.call("backup.restore", {"file": made["file"], "dry_run": True})["plans"]
    assert {p["agent_id"]: p["root"] for p in plans}["rest.v2"] == str(rest)
    with pytest.raises(UnknownWorkspace):  # read, not opened
        daemon.call("memory.search", {"agent_id": "rest.v2", "query": "ferry"})


def test_a_backup_of_every_workspace_names_a_configured_one_it_cannot_read(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A workspace the config file names, closed, opens at the next start: backed up. One
    # whose folder is a file (it never opened) cannot be read: named, and the rest written.
    (tmp_path / "afile").write_text("not a folder\n")
    d = daemon_factory(f'[workspaces.notes]\npath = "{tmp_path / "notes"}"\n'
                       f'[workspaces.flat]\npath = "{tmp_path / "afile"}"\n')
    d.call("workspace.close", {"agent_id": "notes"})
    d.call("workspace.close", {"agent_id": "flat"})
    made = d.call("backup.create", {})
    assert made["not_open"] == ["flat"] and sorted(made["agents"]) == ["default", "notes"], made
    # Named, the one whose place is a file is refused.
    with pytest.raises(InvalidParams, match="is not a folder"):
        d.call("backup.create", {"agents": ["flat"]})


def test_a_file_dated_before_1970_keeps_its_time_through_a_restore(
        daemon: DaemonHandle, ws: Path) -> None:
    # The modification time a restore sets back (ReMe's records know files by it) was
    # refused as malformed when negative: the archive could not be verified or restored.
    old = ws / "resource" / "2026-07-23" / "scan-1960.txt"
    old.write_text("a scan of a 1960 timetable\n")
    os.utime(old, ns=(-315_619_200 * 10**9, -315_619_200 * 10**9))
    archive = daemon.call("backup.create", {"agents": ["w"]})["file"]
    assert daemon.call("backup.verify", {"file": archive})["ok"] is True
    old.unlink()
    daemon.call("backup.restore", {"file": archive, "agents": ["w"]})
    assert old.stat().st_mtime_ns == -315_619_200 * 10**9


def test_a_file_that_compresses_very_well_is_backed_up_restorably(
        daemon: DaemonHandle, ws: Path) -> None:
    # A log of one line repeated deflates far past the ratio a restore takes for a
    # decompression bomb: the backup holding it was refused by its own verify and restore.
    log = ws / "resource" / "2026-07-23" / "heartbeat.log"
    log.write_text("2026-07-23 12:00:00 INFO heartbeat ok\n" * 60_000)
    before = tree(ws)
    archive = daemon.call("backup.create", {"agents": ["w"]})["file"]
    assert daemon.call("backup.verify", {"file": archive})["ok"] is True
    shutil.rmtree(ws / "resource")
    daemon.call("backup.restore", {"file": archive, "agents": ["w"]})
    assert tree(ws) == before


def test_files_larger_than_a_restore_takes_never_make_a_useless_archive(
        daemon: DaemonHandle, ws: Path) -> None:
    # A restore refuses a member over 4 GiB and an archive over 16 GiB: a backup holding
    # one was written, and could never be restored. (Sparse files: nothing is read.)
    big = ws / "memory" / "2026-07-23" / "recording.wav"
    with big.open("wb") as f:
        f.truncate((4 << 30) + 1)
    made = daemon.call("backup.create", {"agents": ["w"]})
    assert made["too_large"] == {"w": ["memory/2026-07-23/recording.wav"]}
    assert daemon.call("backup.verify", {"file": made["file"]})["ok"] is True
    # The restore would remove it, and its snapshot cannot hold it: refused, unchanged.
    before = tree(ws, ("digest", "resource"))
    with pytest.raises(InvalidParams, match=r"no pre-restore snapshot can be taken: .*"
                                            r"recording\.wav has 4294967297 bytes"):
        daemon.call("backup.restore", {"file": made["file"], "agents": ["w"]})
    assert big.stat().st_size == (4 << 30) + 1 and tree(ws, ("digest", "resource")) == before
    big.unlink()
    for n in range(5):
        with (ws / "memory" / "2026-07-23" / f"part{n}.bin").open("wb") as f:
            f.truncate(4 << 30)
    with pytest.raises(InvalidParams, match="more than a restore takes from one archive"):
        daemon.call("backup.create", {"agents": ["w"]})


def test_pre_restore_snapshot_rolls_back(daemon: DaemonHandle, ws: Path) -> None:
    archive = Path(daemon.call("backup.create", {"agents": ["w"]})["file"])
    # Memory changes after the backup: a new note and an edit.
    write_tree(ws, {"memory/2026-07-25/new.md": "A brand new zeppelin note.\n",
                    "digest/personal/food.md": "I now prefer pizza.\n"})
    daemon.call("index.sync", {"agent_id": "w"})
    changed = tree(ws)
    result = daemon.call("backup.restore", {"file": str(archive), "agents": ["w"]})
    snapshot = Path(result["snapshot"])
    assert snapshot.name.startswith("pre-restore-") and snapshot.is_file()
    assert not (ws / "memory/2026-07-25/new.md").exists()
    assert daemon.call("memory.search", {"agent_id": "w", "query": "zeppelin"})["results"] == []

    rolled = daemon.call("backup.rollback")
    assert rolled["rolled_back"]["snapshot"] == str(snapshot)
    assert tree(ws) == changed
    hits = daemon.call("memory.search", {"agent_id": "w", "query": "zeppelin"})["results"]
    assert [h["path"] for h in hits] == ["memory/2026-07-25/new.md"]
    # Undone once: work done after the rollback is not thrown away by a second one.
    write_tree(ws, {"memory/2026-07-26/later.md": "The quokka note written afterwards.\n"})
    assert daemon.call("backup.list")["rollback"] is None
    with pytest.raises(NotFound, match="no restore to roll back"):
        daemon.call("backup.rollback")
    assert (ws / "memory/2026-07-26/later.md").is_file() and snapshot.is_file()
    assert str(snapshot) in [b.get("file") for b in daemon.call("backup.list")["backups"]]


def test_a_backup_that_cannot_be_read_is_listed_with_the_reason(daemon: DaemonHandle,
                                                                 ws: Path) -> None:
    # A link to a drive that is not mounted among the backups: listed as such, and the
    # others (and a rollback, which lists them first) still work.
    made = Path(daemon.call("backup.create", {"agents": ["w"]})["file"])
    (made.parent / "elsewhere.zip").symlink_to("/nonexistent/recalld/elsewhere.zip")
    listed = {b["name"]: b for b in daemon.call("backup.list")["backups"]}
    assert listed["elsewhere.zip"]["error"].startswith("cannot be read: "), listed
    assert listed[made.name]["agents"] == ["w"]


def test_backups_with_odd_meta_are_listed_as_such_and_the_list_prints(
        daemon: DaemonHandle, ws: Path) -> None:
    # meta.json is read, not checked, for the list: a time past any calendar made the
    # CLI's table end in a traceback.
    folder = Path(daemon.call("backup.create", {"agents": ["w"]})["file"]).parent
    good = {"format": "recalld-backup", "version": 1, "created": 1.0, "note": "",
            "agents": {"w": {}}, "files": []}
    odd = {"far": {"created": 1e300}, "word": {"created": "yesterday", "note": {"n": 1}},
           "agents": {"agents": ["w"]}, "files": {"files": "x"}, "foreign": {"format": "x"}}
    for name, changes in odd.items():
        with zipfile.ZipFile(folder / f"{name}.zip", "w") as zf:
            zf.writestr("meta.json", orjson.dumps({**good, **changes}))
    listed = {b["name"]: b for b in daemon.call("backup.list")["backups"]}
    assert listed["far.zip"]["created"] is None
    assert (listed["word.zip"]["created"], listed["word.zip"]["note"]) == (None, "")
    for name in ("agents.zip", "files.zip", "foreign.zip"):
        assert listed[name]["error"] == "meta.json does not describe a recalld backup"
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "--socket",
                           str(daemon.socket_path), "backup", "list"], env=daemon.env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "far.zip" in proc.stdout


def test_a_backup_named_in_another_encoding_is_listed_with_the_reason(
        daemon: DaemonHandle, ws: Path) -> None:
    # caf\xe9.zip, copied in by a Latin-1 tool: the list answered "internal error", since
    # no JSON answer can carry the name. It is listed escaped, with what to do.
    made = Path(daemon.call("backup.create", {"agents": ["w"]})["file"])
    (made.parent / os.fsdecode(b"caf\xe9.zip")).write_bytes(made.read_bytes())
    listed = {b["name"]: b for b in daemon.call("backup.list")["backups"]}
    assert "is not valid UTF-8" in listed["caf\\xe9.zip"]["error"], listed
    assert listed[made.name]["agents"] == ["w"]


def test_a_fifo_or_device_link_among_the_backups_does_not_hang_the_list(
        daemon: DaemonHandle, ws: Path) -> None:
    made = Path(daemon.call("backup.create", {"agents": ["w"]})["file"])
    os.mkfifo(made.parent / "fifo.zip")  # nobody will ever write to it
    (made.parent / "zero.zip").symlink_to("/dev/zero")
    listed = {b["name"]: b for b in daemon.call("backup.list", timeout=10)["backups"]}
    assert listed["fifo.zip"]["error"] == listed["zero.zip"]["error"] == "not a regular file"
    assert listed[made.name]["agents"] == ["w"]
    with pytest.raises(InvalidBackup, match="not a regular file"):
        daemon.call("backup.verify", {"file": str(made.parent / "fifo.zip")})
    # The rollback record was read in the event loop: a FIFO there froze the daemon.
    os.mkfifo(made.parent / "rollback.json")
    assert daemon.call("backup.list", timeout=10)["rollback"] is None
    assert daemon.call("daemon.ping", timeout=5)["pong"] is True


def test_rollback_without_a_snapshot_is_not_found(daemon: DaemonHandle) -> None:
    with pytest.raises(NotFound):
        daemon.call("backup.rollback")


# ------------------------------------------------------------------------ hostile zips


def _member(zf: zipfile.ZipFile, name: str, data: bytes, mode: int = 0o100644) -> dict[str, Any]:
    info = zipfile.ZipInfo(name, (2026, 7, 23, 0, 0, 0))
    info.external_attr = mode << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    return {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def hostile(path: Path, members: list[tuple[str, bytes, int]], *, meta: bool = True,
            lie: dict[str, str] | None = None, agents: tuple[str, ...] = ("w",),
            dirs: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        files = [_member(zf, name, data, mode) for name, data, mode in members]
        for entry in files:
            if lie and entry["path"] in lie:
                entry["sha256"] = lie[entry["path"]]
        if meta:
            doc = {"format": "recalld-backup", "version": 1, "created": 0.0,
                   "agents": {a: {"path": "/x", "dirs": dirs or {"daily_dir": "memory",
                                                                 "digest_dir": "digest"}}
                              for a in agents},
                   "files": files}
            zf.writestr("meta.json", orjson.dumps(doc))
    return path


GOOD = ("agents/w/memory/2026-01-01/a.md", b"fine\n", 0o100644)
BOMB = b"\0" * (8 << 20)


HOSTILE: list[tuple[str, list[tuple[str, bytes, int]], dict[str, Any]]] = [
    ("traversal", [GOOD, ("agents/w/memory/../../../../etc/evil.md", b"x", 0o100644)], {}),
    ("absolute", [GOOD, ("/tmp/evil.md", b"x", 0o100644)], {}),
    ("symlink", [GOOD, ("agents/w/memory/link.md", b"/etc/passwd", 0o120777)], {}),
    ("bomb", [GOOD, ("agents/w/memory/zeros.md", BOMB, 0o100644)], {}),
    ("checksum", [GOOD], {"lie": {GOOD[0]: "0" * 64}}),
    ("foreign", [("README.txt", b"just a zip", 0o100644)], {"meta": False}),
    ("other-agent", [GOOD, ("agents/intruder/memory/x.md", b"x", 0o100644)], {}),
    ("outside-dirs", [GOOD, ("agents/w/.bashrc", b"x", 0o100644)], {}),
    ("agent-id", [GOOD], {"agents": ("w", "../evil")}),
    ("agent-id-empty", [GOOD], {"agents": ("w", "")}),
    # A file where another member needs a folder: half of it could be written.
    ("file-and-folder", [GOOD, (GOOD[0] + "/inner.md", b"x", 0o100644)], {}),
    # 133 characters but 262 bytes: past the 255 a file name may have (no restore could).
    ("long-name", [GOOD, ("agents/w/memory/" + "é" * 131 + ".md", b"x", 0o100644)], {}),
]


def test_hostile_archives_are_refused_and_change_nothing(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    before = tree(ws)
    backups = daemon.data_dir / "backups"
    for name, members, kwargs in HOSTILE:
        archive = hostile(tmp_path / f"{name}.zip", members, **kwargs)
        with pytest.raises(InvalidBackup) as err:
            daemon.call("backup.restore", {"file": str(archive)})
        assert err.value.message.startswith(f"refusing backup {archive}: "), (
            name, err.value.message)
        assert err.value.data["file"] == str(archive) and err.value.data["reason"], name
        assert tree(ws) == before, name
        assert not (ws / "memory/2026-01-01").exists(), name
        assert not list(backups.glob("pre-restore-*")), "no snapshot for a refused restore"
        assert not Path("/tmp/evil.md").exists()
        with pytest.raises(InvalidBackup):
            daemon.call("backup.verify", {"file": str(archive)})


def test_duplicate_members_and_limits_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.zip"
    with pytest.warns(UserWarning):  # zipfile itself warns about the duplicate
        hostile(path, [GOOD, GOOD])
    with pytest.raises(BackupInvalid, match="duplicate"):
        open_checked(path)
    ok = hostile(tmp_path / "ok.zip", [GOOD])
    assert open_checked(ok).agents == ["w"]
    with pytest.raises(BackupInvalid, match="exceeds"):
        open_checked(ok, BackupLimits(max_total_bytes=3))
    with pytest.raises(BackupInvalid, match="too large"):
        open_checked(ok, BackupLimits(max_member_bytes=2))


def test_members_restored_onto_one_file_are_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    # Two session folders apart in the backup, one inside the other here: both members
    # would land on mem_session/agent/s.jsonl.
    archive = hostile(tmp_path / "sessions.zip", [
        ("agents/w/sessions/agent/s.jsonl", b'{"a": 1}\n', 0o100644),
        ("agents/w/agent_sessions/s.jsonl", b'{"b": 2}\n', 0o100644)],
        dirs={"session_dir": "sessions", "mem_session_dir": "agent_sessions"})
    checked = open_checked(archive)
    root = tmp_path / "ws"
    root.mkdir()
    with pytest.raises(BackupInvalid, match=r"two members of w restore to "
                                            r"'mem_session/agent/s\.jsonl'"):
        plan_restore(checked, "w", root, {"session_dir": "mem_session",
                                          "mem_session_dir": "mem_session/agent"})
    assert list(root.iterdir()) == []


def test_a_truncated_archive_is_refused(tmp_path: Path) -> None:
    ok = hostile(tmp_path / "ok.zip", [GOOD, ("agents/w/digest/b.md", b"y" * 5000, 0o100644)])
    data = ok.read_bytes()
    cut = tmp_path / "cut.zip"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(BackupInvalid, match="unreadable"):
        open_checked(cut)


def test_backup_leaves_out_symlinks_and_hidden_files(daemon: DaemonHandle, ws: Path,
                                                    tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("outside the workspace\n")
    (ws / "memory" / "link.md").symlink_to(secret)
    (ws / "memory" / ".tmp-cookie").write_text("x")
    out = tmp_path / "out" / "b.zip"
    out.parent.mkdir()  # (a missing folder is refused, not made)
    made = daemon.call("backup.create", {"agents": ["w"], "out": str(out)})
    assert Path(made["file"]) == out
    # Every file of the workspace is in it: only its owner may read it, wherever it is.
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        for info in zf.infolist():
            assert stat.S_ISREG(info.external_attr >> 16)
    assert "agents/w/memory/link.md" not in names and not any(".tmp" in n for n in names)
    with pytest.raises(InvalidParams, match="exists"):
        daemon.call("backup.create", {"agents": ["w"], "out": str(out)})
    # Inside a workspace (any, through a link too) it would be read as its memory.
    (tmp_path / "to-ws").symlink_to(ws)
    for inside in (ws / "resource" / "b.zip", tmp_path / "to-ws" / "b.zip"):
        with pytest.raises(InvalidParams, match="inside workspace 'w'"):
            daemon.call("backup.create", {"agents": ["w"], "out": str(inside)})
        assert not (ws / "resource" / "b.zip").exists()
    # A workspace's own folder (or one in it) is refused as such, not with a file in it to
    # name instead, which would be refused in turn.
    for folder in (ws, ws / "memory", tmp_path / "to-ws"):
        with pytest.raises(InvalidParams, match="inside workspace 'w'"):
            daemon.call("backup.create", {"agents": ["w"], "out": str(folder)})


def test_restore_on_another_machine_opens_the_workspace_and_indexes_it(
        daemon: DaemonHandle, ws: Path, daemon_factory: Any) -> None:
    archive = Path(daemon.call("backup.create", {"agents": ["w"]})["file"])
    expected = tree(ws)
    other = daemon_factory()  # a second machine: its own data dir, no workspace "w"
    assert "w" not in [w["agent_id"] for w in other.call("workspace.list")["workspaces"]]
    result = other.call("backup.restore", {"file": str(archive)})
    assert result["restored"][0]["opened"] is True
    target = other.data_dir / "workspaces" / "w"
    assert tree(target) == expected
    # The workspace opened by the restore builds its index in the background (as any
    # workspace.open): the search waits for it.
    hits = other.call("memory.search",
                      {"agent_id": "w", "query": "ECONNREFUSED", "sync": True})["results"]
    assert [h["path"] for h in hits] == ["memory/2026-07-23/commute.md"]


def test_a_closed_workspace_is_restored_where_and_as_it_was_recorded(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Closed (still recorded) at a path of its own with folders of its own: the restore
    # puts its files back there, in its folders, and opens it there as it was.
    root = tmp_path / "elsewhere" / "w2"
    write_tree(root, {"days/2026-07-23/trip.md": "# Trip\n\nThe ferry to Lindau leaves at nine.\n",
                      "digest/wiki/ferry.md": "Ferries run every hour.\n"})
    daemon.call("workspace.open", {"agent_id": "w2", "path": str(root),
                                   "config": {"daily_dir": "days"}})
    daemon.call("index.sync", {"agent_id": "w2"})
    archive = Path(daemon.call("backup.create", {"agents": ["w2"]})["file"])
    expected = tree(root, ("days", "digest"))
    assert list(expected) == ["days/2026-07-23/trip.md", "digest/wiki/ferry.md"]
    daemon.call("workspace.close", {"agent_id": "w2"})
    for top in ("days", "digest"):
        shutil.rmtree(root / top)
    result = daemon.call("backup.restore", {"file": str(archive), "agents": ["w2"]})
    assert result["restored"][0]["opened"] is True
    assert tree(root, ("days", "digest")) == expected
    assert not (daemon.data_dir / "workspaces" / "w2").exists()
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    assert listed["w2"]["path"] == str(root.resolve())
    assert listed["w2"]["settings"]["daily_dir"] == "days"
    hits = daemon.call("memory.search",
                       {"agent_id": "w2", "query": "Lindau", "sync": True})["results"]
    assert [h["path"] for h in hits] == ["days/2026-07-23/trip.md"]
