"""Pure parts of the vector path: exact-term detection, fusion order, the embedding cache."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.embedcache import EmbeddingCache, decode_f16, encode_f16, text_hash
from recalld.daemon.index.exact import exact_first, exact_keys, identifier_terms, rare_terms
from recalld.daemon.index.fusion import fuse
from recalld.daemon.index.state import StoredChunk
from recalld.daemon.index.tokenizer import tokenize, tokenize_query
from recalld.daemon.index.vectors import (
    MATRIX_MAGIC,
    SLOTS,
    VectorIndex,
    WindowVectors,
    normalize,
)


def test_identifier_terms() -> None:
    assert identifier_terms("why ECONNREFUSED in handleWebSocketReconnect?") == [
        "econnrefused", "handlewebsocketreconnect"]
    assert identifier_terms("snake_case_name and config.toml and foo-bar, v2 k8s") == [
        "snake_case_name", "config.toml", "foo-bar", "v2", "k8s"]
    # Plain words, capitalised names, short caps and bare numbers are not identifiers.
    assert identifier_terms("What did Caroline do in 2023 at the IT desk?") == []
    # A short query's answer is remembered; each caller still gets its own list, and a
    # long query is looked at as well.
    identifier_terms("v2 k8s").append("changed")
    assert identifier_terms("v2 k8s") == ["v2", "k8s"]
    assert identifier_terms("plain words " * 40 + "ECONNREFUSED") == ["econnrefused"]
    # camelCase after digits, and in a word of any length; digits alone before a capital
    # are the letter-digit rule's.
    assert identifier_terms("2fastFurious x9 aaaB 12 Abc") == ["2fastfurious", "x9", "aaab"]
    assert identifier_terms("z" * 50_000 + "Q") == ["z" * 50_000 + "q"]
    assert identifier_terms("z" * 50_000) == []


def test_rare_terms_need_a_real_index() -> None:
    bm = BM25Index()
    docs = [f"common words about trains number {i}" for i in range(60)]
    docs[3] += " zugfahrt"
    bm.add_many((i + 1, tokenize(d)) for i, d in enumerate(docs))
    assert rare_terms("zugfahrt trains", bm) == ["zugfahrt"]
    small = BM25Index()
    small.add_many((i + 1, tokenize(d)) for i, d in enumerate(docs[:10]))
    assert rare_terms("zugfahrt trains", small) == []


def chunk(key: int, text: str) -> StoredChunk:
    return StoredChunk(key, str(key), "p.md", 1, 1, text, "", {})


def test_exact_keys_need_every_term() -> None:
    chunks = {1: chunk(1, "ECONNREFUSED in config.toml"), 2: chunk(2, "ECONNREFUSED only")}
    hits = [(1, 2.0), (2, 3.0)]
    assert exact_keys(["econnrefused", "config.toml"], hits, chunks) == {1}
    assert exact_keys(["econnrefused"], hits, chunks) == {1, 2}
    assert exact_keys([], hits, chunks) == set()


def test_fusion_puts_exact_first_and_ignores_an_empty_branch() -> None:
    vector = [(k, 0.9 - k / 100) for k in range(10, 40)]
    keyword = [(99, 5.0)]
    plain = fuse(keyword, vector, keyword_weight=0.3, vector_weight=0.7, k=60)
    assert [f.key for f in plain].index(99) > 20  # buried by plain weighted RRF
    fused = fuse(keyword, vector, keyword_weight=0.3, vector_weight=0.7, k=60, exact={99})
    assert fused[0].key == 99 and fused[0].exact and fused[0].vector is None
    # Vector-only: the keyword weight does not dilute anything.
    only = fuse([], vector, keyword_weight=0.3, vector_weight=0.7, k=60)
    assert [f.key for f in only] == [k for k, _ in vector]
    assert only[0].score == pytest.approx(0.7 / 61)


def test_f16_round_trip() -> None:
    vec = np.linspace(-1, 1, 16, dtype=np.float32)
    assert np.allclose(decode_f16(encode_f16(vec)), vec, atol=1e-3)
    for bad in ("not base64!", "", "AAAA"):
        with pytest.raises(ValueError):
            decode_f16(bad)


def test_cache_persists_skips_damage_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "emb" / "space.log"
    cache = EmbeddingCache(path, 4, max_cache_size=2)
    cache.open()
    vecs = {f"text {i}": np.full(4, i / 10, dtype=np.float32) for i in range(6)}
    assert cache.put_many((text_hash(t), v) for t, v in vecs.items()) == 6
    assert cache.put_many([(text_hash("text 0"), vecs["text 0"])]) == 0  # already there
    cache.put_many([("wrongsize", np.zeros(3, dtype=np.float32))])  # refused: other dims
    cache.close()
    with path.open("ab") as fh:
        fh.write(b"00000000 {\"h\": torn")  # a torn tail from a crash mid-append
    again = EmbeddingCache(path, 4, max_cache_size=2)
    again.open()
    got = again.get_many([text_hash("text 3"), text_hash("missing")])
    assert got[1] is None and got[0] is not None
    assert np.allclose(got[0], vecs["text 3"], atol=1e-3)
    assert len(again) == 6
    # Compaction keeps live entries and the newest max_cache_size others.
    live = {text_hash("text 0")}
    assert again.compact(live) == 3
    kept = again.get_many([text_hash(f"text {i}") for i in range(6)])
    assert [v is not None for v in kept] == [True, False, False, False, True, True]
    again.close()
    third = EmbeddingCache(path, 4)
    third.open()
    assert len(third) == 3
    third.close()


def test_exact_keys_match_identifiers_as_whole_words() -> None:
    chunks = {1: chunk(1, "pinned kelmo v4.27.3 today"), 2: chunk(2, "kelmo v4.27 is old"),
              3: chunk(3, "问题出在FP_KELMO_4821上"), 4: chunk(4, "see XFP_KELMO_48210")}
    hits = [(k, 1.0) for k in chunks]
    assert exact_keys(["v4.27"], hits, chunks, idents=["v4.27"]) == {2}
    assert exact_keys(["fp_kelmo_4821"], hits, chunks, idents=["fp_kelmo_4821"]) == {3}
    # A rare term is a stem: it matches at the start of a word or of an identifier's part.
    assert exact_keys(["kelm"], hits, chunks) == {1, 2, 3, 4}
    assert exact_keys(["elmo"], hits, chunks) == set()
    # Every occurrence is looked at: a glued one before a free one does not hide it.
    glued = {5: chunk(5, "xv4.27 and v4.27.1, then v4.27 alone"), 6: chunk(6, "2v4.27 v4.27x")}
    assert exact_keys(["v4.27"], [(5, 1.0), (6, 1.0)], glued, idents=["v4.27"]) == {5}


def test_exact_first_lifts_a_long_note_over_notes_sharing_the_parts() -> None:
    # One long Chinese note holds the code; short English notes hold a sibling code and
    # its parts. BM25 ranks the English notes first; exact_first puts the note that holds
    # the code first, even when it scored below the candidate pool.
    zh = "今天检查日志发现夜间任务重启以后停止运行下午和同事讨论迁移方案" * 20
    texts = {1: f"{zh}，问题出在 QX_TORVEL_5831 上。{zh}"}
    for k in range(2, 26):
        texts[k] = f"QX_TORVEL_{5832 + k} again: qx torvel 5831, qx torvel 5831."
    for k in range(26, 200):
        texts[k] = f"coffee with the team, then review number {k}"
    bm = BM25Index()
    bm.add_many((k, tokenize(t)) for k, t in texts.items())
    chunks = {k: chunk(k, t) for k, t in texts.items()}
    query = "QX_TORVEL_5831"
    plain = bm.search(tokenize_query(query), 5)
    assert 1 not in [k for k, _ in plain]
    hits, exact = exact_first(query, bm, plain, chunks, limit=5)
    assert exact == {1} and hits[0][0] == 1 and len(hits) == 5
    # A short question naming it is a lookup too; a long claim with one rare word is not.
    hits, _ = exact_first("what went wrong with QX_TORVEL_5831?", bm,
                          bm.search(tokenize_query("what went wrong with QX_TORVEL_5831?"), 5),
                          chunks, limit=5)
    assert hits[0][0] == 1
    long_query = "notes about the sibling codes that came again after the nightly restart 5831"
    assert exact_first(long_query, bm, plain, chunks, limit=5) == (plain, set())


def test_a_lookup_of_names_a_few_notes_hold_scores_no_second_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The notes holding a lookup's identifier or rare names are read from the postings:
    # the only scoring search is the query's own, and the answer is the one that search
    # and a search of the names give.
    texts = {k: f"coffee with the team, then review number {k}" for k in range(1, 80)}
    texts[7] += " zugfahrt bahnsteig"
    texts[9] += " ERR_KELMO_4821 failed"
    texts[11] += " see err kelmo 4821 apart"
    bm = BM25Index()
    bm.add_many((k, tokenize(t)) for k, t in texts.items())
    chunks = {k: chunk(k, t) for k, t in texts.items()}
    searched: list[list[str]] = []
    search = BM25Index.search

    def counted(self: BM25Index, tokens: list[str], limit: int, **kw: object) -> object:
        searched.append(list(tokens))
        return search(self, tokens, limit, **kw)  # type: ignore[arg-type]

    for query, want in (("ERR_KELMO_4821", 9), ("Zugfahrt Bahnsteig", 7)):
        plain = bm.search(tokenize_query(query), 15)
        monkeypatch.setattr(BM25Index, "search", counted)
        hits, exact = exact_first(query, bm, plain, chunks, limit=15)
        monkeypatch.setattr(BM25Index, "search", search)
        assert exact == {want} and hits[0][0] == want
        assert searched == []


def test_each_key_of_a_space_is_sent_by_its_own_workspaces(tmp_path: Path) -> None:
    from recalld.daemon.config import EmbeddingModelConfig
    from recalld.daemon.index.spaces import VectorSpaces, public_config

    def config(model: str, key: str, batch: int = 10) -> EmbeddingModelConfig:
        return EmbeddingModelConfig(backend="openai", base_url="http://127.0.0.1:9/v1",
                                    model_name=model, dimensions=8, api_key=key,
                                    max_batch_size=batch)

    spaces = VectorSpaces(tmp_path, None, environ={})
    first = spaces.space(config("m", "sk-first"))
    other = spaces.space(config("m", "sk-other", batch=3))
    # One space, one cache; each key its own client (and breaker), sent by its own.
    assert other is not first and other.key == first.key and other.cache is first.cache
    assert other.client.breaker is not first.client.breaker
    assert (first.client.config.api_key, other.client.config.api_key) == ("sk-first",
                                                                         "sk-other")
    assert spaces.space(config("m", "sk-first")) is first
    assert spaces.space(config("m", " sk-first ")) is first  # the same key as sent
    assert list(spaces.statistics()) == [first.key]
    # Rebuilding the space vectors were made in (a model change) sends the current key.
    assert spaces.old_space(public_config(first.client.config),
                            config("m2", "sk-other")) is other


def test_a_graph_edited_for_long_keeps_its_size_and_answers(tmp_path: Path) -> None:
    # Every edit of a note gives its chunks new keys: the graph deletes the old ones and
    # adds the new. A long-lived workspace edits the same notes thousands of times; the
    # graph (in memory, on disk, in search time) must follow the live vectors, not the
    # edits, also once saved and loaded again.
    rng = np.random.default_rng(7)
    index = VectorIndex(16, exact_max=0)  # a graph however small
    live = {key: rng.standard_normal(16) for key in range(50)}
    index.add(list(live), np.stack(list(live.values())))
    next_key = 50

    def churn(times: int) -> None:
        nonlocal next_key
        for _ in range(times):
            old = min(live)
            index.remove(old)
            del live[old]
            live[next_key] = rng.standard_normal(16)
            index.add([next_key], live[next_key][None, :])
            next_key += 1

    churn(2000)
    small = len(index.to_bytes(tmp_path))
    assert index._index.get_current_count() <= 2 * len(live) + 1, "deleted slots are not reused"
    index = VectorIndex.from_bytes(index.to_bytes(tmp_path), dim=16, live=list(live),
                                   tmp_dir=tmp_path, exact_max=0)
    churn(2000)
    assert index._index.get_current_count() <= 2 * len(live) + 1
    assert len(index.to_bytes(tmp_path)) <= small
    keys = list(live)
    rows = normalize(np.stack([live[k] for k in keys]))
    for q in rng.standard_normal((20, 16)):
        exact = [keys[i] for i in np.argsort(-(rows @ normalize(q)[0]))[:10]]
        found = [key for key, _ in index.search(q, 10)]
        assert found == exact
    # A key deleted long ago and added again is live once, like any other.
    index.add([3], rng.standard_normal((1, 16)))
    assert [key for key, _ in index.search(index.vectors([3])[0], 1)] == [3]
    assert len(index) == len(live) + 1


def test_a_restart_keeps_no_window_copy_of_one_window_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # After a restart a chunk's windows are refilled. A one-window chunk's window is the
    # chunk itself: a copy of its vector in the window index cost an hnswlib insert per
    # chunk at every start (seconds at thousands of chunks) and doubled the memory. It is
    # looked at once (a bounded slice per locked call, searches go between) and found by
    # its own vector.
    import logging

    from recalld.daemon.config import EmbeddingModelConfig
    from recalld.daemon.index import vector_fill
    from recalld.daemon.index.prepare import prepare_files
    from recalld.daemon.index.spaces import VectorSpaces
    from recalld.daemon.index.state import IndexState
    from recalld.daemon.index.windows import chunk_windows

    monkeypatch.setattr(vector_fill, "SPLITS_PER_CALL", 7)
    root = tmp_path / "ws"
    rels = [f"memory/2026-07-{1 + i % 28:02d}/n{i}.md" for i in range(2 * 7 + 3)]
    for i, rel in enumerate(rels):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# Note {i}\n\nshort fact number {i}\n", "utf-8")
    state = IndexState(daily_dir="memory", digest_dir="digest")
    state.apply([prepare_files(root, rels, max_chars=2000, digests=dict.fromkeys(rels))])
    config = EmbeddingModelConfig(backend="openai", base_url="http://127.0.0.1:9/v1",
                                  model_name="m", dimensions=8, api_key="k")
    spaces = VectorSpaces(tmp_path / "cache", None, environ={})
    target = spaces.space(config)
    keys = sorted(state.chunks)
    rows = np.random.default_rng(3).standard_normal((len(keys), 8)).astype(np.float32)
    state.vectors = VectorIndex(8)
    state.vectors.add(keys, rows)
    state.vector_space = target.key
    fill = vector_fill.VectorFill("w", spaces, config, target, 400,
                                  log=logging.getLogger("t"))
    calls = 0
    while True:
        rnd = fill.next_round(state, limit=40, now=0.0)
        calls += 1
        assert fill.windows is not None and len(fill.windows) == 0
        assert not rnd.items and rnd.pending == 0 and rnd.total == len(keys)
        if not rnd.more:
            break
    assert calls == 3
    # Each chunk is found by its own vector, its one window handed back.
    for i in (0, 9, len(keys) - 1):
        hits = fill.search(state, normalize(rows[i])[0], 3, None)
        assert hits[0][0] == keys[i] and hits[0][1] > 0.99
        best = fill.best_windows(state, normalize(rows[i])[0], [keys[i]])
        assert best[keys[i]] == chunk_windows(state.chunks.text(keys[i]), 400)[0]


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def test_small_indexes_cost_their_vectors_not_a_graph_each() -> None:
    # Thirty workspaces of a few notes: each index held a graph of ~2.6 MB (hnswlib's
    # label locks) for kilobytes of vectors; now memory grows with the vectors.
    rng = np.random.default_rng(3)
    before = _rss_kib()
    held = []
    for _ in range(30):
        index = VectorIndex(384)
        index.add(range(5), rng.standard_normal((5, 384)))
        held.append(index)
    grown_mib = (_rss_kib() - before) / 1024
    assert grown_mib < 15, f"30 indexes of 5 vectors took {grown_mib:.0f} MiB"
    assert all(len(i) == 5 for i in held)


@pytest.mark.parametrize("exact_max", [0, 40, 10_000])
def test_an_index_answers_alike_as_a_matrix_a_graph_and_between(
        exact_max: int, tmp_path: Path) -> None:
    # The same edits (adds, replaced vectors, removals, keys coming back) and searches,
    # with and without a filter, on an index that is a matrix throughout, a graph
    # throughout, or a matrix that becomes a graph; and once saved and loaded again.
    rng = np.random.default_rng(11)
    index = VectorIndex(16, exact_max=exact_max)
    truth: dict[int, np.ndarray] = {}
    for step in range(30):
        keys = rng.choice(200, size=6, replace=False).tolist()
        rows = rng.standard_normal((6, 16))
        index.add(keys, rows)
        truth.update({k: normalize(r)[0] for k, r in zip(keys, rows, strict=True)})
        for gone in rng.choice(sorted(truth), size=min(2, len(truth)), replace=False).tolist():
            index.remove(gone)
            del truth[gone]
        if step % 10 == 9:
            index = VectorIndex.from_bytes(index.to_bytes(tmp_path), dim=16, live=list(truth),
                                           tmp_dir=tmp_path, exact_max=exact_max)
    assert index.keys() == set(truth)
    for _ in range(5):
        q = rng.standard_normal(16)
        for allowed in (None, lambda key: key % 3 != 0):
            kept = [k for k in truth if allowed is None or allowed(k)]
            sims = {k: float(truth[k] @ normalize(q)[0]) for k in kept}
            want = sorted(kept, key=lambda k: -sims[k])[:5]
            got = index.search(q, 5, allowed=allowed)
            assert [k for k, _ in got] == want
            assert all(abs(s - sims[k]) < 1e-4 for k, s in got)
    assert np.allclose(index.vectors(sorted(truth)), np.stack([truth[k] for k in sorted(truth)]),
                       atol=1e-5)
    saved = index.to_bytes(tmp_path)
    # A matrix is saved as one (its vectors' bytes, no graph), and loads only as itself.
    assert saved.startswith(MATRIX_MAGIC) == index.is_matrix == (len(truth) <= exact_max)
    with pytest.raises((ValueError, RuntimeError)):  # as a load of damaged bytes refuses
        VectorIndex.from_bytes(saved[:-4] if index.is_matrix else b"", dim=16,
                               live=list(truth), tmp_dir=tmp_path)


def test_a_filter_few_keys_pass_compares_them_without_walking_the_graph() -> None:
    # A path_prefix naming a small folder in a big workspace: hnswlib's filter would call
    # back for most keys of the graph before finding the few that pass; the few are
    # compared directly, and rank as a full comparison ranks them.
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((1200, 16)).astype(np.float32)
    index = VectorIndex(16)
    index.add(range(1200), rows)
    wins = WindowVectors(16)
    for key in range(200):
        wins.add(key, rows[key * 6:key * 6 + 6])
    assert not index.is_matrix and not wins.is_matrix
    q = rng.standard_normal(16)
    sims = normalize(rows) @ normalize(q)[0]
    few = {3, 40, 41, 977, 1100, 5000}  # 5000: no such key
    asked: list[int] = []

    def allowed(key: int) -> bool:
        asked.append(key)
        return key in few and key != 41  # the filter may refuse a candidate too

    got = index.search(q, 3, allowed=allowed, candidates=few)
    want = sorted(few - {41, 5000}, key=lambda k: -sims[k])[:3]
    assert [k for k, _ in got] == want and len(asked) <= len(few), (got, asked)
    assert all(abs(s - sims[k]) < 1e-5 for k, s in got)
    asked.clear()
    few = {7, 41, 150, 300}  # 300: a chunk without windows
    got = wins.search(q, 5, allowed=allowed, candidates=few)
    best = {key: max(sims[key * 6:key * 6 + 6]) for key in (7, 150)}
    assert [k for k, _ in got] == sorted(best, key=lambda k: -best[k]), got
    assert all(abs(s - best[k]) < 1e-5 for k, s in got)
    # Each window of a candidate is asked for once at most (its chunk passing or not).
    assert len(asked) <= 3 * SLOTS, len(asked)
