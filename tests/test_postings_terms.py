"""A batch's vocabulary as worker processes hand it back: one string, split on apply."""

from __future__ import annotations

import pytest

from recalld.daemon.index.postings import Slab, join_terms, split_terms, term_table
from recalld.daemon.index.tokenizer import tokenize_split


def test_joined_terms_apply_as_the_list_does() -> None:
    texts = ["handleWebSocketReconnect failed with ECONNREFUSED", "周末我们去爬山", "",
             "C++ and C# notes, v1.2.3 / a_b"]
    split = [tokenize_split(t) for t in texts]
    slab, terms = Slab.local([w for w, _ in split], [r for _, r in split])
    joined = join_terms(terms)
    assert isinstance(joined, str) and split_terms(joined) == terms
    assert split_terms(terms) is terms
    keys = [10, 11, 12, 13]
    a, b = term_table(), term_table()
    from_list, from_joined = slab.remap(terms, a, keys), slab.remap(joined, b, keys)
    assert list(a) == list(b)
    assert from_list.tids.tolist() == from_joined.tids.tolist()
    assert slab.counts(joined) == slab.counts(terms)


def test_an_empty_vocabulary_and_a_term_with_a_line_break() -> None:
    assert join_terms([]) == "" and split_terms("") == []
    with pytest.raises(ValueError, match="line break"):
        join_terms(["one", "two\nthree"])
    for terms in ([""], ["a", ""], ["", "a"], ["a", "", "b"]):
        with pytest.raises(ValueError, match="empty"):
            join_terms(terms)
