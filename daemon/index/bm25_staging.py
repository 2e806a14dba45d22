"""What a pass of many writes holds in the keyword index (:class:`~.bm25.BM25Index`) until
it ends: the documents it staged beside main (``add_encoded(stage=True)``), not searchable
until they are merged, and the vocabularies its worker processes keep over its batches
(``vocabulary_ids``). The index merges, counts and drops them; this only holds them. No
I/O, no threads, no locks: the index's caller serializes its calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pyroaring import BitMap

from recalld.daemon.index import postings
from recalld.daemon.index.postings import I32, Slab

if TYPE_CHECKING:
    from recalld.daemon.index.bm25_terms import Terms


class Staging:
    """The staged documents and held vocabularies of a pass (see the module docstring)."""

    def __init__(self) -> None:
        # Slabs added with ``stage``: remapped, not yet searchable, merged into main
        # together (see BM25Index.add_encoded); their keys and summed lengths.
        self.slabs: list[Slab] = []
        self.keys = BitMap()
        self.length = 0
        # Vocabularies kept by worker processes over the batches of a pass: (pass token,
        # pid) -> this index's id of each of their terms (see vocabulary_ids).
        self.vocabs: dict[tuple[str, int], I32] = {}

    def hold(self, slab: Slab) -> None:
        """Stage ``slab`` (in the index's term ids)."""
        self.slabs.append(slab)
        self.keys.update(slab.keys)
        self.length += sum(slab.lens)

    def drop(self) -> BitMap:
        """Let go of the staged documents; returns their keys."""
        keys = self.keys
        self.slabs, self.keys, self.length = [], BitMap(), 0
        return keys

    def vocabulary_ids(self, source: tuple[str, int], start: int,
                       terms: list[str] | str, dictionary: Terms) -> I32:
        """The index's id (in ``dictionary``) of every term of the vocabulary ``source``
        keeps: see :meth:`~.bm25.BM25Index.vocabulary_ids`."""
        held = self.vocabs.get(source) if start else None
        if (0 if held is None else len(held)) != start:
            raise ValueError(f"a vocabulary of {start} terms is not the one held for {source}")
        new = postings.global_ids(postings.split_terms(terms), dictionary.table)
        ids = new if held is None else np.concatenate([held, new])
        self.vocabs[source] = ids
        return ids
