"""The postings merge (``postings.merge``): what it holds besides the segment it makes."""

from __future__ import annotations

import tracemalloc

import numpy as np

from recalld.daemon.index import postings
from recalld.daemon.index.postings import Segment, Slab, term_table


def _main(n_terms: int, n_docs: int, per_doc: int) -> Segment:
    """A main segment of ``n_docs`` rows with ``per_doc`` distinct terms each."""
    rng = np.random.default_rng(7)
    tids = np.concatenate([rng.choice(n_terms, per_doc, replace=False) for _ in range(n_docs)])
    rows = np.repeat(np.arange(n_docs, dtype=np.int32), per_doc)
    order = np.argsort(tids, kind="stable")  # by term, rows ascending within each
    indptr = np.zeros(n_terms + 1, dtype=np.int64)
    np.cumsum(np.bincount(tids, minlength=n_terms), out=indptr[1:])
    return Segment(indptr, rows[order], rng.random(len(rows)).astype(np.float32)[order],
                   np.full(n_docs, per_doc, dtype=np.float32),
                   np.arange(n_docs, dtype=np.uint32))


def test_a_merge_of_few_new_documents_into_a_large_main_holds_little_besides_it() -> None:
    # Every merge rewrites main: its postings are copied in order, and only the new
    # ones get positions; per posting of main the merge holds the new segment's 8 bytes
    # and a byte or so beside them, never positions for each (memory the kernel must
    # hand out and zero at every merge of a first build).
    n_terms = 5000
    main = _main(n_terms, 4000, 50)  # 200,000 postings
    table = term_table(f"t{i}" for i in range(n_terms))
    new = Slab.encode({4000 + d: [f"t{(d * 7 + j) % n_terms}" for j in range(20)]
                       for d in range(10)}, table)
    alive = np.ones(len(main.row_keys), dtype=np.bool_)
    tracemalloc.start()
    try:
        seg, _ = postings.merge(main, alive, [new], len(table))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    n_post = len(main.rows)
    assert len(seg.rows) == n_post + 200
    made = seg.rows.nbytes + seg.tfs.nbytes + seg.indptr.nbytes + seg.doclen.nbytes \
        + seg.row_keys.nbytes
    assert peak - made < 3 * n_post + 16 * n_terms, (peak, made)
    # And the result is main's postings of each term followed by the new ones.
    for t in (0, 7, 13, n_terms - 1):
        old = main.rows[main.indptr[t]:main.indptr[t + 1]].tolist()
        got = seg.rows[seg.indptr[t]:seg.indptr[t + 1]].tolist()
        added = [4000 + d for d in range(10) if t in {(d * 7 + j) % n_terms for j in range(20)}]
        assert got == old + added
