"""A batch's vocabulary as worker processes hand it back: one string, split on apply."""

from __future__ import annotations

import itertools

import pytest

from recalld.daemon.index.postings import Slab, join_terms, split_terms, term_table
from recalld.daemon.index.saved import terms_to_arrays
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


def test_terms_to_arrays_matches_encoding_each_string() -> None:
    # Joined and encoded at once, or one at a time where a string holds a line break of
    # its own (a note's path may): the same blob and offsets as encoding each string.
    cases = [[], [""], ["a", "", "b"], ["deploy", "数据库", "x" * 40, "a\x00b", "🙂", "z"],
             ["notes/a\nb.md", "notes/c.md"], ["\n"], ["", "\n", ""]]
    for terms in cases:
        blob, offsets = terms_to_arrays(terms)
        encoded = [t.encode("utf-8") for t in terms]
        assert blob.tobytes() == b"".join(encoded)
        assert offsets.tolist() == [0, *itertools.accumulate(len(e) for e in encoded)]
        assert [blob[offsets[i]:offsets[i + 1]].tobytes().decode() for i in range(len(terms))
                ] == terms
    with pytest.raises(UnicodeEncodeError):
        terms_to_arrays(["ok", "\udcff"])
