"""The columnar chunk table against a plain dict of chunks, through adds, removes,
compactions, copies and persistence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markers import marker

from recalld.daemon.index import chunktable as ct
from recalld.daemon.index.chunker import chunk_id
from recalld.daemon.index.chunktable import ChunkTable
from recalld.daemon.index.persist import (
    IndexStore,
    adopt_saved,
    reload_saved,
    snapshot,
    state_stamp,
)
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.state import IndexState

TEXTS = ["plain text", "周末我们去爬山", "", "emoji 🙂 and ＦＵＬＬ width", "line\nbreaks\n"]
METAS: list[dict[str, object]] = [{}, {"headings": ["A"], "starts_with_heading": True}]
# (operation, key or text index, heading or embedding, metadata index)
_OP = st.one_of(
    st.tuples(st.just("add"), st.integers(0, len(TEXTS) - 1), st.sampled_from(["", "A > B"]),
              st.integers(0, 1)),
    st.tuples(st.just("remove"), st.integers(0, 40), st.none(), st.just(0)),
    st.tuples(st.just("embed"), st.integers(0, 40), st.sampled_from(["AAAA", None]),
              st.just(0)),
    st.tuples(st.sampled_from(["reload", "copy", "keep_copy"]), st.just(0), st.none(),
              st.just(0)),
)
Ref = tuple[str, int, int, str, str, dict[str, object], str | None]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_OP, max_size=60))
def test_matches_a_dict_of_chunks(
    ops: list[tuple[str, int, str | None, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ct, "DEAD_MIN_ROWS", 2)  # compact often
    table = ChunkTable()
    ref: dict[int, Ref] = {}
    next_key = 1
    # Copies taken while the original goes on changing (they share its sealed bytes).
    copies: list[tuple[ChunkTable, dict[int, Ref]]] = []
    for op, n, s, m in ops:
        if op == "add":
            path = f"memory/2026-07-0{next_key % 9 + 1}/n.md"
            row: Ref = (path, next_key, next_key + 2, TEXTS[n], s or "", METAS[m], None)
            table.add(next_key, *row[:6])
            ref[next_key] = row
            next_key += 1
        elif op == "remove":
            table.remove(n)
            ref.pop(n, None)
        elif op == "embed":
            table.set_embedding(n, s)
            if n in ref:
                ref[n] = (*ref[n][:6], s)
        elif op == "reload":
            table = ChunkTable.from_arrays(table.to_arrays())
        elif op == "keep_copy":
            copies.append((table.copy(), dict(ref)))
        else:
            copy = table.copy()
            table.add(10_000 + next_key, "x.md", 1, 1, "only in the original", "", {})
            table.remove(10_000 + next_key)
            table = copy
        assert len(table) == len(ref) and list(table) == sorted(ref)
        # Read after every change: a chunk built (and kept) before it must not be served
        # after it.
        assert {k: (c.text, c.embedding) for k, c in table.items()} == {
            k: (v[3], v[6]) for k, v in ref.items()}
        table.check()  # what a health check asks of the table in memory, after any history
        for copy, _ in copies:
            copy.check()
    for key, (path, start, end, text, heading, meta, emb) in ref.items():
        chunk = table[key]
        assert (chunk.path, chunk.start_line, chunk.end_line, chunk.text, chunk.heading,
                dict(chunk.metadata), chunk.embedding) == (path, start, end, text, heading,
                                                           meta, emb)
        assert chunk.id == chunk_id(path, start, end, text)
        assert table.text(key) == text
    assert dict(table.texts()) == {k: v[3] for k, v in ref.items()}
    assert table.embeddings() == {k: v[6] for k, v in ref.items() if v[6] is not None}
    assert [r["text"] for r in table.records()] == [ref[k][3] for k in sorted(ref)]
    assert list(table.records()) == [table[k].to_record() for k in sorted(ref)]
    for copy, at in copies:
        assert {k: (c.path, c.start_line, c.end_line, c.text, c.heading, dict(c.metadata))
                for k, c in copy.items()} == {k: v[:6] for k, v in at.items()}
        assert ChunkTable.from_arrays(copy.to_arrays()).live == copy.live


def test_records_of_the_whole_table_leave_the_chunks_searches_keep() -> None:
    # A commit writes every chunk's record (twice); the chunks searches read again (kept
    # by the table) are still the ones kept afterwards, not pushed out by the commit's.
    table = ChunkTable()
    for key in range(1, ct.BUILT_MAX + 100):
        table.add(key, f"memory/{key % 7}.md", key, key + 1, f"text {key}", "H",
                  {"n": key} if key % 2 else {})
    table.remove(3)
    kept = table[ct.BUILT_MAX + 50]
    records = list(table.records())
    assert table[ct.BUILT_MAX + 50] is kept
    assert len(records) == ct.BUILT_MAX + 98
    assert records[1] == {"id": table[2].id, "path": "memory/2.md", "start_line": 2,
                          "end_line": 3, "text": "text 2",
                          "metadata": {"heading": "H", "key": 2}}
    assert records[3]["metadata"] == {"n": 5, "heading": "H", "key": 5}


def test_keys_must_ascend_and_missing_keys_raise() -> None:
    table = ChunkTable()
    table.add(5, "a.md", 1, 2, "x", "", {})
    with pytest.raises(ValueError, match="ascend"):
        table.add(5, "a.md", 1, 2, "x", "", {})
    table.remove(5)
    with pytest.raises(KeyError):
        table[5]
    assert table.get(5) is None and 5 not in table and "5" not in table


@pytest.mark.parametrize("damage", ["keys", "off", "path", "text_len", "missing"])
def test_from_arrays_refuses_inconsistent_arrays(damage: str) -> None:
    table = ChunkTable()
    for key in (1, 2, 3):
        table.add(key, f"n{key}.md", 1, 3, f"text {key}", "h", {"k": key})
    arrays = {k: v.copy() for k, v in table.to_arrays().items()}
    if damage == "keys":
        arrays["keys"][2] = 1  # not ascending
    elif damage == "off":
        arrays["off"][1] = 10_000
    elif damage == "path":
        arrays["path"][0] = 7
    elif damage == "text_len":
        arrays["text_len"][0] = 1_000
    else:
        del arrays["head_len"]
    with pytest.raises(ValueError):
        ChunkTable.from_arrays(arrays)


def test_saved_arrays_are_plain_numbers() -> None:
    table = ChunkTable()
    table.add(1, "a.md", 1, 1, "text", "", {})
    table.set_embedding(1, "AAAA")
    arrays = table.to_arrays()
    for arr in arrays.values():
        assert arr.dtype.kind in "uif" and not arr.dtype.hasobject
        assert isinstance(arr, np.ndarray)
    table.add(2, "b.md", 1, 1, "more", "", {})  # the arrays do not pin the table
    assert arrays["keys"].tolist() == [1] and len(table) == 2


def test_index_served_from_its_saved_files_answers_the_same(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(40):
        rel = root / f"memory/2026-07-{i % 28 + 1:02d}/n{i}.md"
        rel.parent.mkdir(parents=True, exist_ok=True)
        rel.write_text(f"# Note {i}\n\n{marker(i, 'word')} shared 周末爬山 text\n\n"
                       f"second part {i % 3}\n",
                       encoding="utf-8")
    rels = sorted(str(p.relative_to(root)) for p in root.rglob("*.md"))
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=2000, digests={})])
    store = IndexStore(root / "mem_metadata")
    queries = [marker(7, "word"), "shared", "周末", "second part 2"]

    def answers(st: IndexState) -> list[object]:
        return [[(k, round(s, 6), st.chunks[k].text, st.chunks[k].id)
                 for k, s in st.keyword_search(q, 10)] for q in queries]

    before = answers(state)
    snap = snapshot(state)
    store.save(snap)
    assert state_stamp(state) == snap.stamp
    assert store.store.current is not None
    adopt_saved(state, store.store.current)
    assert state.mapped and not state.bm25._rows.flags.writeable
    assert answers(state) == before
    # Changes after adopting go to memory beside the mapped parts, and save again.
    (root / rels[0]).write_text("# Changed\n\nbrand new words\n", encoding="utf-8")
    (root / rels[1]).unlink()
    state.apply([prepare_files(root, rels[:2], max_chars=2000, digests={})])
    after = answers(state)
    gone = marker(int(rels[1].rsplit("/n", 1)[1].removesuffix(".md")), "word")
    assert state.keyword_search("brand", 5) and not state.keyword_search(gone, 5)
    store.save(snapshot(state))
    loaded = IndexState()
    assert IndexStore(root / "mem_metadata").load(loaded).corrupt == {}
    assert answers(loaded) == after


def _linked_notes(root: Path, count: int) -> list[str]:
    for i in range(count):
        rel = root / f"memory/2026-07-{i % 28 + 1:02d}/n{i}.md"
        rel.parent.mkdir(parents=True, exist_ok=True)
        rel.write_text(f"# Note {i}\n\n{marker(i, 'word')} shared 周末爬山 "
                       f"[[n{(i + 1) % count}]]\n\n"
                       f"second part {i % 3} related:: [[n{(i + 7) % count}]]\n",
                       encoding="utf-8")
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.md"))


def test_state_reloaded_from_its_saved_files_is_the_one_a_warm_start_loads(
        tmp_path: Path) -> None:
    # After a large pass the whole state is served as a warm start loads it: same
    # answers, files and links; the keyword dictionary is the saved bytes again (no
    # string per term) until a write needs it; writes and saves go on as before.
    root = tmp_path / "ws"
    rels = _linked_notes(root, 100)  # more than one delta: the bulk path, into main
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=2000, digests={})])
    store = IndexStore(root / "mem_metadata")
    queries = [marker(7, "word"), "shared", "周末", "second part 2", "n12"]

    def answers(st: IndexState) -> list[object]:
        return [[(k, round(s, 6), st.chunks[k].text) for k, s in st.keyword_search(q, 10)]
                for q in queries]

    def shape(st: IndexState) -> object:
        return (st.files, st.graph.to_records(), st.next_key, st.chunks.live,
                [st.neighbours(p) for p in rels], st.resolve("n3"),
                # (a save gives the delta's new terms ids: "terms" counts them after it)
                {k: v for k, v in st.bm25.stats().items() if k not in ("merges", "terms")})

    before, files_before = answers(state), shape(state)
    snap = snapshot(state)
    store.save(snap)
    assert store.store.current is not None and state_stamp(state) == snap.stamp
    reload_saved(state, store.store.current)
    assert answers(state) == before and shape(state) == files_before
    assert state.mapped and not state.bm25.terms_built  # the saved bytes, as after a load
    assert state.linked_chunks("second", [(rel, "") for rel in rels[:3]])
    assert not state.bm25.terms_built
    loaded = IndexState()
    assert IndexStore(root / "mem_metadata").load(loaded).corrupt == {}
    assert answers(loaded) == before and shape(loaded) == files_before
    # A write after the reload, saved and loaded again.
    (root / rels[0]).write_text("# Changed\n\nbrand new words [[n5]]\n", encoding="utf-8")
    state.apply([prepare_files(root, rels[:1], max_chars=2000, digests={})])
    assert [state.chunks[k].path for k, _ in state.keyword_search("brand", 5)] == [rels[0]]
    linked = state.neighbours(rels[0])  # its own links and the links to it
    assert "memory/2026-07-06/n5.md" in linked and "memory/2026-07-02/n1.md" not in linked
    after, files_after = answers(state), shape(state)
    store.save(snapshot(state))
    again = IndexState()
    assert IndexStore(root / "mem_metadata").load(again).corrupt == {}
    assert answers(again) == after and shape(again) == files_after


def test_a_reload_that_does_not_match_leaves_the_state_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    rels = _linked_notes(root, 12)
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=2000, digests={})])
    store = IndexStore(root / "mem_metadata")
    store.save(snapshot(state))
    assert store.store.current is not None
    (root / rels[0]).unlink()  # the state moves on; the saved generation does not
    state.apply([prepare_files(root, rels[:1], max_chars=2000, digests={})])
    files, chunks, bm25, graph = state.files, state.chunks, state.bm25, state.graph
    with pytest.raises(ValueError, match="other chunks"):
        reload_saved(state, store.store.current)
    assert (state.files, state.chunks, state.bm25, state.graph) == (files, chunks, bm25, graph)
    assert rels[0] not in state.files and state.keyword_search(marker(1, "word"), 5)


def test_bare_links_resolve_against_files_of_a_loaded_index(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "digest/wiki").mkdir(parents=True)
    (root / "memory/2026-07-01").mkdir(parents=True)
    (root / "digest/wiki/trains.md").write_text("# Trains\n\nSBB facts\n", encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(root, ["digest/wiki/trains.md"], max_chars=2000, digests={})])
    store = IndexStore(root / "mem_metadata")
    store.save(snapshot(state))
    loaded = IndexState()
    assert store.load(loaded).corrupt == {}
    (root / "memory/2026-07-01/n.md").write_text("see [[Trains]]\n", encoding="utf-8")
    loaded.apply([prepare_files(root, ["memory/2026-07-01/n.md"], max_chars=2000,
                                digests={})])
    assert loaded.neighbours("memory/2026-07-01/n.md") == ["digest/wiki/trains.md"]
    assert loaded.neighbours("digest/wiki/trains.md") == ["memory/2026-07-01/n.md"]


def test_metadata_is_parsed_on_use_and_can_be_stored_again() -> None:
    meta = {"name": "Commute", "tags": ["travel"], "starts_with_heading": True}
    table = ChunkTable()
    table.add(1, "memory/2026-07-23/commute.md", 1, 3, "train to Zurich", "Commute", meta)
    chunk = table[1]
    assert chunk.metadata == meta and dict(chunk.metadata) == meta and len(chunk.metadata) == 3
    assert chunk.to_record()["metadata"] == {**meta, "heading": "Commute", "key": 1}
    other = ChunkTable()  # a chunk read from one table goes into another unchanged
    other.add(7, chunk.path, chunk.start_line, chunk.end_line, chunk.text, chunk.heading,
              chunk.metadata)
    assert dict(other[7].metadata) == meta


def test_neighbours_follow_every_change_of_links_and_files(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "digest/wiki").mkdir(parents=True)
    (root / "memory/2026-07-01").mkdir(parents=True)
    note, wiki = "memory/2026-07-01/n.md", "digest/wiki/trains.md"

    def put(rel: str, text: str | None) -> None:
        if text is None:
            (root / rel).unlink()
        else:
            (root / rel).write_text(text, encoding="utf-8")
        state.apply([prepare_files(root, [rel], max_chars=2000, digests={})])

    state = IndexState()
    put(wiki, "# Trains\n")
    put(note, "see [[Trains]]\n")
    assert state.neighbours(wiki) == [note] and state.neighbours(note) == [wiki]
    state.neighbours(wiki).append("elsewhere.md")  # a caller's list is its own
    assert state.neighbours(wiki) == [note]
    put(note, "no link now\n")  # asked before: the answers must not be kept
    assert state.neighbours(wiki) == [] and state.neighbours(note) == []
    put(note, "back to [[Trains]]\n")
    assert state.neighbours(wiki) == [note]
    put(wiki, None)  # a deleted file is nobody's neighbour
    assert state.neighbours(note) == []
