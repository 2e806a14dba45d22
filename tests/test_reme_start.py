"""A start of a workspace ReMe (QwenPaw) indexed reads ReMe's chunk store only when it
needs something of it: a restart reads a small record, a note prepared again reads the
boundaries, a lost cache or a store ReMe changed is read and seeded again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from fakes.provider_server import fake_vector, unit
from reme_fixture_util import (
    DIMS,
    copy_fixture,
    embedding_toml,
    fixture_provider,
    passage_texts,
    with_list_vectors,
)
from test_reme_import import vectors_status, wait_full
from waits import wait_for

from recalld.daemon.index import reme_import
from recalld.daemon.index.embedcache import encode_f16
from recalld.daemon.index.reme_source import SEEN
from recalld.daemon.store.fsio import REAL
from recalld.daemon.store.records import read_foreign_records, read_records, write_records

READ = "ReMe's chunk store holds"


def index_status(d: Any, agent: str = "w") -> dict[str, Any]:
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == agent)
    out: dict[str, Any] = ws["index"]
    return out


def settled(d: Any) -> bool:
    index = index_status(d)
    return bool(index["last_commit"]) and not index["uncommitted_changes"]


def report(d: Any, ws: Path) -> dict[str, Any]:
    out: dict[str, Any] = d.call("workspace.open", {"agent_id": "w", "path": str(ws),
                                                    "import_report": True})["import"]
    return out


def reme_workspace(tmp_path: Path) -> tuple[Path, str]:
    """A copy of the ReMe fixture workspace and a configuration serving it with the
    fixture's embedding model (and a short persist delay)."""
    ws = copy_fixture(tmp_path / "ws")
    return ws, (f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}'
                '[daemon]\npersist_delay_s = 0.05\n')


def restarted(daemon_factory: Any, d: Any, config: str) -> tuple[Any, dict[str, Any]]:
    """A daemon on ``d``'s data, once its index is synced and every vector is there; and
    its vectors' status."""
    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
    d2.call("index.sync", {"agent_id": "w"})
    return d2, wait_full(d2)


def first_import(daemon_factory: Any, ws: Path, config: str) -> tuple[Any, dict[str, Any]]:
    d = daemon_factory(config)
    d.call("index.sync", {"agent_id": "w"})
    wait_full(d)
    wait_for(lambda: settled(d), "the vectors committed")
    got = report(d, ws)
    assert READ in d.log() and (ws / "mem_metadata" / SEEN).is_file()
    assert d.stop() == 0
    return d, got


def test_a_restart_reads_remes_store_only_for_a_note_prepared_again(
        daemon_factory: Any, tmp_path: Path) -> None:
    ws, config = reme_workspace(tmp_path)
    with fixture_provider() as fake:
        d, before = first_import(daemon_factory, ws, config)
        assert before["chunks"]["reme_boundaries"] == before["chunks"]["total"]
        d2, _ = restarted(daemon_factory, d, config)
        again = report(d2, ws)
        # Nothing of the store was read, and the report says what the first one said.
        assert READ not in d2.log()
        for part in ("notes", "chunks", "reme_store", "vectors"):
            assert again[part] == before[part], part
        # A note ReMe does not know, with every note of ReMe's where it was (none of
        # them moved there): nothing of the store is read for it either.
        (ws / "memory" / "2026-06-20").mkdir()
        (ws / "memory" / "2026-06-20" / "kites.md").write_text("# Kites\nflown on the dunes\n")
        d2.call("index.sync", {"agent_id": "w"})
        wait_full(d2)
        assert READ not in d2.log()
        # A note touched (a checkout, a copy) is prepared again: ReMe's boundaries are
        # read for it and kept, and nothing is paid for.
        note = "memory/2026-06-14/travel-3.md"
        os.utime(ws / note, ns=(1, 1))
        d2.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: READ in d2.log(), "the store read for the touched note")
        wait_full(d2)
        assert report(d2, ws)["chunks"]["reme_boundaries"] == before["chunks"]["total"]
        paid = passage_texts(fake)
        assert paid and all("dunes" in t for t in paid), paid
        assert d2.stop() == 0


def test_a_lost_index_and_cache_are_seeded_from_remes_store_again(
        daemon_factory: Any, tmp_path: Path) -> None:
    ws, config = reme_workspace(tmp_path)
    with fixture_provider() as fake:
        d, before = first_import(daemon_factory, ws, config)
        # recalld's own state is gone (its record of ReMe's store stays).
        shutil.rmtree(ws / "mem_metadata" / "index")
        shutil.rmtree(d.data_dir / "state" / "embeddings")
        d2, st = restarted(daemon_factory, d, config)
        assert st["reused_vectors"] == st["total"] == before["chunks"]["total"]
        assert passage_texts(fake) == []
        assert d2.stop() == 0


def test_a_store_reme_changed_between_starts_is_read_at_the_start(
        daemon_factory: Any, tmp_path: Path) -> None:
    ws, config = reme_workspace(tmp_path)
    with fixture_provider() as fake:
        d, before = first_import(daemon_factory, ws, config)
        # ReMe indexed a new note meanwhile: its chunk and vector are in the store.
        note = "memory/2026-06-18/garden.md"
        text = "# Garden\n\nThe tomatoes need staking this week."
        (ws / note).parent.mkdir()
        (ws / note).write_text(text + "\n", "utf-8")
        store = ws / "mem_metadata" / reme_import.CHUNK_STORE
        records = read_foreign_records(store).records
        records.append({"path": note, "start_line": 1, "end_line": 3, "text": text,
                        "metadata": {},
                        "_embedding_f16_b64": encode_f16(unit(fake_vector(text, DIMS)))})
        write_records(REAL, store, records)
        d2, _ = restarted(daemon_factory, d, config)
        assert READ in d2.log()
        # Counted once the start's pass has told the vectors of it (a status read between
        # the two may show every vector of the notes known before, coverage 1.0).
        wait_for(lambda: vectors_status(d2)["total"] == before["chunks"]["total"] + 1,
                 "the new note's chunk counted")
        st = wait_full(d2)
        assert st["total"] == before["chunks"]["total"] + 1
        assert report(d2, ws)["reme_store"]["chunks"] == before["reme_store"]["chunks"] + 1
        assert passage_texts(fake) == []
        assert d2.stop() == 0


def test_a_record_of_an_older_reader_is_not_trusted(daemon_factory: Any,
                                                    tmp_path: Path) -> None:
    # recalld once read no vector from a store ReMe 0.4.0 or 0.4.1 wrote (lists of
    # numbers) and recorded "no vectors" for it. That record is not trusted: the store is
    # read again, and its vectors are reused rather than paid for again.
    ws, config = reme_workspace(tmp_path)
    with_list_vectors(ws)
    with fixture_provider() as fake:
        d, before = first_import(daemon_factory, ws, config)
        assert before["vectors"]["reused_from_reme"] == before["chunks"]["total"]
        seen = ws / "mem_metadata" / SEEN
        rec = read_records(seen)[0]
        old = {**rec, "version": 1, "summary": {**rec["summary"], "vectors": 0},
               "seed": {**rec["seed"], "hashes": []}}
        write_records(REAL, seen, [old])
        shutil.rmtree(ws / "mem_metadata" / "index")
        shutil.rmtree(d.data_dir / "state" / "embeddings")
        d2, st = restarted(daemon_factory, d, config)
        assert READ in d2.log()
        assert st["reused_vectors"] == st["total"] == before["chunks"]["total"], st
        assert passage_texts(fake) == []
        assert d2.stop() == 0
