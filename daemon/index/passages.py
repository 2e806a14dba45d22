"""The backfill's provider calls, and how a text the provider cannot take is singled out.

:class:`PassageCalls` sends one batch of a round's texts to the provider (through the
shared-workspace hook) and puts the vectors into the round's ``vectors``. Two kinds of
failure are told apart from an outage, so that one text never holds back the rest:

- a refusal for the input (HTTP 400/413/422, the provider's word): a batch of several
  texts is sent again text by text; a text refused alone is reported (its chunk is
  parked), whether it came alone or in a batch, refused as a whole or failing again and
  again; unless nothing shows the provider takes other texts now (none of the call's was
  embedded, and it refused two or more alone, or a lone one while its last call failed):
  then the fault is not the texts', the provider is marked failing and the error is
  raised;
- a transient failure (5xx, a timeout, a dropped connection; not an open circuit breaker,
  which sent nothing) or an answer that cannot be used (bad JSON, a wrong count of
  vectors, vectors of other dimensions: ``answer_at_fault``) strikes every text of the
  call. Struck texts go last in
  the next rounds (``order``), so the round's other texts are embedded first; a batch holding a
  text struck ``isolate_after`` times is sent text by text (the least struck first: a
  success closes a circuit breaker the failures opened); a text that then fails alone,
  struck ``isolate_after`` times or more, while the provider embedded other texts since
  its first strike, is reported like a refused one (the failure is the text's, not the
  provider's). During an outage nothing is embedded, so nothing is singled out: the round
  waits and is tried again.

Strikes live in memory only; they are dropped when the text is embedded or reported, and
at each round for texts no longer in it. A text parked before and tried again starts
with ``isolate_after`` strikes (``suspect``): it goes alone, and one more failure parks it
again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.spaces import VectorSpace
from recalld.daemon.providers.errors import (
    CircuitOpen,
    ProviderError,
    ProviderPermanent,
    ProviderTransient,
    answer_at_fault,
    input_refused,
)
from recalld.daemon.remote.hook import embed_passages
from recalld.daemon.workspaces import Workspace


@dataclass(slots=True)
class _Strikes:
    """How often calls holding a text failed, and the provider's successful calls before
    the first of those failures."""

    count: int
    successes_before: int


class PassageCalls:
    """Provider calls of one workspace's backfill in one vector space."""

    def __init__(self, workspace: Workspace, space: VectorSpace, *, use_cache: bool,
                 isolate_after: int) -> None:
        self.workspace = workspace
        self.space = space
        self.use_cache = use_cache
        self.isolate_after = max(1, isolate_after)
        #: Texts (by hash) whose calls failed transiently.
        self._strikes: dict[str, _Strikes] = {}
        #: Texts sent to the provider and embedded.
        self.provider_texts = 0
        #: The cache keys of those texts (since the workspace opened): what the import
        #: report counts as paid since then, not as there before. Rebound, never changed
        #: in place but by adding, so a worker thread may read it (``VectorSpace``
        #: drops the keys no chunk uses any more).
        self.paid: set[str] = set()
        #: Until when (trio clock) a call waits to retry, and the error it follows.
        self._retry_until = -math.inf
        self._retry_error = ""
        self._wait_seen = trio.Event()
        #: The key a text's vector is cached under (the space's ``cache_key`` unless the
        #: worker says otherwise).
        self.cache_key: Callable[[str], str] = space.cache_key

    def retry_wait(self) -> tuple[float, str] | None:
        """``(seconds left, error)`` while a call waits to retry (the provider's
        Retry-After, or a backoff after a failed attempt), else None."""
        left = self._retry_until - trio.current_time()
        return (left, self._retry_error) if left > 0 else None

    def watch_waits(self) -> trio.Event:
        """An event set once a call next starts to wait to retry."""
        self._wait_seen = trio.Event()
        return self._wait_seen

    def _waiting(self, delay_s: float, error: str) -> None:
        self._retry_until = trio.current_time() + delay_s
        self._retry_error = error
        self._wait_seen.set()

    def start_round(self, hashes: Sequence[str]) -> None:
        """Forget the strikes of texts no longer in the round."""
        keep = set(hashes)
        self._strikes = {h: s for h, s in self._strikes.items() if h in keep}

    def suspect(self, hashes: Sequence[str]) -> None:
        """Strike ``hashes`` (texts parked before, tried again) enough to send them alone
        and to report one that fails alone again at once: its earlier failures already
        showed the fault is its own (else, the last text left, it would be retried as an
        outage for good, with the circuit breaker opened by it alone)."""
        for h in hashes:
            if self._count(h) < self.isolate_after:
                self._strikes[h] = _Strikes(self.isolate_after, -1)

    def _suspected(self, text_hash: str) -> bool:
        s = self._strikes.get(text_hash)
        return s is not None and s.successes_before < 0

    def _count(self, text_hash: str) -> int:
        s = self._strikes.get(text_hash)
        return 0 if s is None else s.count

    def order(self, text_hash: str) -> int:
        """Sort key of a text in its round: the more often its calls failed, the later."""
        return self._count(text_hash)

    def _strike(self, hashes: Sequence[str]) -> None:
        successes = self.space.client.successes
        for h in hashes:
            s = self._strikes.setdefault(h, _Strikes(0, successes))
            s.count += 1

    def _singled_out(self, text_hash: str) -> int:
        """The strikes of a text that failed alone, if they show the fault is its own
        (enough of them, and the provider embedded other texts since the first), else 0."""
        s = self._strikes.get(text_hash)
        if s is None or s.count < self.isolate_after:
            return 0
        return s.count if self.space.client.successes > s.successes_before else 0

    async def send(self, hashes: list[str], texts: list[str], vectors: dict[str, F32],
                   refused: dict[str, str]) -> None:
        """One provider call for ``texts``, its vectors into ``vectors`` (and the cache).
        Texts singled out (see the module docstring) go into ``refused`` with the reason;
        any other failure is raised."""
        if len(texts) > 1 and any(self._count(h) >= self.isolate_after for h in hashes):
            await self._one_by_one(hashes, texts, vectors, refused)
            return
        try:
            await self._call(hashes, texts, vectors, refused)
        except ProviderPermanent as exc:
            if not input_refused(exc):
                raise
            if len(texts) > 1:
                await self._one_by_one(hashes, texts, vectors, refused, refusal=exc)
            else:
                self._judge({hashes[0]: (texts[0], exc)}, False, refused)

    async def _call(self, hashes: list[str], texts: list[str], vectors: dict[str, F32],
                    refused: dict[str, str]) -> None:
        """The provider call itself: a refusal is raised for :meth:`send` to judge; a
        transient failure strikes the texts (and a text singled out by it goes into
        ``refused``)."""
        space = self.space
        # Keyed by what the call sends (a stricter workspace may join meanwhile).
        keys = [self.cache_key(t) for t in texts]
        try:
            rows = await embed_passages(self.workspace, space.key, hashes, texts,
                                        partial(space.client.embed, kind="passage",
                                                on_wait=self._waiting))
        except ProviderError as exc:
            if isinstance(exc, CircuitOpen) or not (exc.transient or answer_at_fault(exc)):
                raise  # nothing was sent, or a fault no text has (a key, the dimensions)
            self._strike(hashes)
            strikes = self._singled_out(hashes[0]) if len(texts) == 1 else 0
            if not strikes:
                raise
            del self._strikes[hashes[0]]
            self.space.client.text_at_fault()
            refused[texts[0]] = (f"{exc} (failed {strikes} times for this text while the "
                                 "provider embedded others)")
            return
        self.provider_texts += len(texts)
        self.paid.update(keys)
        for h in hashes:
            self._strikes.pop(h, None)
        if self.use_cache:
            await trio.to_thread.run_sync(space.cache.put_many,
                                          list(zip(keys, rows, strict=True)))
        for j, t in enumerate(texts):
            vectors[t] = rows[j]

    def _judge(self, errors: dict[str, tuple[str, ProviderPermanent]], others_embedded: bool,
               refused: dict[str, str], refusal: ProviderPermanent | None = None) -> None:
        """Texts (hash -> text, error) each refused alone for their input: into
        ``refused`` (their chunks are parked) when the fault is theirs, else
        ``refusal`` (the batch's) or the first text's error is raised with the provider
        marked failing.

        The fault is the provider's when nothing shows it takes other texts now: no text
        of the call was embedded, and it refused two texts or more it had not refused
        before, or a lone one while its last call failed. A text refused before (parked,
        tried again) and refused again is always its own fault."""
        fresh = [h for h in errors if not self._suspected(h)]
        health = self.space.client.health
        if fresh and not others_embedded and (len(fresh) > 1 or health == "fail"):
            for h in errors.keys() - set(fresh):
                text, exc = errors[h]
                refused[text] = str(exc)
            # Refusing every text: not the texts' fault, and no retry changes that.
            self.space.client.failing(for_good=True)
            raise refusal or errors[fresh[0]][1]
        for text, exc in errors.values():
            refused[text] = str(exc)

    async def _one_by_one(self, hashes: list[str], texts: list[str],
                          vectors: dict[str, F32], refused: dict[str, str], *,
                          refusal: ProviderPermanent | None = None) -> None:
        """Send the texts of a batch one by one (refused as a whole, or failing again
        and again), the least struck first (the others' successes are what singles a
        failing text out). The texts refused alone are judged (:meth:`_judge`) once
        every text was tried; then the first failure of the others not singled out is
        raised."""
        pairs = sorted(zip(hashes, texts, strict=True), key=lambda p: self._count(p[0]))
        first: ProviderError | None = None
        errors: dict[str, tuple[str, ProviderPermanent]] = {}
        try:
            for h, t in pairs:
                try:
                    await self._call([h], [t], vectors, refused)
                except CircuitOpen:
                    raise
                except ProviderPermanent as one:
                    if answer_at_fault(one):
                        first = first or one
                    elif input_refused(one):
                        errors[h] = (t, one)
                    else:
                        raise
                except ProviderTransient as one:
                    first = first or one
        except ProviderError:
            if any(t in vectors for t in texts):  # others were embedded: theirs alone
                refused.update((t, str(exc)) for t, exc in errors.values())
            raise
        self._judge(errors, any(t in vectors for t in texts), refused, refusal)
        if first is not None:
            raise first


__all__ = ["PassageCalls"]
