"""``recalld import-qwenpaw`` on ReMe's stores: a damaged dream record, a damaged chunk
store, chunk stores it does not read, stored vectors of other dimensions, each reported."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import zstandard
from conftest import DaemonHandle
from reme_fixture_util import (
    DIMS,
    copy_fixture,
    fixture_provider,
    passage_texts,
    with_list_vectors,
)
from test_import_qwenpaw import agent_json, cli

from recalld.daemon.index import reme_import
from recalld.daemon.store.records import read_foreign_records


def test_a_damaged_reme_dream_record_is_reported(daemon: DaemonHandle, tmp_path: Path) -> None:
    # A copy cut short (a move from another machine interrupted): the notes the record
    # lost are dreamed again, and the report says so rather than "0 consolidated".
    ws = copy_fixture(tmp_path / "cut")
    record = ws / "mem_metadata/file_catalog/dream.jsonl.zst"
    record.write_bytes(record.read_bytes()[: record.stat().st_size // 2])
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    dream = json.loads(proc.stdout)["import"]["dream"]
    assert "truncated" in dream["damaged"] and dream["recognised"] < 20
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert "ReMe's dream record is damaged (" in text, text


def test_a_damaged_reme_resource_record_is_reported(daemon: DaemonHandle,
                                                   tmp_path: Path) -> None:
    # Cut short, the resources ReMe interpreted that it lost are interpreted again (the
    # chat model paid again): the report says so; a whole one says nothing.
    for name, cut in (("cut", True), ("whole", False)):
        ws = copy_fixture(tmp_path / name)
        record = ws / "mem_metadata/file_catalog/resource.jsonl.zst"
        if cut:
            record.write_bytes(record.read_bytes()[: record.stat().st_size // 2])
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws), "--agent", name)
        assert proc.returncode == 0, proc.stderr
        rep = json.loads(proc.stdout)["import"]
        assert ("truncated" in rep["reme_resources_damaged"]) if cut else (
            "reme_resources_damaged" not in rep), rep
    text = cli(daemon, "import-qwenpaw", str(tmp_path / "cut"), "--agent", "cut").stdout
    assert "ReMe's resource record is damaged (" in text, text


def test_a_damaged_reme_chunk_store_is_reported(daemon: DaemonHandle, tmp_path: Path) -> None:
    # Cut short, or with a record that does not parse: what it lost is chunked and
    # embedded anew, and the report says why rather than only "0 chunks of 0 notes".
    cut = copy_fixture(tmp_path / "cut")
    store = cut / "mem_metadata" / reme_import.CHUNK_STORE
    whole = store.read_bytes()
    store.write_bytes(whole[: len(whole) // 2])
    torn = copy_fixture(tmp_path / "torn")
    (torn / "mem_metadata" / reme_import.CHUNK_STORE).write_bytes(
        whole + zstandard.compress(b'{"path": "memory/x.md", "te\n'))
    for ws, why, chunks in ((cut, "truncated", 0), (torn, "1 unreadable record(s)", 38)):
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        found = json.loads(proc.stdout)["import"]["reme_store"]
        assert why in found["damaged"] and found["chunks"] == chunks, found
        text = cli(daemon, "import-qwenpaw", str(ws)).stdout
        assert "ReMe's chunk store is damaged (" in text, text
    proc = cli(daemon, "--json", "import-qwenpaw", str(copy_fixture(tmp_path / "whole")))
    assert "damaged" not in json.loads(proc.stdout)["import"]["reme_store"]


def test_reme_chunk_stores_not_read_are_reported(daemon: DaemonHandle, tmp_path: Path) -> None:
    # A ReMe configured with another store_version (or file store name), or a later
    # release, keeps its chunks under another name: recalld reads only 0.4.2's default
    # store, and the report names the others rather than saying nothing about them.
    moved = copy_fixture(tmp_path / "moved")
    store = moved / "mem_metadata" / reme_import.CHUNK_STORE
    store.rename(store.with_name("file_chunks_default_v2.jsonl.zst"))
    both = copy_fixture(tmp_path / "both")
    shutil.copy(both / "mem_metadata" / reme_import.CHUNK_STORE,
                both / "mem_metadata/file_store/file_chunks_notes_v1.jsonl.zst")
    for ws, name, read in ((moved, "file_chunks_default_v2.jsonl.zst", False),
                           (both, "file_chunks_notes_v1.jsonl.zst", True)):
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        rep = json.loads(proc.stdout)["import"]
        assert rep["reme_stores_not_read"] == [f"file_store/{name}"], rep
        assert (rep["reme_store"] is not None) is read
        assert list(rep["reme_stores_unread"]) == [f"mem_metadata/file_store/{name}"], rep
        text = cli(daemon, "import-qwenpaw", str(ws)).stdout
        assert f"mem_metadata/file_store/{name} (" in text, text
    proc = cli(daemon, "--json", "import-qwenpaw", str(copy_fixture(tmp_path / "plain")))
    assert "reme_stores_not_read" not in json.loads(proc.stdout)["import"]
    assert "reme_stores_unread" not in json.loads(proc.stdout)["import"]


def test_stored_vectors_of_other_dimensions_are_reported(daemon: DaemonHandle,
                                                         tmp_path: Path) -> None:
    # ReMe kept no cache file (its cache off), and the agent's dimensions changed since
    # ReMe embedded: none of its stored vectors can serve, and the report says why.
    ws = copy_fixture(tmp_path / "dims")
    shutil.rmtree(ws / "mem_metadata/embedding_store")
    config = agent_json()
    config["running"]["reme_light_memory_config"]["embedding_model_config"].update(
        dimensions=DIMS // 2, base_url="http://127.0.0.1:9/v1")
    (ws / "agent.json").write_text(json.dumps(config), "utf-8")
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    vec = json.loads(proc.stdout)["import"]["vectors"]
    assert vec["reused_from_reme"] == 0
    assert vec["reme"]["store_vectors_other_dims"] == vec["reme"]["store_vectors"] > 0
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert "of ReMe's stored vectors have other dimensions than configured" in text, text


def test_an_older_remes_stores_are_named_with_their_size(daemon: DaemonHandle,
                                                         tmp_path: Path) -> None:
    # CoPaw 1.0 ran ReMe 0.3 in the workspace folder itself: its chunk store (local
    # backend: <store>_chunks.jsonl, chroma: chroma.sqlite3, zvec: a folder) and its
    # embedding cache are not read, so their vectors are paid for again: the report
    # names each with its size and why rather than saying nothing.
    ws = copy_fixture(tmp_path / "older")
    chunk = {"id": "c1", "path": "memory/2026-03-01.md", "source": "memory",
             "start_line": 1, "end_line": 2, "text": "Ärger über den Zug\n火车晚点",
             "hash": "h", "embedding": [0.25] * 8, "metadata": {}}
    stores = {"file_store/copaw_chunks.jsonl": json.dumps(chunk, ensure_ascii=False),
              "file_store/chroma.sqlite3": "x" * 1000,
              "file_store/chunks_copaw/data.bin": "y" * 300,
              "embedding_cache/embedding_cache.jsonl": json.dumps({"k" * 64: [0.5] * 8})}
    for rel, body in stores.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(body, "utf-8")
    (ws / "file_store/copaw_file_metadata.json").write_text("{}", "utf-8")  # no store
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)["import"]
    unread = rep["reme_stores_unread"]
    sizes = {rel: len(body.encode()) for rel, body in stores.items()}
    sizes["file_store/chunks_copaw"] = sizes.pop("file_store/chunks_copaw/data.bin")
    assert {rel: found["bytes"] for rel, found in unread.items()} == sizes, unread
    assert all("ReMe 0.3" in found["why"] and "embedded anew" in found["why"]
               for found in unread.values()), unread
    assert "reme_stores_not_read" not in rep  # those are ReMe 0.4's only
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert f"file_store/copaw_chunks.jsonl ({sizes['file_store/copaw_chunks.jsonl']} bytes)" \
        in text, text


def test_a_link_in_place_of_an_older_remes_folder_is_passed_by(daemon: DaemonHandle,
                                                              tmp_path: Path) -> None:
    # Only names and sizes are read, never through a link: a file_store folder that is a
    # link to another folder is not listed, and the workspace stays open.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "copaw_chunks.jsonl").write_text("{}", "utf-8")
    ws = copy_fixture(tmp_path / "linked")
    (ws / "file_store").symlink_to(elsewhere)
    (ws / "embedding_cache").symlink_to(elsewhere)
    (elsewhere / "embedding_cache.jsonl").write_text("{}", "utf-8")
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    assert "reme_stores_unread" not in json.loads(proc.stdout)["import"]
    again = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert again.returncode == 0, again.stderr


def test_vectors_reme_0_4_0_stored_as_lists_are_reused(daemon: DaemonHandle,
                                                       tmp_path: Path) -> None:
    # ReMe 0.4.0 and 0.4.1 wrote each chunk's vector as "embedding", a list of numbers,
    # in the same chunk store (ReMe still reads those): they were not read, and every
    # chunk was paid for again. Its embedding cache has no vector space in its name, and
    # is not read: the store's vectors are reused as 0.4.2's are without a cache.
    ws = copy_fixture(tmp_path / "older")
    store = ws / "mem_metadata" / reme_import.CHUNK_STORE
    count = with_list_vectors(ws)
    zero = {**read_foreign_records(store).records[0], "id": "zero", "embedding": [0.0] * DIMS}
    for npz in (ws / "mem_metadata" / reme_import.EMBEDDING_DIR).iterdir():
        npz.rename(npz.with_name("default_v1.npz"))  # 0.4.0's name: no vector space
    found = reme_import.read_store(ws / "mem_metadata")
    assert found is not None and len(found.vectors) == count == len(found)
    (ws / "agent.json").write_text(json.dumps(agent_json()), "utf-8")
    with fixture_provider() as fake:
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        vec = json.loads(proc.stdout)["import"]["vectors"]
        assert vec["reused_from_reme"] == len(found) and vec["to_embed"] == 0, vec
        assert passage_texts(fake) == []
        unread = json.loads(proc.stdout)["import"]["reme_stores_unread"]
        cache = "mem_metadata/embedding_store/default_v1.npz"
        assert list(unread) == [cache] and "0.4.0" in unread[cache]["why"], unread
        assert unread[cache]["bytes"] == (ws / cache).stat().st_size
    # All zeros is what ReMe stores with its embedding off: no vector.
    store.write_bytes(zstandard.compress(json.dumps(zero).encode() + b"\n"))
    again = reme_import.read_store(ws / "mem_metadata")
    assert again is not None and again.vectors == [] and len(again) == 1


def test_stores_not_read_with_odd_names_are_shown_as_paths_are(daemon: DaemonHandle,
                                                               tmp_path: Path) -> None:
    # A store named in bytes that are not UTF-8 failed the whole import with an internal
    # error; one whose name holds what looks like a key would have shown it. They are
    # named as the report shows paths: \xNN for such bytes, a credential masked.
    ws = copy_fixture(tmp_path / "odd")
    folder = os.fsencode(ws / "mem_metadata" / "file_store")
    key = "sk-" + "q7" * 16
    for name in (b"file_chunks_\xff\xfe_v2.jsonl.zst",
                 f"file_chunks_api_key={key}_v3.jsonl.zst".encode()):
        Path(os.fsdecode(folder + b"/" + name)).write_bytes(b"x" * 7)
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)["import"]
    unread = rep["reme_stores_unread"]
    assert "mem_metadata/file_store/file_chunks_\\xff\\xfe_v2.jsonl.zst" in unread, unread
    assert len(unread) == 2 and all(v["bytes"] == 7 for v in unread.values()), unread
    assert key not in proc.stdout and "[REDACTED]" in json.dumps(unread)
    text = cli(daemon, "import-qwenpaw", str(ws))
    assert text.returncode == 0 and key not in text.stdout, text.stdout
