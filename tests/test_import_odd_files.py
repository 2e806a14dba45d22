"""A QwenPaw workspace whose files are not regular files where ReMe or QwenPaw keep them.

A FIFO (a named pipe) in the place of one of ReMe's files or of ``agent.json`` is read by
nobody: opening it for reading waits for a writer that never comes. It is refused with
what it is, as a damaged file is, and the rest of the workspace is imported.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zstandard
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from reme_fixture_util import copy_fixture, fixture_notes, fixture_provider, passage_texts
from test_import_qwenpaw import agent_json, cli
from test_reme_dream import AGENT, NoteRecorder, dream, open_ws

from recalld.daemon import config
from recalld.daemon.index import reme_import
from recalld.daemon.memory.reme_dream import REME_DREAM_CATALOG
from recalld.daemon.store.fsio import REAL
from recalld.daemon.store.records import read_foreign_records, write_records


def test_a_fifo_or_link_in_place_of_remes_cache_is_refused(daemon: DaemonHandle,
                                                           tmp_path: Path) -> None:
    kept = tmp_path / "kept.npz"
    for kind in ("fifo", "link"):
        ws = copy_fixture(tmp_path / kind)
        (ws / "agent.json").write_text(json.dumps(agent_json()), "utf-8")
        npz = next((ws / "mem_metadata" / reme_import.EMBEDDING_DIR).glob("*.npz"))
        if not kept.exists():
            shutil.copy(npz, kept)
        npz.unlink()
        if kind == "fifo":
            os.mkfifo(npz)
        else:  # a good cache file, but elsewhere: not read through the link
            npz.symlink_to(kept)
        stored = reme_import.read_store(ws / "mem_metadata")
        assert stored is not None
        with fixture_provider() as fake:
            proc = cli(daemon, "--json", "import-qwenpaw", str(ws), "--agent", kind)
            assert proc.returncode == 0, proc.stderr
            vec = json.loads(proc.stdout)["import"]["vectors"]
            assert "not a regular file" in vec["reme"]["refused"][npz.name], vec
            # The chunk store's vectors, with nothing in ReMe's cache to contradict them.
            assert vec["reused_from_reme"] == len(stored) and vec["to_embed"] == 0
            text = cli(daemon, "import-qwenpaw", str(ws), "--agent", kind).stdout
            assert f"refused {npz.name}: " in text, text
            assert passage_texts(fake) == []
        assert npz.is_symlink() or npz.is_fifo()  # ReMe's files are left as they are


def test_an_agent_json_that_is_a_fifo_is_refused(daemon: DaemonHandle, tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "coder")
    os.mkfifo(ws / "agent.json")
    for args in ((), ("--agent-json", str(ws / "agent.json"))):
        proc = cli(daemon, "import-qwenpaw", str(ws), *args)
        assert proc.returncode == 2, proc
        assert f"{ws / 'agent.json'}: not a regular file" in proc.stderr, proc.stderr
    assert [w["agent_id"] for w in daemon.call("workspace.list")["workspaces"]] == ["default"]
    # The same file named by the config file: the configuration is refused, saying why.
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(f'[workspaces.coder]\npath = "{ws}"\n'
                        'qwenpaw_agent_json = "coder/agent.json"\n', "utf-8")
    with pytest.raises(config.ConfigError, match=r"agent\.json: not a regular file \(a FIFO\)"):
        config.load(config=cfg_file, environ={"HOME": str(tmp_path)})


def test_paths_no_note_can_have_in_remes_dream_record_are_skipped(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # ReMe's dream record damaged or written by something else: a path with a NUL byte,
    # one leaving the workspace, one too long for the file system. None of them is a
    # note; the other records still count, for the import report as for the dream.
    ws = copy_fixture(tmp_path / "ws")
    record = ws / "mem_metadata" / REME_DREAM_CATALOG
    records = read_foreign_records(record).records
    odd = ["memory/2026-06-10/a\x00b.md", "memory/../../outside.md",
           "memory/2026-06-10/" + "n" * 300 + ".md"]
    write_records(REAL, record, [*records, *({"path": p, "st_mtime": 1.0} for p in odd)])
    model = NoteRecorder(fake)
    open_ws(daemon, ws, fake)
    report = daemon.call("workspace.open", {"agent_id": AGENT, "path": str(ws),
                                            "import_report": True})["import"]["dream"]
    assert report["recognised"] == len(records) and report["gone"] == 0, report
    result = dream(daemon)
    assert result["recognised_from_reme"] == len(records)
    assert not set(model.notes) & {r["path"] for r in records}


def npy_bytes(arr: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    """``arr`` as a .npy file, its header claiming ``shape`` when given."""
    header = np.lib.format.header_data_from_array_1_0(arr)
    if shape is not None:
        header["shape"] = shape
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + arr.tobytes()


def test_a_cache_file_declaring_more_than_it_holds_is_refused(daemon: DaemonHandle,
                                                              tmp_path: Path) -> None:
    # A damaged header claims 2**36 vectors: numpy would allocate them all before
    # finding the data missing, and the MemoryError failed the whole workspace.
    ws = copy_fixture(tmp_path / "coder")
    (ws / "agent.json").write_text(json.dumps(agent_json()), "utf-8")
    npz = next((ws / "mem_metadata" / reme_import.EMBEDDING_DIR).glob("*.npz"))
    with np.load(npz) as data:
        keys, emb = data["keys"], data["embeddings"]
    with zipfile.ZipFile(npz, "w") as zf:
        zf.writestr("keys.npy", npy_bytes(keys))
        zf.writestr("embeddings.npy", npy_bytes(emb, (2**36, emb.shape[1])))
    stored = reme_import.read_store(ws / "mem_metadata")
    assert stored is not None
    with fixture_provider() as fake:
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        vec = json.loads(proc.stdout)["import"]["vectors"]
        assert "embeddings.npy declares" in vec["reme"]["refused"][npz.name], vec
        assert vec["reused_from_reme"] == len(stored) and vec["to_embed"] == 0
        assert passage_texts(fake) == []
    ws_state = next(w for w in daemon.call("workspace.list")["workspaces"]
                    if w["agent_id"] == "coder")
    assert ws_state["state"] == "ready"


def test_a_cache_file_larger_unpacked_than_a_cache_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Compressed, an archive of zeros is small on disk and large once read.
    monkeypatch.setattr(reme_import, "MAX_NPZ_BYTES", 1 << 20)
    npz = tmp_path / "default_v1_0123456789ab.npz"
    rows = 1 << 14
    np.savez_compressed(npz, keys=np.array([f"{i:064x}" for i in range(rows)]),
                        embeddings=np.zeros((rows, 64), np.float16))
    assert npz.stat().st_size < reme_import.MAX_NPZ_BYTES
    with pytest.raises(ValueError, match="unpacked"):
        reme_import.load_npz(npz, 64)


def test_notes_reme_indexed_behind_a_link_are_named_not_dropped_silently(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A QwenPaw user kept a day's folder (or one node) elsewhere and linked it in: ReMe
    # followed the link and indexed it; recalld does not, and the report says which
    # notes of ReMe's are not served and why, rather than a clean count without them.
    ws = copy_fixture(tmp_path / "linked")
    away = tmp_path / "elsewhere"
    away.mkdir()
    day = ws / "memory" / "2026-06-12"
    day.rename(away / day.name)
    day.symlink_to(away / day.name, target_is_directory=True)
    node = ws / "digest" / "wiki" / "budget-notes.md"
    node.rename(away / node.name)
    node.symlink_to(away / node.name)
    gone = ws / "memory" / "2026-06-13" / "cooking-1.md"
    gone.unlink()  # deleted since ReMe indexed it: nothing lost, nothing to say
    # ReMe's chunks of a file outside memory/ and digest/ (one more folder it watched),
    # never a note of recalld's, behind a link: not named.
    (away / "extra").mkdir()
    (away / "extra" / "x.md").write_text("# x\n", "utf-8")
    (ws / "extra").symlink_to(away / "extra", target_is_directory=True)
    with (ws / "mem_metadata" / reme_import.CHUNK_STORE).open("ab") as f:
        f.write(zstandard.compress(json.dumps({
            "id": "x1", "path": "extra/x.md", "start_line": 1, "end_line": 1,
            "text": "# x", "metadata": {}, "scores": {}}).encode() + b"\n"))
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["state"] == "ready"
    found = info["import"]["reme_notes_not_indexed"]
    skipped = found["notes"]
    linked = sorted(f"memory/2026-06-12/{p.name}" for p in (away / day.name).iterdir())
    assert sorted(skipped) == sorted([*linked, "digest/wiki/budget-notes.md"]), skipped
    assert found["count"] == len(skipped)
    assert all("memory/2026-06-12 is a symbolic link" in skipped[p] for p in linked)
    assert "budget-notes.md is a symbolic link" in skipped["digest/wiki/budget-notes.md"]
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert f"{found['count']} notes ReMe indexed are not indexed:" in text, text
    assert "memory/2026-06-12 is a symbolic link" in text
    proc = cli(daemon, "--json", "import-qwenpaw", str(copy_fixture(tmp_path / "plain")))
    assert "reme_notes_not_indexed" not in json.loads(proc.stdout)["import"]


def test_a_note_folder_that_is_a_link_is_named_though_reme_never_indexed_it(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A QwenPaw user keeps the notes in a synced folder and links it in as memory/:
    # QwenPaw follows the link, recalld does not. With no chunk store of ReMe's naming
    # those notes, the report said "notes: 0" and nothing more.
    away = tmp_path / "synced"
    (away / "2026-03-02").mkdir(parents=True)
    (away / "2026-03-02" / "n.md").write_text("- the copper lantern\n", "utf-8")
    ws = tmp_path / "writer"
    ws.mkdir()
    (ws / "memory").symlink_to(away, target_is_directory=True)
    (ws / "agent.json").write_text(json.dumps({"id": "writer"}), "utf-8")
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)["import"]["folders_not_indexed"]
    assert found == {
        "memory": "memory is a symbolic link, which recalld does not follow: move or copy "
                  "the folder into the workspace"}, found
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert "memory/ is not indexed: memory is a symbolic link" in text, text
    # A plain workspace has nothing to say.
    plain = tmp_path / "plain"
    (plain / "memory").mkdir(parents=True)
    proc = cli(daemon, "--json", "import-qwenpaw", str(plain))
    assert "folders_not_indexed" not in json.loads(proc.stdout)["import"]


def test_notes_reme_indexed_outside_the_note_folders_are_counted(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A QwenPaw agent with a knowledge base has ReMe index its published folders
    # (knowledge/<bucket>/wiki) beside memory/ and digest/: recalld serves the note
    # folders only, and the report said nothing of the rest.
    ws = copy_fixture(tmp_path / "kb")
    wiki = ws / "knowledge" / "business" / "wiki"
    wiki.mkdir(parents=True)
    records = []
    for n in range(3):
        (wiki / f"p{n}.md").write_text(f"# policy {n}\n", "utf-8")
        records.append({"id": f"k{n}", "path": f"knowledge/business/wiki/p{n}.md",
                        "start_line": 1, "end_line": 1, "text": f"# policy {n}",
                        "metadata": {}, "scores": {}})
    # One deleted since ReMe indexed it: nothing of it is lost, nothing to say.
    records.append({**records[0], "id": "k9", "path": "knowledge/business/wiki/gone.md"})
    with (ws / "mem_metadata" / reme_import.CHUNK_STORE).open("ab") as f:
        f.write(zstandard.compress(b"".join(json.dumps(r).encode() + b"\n"
                                            for r in records)))
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["import"]
    assert report["reme_notes_elsewhere"] == {"knowledge": 3}, report
    assert "reme_notes_not_indexed" not in report
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert ("3 notes ReMe indexed outside the note folders are not indexed (knowledge/: 3)"
            in text), text
    proc = cli(daemon, "--json", "import-qwenpaw", str(copy_fixture(tmp_path / "plain")))
    assert "reme_notes_elsewhere" not in json.loads(proc.stdout)["import"]


def test_notes_whose_name_is_not_utf8_are_named_in_the_report(daemon: DaemonHandle,
                                                               tmp_path: Path) -> None:
    # A note a Latin-1 tool named (ReMe indexes it): recalld cannot index it, and the
    # import says so and how to have it indexed, not a clean count without it.
    ws = copy_fixture(tmp_path / "latin")
    day = os.fsencode(ws / "memory" / "2026-06-21")
    os.mkdir(day)
    with open(day + b"/r\xe9sum\xe9.md", "wb") as f:
        f.write(b"Notes about the quokka survey.\n")
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws), "--agent", "latin")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)["import"]
    assert rep["misnamed"] == {"count": 1, "paths": ["memory/2026-06-21/r\\xe9sum\\xe9.md"]}
    assert rep["notes"] == len(fixture_notes())  # the others are all there
    text = cli(daemon, "import-qwenpaw", str(ws), "--agent", "latin").stdout
    assert ("1 not indexed: their name is not valid UTF-8 (first: "
            "memory/2026-06-21/r\\xe9sum\\xe9.md); rename them to UTF-8") in text, text
