"""A workspace made by the real ReMe 0.4.2 reuses what ReMe paid for (vectors, chunking)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reme_fixture_util import (
    DIMS,
    FIXTURE,
    MODEL,
    copy_fixture,
    embedding_toml,
    fixture_provider,
    passage_texts,
)
from waits import wait_for, wait_value

from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.index import reme_import
from recalld.daemon.index.reme_chunks import ReMeChunk, adopt_chunks, still_says

CONFIG = EmbeddingModelConfig(backend="openai", base_url="http://127.0.0.1:48231/v1",
                              model_name=MODEL, dimensions=DIMS)


def vectors_status(d: Any, agent: str = "w") -> dict[str, Any]:
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == agent)
    out: dict[str, Any] = ws["index"]["vectors"]
    return out


def wait_full(d: Any, agent: str = "w", deadline_s: float = 120.0) -> dict[str, Any]:
    return wait_value(lambda: vectors_status(d, agent),
                      lambda st: st["total"] and st["coverage"] == 1.0
                      and st["state"] in ("idle", "waiting"),
                      f"every vector of {agent}", deadline_s)


# -------------------------------------------------------------------- reading ReMe's files


def test_remes_chunk_store_and_cache_are_read() -> None:
    meta = FIXTURE / "mem_metadata"
    store = reme_import.read_store(meta)
    assert store is not None and store.skipped == 0
    assert len(store) == len(store.vectors) == store.records > 30
    cache = reme_import.read_embeddings(meta, CONFIG)
    assert cache.space_known and not cache.refused and not cache.other_spaces
    # Every stored chunk's text finds its vector in ReMe's cache under ReMe's own key.
    keys = {reme_import.text_key(t, CONFIG.max_input_length) for t, _ in store.vectors}
    assert keys <= set(cache.vectors)
    other = reme_import.read_embeddings(meta, EmbeddingModelConfig(
        backend="openai", base_url=CONFIG.base_url, model_name="another", dimensions=DIMS))
    assert not other.vectors and other.other_spaces and not other.space_known


def test_remes_boundaries_are_kept_only_while_the_note_matches(tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "ws")
    store = reme_import.read_store(ws / "mem_metadata")
    assert store is not None
    for path, chunks in store.chunks.items():
        got = adopt_chunks(path, (ws / path).read_text("utf-8"), chunks)
        assert got is not None, path
        assert [(c.start_line, c.end_line, c.text) for c in got] == [
            (c.start_line, c.end_line, c.text) for c in chunks]
    long_note = max(store.chunks, key=lambda p: len(store.chunks[p]))
    assert len(store.chunks[long_note]) > 1
    text = (ws / long_note).read_text("utf-8")
    # Frontmatter stays searchable: it is the first chunk's heading (keyword side only).
    fm_note = next(p for p in store.chunks if (ws / p).read_text("utf-8").startswith("---"))
    first = adopt_chunks(fm_note, (ws / fm_note).read_text("utf-8"), store.chunks[fm_note])
    assert first is not None and "description:" in first[0].index_text
    assert "description:" not in first[0].text
    # An edit inside a chunk, a line added after the last one, a line removed: the
    # chunks that still say what the note says are kept, the rest is recalld's.
    reme = store.chunks[long_note]
    assert [(c.start_line, c.end_line) for c in reme] == [(1, 56), (58, 64)]
    assert still_says(long_note, text, reme)
    edited = text.replace("sentence 3", "sentence three", 1)
    got = adopt_chunks(long_note, edited, reme)
    assert got is not None and not still_says(long_note, edited, reme)
    assert [c.text for c in got if c.metadata.get("chunker")] == [reme[1].text]
    assert all(c.end_line <= 56 for c in got if not c.metadata.get("chunker"))
    assert "sentence three" in "".join(c.text for c in got)
    got = adopt_chunks(long_note, text + "\nA new line.\n", reme)
    assert got is not None and [c.text for c in got] == [c.text for c in reme] + ["A new line."]
    assert not still_says(long_note, text + "\nA new line.\n", reme)
    lines = text.split("\n")
    heading = max(i for i, ln in enumerate(lines) if ln.startswith("## Section"))
    got = adopt_chunks(long_note, "\n".join(lines[:heading] + lines[heading + 1:]), reme)
    assert got is not None and [c.text for c in got if c.metadata.get("chunker")] == [
        reme[0].text]
    # Frontmatter ReMe leaves out though recalld cannot read its YAML (an anchor, a key
    # twice): ReMe's chunks still fit, and the block stays searchable as their heading.
    for old, new in (("description: notes", "description: &d notes"),
                     ("description: notes", "name: again\ndescription: notes")):
        odd = (ws / fm_note).read_text("utf-8").replace(old, new, 1)
        shift = odd.count("\n") - (ws / fm_note).read_text("utf-8").count("\n")
        chunks = [ReMeChunk(c.start_line + shift, c.end_line + shift, c.text)
                  for c in store.chunks[fm_note]]
        got = adopt_chunks(fm_note, odd, chunks)
        assert got is not None and new in got[0].index_text, new
    # An edit of a number that keeps its digits is an edit: ReMe's text says otherwise.
    rel = next(p for p in store.chunks if "v2.3.1" in (ws / p).read_text("utf-8"))
    note = (ws / rel).read_text("utf-8")
    for old, new in (("v2.3.1", "v23.1"), ("v2.3.1", "v2-3-1"), ("2026-06", "2026-0-6")):
        assert adopt_chunks(rel, note.replace(old, new), store.chunks[rel]) is None, new
    # Lines added before a chunk move it: it is kept where its lines are now.
    moved = [*lines[:56], "", "Two lines more.", *lines[56:]]
    got = adopt_chunks(long_note, "\n".join(moved), reme)
    assert got is not None and [(c.start_line, c.end_line, c.text) for c in got] == [
        (1, 56, reme[0].text), (58, 58, "Two lines more."), (60, 66, reme[1].text)]


def test_an_unsafe_or_odd_embedding_cache_is_refused(tmp_path: Path) -> None:
    meta = tmp_path / "mem_metadata"
    folder = meta / "embedding_store"
    folder.mkdir(parents=True)
    name = f"default_v1_{reme_import.space_id(CONFIG)}.npz"
    keys = np.array(["a" * 64], dtype=str)
    # Object arrays need pickle to load: refused, never unpickled.
    np.savez(folder / name, keys=np.array(["a" * 64], dtype=object),
             embeddings=np.zeros((1, DIMS), np.float16))
    got = reme_import.read_embeddings(meta, CONFIG)
    assert not got.vectors and name in got.refused
    np.savez(folder / name, keys=keys, embeddings=np.zeros((1, DIMS + 1), np.float16))
    assert "dimensions" in reme_import.read_embeddings(meta, CONFIG).refused[name]
    # Fewer vectors than keys (a write cut short): which key is which vector is unknown.
    np.savez(folder / name, keys=np.array(["a" * 64, "b" * 64]),
             embeddings=np.ones((1, DIMS), np.float16))
    assert "[1, 64] for 2 keys" in reme_import.read_embeddings(meta, CONFIG).refused[name]
    np.savez(folder / name, keys=keys, embeddings=np.zeros((1, DIMS), np.float16),
             extra=np.zeros(1))
    assert "members" in reme_import.read_embeddings(meta, CONFIG).refused[name]
    (folder / name).write_bytes(b"PK\x03\x04 not really a zip")
    assert "archive" in reme_import.read_embeddings(meta, CONFIG).refused[name]
    np.savez(folder / name, keys=keys, embeddings=np.full((1, DIMS), np.nan, np.float16))
    assert "non-finite" in reme_import.read_embeddings(meta, CONFIG).refused[name]
    np.savez(folder / name, keys=keys, embeddings=np.ones((1, DIMS), np.float16))
    ok = reme_import.read_embeddings(meta, CONFIG)
    assert list(ok.vectors) == ["a" * 64] and not ok.refused
    assert zipfile.is_zipfile(folder / name)


# ------------------------------------------------------------------- through the daemon


def test_a_reme_workspace_reuses_remes_vectors(daemon_factory: Any, tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "ws")
    store = reme_import.read_store(ws / "mem_metadata")
    assert store is not None
    with fixture_provider() as fake:
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}'
                           '[daemon]\npersist_delay_s = 0.05\n')
        synced = d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        asked = passage_texts(fake)
        # Every chunk is ReMe's (its boundaries kept), and its vector came from ReMe.
        assert synced["chunks"] == st["total"] == len(store)
        assert (st["total"] - len(asked)) / st["total"] >= 0.9
        assert asked == [], asked
        res = d.call("memory.search", {"agent_id": "w", "query": "sourdough bulk ferment"})
        assert res["mode"] == "hybrid" and "cooking" in res["results"][0]["path"]
        # A changed note is chunked by recalld and only its new chunks are paid for.
        before = len(passage_texts(fake))  # the query's vector
        edited = "memory/2026-06-12/budget-0.md"
        with (ws / edited).open("a", encoding="utf-8") as f:
            f.write("\nThe GPU reservation ends in August.\n")
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: len(passage_texts(fake)) > before, "the edit's passages")
        wait_full(d)
        fresh = passage_texts(fake)[before:]
        assert fresh and all("GPU reservation" in t or "budget" in t.lower() for t in fresh)
        assert len(fresh) <= 3
        assert d.stop() == 0
    # ReMe's files are left as ReMe wrote them.
    for rel in ("file_store/file_chunks_default_v1.jsonl.zst", "file_graph/default.jsonl.zst",
                "file_catalog/dream.jsonl.zst"):
        assert (ws / "mem_metadata" / rel).read_bytes() == (
            FIXTURE / "mem_metadata" / rel).read_bytes(), rel


def test_vectors_of_another_space_are_not_reused(daemon_factory: Any, tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "ws")
    with fixture_provider() as fake:
        emb = embedding_toml().replace(f'model_name = "{MODEL}"', 'model_name = "other"')
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{emb}')
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        # Every chunk paid for (a long one as its windows), each text once.
        sent = passage_texts(fake)
        assert len(sent) >= st["total"] and len(set(sent)) == len(sent)
        assert st["provider_texts"] == len(sent)
        assert st["reused_vectors"] == 0
        assert d.stop() == 0


# Ids the real ReMe 0.4.2 gives the spaces QwenPaw configures (its ``as_embedding``
# component: backend, model, dimensions, and a credential holding ``base_url`` / ``host``
# only when the user named one), computed by ReMe's wrappers, configured or with the
# model QwenPaw injects alike.
REME_SPACES = [
    ("openai", "text-embedding-v4", 1024, "", "9fb062aba396"),
    ("dashscope", "text-embedding-v4", 1024, "", "0a3b232e653e"),
    ("dashscope_multimodal", "mm", 1024, "", "cbd50eef55f7"),
    ("gemini", "g", 768, "", "71bd1518de7b"),
    ("ollama", "nomic", 768, "", "f1b2f269b344"),
    ("ollama", "nomic", 768, "http://gpu:11434/", "ae590daaa625"),
    ("openai", "m", 64, "http://127.0.0.1:48231/v1/", "9d0159606787"),
]


@pytest.mark.parametrize(("backend", "model", "dims", "base_url", "expected"), REME_SPACES)
def test_remes_space_id_for_each_qwenpaw_setup(backend: str, model: str, dims: int,
                                               base_url: str, expected: str) -> None:
    config = EmbeddingModelConfig(backend=backend, model_name=model, dimensions=dims,
                                  base_url=base_url)
    assert reme_import.space_id(config) == expected
    if not base_url:
        # Naming the endpoint recalld calls when none is named is the same service.
        from recalld.daemon.providers.embedding_formats import DEFAULT_BASE_URLS

        named = EmbeddingModelConfig(backend=backend, model_name=model, dimensions=dims,
                                     base_url=DEFAULT_BASE_URLS[backend] + "/")
        assert reme_import.space_id(named) == expected
    assert reme_import.space_id(EmbeddingModelConfig(
        backend=backend, model_name=model, dimensions=dims + 1, base_url=base_url)) != expected


REME_VENV = Path(__file__).resolve().parents[1] / "bench-results" / ".reme-venv" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not REME_VENV.exists(),
                    reason="needs ReMe 0.4.2 in bench-results/.reme-venv (made by "
                           "tests/bench/reme_baseline.py or reme_fixture.py)")
def test_back_and_forth_between_recalld_and_reme(daemon_factory: Any, tmp_path: Path) -> None:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
    import reme_fixture

    ws = copy_fixture(tmp_path / "ws")
    stored = reme_import.read_store(ws / "mem_metadata")
    assert stored is not None
    edited = "memory/2026-06-16/deploy-2.md"
    with fixture_provider() as fake:
        config = (f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}'
                  '[daemon]\npersist_delay_s = 0.05\n')
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        wait_full(d)
        with (ws / edited).open("a", encoding="utf-8") as f:
            f.write("\nThe pool size went back to 50 after the fix.\n")
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: passage_texts(fake), "the edit's passages")
        wait_full(d)
        assert d.stop() == 0
        # ReMe opens what recalld served: its chunks load as it left them, nothing is
        # rebuilt; only the note edited meanwhile is indexed again.
        got = reme_fixture.check(ws, python=REME_VENV, base_url=fake.url + "/v1")
        assert got["loaded_chunks"] == got["loaded_vectors"] == len(stored), got
        assert got["reindexed_files"] == [edited], got
        assert got["dream_catalog"] == 20
        # While on ReMe's side a note changes and one is added; ReMe embeds them.
        changed, added = "memory/2026-06-17/travel-0.md", "memory/2026-06-18/garden.md"
        with (ws / changed).open("a", encoding="utf-8") as f:
            f.write("\nThe hotel confirmed the late check-in.\n")
        (ws / added).parent.mkdir()
        (ws / added).write_text("# Garden\n\nThe tomatoes need staking this week.\n",
                                "utf-8")
        got = reme_fixture.check(ws, python=REME_VENV, base_url=fake.url + "/v1")
        assert got["reindexed_files"] == [changed, added], got
        # Back to recalld: what ReMe embedded meanwhile is reused, not bought again.
        before = len(passage_texts(fake))
        d2 = daemon_factory(config)
        d2.call("index.sync", {"agent_id": "w"})
        found = d2.call("memory.search", {"agent_id": "w", "query": "tomatoes staking"})
        assert found["results"][0]["path"] == added
        wait_value(lambda: vectors_status(d2), lambda st: st["embedded"] >= st["total"],
                   "every chunk embedded")
        asked = passage_texts(fake)[before:]
        assert asked == ["tomatoes staking"], asked  # the query's own vector only
        assert d2.stop() == 0


def test_copies_an_older_version_wrote_under_remes_names_go(daemon_factory: Any,
                                                            tmp_path: Path) -> None:
    from recalld.daemon.store.fsio import REAL
    from recalld.daemon.store.records import write_records

    ws = tmp_path / "ws"
    (ws / "memory/2026-07-01").mkdir(parents=True)
    (ws / "memory/2026-07-01/a.md").write_text("# A\n\nwalrus facts\n", "utf-8")
    d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n[daemon]\npersist_delay_s = 0.05\n')
    d.call("index.sync", {"agent_id": "w"})
    wait_for(lambda: list((ws / "mem_metadata" / "index").glob("MANIFEST-*")), "a manifest")
    assert d.stop() == 0
    meta = ws / "mem_metadata"
    old = {"file_store/file_chunks_default_v1.jsonl.zst": {
               "id": "x", "path": "memory/2026-07-01/a.md", "start_line": 1, "end_line": 3,
               "text": "# A\n\nwalrus facts", "metadata": {"heading": "", "key": 1}},
           "file_graph/default.jsonl.zst": {"src": "a.md", "dst": "b.md", "kind": "link",
                                            "line": 1},
           "file_catalog/default.jsonl.zst": {"path": "memory/2026-07-01/a.md", "mtime_ns": 1,
                                              "size": 1, "digest": "d", "keys": [1]}}
    for rel, rec in old.items():
        (meta / rel).parent.mkdir(parents=True, exist_ok=True)
        write_records(REAL, meta / rel, [rec])
    # ReMe's own catalogs beside them stay.
    write_records(REAL, meta / "file_catalog/dream.jsonl.zst",
                  [{"path": "memory/2026-07-01/a.md", "st_mtime": 1.5}])
    # Nothing of what ReMe wrote is taken for such a copy.
    fx = copy_fixture(tmp_path / "fx")
    assert reme_import.remove_own_mirrors(fx / "mem_metadata") == []
    d2 = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n')
    d2.call("index.sync", {"agent_id": "w"})
    assert not any((meta / rel).exists() for rel in old)
    assert (meta / "file_catalog/dream.jsonl.zst").exists()
    res = d2.call("memory.search", {"agent_id": "w", "query": "walrus"})
    assert res["results"][0]["path"] == "memory/2026-07-01/a.md"
    assert d2.stop() == 0


def test_remes_stored_vectors_are_reused_with_the_cache_off(daemon_factory: Any,
                                                            tmp_path: Path) -> None:
    # ReMe run with its embedding cache off keeps vectors only in its chunk store.
    import shutil

    ws = copy_fixture(tmp_path / "ws")
    shutil.rmtree(ws / "mem_metadata" / "embedding_store")
    emb = embedding_toml().replace(f"dimensions = {DIMS}",
                                   f"dimensions = {DIMS}, enable_cache = false")
    config = f'[workspaces.w]\npath = "{ws}"\n{emb}[daemon]\npersist_delay_s = 0.05\n'
    with fixture_provider() as fake:
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        assert st["reused_vectors"] == st["total"] > 30
        assert passage_texts(fake) == []
        assert d.stop() == 0
        d2 = daemon_factory(config)
        d2.call("index.sync", {"agent_id": "w"})
        wait_full(d2)
        assert passage_texts(fake) == []
        assert d2.stop() == 0


def test_a_store_left_from_remes_former_model_is_not_reused(daemon_factory: Any,
                                                           tmp_path: Path) -> None:
    # ReMe switched to the configured model: its cache of this space holds a few chunk
    # texts, its chunk store still the former model's vectors (same dimensions).
    from recalld.daemon.index.embedcache import encode_f16
    from recalld.daemon.store.fsio import REAL
    from recalld.daemon.store.records import read_foreign_records, write_records

    ws = copy_fixture(tmp_path / "ws")
    meta = ws / "mem_metadata"
    store = meta / reme_import.CHUNK_STORE
    records = read_foreign_records(store).records
    rng = np.random.default_rng(7)
    for rec in records:
        rec["_embedding_f16_b64"] = encode_f16(rng.standard_normal(DIMS).astype(np.float32))
    write_records(REAL, store, records)
    npz = next((meta / "embedding_store").glob("*.npz"))
    kept = {reme_import.text_key(r["text"], CONFIG.max_input_length) for r in records[:5]}
    with np.load(npz) as data:
        rows = [i for i, k in enumerate(data["keys"]) if str(k) in kept]
        keys, emb = data["keys"][rows], data["embeddings"][rows]
    np.savez(npz, keys=keys, embeddings=emb)
    assert len(keys) == 5
    with fixture_provider() as fake:
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}')
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        # The five its cache confirms come from ReMe; every other chunk is paid for (a
        # long one as its windows).
        asked = passage_texts(fake)
        assert st["reused_vectors"] == 0 and st["reme_cache_texts"] == 5
        assert len(asked) >= len(records) - 5
        assert not set(asked) & {r["text"] for r in records[:5]}
        assert d.stop() == 0


@pytest.mark.parametrize("bad", ["infinite", "zero"])
def test_one_vector_out_of_range_leaves_the_rest_of_remes_cache(daemon_factory: Any,
                                                                 tmp_path: Path,
                                                                 bad: str) -> None:
    # ReMe's cache is the only source of vectors (its chunk store keeps none); one of its
    # float16 rows overflowed, or is all zeros (no direction: it would match nothing, or
    # everything alike).
    from recalld.daemon.store.fsio import REAL
    from recalld.daemon.store.records import read_foreign_records, write_records

    ws = copy_fixture(tmp_path / "ws")
    meta = ws / "mem_metadata"
    records = read_foreign_records(meta / reme_import.CHUNK_STORE).records
    for rec in records:
        del rec["_embedding_f16_b64"]
    write_records(REAL, meta / reme_import.CHUNK_STORE, records)
    npz = next((meta / "embedding_store").glob("*.npz"))
    with np.load(npz) as data:
        keys, emb = data["keys"], data["embeddings"].copy()
    if bad == "zero":
        emb[0] = 0
    else:
        emb[0, 3] = np.inf
    np.savez(npz, keys=keys, embeddings=emb)
    assert list(reme_import.read_embeddings(meta, CONFIG).vectors) == [str(k) for k in keys[1:]]
    with fixture_provider() as fake:
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}')
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        assert st["reme_cache_texts"] == len(keys) - 1
        assert 1 <= len(passage_texts(fake)) <= 3  # the one chunk (or its windows)
        assert d.stop() == 0


def test_an_all_zero_vector_in_remes_chunk_store_is_not_reused(daemon_factory: Any,
                                                                tmp_path: Path) -> None:
    # The chunk store is the only source of vectors (ReMe's cache is gone) and one of its
    # records holds a vector of zeros (float16 base64, as ReMe 0.4.2 writes them): that
    # chunk is embedded anew, the others reused.
    from recalld.daemon.index.embedcache import encode_f16
    from recalld.daemon.store.fsio import REAL
    from recalld.daemon.store.records import read_foreign_records, write_records

    ws = copy_fixture(tmp_path / "ws")
    meta = ws / "mem_metadata"
    next((meta / "embedding_store").glob("*.npz")).unlink()
    records = read_foreign_records(meta / reme_import.CHUNK_STORE).records
    records[0]["_embedding_f16_b64"] = encode_f16(np.zeros(DIMS))
    write_records(REAL, meta / reme_import.CHUNK_STORE, records)
    with fixture_provider() as fake:
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}')
        d.call("index.sync", {"agent_id": "w"})
        wait_full(d)
        assert 1 <= len(passage_texts(fake)) <= 3  # the one chunk (or its windows)
        assert d.stop() == 0


def test_a_store_left_from_remes_former_model_is_known_by_its_cache(daemon_factory: Any,
                                                                    tmp_path: Path) -> None:
    # ReMe switched to the configured model and has embedded only a query since: its
    # cache of this space knows no chunk text; that of the former model matches its store.
    ws = copy_fixture(tmp_path / "ws")
    folder = ws / "mem_metadata" / "embedding_store"
    npz = next(folder.glob("*.npz"))
    npz.rename(folder / "default_v1_0123456789ab.npz")
    np.savez(npz, keys=np.array(["f" * 64], dtype=str),
             embeddings=np.ones((1, DIMS), np.float16))
    with fixture_provider() as fake:
        d = daemon_factory(f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}')
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        assert st["reused_vectors"] == st["reme_cache_texts"] == 0
        assert len(passage_texts(fake)) >= st["total"]
        assert d.stop() == 0


def test_a_restart_keeps_remes_vectors_without_a_round(daemon_factory: Any,
                                                       tmp_path: Path) -> None:
    # A chunk ReMe embedded whole is one window: a restart takes that window from the
    # chunk's saved vector, with no round through the cache and no commit of the same
    # vectors again.
    ws = copy_fixture(tmp_path / "ws")
    config = (f'[workspaces.w]\npath = "{ws}"\n{embedding_toml()}'
              '[daemon]\npersist_delay_s = 0.05\n')
    with fixture_provider() as fake:
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        first = wait_full(d)
        assert first["reused_vectors"] == first["total"] and passage_texts(fake) == []
        wait_for(lambda: _settled(d), "the vectors committed")
        assert d.stop() == 0
        d2 = daemon_factory(config)
        d2.call("index.sync", {"agent_id": "w"})
        st = wait_full(d2)
        index = _index_status(d2)
        assert st["cache_texts"] == st["reme_cache_texts"] == 0, st
        assert index["uncommitted_changes"] == 0 and index["last_commit"] is None, index
        res = d2.call("memory.search", {"agent_id": "w", "query": "sourdough bulk ferment"})
        assert res["mode"] == "hybrid" and "cooking" in res["results"][0]["path"]
        assert passage_texts(fake) == ["sourdough bulk ferment"]
        assert d2.stop() == 0


def _index_status(d: Any, agent: str = "w") -> dict[str, Any]:
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == agent)
    out: dict[str, Any] = ws["index"]
    return out


def _settled(d: Any) -> bool:
    index = _index_status(d)
    return bool(index["last_commit"]) and not index["uncommitted_changes"]
