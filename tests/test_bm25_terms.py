"""Counting terms for the BM25 index: slabs counted in bulk (CJK runs too), term ids
remapped and vocabularies kept over a pass, lengths of CJK text, and the postings a merge
keeps per term."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from bm25_reference import VOCAB
from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.index import bm25 as bm25_mod
from recalld.daemon.index import postings as postings_mod
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.postings import Slab, stable_order
from recalld.daemon.index.tokenizer import doc_length, tokenize, tokenize_split


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 70_000), max_size=200))
def test_stable_order_is_a_stable_argsort(values: list[int]) -> None:
    arr = np.asarray(values, dtype=np.int32)
    assert np.array_equal(stable_order(arr), np.argsort(arr, kind="stable"))


def _slab_counts(slab: Slab, terms: list[str]) -> list[dict[str, int]]:
    bounds = [0, *np.cumsum(slab.nterms).tolist()]
    return [
        {terms[t]: int(f) for t, f in zip(slab.tids[lo:hi].tolist(),
                                           slab.tfs[lo:hi].tolist(), strict=True)}
        for lo, hi in itertools.pairwise(bounds)
    ]


# Latin words, identifiers, CJK of several planes and scripts, full-width forms, spacing.
_TEXT = st.lists(st.sampled_from([
    "memory", "the", "ECONNREFUSED", "handleWebSocket", "v2.3.1", "C++", " ", "\n", "，",
    "中", "文", "记忆", "𠀀", "𠀁", "한국어", "カタカナ", "ＡＢＣ", "１２", "é", "ß", "—",
]), max_size=40).map("".join)


@settings(max_examples=120, deadline=None)
@given(st.lists(_TEXT, max_size=8))
def test_bulk_cjk_counting_matches_the_token_lists(texts: list[str]) -> None:
    # Worker processes count CJK runs in numpy (tokenize_split); the result must be the
    # counts of tokenize(), which queries and rebuilds use.
    split = [tokenize_split(t) for t in texts]
    bulk, bulk_terms = Slab.local([w for w, _ in split], [r for _, r in split])
    plain, plain_terms = Slab.local([tokenize(t) for t in texts])
    assert bulk.lens == plain.lens == [doc_length(tokenize(t)) for t in texts]
    assert _slab_counts(bulk, bulk_terms) == _slab_counts(plain, plain_terms)
    assert sorted(bulk_terms) == sorted(plain_terms)


@settings(max_examples=120, deadline=None)
@given(st.lists(_TEXT, max_size=8), st.integers(1, 40))
def test_bulk_counting_does_not_depend_on_its_blocks(texts: list[str], block: int) -> None:
    # CJK runs are counted a block of characters at a time: small blocks (one per few
    # characters, documents split across none) give the same counts and lengths; word
    # terms are numbered first, in the order they first occur (as a TermTable would).
    split = [tokenize_split(t) for t in texts]
    whole, whole_terms = Slab.local([w for w, _ in split], [r for _, r in split])
    saved = postings_mod.CJK_BLOCK_CHARS
    postings_mod.CJK_BLOCK_CHARS = block
    try:
        small, small_terms = Slab.local([w for w, _ in split], [r for _, r in split])
    finally:
        postings_mod.CJK_BLOCK_CHARS = saved
    assert _slab_counts(small, small_terms) == _slab_counts(whole, whole_terms)
    assert sorted(small_terms) == sorted(whole_terms)
    assert (small.lens, small.keys) == (whole.lens, whole.keys)
    words = [t for w, _ in split for t in w]
    assert whole_terms[:len(dict.fromkeys(words))] == list(dict.fromkeys(words))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([*VOCAB, "中", "文件", "x" * 40]), unique=True, max_size=12),
       st.lists(st.sampled_from([*VOCAB, "中", "文件", "x" * 40, "新"]), unique=True,
                max_size=12))
def test_remap_is_a_lookup_of_every_term(known: list[str], local: list[str]) -> None:
    # Known terms are looked up, new ones join in local order, interned; as if each term
    # were looked up in turn.
    ids = postings_mod.term_table(known)
    reference = postings_mod.term_table(known)
    slab = Slab(np.arange(len(local), dtype=np.int32)[::-1].copy(),
                np.ones(len(local), dtype=np.float32),
                np.asarray([len(local)], dtype=np.int64), [len(local)], [0])
    got = slab.remap(["".join(t) for t in local], ids, [7])  # new string objects
    expected = [reference[sys.intern(t)] for t in local][::-1]
    assert got.tids.tolist() == expected and got.keys == [7]
    assert list(ids.items()) == list(reference.items())
    for term in ids:
        assert term is sys.intern(term)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(_TEXT, min_size=1, max_size=5), min_size=1, max_size=6),
       st.lists(st.integers(0, 1), min_size=6, max_size=6))
def test_batches_counted_against_a_kept_vocabulary_index_the_same(
    batches: list[list[str]], workers: list[int],
) -> None:
    # Worker processes keep one vocabulary over a pass and hand back only the terms a
    # batch added to it; the daemon maps them through vocabulary_ids. The index built is
    # the one per-batch vocabularies build, array for array, when batches are merged (as
    # a pass's batches of 128 files are; the delta of a few documents numbers its terms
    # as they come, a merge in batch order).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bm25_mod, "SMALL_ADD_DOCS", 0)
        _build_both(batches, workers)


def _build_both(batches: list[list[str]], workers: list[int]) -> None:
    plain, kept = BM25Index(), BM25Index()
    held = [postings_mod.Vocabulary(), postings_mod.Vocabulary()]
    key = 0
    for i, texts in enumerate(batches):
        split = [tokenize_split(t) for t in texts]
        words, runs = [w for w, _ in split], [r for _, r in split]
        keys = list(range(key, key + len(texts)))
        key += len(texts)
        slab, terms = Slab.local(words, runs)
        plain.add_encoded([(terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens, keys))],
                          stage=i < len(batches) - 1)
        vocab = held[workers[i]]
        start = len(vocab)
        slab, new_terms = Slab.local(words, runs, vocab=vocab)
        assert new_terms == list(vocab.ids)[start:]
        to_global = kept.vocabulary_ids(("pass", workers[i]), start,
                                        postings_mod.join_terms(new_terms))
        kept.add_encoded([(None, slab.mapped(to_global, keys))], stage=i < len(batches) - 1)
    got, want = kept.to_arrays(), plain.to_arrays()
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def test_a_vocabulary_out_of_step_is_refused_and_held_terms_stay() -> None:
    index = BM25Index()
    index.add(0, ["gone"])
    index.compact()
    ids = index.vocabulary_ids(("p", 1), 0, "alpha\nbeta")
    assert ids.tolist() == [1, 2]
    with pytest.raises(ValueError, match="not the one held"):
        index.vocabulary_ids(("p", 1), 5, "gamma")
    with pytest.raises(ValueError, match="not the one held"):
        index.vocabulary_ids(("p", 2), 3, "gamma")
    assert index.vocabulary_ids(("p", 1), 2, "gamma").tolist() == [1, 2, 3]
    assert index.vocabulary_ids(("p", 1), 0, "beta").tolist() == [2]  # began again
    # While a vocabulary is held, a merge keeps terms without postings: its ids hold.
    index.remove(0)
    index.compact()
    assert index.stats()["terms"] == 4
    index.forget_vocabularies()
    index.add(5, ["beta"])
    index.compact()
    assert index.stats()["terms"] == 1


def test_cjk_text_counts_by_characters_in_lengths() -> None:
    # Indexed as characters plus pairs, counted as one term per two characters, so a
    # Chinese note is not several times as long as an English note of the same content.
    assert doc_length(tokenize("数据迁移")) == 2  # 4 characters + 3 pairs indexed
    assert doc_length(tokenize("数据迁移计划 ECONNREFUSED on deploy")) == 3 + 2
    assert doc_length(tokenize("deploy the server")) == 2
    split = tokenize_split("迁移 ECONNREFUSED 服务器")
    bulk, _ = Slab.local([split[0]], [split[1]])
    assert bulk.lens == [doc_length(tokenize("迁移 ECONNREFUSED 服务器"))] == [1 + 3]


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(st.lists(st.booleans(), max_size=6), max_size=12))
def test_a_merge_counts_the_postings_it_keeps_per_term(runs: list[list[bool]]) -> None:
    # Terms with no postings, with none kept, with all kept: as counting them one by one.
    keep = np.asarray([k for run in runs for k in run], dtype=np.bool_)
    indptr = np.zeros(len(runs) + 1, dtype=np.int64)
    np.cumsum([len(run) for run in runs], out=indptr[1:])
    counts = postings_mod._kept_per_term(keep, indptr)
    assert counts.dtype == np.int64
    assert counts.tolist() == [sum(run) for run in runs]
