"""The EmbeddingClient: embeds texts for one vector space through one backend.

Remote backends (``openai``, ``dashscope``, ``dashscope_multimodal``, ``gemini``,
``ollama``) are sans-IO wire formats in embedding_formats.py; ``local`` runs a model shipped
in a PyPI package in worker threads (local.py).

:class:`EmbeddingClient` sends through the shared :class:`ProviderBridge` with a
:class:`RetryPolicy` and a :class:`CircuitBreaker`, batches by ``max_batch_size``, cuts inputs
to a character budget derived from ``max_input_length`` (both the strictest of the
workspaces that share the client) and returns L2-normalized float32
rows. It starts no task; cancelling ``embed`` cancels the HTTP attempt in flight.

API keys come from the config, else ``RECALLD_EMBEDDING_API_KEY``, else the backend's
conventional variable (OPENAI_API_KEY, DASHSCOPE_API_KEY, GEMINI_API_KEY/GOOGLE_API_KEY).
They never appear in logs, reprs, errors or status.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import random
import re
import time
import unicodedata
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np
import trio

from recalld.daemon import metrics
from recalld.daemon.arraytypes import F32
from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.providers.breaker import BreakerState, CircuitBreaker
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.embedding_formats import (
    FORMATS,
    WireFormat,
    to_unit_rows,
    truncate_to_budget,
)
from recalld.daemon.providers.embedding_keys import disabled_reason, resolve_api_key
from recalld.daemon.providers.errors import (
    CircuitOpen,
    ProviderBadResponse,
    ProviderConfigError,
    ProviderError,
    ProviderRetryableStatus,
    ProviderTimeout,
    input_refused,
    mask_model,
    redact,
    redact_url,
    unexpected,
)
from recalld.daemon.providers.retry import RetryPolicy, call_with_retry, check_response

if TYPE_CHECKING:
    from recalld.daemon.providers.local import LocalEmbedder, PassageLane

log = logging.getLogger(__name__)


class EmbeddingStatus(TypedDict):
    enabled: bool
    disabled_reason: str | None
    backend: str
    model: str
    dims: int
    endpoint: str
    vector_space: str
    health: Literal["unknown", "ok", "fail"]
    breaker: BreakerState
    last_error: str | None
    #: When (wall clock) ``last_error`` came; past once ``last_ok`` is later.
    last_error_at: float | None
    #: While ``health`` is "fail": whether the provider failed for good (a retry of the
    #: same request will not help: the key, the model, the address, the dimensions, or
    #: every text refused), so the fix is the user's; False for an outage, a rate limit.
    fails_for_good: bool
    last_ok: float | None
    #: The limits calls apply now: the strictest of the workspaces sharing the client.
    max_batch_size: int
    max_input_length: int


__all__ = ["DEADLINE_MARGIN_S", "EmbeddingClient", "EmbeddingStatus", "Kind", "OnWait",
           "disabled_reason", "resolve_api_key"]

Kind = Literal["passage", "query"]
#: Told of a wait before a try again as it starts: its length and the error it follows
#: (redacted).
OnWait = Callable[[float, str], None]

#: How much later than an ``embed`` call's ``deadline_s`` its caller gives up on it: time
#: for the retry loop to stop at the deadline with the provider's error.
DEADLINE_MARGIN_S = 0.5

# ----------------------------------------------------------------------- client

class EmbeddingClient:
    """Embeds texts for one vector space. Shared by every workspace using that space."""

    def __init__(
        self,
        config: EmbeddingModelConfig,
        bridge: ProviderBridge | None,
        *,
        policy: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        rng: random.Random | None = None,
        environ: Mapping[str, str] | None = None,
        local_limiter: trio.CapacityLimiter | None = None,
        passage_lane: PassageLane | None = None,
        health_timeout_s: float = 30.0,
    ) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        self._bridge = bridge
        self._environ = env
        self._api_key = resolve_api_key(config, env)
        self.policy = policy or RetryPolicy()
        self.breaker = breaker or CircuitBreaker(name=f"embedding provider {config.backend}")
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._health_timeout_s = health_timeout_s
        self.disabled_reason = disabled_reason(config, self._api_key)
        self._format: WireFormat | None = None
        self._local: LocalEmbedder | None = None
        self.dimensions = config.dimensions
        if self.disabled_reason is None:
            if config.backend == "local":
                from recalld.daemon.providers import local

                self._local = local.LocalEmbedder(config.model_name, limiter=local_limiter,
                                                  lane=passage_lane)
                self.dimensions = local.LOCAL_DIMENSIONS
                # Vectors off, said so, rather than a load failing at every retry; its
                # vector space stays the model's (what it embeds once installed).
                self.disabled_reason = local.missing_packages(config.model_name)
            else:
                self._format = FORMATS[config.backend](config, self._api_key)
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_ok: float | None = None
        #: Calls answered with vectors so far (a text failing while others are embedded
        #: is the text's fault, not the provider's: ``index/passages.py``).
        self.successes = 0
        self.health: Literal["unknown", "ok", "fail"] = "unknown"
        #: See ``EmbeddingStatus.fails_for_good``.
        self.fails_for_good = False
        #: Whether the last failure was met by the backfill's call or ping (``failing``).
        self._judged_by_backfill = False
        #: Until when (trio clock) the provider's last Retry-After asks to be left alone.
        self._quiet_until = -math.inf
        #: The provider's own error that asked for it (what ``quiet_error`` quotes: the
        #: last error may be a refusal quoting it, and quoted again it would grow by one
        #: quote per refusal for as long as the wait lasts).
        self._quiet_cause: str | None = None
        #: Texts per request and the input budget (``share_limits``).
        self._batch_limit = max(1, config.max_batch_size)
        self.input_limit = config.max_input_length

    def __repr__(self) -> str:
        c, endpoint = self.config, redact_url(self.endpoint, self._api_key)
        return (f"EmbeddingClient(backend={c.backend!r}, model={mask_model(c.model_name)!r}, "
                f"dims={self.dimensions}, endpoint={endpoint!r}, api_key=***)")

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    @property
    def endpoint(self) -> str:
        if self._format is not None:
            return self._format.endpoint
        if self._local is not None:
            return f"local:{self._local.model_name}"
        return self.config.base_url

    @property
    def local(self) -> LocalEmbedder | None:
        """The in-process model of the ``local`` backend; None for a provider over HTTP."""
        return self._local

    @property
    def max_batch_size(self) -> int:
        return self._batch_limit

    def share_limits(self, configs: Collection[EmbeddingModelConfig]) -> None:
        """Apply the strictest ``max_batch_size`` and ``max_input_length`` of ``configs``
        (the workspaces sharing this client; its own config's when none): a limit one of
        them states for the provider or the model is never passed for another's texts."""
        configs = configs or (self.config,)
        self._batch_limit = max(1, min(c.max_batch_size for c in configs))
        self.input_limit = min(c.max_input_length for c in configs)

    def sent_text(self, text: str) -> str:
        """What is sent for ``text`` now: composed (NFC), cut to the input budget (the
        strictest of the workspaces sharing the client), a blank one as a space. A note
        written decomposed (NFD: macOS, some editors) and a query typed composed are one
        text to the keyword index; a provider embeds the code points as sent, so both
        are sent composed, whatever the form written."""
        if not text.isascii():
            text = unicodedata.normalize("NFC", text)
        return truncate_to_budget(text, self.input_limit) or " "

    def vector_space_key(self) -> str:
        """A stable, filename-safe key for (backend, model, dimensions, endpoint). A local
        model counts by its canonical name: its aliases make the same vectors."""
        c = self.config
        name = c.model_name if self._local is None else self._local.model_name
        # A key pasted into model_name is masked here too: the key names files and is
        # shown (status); the digest, of the name itself, keeps two such spaces apart.
        model = re.sub(r"[^A-Za-z0-9._-]+", "_", mask_model(name.strip())).strip("_") or "none"
        digest = hashlib.sha256(
            f"{c.backend}\n{name}\n{self.dimensions}\n{self.endpoint.lower()}".encode()
        ).hexdigest()[:10]
        return f"{c.backend}-{model[:48]}-{self.dimensions}-{digest}"

    def _redact(self, text: str) -> str:
        return redact(text, self._api_key)

    def _require_enabled(self) -> None:
        if self.disabled_reason is not None:
            raise ProviderConfigError(self.disabled_reason)

    async def embed(self, texts: list[str], kind: Kind = "passage", *,
                    deadline_s: float | None = None, on_wait: OnWait | None = None) -> F32:
        """Embed ``texts``: float32, L2-normalized, shape (len(texts), dimensions).

        ``kind`` selects query or passage encoding where the model distinguishes them
        (the local e5 model); remote backends embed both alike. Inputs are cut to the
        ``max_input_length`` budget and sent in batches of ``max_batch_size``; a failing
        batch raises (ProviderTransient: retry later; ProviderPermanent: do not). On
        cancellation the HTTP attempt in flight is cancelled; nothing is half-returned.
        ``deadline_s`` shortens the retry policy's deadline for each batch: a retry whose
        wait would pass it is not started, and the provider's last error is raised.
        ``on_wait(delay_s, error)`` is told of each wait before a retry as it starts. While
        the provider's last Retry-After runs (another call was asked to wait), the call
        waits it out before sending, or raises at once, sending nothing, when that passes
        the deadline.

        A failure marks the provider failing (``health``, ``fails_for_good``), but for a
        text it refuses (that says nothing of its health) and for an answer to a query it
        could not use (other dimensions, not JSON, NaN): that is one answer to one short
        text, kept as ``last_error``; whether the provider fails for good is for the
        backfill's calls and its pings (which judge their own answers) to show, and so a
        good answer to a query does not end a failure for good either.
        """
        def told(delay_s: float, exc: ProviderError) -> None:
            if exc.retry_after_s is not None and not isinstance(exc, CircuitOpen):
                # The provider asked to be left alone while this call waits to try again:
                # other calls (a search's query vector) keep off meanwhile (``quiet_s``),
                # and say after what.
                self._quiet_until = max(self._quiet_until, trio.current_time() + delay_s)
                self._quiet_cause = self._redact(str(exc))
                self.note_error(self._quiet_cause)
            if on_wait is not None:
                on_wait(delay_s, self._redact(str(exc)))

        self._require_enabled()
        if kind not in ("passage", "query"):
            raise ValueError(f"kind must be 'passage' or 'query', not {kind!r}")
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        prepared = [self.sent_text(t) for t in texts]
        policy = self.policy
        if deadline_s is not None:
            policy = dataclasses.replace(
                policy, deadline_s=min(policy.deadline_s, deadline_s),
                attempt_timeout_s=min(policy.attempt_timeout_s, deadline_s))
        policy = await self._wait_quiet(policy, on_wait)
        parts: list[F32] = []
        started = time.monotonic()
        try:
            for start in range(0, len(prepared), self.max_batch_size):
                batch = prepared[start:start + self.max_batch_size]
                parts.append(await self._embed_batch(batch, kind, policy, told))
        except ProviderError as exc:
            self.note_error(self._redact(str(exc)))
            if exc.retry_after_s is not None and not isinstance(exc, CircuitOpen):
                # The provider's own Retry-After (an open circuit's wait is the breaker's,
                # which ``hold_s`` reads from it).
                wait = min(max(exc.retry_after_s, 0.0), self.policy.retry_after_cap_s)
                self._quiet_until = trio.current_time() + wait
                self._quiet_cause = self._redact(str(exc))
            if not input_refused(exc) and not (
                    kind == "query" and isinstance(exc, ProviderBadResponse)):
                self.failing(for_good=not exc.transient, by_backfill=kind == "passage")
            metrics.count("recalld_embed_errors_total")
            raise
        finally:
            metrics.observe("recalld_embed_seconds", time.monotonic() - started)
        metrics.count("recalld_embed_texts_total", len(texts))
        self.last_ok = time.time()
        self.successes += 1
        self._quiet_until = -math.inf  # it answers again: a Retry-After is over
        if kind == "passage" or not (self.fails_for_good and self._judged_by_backfill):
            # A good answer to a query ends an outage, or a failure for good another
            # query met (a key refused), but not one the backfill met for what it sends
            # (its texts, their dimensions): its pings (``health_check``) say when that
            # is over.
            self.health, self.fails_for_good = "ok", False
        rows: F32 = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return rows

    async def _wait_quiet(self, policy: RetryPolicy, on_wait: OnWait | None) -> RetryPolicy:
        """Wait out the provider's last Retry-After (another call was asked to wait) before
        sending, told to ``on_wait``; ``policy`` with what is left of its deadline. Raises
        the error of :meth:`quiet_error` at once, sending nothing, when the wait would
        pass the deadline. On cancellation nothing was sent."""
        error = self.quiet_error()
        if error is None:
            return policy
        wait = error.retry_after_s or 0.0
        if wait >= policy.deadline_s:
            raise error
        if on_wait is not None:
            on_wait(wait, str(error))
        await trio.sleep(wait)
        return dataclasses.replace(policy, deadline_s=policy.deadline_s - wait)

    def quiet_error(self) -> ProviderRetryableStatus | None:
        """What a call made now meets without being sent while the provider's last
        Retry-After runs (None when none does): asking again would only be refused again."""
        quiet = self.quiet_s()
        if quiet <= 0:
            return None
        return ProviderRetryableStatus(
            f"the embedding provider asked to wait {quiet:.0f}s more (Retry-After) "
            f"after: {self._quiet_cause or self.last_error}", retry_after_s=quiet)

    async def _embed_batch(self, batch: list[str], kind: Kind, policy: RetryPolicy,
                           on_wait: Callable[[float, ProviderError], None] | None) -> F32:
        if self._local is not None:
            try:
                rows: F32 = await self._local.embed(batch, is_query=kind == "query")
            except ProviderError:
                raise  # the model's own refusal (its package missing or damaged), as said
            except (OSError, RuntimeError, ValueError, MemoryError) as exc:
                raise ProviderBadResponse(f"local embedding failed: {exc}") from exc
            except Exception as exc:
                raise unexpected(exc, "local embedding") from exc
            return rows
        fmt, bridge = self._format, self._bridge
        assert fmt is not None
        if bridge is None:
            raise ProviderConfigError("no provider bridge to send embedding requests through")
        request = fmt.build(batch)
        what = f"embedding {fmt.name} {mask_model(self.config.model_name)}"

        async def attempt(timeout_s: float) -> F32:
            result = await bridge.request("POST", request.url, headers=request.headers,
                                          json=request.body, timeout_s=timeout_s)
            check_response(result, policy, what=what, secret=self._api_key)
            return to_unit_rows(fmt.parse(result.body, len(batch)), len(batch),
                                self.dimensions, what)

        return await call_with_retry(policy, attempt, rng=self._rng,
                                     breaker=self.breaker, what=what, on_wait=on_wait,
                                     secret=self._api_key)

    async def health_check(self, workspace_dir: str | os.PathLike[str], *, name: str,
                           on_wait: OnWait | None = None) -> bool:
        """One "ping" embedding with a deadline and a dimension check; logs the outcome
        with the workspace's ``name`` (its agent) and folder; ``on_wait`` as for ``embed``.

        Never raises a provider error: returns False and keeps the reason in ``status()``.
        The breaker is bypassed neither way: an open circuit is itself a FAIL reason.
        """
        prefix = f"[EMBEDDING HEALTH CHECK] name={name} workspace_dir={Path(workspace_dir)}"
        reason: str | None = None
        for_good = False
        try:
            self._require_enabled()
            # The retries stop short of the deadline with the provider's own error; the
            # scope, a little later, bounds what no retry policy does (a local model).
            with trio.move_on_after(self._health_timeout_s + DEADLINE_MARGIN_S) as scope:
                rows = await self.embed(["ping"], kind="query",
                                        deadline_s=self._health_timeout_s, on_wait=on_wait)
            if scope.cancelled_caught:
                reason = f"no answer within {self._health_timeout_s:g}s"
            elif rows.shape != (1, self.dimensions):
                reason, for_good = f"unexpected vector shape {rows.shape}", True
        except ProviderTimeout:
            reason = f"no answer within {self._health_timeout_s:g}s"
        except ProviderError as exc:
            reason, for_good = str(exc), not exc.transient
        if reason is None:
            self.health, self.fails_for_good = "ok", False
            log.info("%s -> OK", prefix)
            return True
        reason = self._redact(reason).replace("\n", " ")
        self.failing(for_good=for_good)
        self.note_error(reason)
        log.warning("%s -> FAIL %s", prefix, reason)
        return False

    async def wait_healthy(
        self,
        workspace_dir: str | os.PathLike[str],
        *,
        name: str,
        backoff_base_s: float = 5.0,
        backoff_max_s: float = 300.0,
        on_wait: OnWait | None = None,
    ) -> None:
        """Health-check until OK, waiting longer after each failure (never gives up).

        Waits are "equal jitter" (half fixed, half random) up to ``backoff_max_s``, and at
        least ``hold_s()`` (an open breaker, the provider's Retry-After), so a long outage
        costs one ping per few minutes, not a spin. Every attempt logs its OK/FAIL line and
        updates status(); ``on_wait(delay_s, error)`` is told of each wait as it starts,
        between pings and inside one. Cancel it to stop.
        """
        attempt = 0
        while not await self.health_check(workspace_dir, name=name, on_wait=on_wait):
            ceiling = min(backoff_max_s, backoff_base_s * (2 ** min(attempt, 30)))
            delay = max(ceiling / 2 + self._rng.uniform(0.0, ceiling / 2), self.hold_s())
            if on_wait is not None:
                on_wait(delay, self.last_error or "")
            await trio.sleep(delay)
            attempt += 1

    def failing(self, *, for_good: bool, by_backfill: bool = True) -> None:
        """Mark the provider failing: ``for_good`` when a retry of the same request will
        not help (see ``EmbeddingStatus.fails_for_good``); ``by_backfill`` when the
        backfill's own call or ping failed, not a search's query."""
        self.health, self.fails_for_good = "fail", for_good
        self._judged_by_backfill = by_backfill

    def text_at_fault(self) -> None:
        """The last failure was a text's own (it failed alone again and again while
        others were embedded: ``index/passages.py``), so it says nothing of the provider's
        health, as a refused text does not."""
        self.health, self.fails_for_good = "ok", False

    def note_error(self, error: str) -> None:
        """Keep ``error`` (redacted) as the last one met, with its time."""
        self.last_error, self.last_error_at = error, time.time()

    def hold_s(self) -> float:
        """Seconds before the provider should be called again of its own accord: while the
        breaker is open, or the provider's last Retry-After (capped by the retry policy)
        runs. A call it made fail at once (past a short deadline) is no leave to ask again
        at once."""
        return max(self.breaker.retry_in_s(), self.quiet_s())

    def quiet_s(self) -> float:
        """Seconds the provider's last Retry-After (capped by the retry policy) still
        asks to be left alone (0 when none runs)."""
        return max(self._quiet_until - trio.current_time(), 0.0)

    def status(self) -> EmbeddingStatus:
        """For daemon.status: no secrets, JSON-serializable."""
        c = self.config
        return {
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "backend": c.backend,
            "model": mask_model(c.model_name),
            "dims": self.dimensions,
            "endpoint": redact_url(self.endpoint, self._api_key),
            "vector_space": self.vector_space_key(),
            "health": self.health,
            "breaker": self.breaker.snapshot().as_dict(),
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "fails_for_good": self.health == "fail" and self.fails_for_good,
            "last_ok": self.last_ok,
            "max_batch_size": self.max_batch_size,
            "max_input_length": self.input_limit,
        }
