"""Counting the CJK tokens of a batch's documents for ``postings.Slab.local``: every
character and neighbouring pair of a document's CJK runs, as packed integers, without a
string per token (only distinct ones become terms).

Owns how a (document, term) pair and a CJK token pack into one int64, the bulk id
lookup of new terms (:func:`local_ids`), the ids of tokens earlier blocks already named
(:class:`KnownTokens`) and the block-wise count (:func:`count_cjk`). Pure numpy, no
state of its own beyond what a ``postings.Vocabulary`` keeps in a ``KnownTokens``.
"""

from __future__ import annotations

import itertools
import re
from typing import Final

import numpy as np
import numpy.typing as npt

from recalld.daemon.index.tokenizer import cjk_length

I64 = npt.NDArray[np.int64]


# Bulk counting packs (document, term) into one int64: the document above DOC_SHIFT.
DOC_SHIFT = 32
TERM_MASK = (1 << DOC_SHIFT) - 1
# A CJK token as one integer: a character is its code point (21 bits); a pair of
# neighbours is (1 << 42) | first << 21 | second. Counted with the block's document in
# the low _BLOCK_DOC_BITS bits (43 + 20 bits: a non-negative int64).
_PAIR = 1 << 42
_CP_MASK = (1 << 21) - 1
_BLOCK_DOC_BITS = 20
_BLOCK_DOC_MASK = (1 << _BLOCK_DOC_BITS) - 1


def local_ids(terms: list[str], ids: dict[str, int]) -> I64:
    """The ids of ``terms`` in ``ids``, where each new term gets the next id in the order
    of its first occurrence (as a ``TermTable`` would give them)."""
    fresh = [t for t in dict.fromkeys(terms) if t not in ids]
    ids.update(zip(fresh, range(len(ids), len(ids) + len(fresh)), strict=True))
    return np.fromiter(map(ids.__getitem__, terms), dtype=np.int64, count=len(terms))


# CJK characters counted per step of ``count_cjk``: its arrays take about 100 bytes a
# character, so a step stays at a few MB however many documents a batch has.
CJK_BLOCK_CHARS = 1 << 15
# Two code points of a pair, as two characters of one UTF-32 string.
_TWO: Final = re.compile("..", re.S)


def count_cjk(runs: list[list[str]], known: KnownTokens) -> tuple[I64, I64, list[int]]:
    """The (document, term) pairs (packed as in ``Slab.local``) and their counts of every
    character and neighbouring pair of ``runs`` (per document), and each document's BM25
    length of them (``tokenizer.cjk_length`` of its characters): what ``tokenizer._cjk``
    emits with unigrams, without a string per token (only distinct ones become terms).
    Documents are counted a block of about ``CJK_BLOCK_CHARS`` characters at a time;
    ``known`` gives the ids of the tokens (new ones join it)."""
    pairs: list[I64] = []
    tfs: list[I64] = []
    lens: list[int] = []
    lo = chars = 0
    for hi, doc in enumerate(runs, 1):
        chars += sum(map(len, doc))
        if chars >= CJK_BLOCK_CHARS or hi == len(runs) or hi - lo > _BLOCK_DOC_MASK:
            p, f, n = _cjk_block(runs[lo:hi], known)
            pairs.append(p + (lo << DOC_SHIFT))
            tfs.append(f)
            lens += n
            lo, chars = hi, 0
    if not pairs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), []
    return np.concatenate(pairs), np.concatenate(tfs), lens


class KnownTokens:
    """The CJK tokens (packed integers, ascending) already given an id in ``ids``, so a
    block makes strings and looks up ids only for tokens no earlier block had (of this
    batch, or of the batches before it that counted against the same ``Vocabulary``)."""

    __slots__ = ("codes", "ids", "tids")

    def __init__(self, ids: dict[str, int]) -> None:
        self.ids = ids
        self.codes = np.zeros(0, dtype=np.int64)
        self.tids = np.zeros(0, dtype=np.int64)

    def lookup(self, distinct: I64) -> I64:
        """The ids of ``distinct`` (ascending tokens); new ones join ``ids`` in order."""
        tids = np.empty(len(distinct), dtype=np.int64)
        if len(self.codes):
            at = np.minimum(np.searchsorted(self.codes, distinct), len(self.codes) - 1)
            seen = self.codes[at] == distinct
            tids[seen] = self.tids[at[seen]]
            new = distinct[~seen]
        else:
            seen = np.zeros(len(distinct), dtype=np.bool_)
            new = distinct
        if len(new):
            new_tids = local_ids(_token_strings(new), self.ids)
            tids[~seen] = new_tids
            # ``new`` is ascending and holds no known token: inserted in place, the codes
            # stay ascending without sorting them all again.
            at = np.searchsorted(self.codes, new)
            codes, known = np.insert(self.codes, at, new), np.insert(self.tids, at, new_tids)
            self.codes, self.tids = codes, known  # both or neither, should an insert raise
        return tids


def _token_strings(tokens: I64) -> list[str]:
    """The strings of ascending packed CJK tokens: characters (which sort first), then
    pairs, whose two code points decode as one UTF-32 string."""
    n_chars = int(np.searchsorted(tokens, _PAIR))
    strings = list(map(chr, tokens[:n_chars].tolist()))
    two = np.empty((len(tokens) - n_chars, 2), dtype=np.uint32)
    two[:, 0] = (tokens[n_chars:] >> 21) & _CP_MASK
    two[:, 1] = tokens[n_chars:] & _CP_MASK
    strings += _TWO.findall(two.tobytes().decode("utf-32-le"))
    return strings


def _cjk_block(runs: list[list[str]], known: KnownTokens) -> tuple[I64, I64, list[int]]:
    """:func:`count_cjk` of one block, its documents numbered from 0."""
    flat = list(itertools.chain.from_iterable(runs))
    per_run = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
    doc_of_run = np.repeat(np.arange(len(runs), dtype=np.int64), list(map(len, runs)))
    # Runs back to back, each closed by a NUL (never inside a run): pairs cannot span two.
    text = "\0".join([*flat, ""])
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    doc_of_pos = np.repeat(doc_of_run, per_run + 1)
    inside = cps != 0
    pair = inside[:-1] & inside[1:]
    # The token above the document: one sort groups every token's documents, so its
    # distinct tokens (ascending) and each count's token come out of that sort.
    tokens = np.concatenate([
        cps[inside] << _BLOCK_DOC_BITS | doc_of_pos[inside],
        (_PAIR | cps[:-1][pair] << 21 | cps[1:][pair]) << _BLOCK_DOC_BITS
        | doc_of_pos[:-1][pair],
    ])
    packed, tfs = np.unique(tokens, return_counts=True)
    keys = packed >> _BLOCK_DOC_BITS
    starts = np.ones(len(keys), dtype=np.bool_)
    np.not_equal(keys[1:], keys[:-1], out=starts[1:])
    term = known.lookup(keys[starts])[np.cumsum(starts) - 1]
    chars = np.bincount(doc_of_run, weights=per_run, minlength=len(runs)).astype(np.int64)
    return ((packed & _BLOCK_DOC_MASK) << DOC_SHIFT | term, tfs,
            [cjk_length(n) for n in chars.tolist()])
