"""Backups asked for in odd ways: an empty selection of agents, an archive named where it
cannot be written, workspace files deep enough that their member names approach the
limits a restore checks, and an archive whose recorded settings are refused here."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from clirun import run_recalld
from conftest import DaemonFactory, DaemonHandle
from test_backup import NOTES, tree, write_tree

from recalld.daemon import backup, remembered
from recalld.ipc.client import Client
from recalld.ipc.errors import InvalidBackup, InvalidParams

LONG_AGENT = "a" * 64


@pytest.fixture
def ws(tmp_path: Path, daemon: DaemonHandle) -> Path:
    root = tmp_path / "ws"
    write_tree(root, NOTES)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    return root


def test_an_empty_selection_of_agents_is_refused_not_taken_for_all(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    made = daemon.call("backup.create", {"agents": ["w"]})
    (ws / "digest" / "wiki" / "trains.md").write_text("changed after the backup\n")
    before = tree(ws)
    backups = set((daemon.data_dir / "backups").iterdir())
    with Client(daemon.socket_path, timeout_s=60) as client:  # the library sends [] too
        with pytest.raises(InvalidParams, match="'agents' is empty"):
            client.backup_restore(made["file"], agents=[])
        with pytest.raises(InvalidParams, match="'agents' is empty"):
            client.backup_create(agents=[], out=str(tmp_path / "none.zip"))
    assert tree(ws) == before  # nothing restored
    assert set((daemon.data_dir / "backups").iterdir()) == backups  # no snapshot either
    assert not (tmp_path / "none.zip").exists()


def test_an_archive_named_where_it_cannot_be_written_names_the_place(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("a file, not a folder\n")
    for out in (tmp_path / "afile" / "x.zip", tmp_path / "afile" / "deeper" / "x.zip"):
        with pytest.raises(InvalidParams) as caught:
            daemon.call("backup.create", {"agents": ["w"], "out": str(out)})
        assert caught.value.message == (
            f"cannot write the backup to {out}: {tmp_path / 'afile'} is not a directory")
    (tmp_path / "folder").mkdir()
    for named in (f"{tmp_path / 'folder'}", f"{tmp_path / 'new-folder'}/"):
        with pytest.raises(InvalidParams, match="is a folder: name the archive file in it"):
            daemon.call("backup.create", {"agents": ["w"], "out": named})
    assert not (tmp_path / "new-folder").exists()
    assert list((tmp_path / "folder").iterdir()) == []



def test_an_archive_named_longer_than_the_system_takes_is_refused_naming_why(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # Looking whether it was a folder failed with ENAMETOOLONG: an "internal error".
    for out in (tmp_path / ("x" * 300 + ".zip"),  # one name past 255 bytes
                tmp_path.joinpath(*["y" * 200] * 21, "x.zip")):  # a path past 4,096
        with pytest.raises(InvalidParams) as caught:
            daemon.call("backup.create", {"agents": ["w"], "out": str(out)})
        message = caught.value.message  # a message past 2,000 characters is cut in its middle
        assert message.startswith(f"cannot write the backup to {str(out)[:900]}"), message
        assert message.endswith(f"{str(out)[-900:]}: File name too long"), message
    assert not list(tmp_path.glob("x*")) and not (tmp_path / ("y" * 200)).exists()
    assert daemon.call("backup.list", {})["backups"] == []


def test_paths_in_a_loop_of_links_are_refused_naming_the_loop(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # Python 3.11's resolve raises RuntimeError on a loop: an "internal error" for an
    # archive named through one, and for a closed workspace whose folder became one.
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    out = tmp_path / "loop-a" / "x.zip"
    with pytest.raises(InvalidParams) as caught:
        daemon.call("backup.create", {"agents": ["w"], "out": str(out)})
    assert caught.value.message == (
        f"cannot write the backup to {out}: Too many levels of symbolic links")
    made = daemon.call("backup.create", {"agents": ["w"]})
    daemon.call("workspace.close", {"agent_id": "w"})
    shutil.move(ws, tmp_path / "ws-moved")
    ws.symlink_to(tmp_path / "loop-a")
    for method, params in (("backup.create", {"agents": ["w"]}),
                           ("backup.restore", {"file": made["file"], "agents": ["w"]})):
        with pytest.raises(InvalidParams, match="Too many levels of symbolic links"):
            daemon.call(method, params)
    assert daemon.call("daemon.ping", {})


def test_an_archive_named_at_a_link_or_in_a_missing_folder_is_refused_making_nothing(
        daemon: DaemonHandle, ws: Path, tmp_path: Path) -> None:
    # A dangling link was replaced by the archive (the check for an existing file
    # followed it); one in the workspace leading out of it put the archive inside it.
    # A missing folder was made, as far up as it was missing.
    outside = tmp_path / "elsewhere" / "target.zip"
    links = {ws / "memory" / "bk.zip": outside, tmp_path / "dangling.zip": outside,
             tmp_path / "to-a-file.zip": ws / "digest" / "wiki" / "trains.md"}
    for link, target in links.items():
        link.symlink_to(target)
        with pytest.raises(InvalidParams) as caught:
            daemon.call("backup.create", {"agents": ["w"], "out": str(link)})
        assert caught.value.message == (
            f"{link} exists (a symbolic link to {target}); choose another name")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    refused = {tmp_path / "no" / "such" / "x.zip": f"no folder {tmp_path / 'no'}: make it first",
               tmp_path / "gone" / "deeper" / "x.zip":
                   f"{tmp_path / 'gone'} is a symbolic link to nothing ({tmp_path / 'nowhere'})"}
    for out, why in refused.items():
        with pytest.raises(InvalidParams) as caught:
            daemon.call("backup.create", {"agents": ["w"], "out": str(out)})
        assert caught.value.message == f"cannot write the backup to {out}: {why}"
    assert all(link.is_symlink() for link in links)
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "no").exists()
    assert not (tmp_path / "nowhere").exists()
    assert daemon.call("backup.list", {})["backups"] == []
    proc = run_recalld(["--socket", str(daemon.socket_path), "backup", "create", "--out", "-"],
                       env=daemon.env)
    assert proc.returncode == 2, proc.stderr
    assert "--out -: the archive is written to a file, not to standard output" in proc.stderr
    assert daemon.call("backup.list", {})["backups"] == []


@contextlib.contextmanager
def _folder_fd(root: Path, parts: list[str]) -> Iterator[int]:
    """A descriptor of ``root/parts...``, created as needed (walked one name at a time:
    the whole path may be past PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def _write_deep(root: Path, rel: str, data: bytes) -> None:
    *folders, name = rel.split("/")
    with _folder_fd(root, folders) as fd:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd)
        os.write(out, data)
        os.close(out)


def _read_deep(root: Path, rel: str) -> bytes:
    *folders, name = rel.split("/")
    with _folder_fd(root, folders) as fd:
        f = os.open(name, os.O_RDONLY, dir_fd=fd)
        try:
            return os.read(f, 1 << 16)
        finally:
            os.close(f)


def _deep_rel(length: int, top: str = "memory/x") -> str:
    rel = top
    while len(rel) + 201 < length - 10:
        rel += "/" + "d" * 200
    return rel + "/" + "n" * (length - len(rel) - 4) + ".md"


def test_a_deep_file_of_a_long_agent_id_makes_an_archive_that_restores(
        daemon: DaemonHandle, tmp_path_factory: pytest.TempPathFactory) -> None:
    # agents/<64 characters>/<a path as long as the system takes>: a member name past
    # the 4,096 characters a restore used to take, written by the backup all the same.
    root = tmp_path_factory.mktemp("w") / "r"  # short: the rest of PATH_MAX is the file's
    write_tree(root, {"memory/2026-07-23/a.md": "# A\n\nshallow note\n"})
    deep = _deep_rel(4077 - len(os.fsencode(root)) - 1)  # and its temp name: 4,095
    assert len(f"agents/{LONG_AGENT}/{deep}") > 4096
    _write_deep(root, deep, b"# Deep\n\nthe deepest note\n")
    # Deeper than the system takes as one path: a restore could not write them.
    too_deep = _deep_rel(4200, "memory/y")
    _write_deep(root, too_deep, b"# Too deep\n")
    daemon.call("workspace.open", {"agent_id": LONG_AGENT, "path": str(root)})
    out = root.parent / "long.zip"
    made = daemon.call("backup.create", {"agents": [LONG_AGENT], "out": str(out)})
    [passed] = made["passed_by"][LONG_AGENT]
    assert too_deep.startswith(passed + "/") or too_deep == passed
    with zipfile.ZipFile(made["file"]) as zf:
        assert f"agents/{LONG_AGENT}/{deep}" in zf.namelist()
    assert daemon.call("backup.verify", {"file": made["file"]})["ok"] is True
    _write_deep(root, deep, b"changed\n")
    shutil.rmtree(root / "memory" / "y")  # the watcher cannot list it (not the backup's)
    daemon.call("backup.restore", {"file": made["file"], "agents": [LONG_AGENT]})
    assert _read_deep(root, deep) == b"# Deep\n\nthe deepest note\n"


def test_a_restore_into_a_deeper_folder_than_paths_allow_says_how_short_it_must_be(
        daemon: DaemonHandle, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Backed up from a short folder, restored where the workspace's folder path is
    # hundreds of bytes longer: its deepest note would lie past PATH_MAX. That was an
    # "internal error" (ENAMETOOLONG while planning); it is a refusal that says why and
    # what would do, before anything changes.
    short = tmp_path_factory.mktemp("s") / "r"
    write_tree(short, {"memory/2026-07-23/a.md": "# A\n\nshallow note\n"})
    deep = _deep_rel(3900 - len(os.fsencode(short)))
    _write_deep(short, deep, b"# Deep\n\nthe deepest note\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(short)})
    made = daemon.call("backup.create", {"agents": ["w"], "out": str(short.parent / "w.zip")})
    assert made["passed_by"] == {} and made["members"] >= 2
    daemon.call("workspace.close", {"agent_id": "w"})
    long = tmp_path_factory.mktemp("l").joinpath("L" * 250, "M" * 250, "r")
    write_tree(long, {"memory/2026-07-23/b.md": "# B\n\nnewer note\n"})
    daemon.call("workspace.open", {"agent_id": "w", "path": str(long)})
    room = backup.PATH_MAX_BYTES - backup.TEMP_NAME_EXTRA - 2 - len(deep)
    assert len(os.fsencode(long)) > room
    for dry_run in (True, False):
        with pytest.raises(InvalidParams) as refused:
            daemon.call("backup.restore", {"file": made["file"], "dry_run": dry_run})
        assert refused.value.message.startswith(f"cannot restore workspace 'w' to {long}: ")
        assert "1 of its files would lie past the longest path the system takes" \
               in refused.value.message
        assert f"into a workspace whose folder path has at most {room} bytes" \
               in refused.value.message
    assert sorted(p.name for p in (long / "memory" / "2026-07-23").iterdir()) == ["b.md"]
    assert not (long / "memory" / "x").exists()
    assert daemon.call("index.sync", {"agent_id": "w"}) is not None
    assert daemon.call("backup.list", {})["rollback"] is None  # no snapshot was taken


def _with_record(archive: Path, out: Path, agent_id: str, config: dict[str, str]) -> None:
    """``archive`` as ``out``, its record of workspaces giving ``agent_id`` ``config``
    (checksums made to match: the archive passes every check)."""
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w") as dst:
        meta = orjson.loads(src.read("meta.json"))
        record = orjson.loads(src.read("daemon/workspaces.json"))["workspaces"]
        record[agent_id]["config"] = config
        data = remembered.dump(record)
        for member in meta["files"]:
            if member["path"] == "daemon/workspaces.json":
                member.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        for name in src.namelist():
            if name != "meta.json":
                dst.writestr(name, data if name == "daemon/workspaces.json" else src.read(name))
        dst.writestr("meta.json", orjson.dumps(meta))


def test_settings_of_the_backup_refused_here_refuse_the_archive_in_verify_and_restore(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Restored where it was never open, a workspace opens with the settings the backup
    # recorded for it. Refused, the restore answered -32602 (exit 2: a wrong command)
    # while `backup verify` had passed the archive.
    d1 = daemon_factory()
    write_tree(tmp_path / "ws", NOTES)
    d1.call("workspace.open", {"agent_id": "w", "path": str(tmp_path / "ws")})
    archive = Path(d1.call("backup.create", {"agents": ["w"]})["file"])
    d2 = daemon_factory()
    cases = {
        "daily_dir": {"daily_dir": "memory/../../elsewhere"},
        "unknown field(s) colour": {"auto_memory_interval": 10, "colour": "teal"},
    }
    for said, config in cases.items():
        bad = tmp_path / f"bad {said[:5]}.zip"
        _with_record(archive, bad, "w", config)
        why = "the settings it recorded for workspace 'w' are refused here (workspace config"
        for method, params in (("backup.verify", {"file": str(bad)}),
                               ("backup.restore", {"file": str(bad), "agents": ["w"]}),
                               ("backup.restore", {"file": str(bad), "dry_run": True})):
            with pytest.raises(InvalidBackup) as refused:
                d2.call(method, params)
            assert refused.value.message.startswith(f"refusing backup {bad}: {why}"), \
                (method, refused.value.message)
            assert said in refused.value.message, refused.value.message
            assert refused.value.data == {"file": str(bad),
                                          "reason": refused.value.message.split(": ", 1)[1]}
        proc = run_recalld(["backup", "verify", str(bad)], env=d2.env)
        assert proc.returncode == 1 and proc.stderr.rstrip().endswith("(code -32012)"), proc
    assert not (d2.data_dir / "workspaces" / "w").exists()
    assert d2.call("backup.list", {})["rollback"] is None  # no snapshot was taken
    # The archive as made passes both, its settings taken as recorded.
    assert d2.call("backup.verify", {"file": str(archive)})["ok"] is True
    assert d2.call("backup.restore", {"file": str(archive), "agents": ["w"]})["restored"]
