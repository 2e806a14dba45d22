"""What ReMe's folders hold besides ReMe's files: a FIFO or a device named like one of its
cache files or chunk records is passed by (named in the report), never waited on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import zstandard
from reme_fixture_util import copy_fixture, embedding_toml, fixture_provider, passage_texts
from test_reme_import import wait_full
from test_reme_start import reme_workspace, report
from waits import wait_for

from recalld.daemon.index import reme_import
from recalld.daemon.store.records import read_foreign_records

SPACE = "78677232862f"  # the fixture's space (tests/fixtures/reme-0.4.2/mem_metadata)


def test_fifos_named_like_remes_files_do_not_hold_the_import(daemon_factory: Any,
                                                              tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "ws")
    meta = ws / "mem_metadata"
    # Nobody ever writes to them: a read would wait for good.
    os.mkfifo(meta / "embedding_store" / f"other_v1_{SPACE}.npz")  # of the configured space
    os.mkfifo(meta / "embedding_store" / "default_v1_0123456789ab.npz")  # of another one
    os.mkfifo(meta / "file_graph" / "default.jsonl.zst.new")
    (meta / "file_graph" / "default.jsonl.zst").unlink()
    os.mkfifo(meta / "file_graph" / "default.jsonl.zst")  # where older versions wrote
    with fixture_provider() as fake:
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}'
                           '[daemon]\npersist_delay_s = 0.05\n')
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        assert passage_texts(fake) == []  # ReMe's own cache file still gave every vector
        reme = d.call("workspace.open", {"agent_id": "w", "path": str(ws),
                                         "import_report": True})["import"]["vectors"]["reme"]
        assert "a device, FIFO or socket" in reme["refused"][f"other_v1_{SPACE}.npz"], reme
        assert "0123456789ab" in reme["other_spaces"], reme
        assert st["reused_vectors"] == st["total"]
        assert d.stop() == 0
    assert reme_import.remove_own_mirrors(meta) == []


def test_remes_chunks_with_a_key_in_their_frontmatter_stay_remes(daemon_factory: Any,
                                                                 tmp_path: Path) -> None:
    # A ReMe set to copy each note's frontmatter into its chunks' metadata
    # (include_frontmatter_in_metadata) writes a note's `key:` (and `heading:`) there
    # too: those chunks are ReMe's all the same. Their boundaries are kept, and the
    # store is never removed as a copy of the index an older recalld wrote.
    ws = copy_fixture(tmp_path / "ws")
    store = ws / "mem_metadata" / reme_import.CHUNK_STORE
    records = read_foreign_records(store).records
    for i, rec in enumerate(records):
        rec["metadata"] = {"name": "runbook", "key": i if i % 2 else "deploy",
                           "heading": "Ops"}
    store.write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(orjson.dumps(rec) + b"\n" for rec in records)))
    written = store.read_bytes()
    d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n[daemon]\npersist_delay_s = 0.05\n')
    d.call("index.sync", {"agent_id": "w"})
    rep = d.call("workspace.open", {"agent_id": "w", "path": str(ws),
                                    "import_report": True})["import"]
    assert rep["reme_store"]["skipped"] == 0, rep["reme_store"]
    assert rep["chunks"]["reme_boundaries"] == len(records), rep["chunks"]
    wait_for(lambda: list((ws / "mem_metadata" / "index").glob("MANIFEST-*")), "a manifest")
    d.call("workspace.close", {"agent_id": "w"})
    d.call("workspace.open", {"agent_id": "w", "path": str(ws)})  # from its saved index
    d.call("index.sync", {"agent_id": "w"})
    assert store.read_bytes() == written
    assert d.stop() == 0


def test_a_chunk_repeated_in_remes_store_is_one_chunk(daemon_factory: Any,
                                                      tmp_path: Path) -> None:
    # ReMe's store written twice over in part (an upsert appended, a copy merged): the
    # same chunk under the same id on two lines, once with an older text, or the same
    # chunk with no id. ReMe keeps the last of an id; the notes keep ReMe's boundaries
    # and vectors, and nothing is paid.
    ws, config = reme_workspace(tmp_path)
    store = ws / "mem_metadata" / reme_import.CHUNK_STORE
    records = read_foreign_records(store).records
    stale = [{**rec, "text": rec["text"] + "\nsaid before an edit"} for rec in records[:3]]
    without_id = {k: v for k, v in records[3].items() if k != "id"}
    again = [*stale, *records, *records[:2], without_id, without_id]
    store.write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(orjson.dumps(rec) + b"\n" for rec in again)))
    found = reme_import.read_store(ws / "mem_metadata")
    assert found is not None and len(found) == len(found.vectors) == len(records)
    with fixture_provider() as fake:
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        rep = report(d, ws)
        assert passage_texts(fake) == []
        assert rep["chunks"] == {"total": len(records), "reme_boundaries": len(records)}, rep
        assert rep["reme_store"]["chunks"] == len(records), rep["reme_store"]
        assert rep["reme_store"]["skipped"] == len(again) - len(records), rep["reme_store"]
        assert st["reused_vectors"] == st["total"] == len(records)
        assert d.stop() == 0


def test_chunks_of_paths_no_note_can_have_are_skipped(daemon_factory: Any,
                                                      tmp_path: Path) -> None:
    # ReMe's chunk store damaged or written by something else: chunks of a path with a
    # NUL byte, one leaving the workspace, an absolute one, one too long for the file
    # system. None of them is a note's; the report counts only the notes it can have.
    ws, config = reme_workspace(tmp_path)
    store = ws / "mem_metadata" / reme_import.CHUNK_STORE
    records = read_foreign_records(store).records
    notes = {rec["path"] for rec in records}
    odd = ["memory/2026-06-10/a\x00b.md", "memory/../../outside.md", "/etc/hosts.md",
           "memory/2026-06-10/" + "n" * 300 + ".md"]
    more = [{**records[0], "id": f"{i:064x}", "path": p} for i, p in enumerate(odd)]
    store.write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(orjson.dumps(rec) + b"\n" for rec in [*records, *more])))
    found = reme_import.read_store(ws / "mem_metadata")
    assert found is not None and set(found.chunks) == notes
    with fixture_provider() as fake:
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        wait_full(d)
        rep = report(d, ws)["reme_store"]
        assert rep["notes"] == len(notes) and rep["skipped"] == len(odd), rep
        assert passage_texts(fake) == []
        assert d.stop() == 0
