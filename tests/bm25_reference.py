"""Shared parts of the BM25 tests: a naive BM25 reference to check scores against, the
vocabularies and write sequences the property tests draw from, documents encoded as
worker processes send them, and the fixture that shrinks the merge thresholds."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import strategies as st
from pyroaring import BitMap

from recalld.daemon.index import bm25 as bm25_mod
from recalld.daemon.index import postings as postings_mod
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.postings import Slab


def reference_scores(
    docs: dict[int, list[str]], query: list[str], k1: float = 1.2, b: float = 0.75
) -> dict[int, float]:
    """BM25 Okapi with Lucene's IDF, written the obvious way."""
    n = len(docs)
    if n == 0:
        return {}
    avgdl = sum(len(t) for t in docs.values()) / n or 1.0
    scores: dict[int, float] = {}
    for term in query:
        df = sum(1 for t in docs.values() if term in t)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for key, toks in docs.items():
            tf = toks.count(term)
            if tf:
                norm = tf + k1 * (1 - b + b * len(toks) / avgdl)
                scores[key] = scores.get(key, 0.0) + idf * tf * (k1 + 1) / norm
    return scores


def assert_matches(index: BM25Index, docs: dict[int, list[str]], query: list[str],
                   allowed: BitMap | None = None) -> None:
    ref = reference_scores(docs, query)
    if allowed is not None:
        ref = {k: v for k, v in ref.items() if k in allowed}
    got = index.search(query, len(docs) + 5, allowed=allowed)
    assert {k for k, _ in got} == set(ref)
    for key, score in got:
        assert score == pytest.approx(ref[key], rel=1e-6, abs=1e-9)
    # Best first, equal scores by ascending key. Scores that are equal in exact arithmetic
    # but not in floating point (other term frequencies and lengths: 1/1.9 against 3/5.7)
    # may come in either order.
    for (key_a, a), (key_b, b) in itertools.pairwise(got):
        if a == b:
            assert key_a < key_b, got
        else:
            assert a > b or math.isclose(a, b, rel_tol=1e-9), got


VOCAB = ["apple", "bird", "cat", "dog", "egg", "fish", "goat", "hen"]


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny thresholds so that a few dozen operations go through every merge path (constant for
    # the whole test, so sharing it across Hypothesis examples is fine).
    monkeypatch.setattr(bm25_mod, "DELTA_MIN_DOCS", 3)
    monkeypatch.setattr(bm25_mod, "DELTA_MAX_DOCS", 6)
    monkeypatch.setattr(bm25_mod, "DEAD_MIN_ROWS", 2)
    monkeypatch.setattr(bm25_mod, "SLAB_DOCS", 4)
    monkeypatch.setattr(bm25_mod, "SMALL_ADD_DOCS", 2)
    monkeypatch.setattr(postings_mod, "SCATTER_BLOCK", 3)  # merges move postings in steps


def _encoded(key: int, docs: list[tuple[int, list[str]]]) -> list[tuple[str | list[str], Slab]]:
    """``docs`` as worker processes send them: in two parts (split by ``key``), each with
    its own vocabulary, keys set on apply."""
    parts: list[tuple[str | list[str], Slab]] = []
    for piece in (docs[: key % 4], docs[key % 4:]):
        slab, terms = Slab.local([doc for _, doc in piece])
        parts.append((terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens,
                                  [k for k, _ in piece])))
    return parts


_WORDS = st.sampled_from(["alpha", "beta", "中文", "ünïcode", "w1", "w2", "x"])


_OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.lists(_WORDS, max_size=5)),
                max_size=20)


def _apply_ops(index: BM25Index, ops: list[tuple[bool, int, list[str]]]) -> None:
    for add, key, tokens in ops:
        if add:
            index.add(key, tokens)
        else:
            index.remove(key)
