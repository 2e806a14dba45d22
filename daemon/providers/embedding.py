"""Embedding backends (sans-IO wire formats) and the EmbeddingClient that calls them.

Each remote backend only builds a request and parses an answer (no I/O), in the provider's
real wire format: ``openai`` (any OpenAI-compatible server), ``dashscope`` (native
text-embedding API), ``dashscope_multimodal``, ``gemini`` (batchEmbedContents) and ``ollama``
(/api/embed). ``local`` runs a model shipped in a PyPI package in worker threads (local.py).

:class:`EmbeddingClient` sends through the shared :class:`ProviderBridge` with a
:class:`RetryPolicy` and a :class:`CircuitBreaker`, batches by ``max_batch_size``, cuts inputs
to a character budget derived from ``max_input_length`` and returns L2-normalized float32
rows. It starts no task; cancelling ``embed`` cancels the HTTP attempt in flight.

API keys come from the config, else ``RECALLD_EMBEDDING_API_KEY``, else the backend's
conventional variable (OPENAI_API_KEY, DASHSCOPE_API_KEY, GEMINI_API_KEY/GOOGLE_API_KEY).
They never appear in logs, reprs, errors or status.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson
import trio

from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.providers.breaker import CircuitBreaker
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.errors import (
    DimensionMismatch,
    ProviderBadResponse,
    ProviderConfigError,
    ProviderError,
    redact,
)
from recalld.daemon.providers.retry import RetryPolicy, call_with_retry, check_response

log = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]
Kind = Literal["passage", "query"]

REMOTE_BACKENDS = ("openai", "dashscope", "dashscope_multimodal", "gemini", "ollama")
BACKENDS = (*REMOTE_BACKENDS, "local")
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "dashscope": "https://dashscope.aliyuncs.com",
    "dashscope_multimodal": "https://dashscope.aliyuncs.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "ollama": "http://localhost:11434",
    "local": "",
}
_ENV_KEYS = {
    "openai": ("OPENAI_API_KEY",),
    "dashscope": ("DASHSCOPE_API_KEY",),
    "dashscope_multimodal": ("DASHSCOPE_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "ollama": (),
    "local": (),
}
_NO_KEY_NEEDED = frozenset({"ollama", "local"})


def resolve_api_key(config: EmbeddingModelConfig, environ: Mapping[str, str]) -> str:
    """The API key: config value, then RECALLD_EMBEDDING_API_KEY, then the backend's var."""
    if config.api_key:
        return config.api_key
    for name in ("RECALLD_EMBEDDING_API_KEY", *_ENV_KEYS.get(config.backend, ())):
        if environ.get(name):
            return environ[name]
    return ""


def disabled_reason(config: EmbeddingModelConfig, api_key: str) -> str | None:
    """Why vectors are off for this config (QwenPaw's enable conditions), or None."""
    if config.backend not in BACKENDS:
        return f"unknown embedding backend {config.backend!r} (one of {', '.join(BACKENDS)})"
    if not config.model_name:
        return "no embedding model configured (model_name is empty)"
    if config.backend not in _NO_KEY_NEEDED and not api_key:
        return f"no API key for embedding backend {config.backend!r}"
    return None


# --------------------------------------------------------------------- input budget

def _is_wide(ch: str) -> bool:
    # CJK ideographs, kana, hangul and full-width forms: about one token per character.
    o = ord(ch)
    return (0x2E80 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF
            or 0xFF00 <= o <= 0xFFEF or 0x20000 <= o <= 0x3FFFF)


def truncate_to_budget(text: str, max_tokens: int) -> str:
    """Cut ``text`` so its estimated token count stays within ``max_tokens``.

    Conservative on purpose: one token per CJK character, one per three other characters
    (real tokenizers average ~4 for English), so the provider never rejects an input.
    """
    if max_tokens <= 0 or len(text) <= max_tokens:
        return text
    cost = 0.0
    for i, ch in enumerate(text):
        cost += 1.0 if _is_wide(ch) else 1.0 / 3.0
        if cost > max_tokens:
            return text[:i]
    return text


# ----------------------------------------------------------------- wire formats

@dataclass(frozen=True, slots=True)
class WireRequest:
    url: str
    headers: dict[str, str]
    body: dict[str, Any]


def _strip_suffixes(url: str, suffixes: tuple[str, ...]) -> str:
    url = url.rstrip("/")
    for suffix in suffixes:
        if url.endswith(suffix):
            return url[: -len(suffix)].rstrip("/")
    return url


def _loads(body: bytes, what: str) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ProviderBadResponse(f"{what}: answer is not valid JSON") from None


def _field(obj: Any, *path: str | int, what: str) -> Any:
    cur = obj
    for key in path:
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            dotted = ".".join(str(p) for p in path)
            raise ProviderBadResponse(f"{what}: answer has no {dotted}") from None
    return cur


class WireFormat:
    """One provider's request/response format. Pure functions of config and data."""

    name = "base"

    def __init__(self, config: EmbeddingModelConfig, api_key: str) -> None:
        self.config = config
        self._api_key = api_key
        self.base_url = (config.base_url or DEFAULT_BASE_URLS[config.backend]).rstrip("/")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.config.model_name!r} url={self.endpoint}>"

    @property
    def endpoint(self) -> str:
        raise NotImplementedError

    def build(self, texts: list[str]) -> WireRequest:
        raise NotImplementedError

    def parse(self, body: bytes, n: int) -> list[Any]:
        raise NotImplementedError

    def _bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    @property
    def _dims(self) -> int | None:
        return self.config.dimensions if self.config.use_dimensions else None


class OpenAIFormat(WireFormat):
    name = "openai"

    @property
    def endpoint(self) -> str:
        base = self.base_url
        return base if base.endswith("/embeddings") else f"{base}/embeddings"

    def build(self, texts: list[str]) -> WireRequest:
        body: dict[str, Any] = {"model": self.config.model_name, "input": texts,
                                "encoding_format": "float"}
        if self._dims is not None:
            body["dimensions"] = self._dims
        return WireRequest(self.endpoint, self._bearer(), body)

    def parse(self, body: bytes, n: int) -> list[Any]:
        data = _field(_loads(body, self.name), "data", what=self.name)
        if not isinstance(data, list):
            raise ProviderBadResponse(f"{self.name}: 'data' is not a list")
        items = sorted(data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
        return [_field(item, "embedding", what=self.name) for item in items]


class DashScopeFormat(WireFormat):
    name = "dashscope"
    path = "/api/v1/services/embeddings/text-embedding/text-embedding"
    index_key = "text_index"

    @property
    def endpoint(self) -> str:
        root = _strip_suffixes(self.base_url, ("/compatible-mode/v1", "/api/v1"))
        return root if root.endswith(self.path) else root + self.path

    def _input(self, texts: list[str]) -> dict[str, Any]:
        return {"texts": texts}

    def build(self, texts: list[str]) -> WireRequest:
        body: dict[str, Any] = {"model": self.config.model_name, "input": self._input(texts)}
        if self._dims is not None:
            body["parameters"] = {"dimension": self._dims}
        return WireRequest(self.endpoint, self._bearer(), body)

    def parse(self, body: bytes, n: int) -> list[Any]:
        embs = _field(_loads(body, self.name), "output", "embeddings", what=self.name)
        if not isinstance(embs, list):
            raise ProviderBadResponse(f"{self.name}: 'output.embeddings' is not a list")
        items = sorted(embs, key=lambda d: d.get(self.index_key, 0) if isinstance(d, dict)
                       else 0)
        return [_field(item, "embedding", what=self.name) for item in items]


class DashScopeMultimodalFormat(DashScopeFormat):
    name = "dashscope_multimodal"
    path = "/api/v1/services/embeddings/multimodal-embedding/multimodal-embedding"
    index_key = "index"

    def _input(self, texts: list[str]) -> dict[str, Any]:
        return {"contents": [{"text": t} for t in texts]}


class GeminiFormat(WireFormat):
    name = "gemini"

    @property
    def _model(self) -> str:
        return self.config.model_name.removeprefix("models/")

    @property
    def endpoint(self) -> str:
        root = _strip_suffixes(self.base_url, ("/v1beta",))
        return f"{root}/v1beta/models/{self._model}:batchEmbedContents"

    def build(self, texts: list[str]) -> WireRequest:
        requests = []
        for text in texts:
            req: dict[str, Any] = {"model": f"models/{self._model}",
                                   "content": {"parts": [{"text": text}]}}
            if self._dims is not None:
                req["outputDimensionality"] = self._dims
            requests.append(req)
        headers = {"x-goog-api-key": self._api_key} if self._api_key else {}
        return WireRequest(self.endpoint, headers, {"requests": requests})

    def parse(self, body: bytes, n: int) -> list[Any]:
        embs = _field(_loads(body, self.name), "embeddings", what=self.name)
        if not isinstance(embs, list):
            raise ProviderBadResponse(f"{self.name}: 'embeddings' is not a list")
        return [_field(item, "values", what=self.name) for item in embs]


class OllamaFormat(WireFormat):
    name = "ollama"

    @property
    def endpoint(self) -> str:
        root = _strip_suffixes(self.base_url, ("/api/embed", "/api", "/v1"))
        return f"{root}/api/embed"

    def build(self, texts: list[str]) -> WireRequest:
        body: dict[str, Any] = {"model": self.config.model_name, "input": texts}
        if self._dims is not None:
            body["dimensions"] = self._dims
        return WireRequest(self.endpoint, self._bearer(), body)

    def parse(self, body: bytes, n: int) -> list[Any]:
        embs = _field(_loads(body, self.name), "embeddings", what=self.name)
        if not isinstance(embs, list):
            raise ProviderBadResponse(f"{self.name}: 'embeddings' is not a list")
        return embs


FORMATS: dict[str, type[WireFormat]] = {
    "openai": OpenAIFormat,
    "dashscope": DashScopeFormat,
    "dashscope_multimodal": DashScopeMultimodalFormat,
    "gemini": GeminiFormat,
    "ollama": OllamaFormat,
}


def to_unit_rows(vectors: list[Any], n: int, dims: int, what: str) -> F32:
    """Validate count and dimension, then L2-normalize into float32 rows."""
    if len(vectors) != n:
        raise ProviderBadResponse(f"{what}: asked for {n} vectors, got {len(vectors)}")
    try:
        arr = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError):
        lengths = sorted({len(v) for v in vectors if isinstance(v, list)})
        if len(lengths) > 1 and dims in lengths:
            raise DimensionMismatch(
                f"{what}: vectors of mixed dimensions {lengths}, configured {dims}"
            ) from None
        raise ProviderBadResponse(f"{what}: vectors are not lists of numbers") from None
    if arr.ndim != 2:
        raise ProviderBadResponse(f"{what}: vectors are not lists of numbers")
    if arr.shape[1] != dims:
        raise DimensionMismatch(
            f"{what}: provider returned {arr.shape[1]}-dimensional vectors but dimensions="
            f"{dims} is configured (set dimensions={arr.shape[1]}, or use_dimensions=true "
            "if the model can shorten its vectors)"
        )
    if not np.isfinite(arr).all():
        raise ProviderBadResponse(f"{what}: vectors contain NaN or infinity")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ProviderBadResponse(f"{what}: provider returned an all-zero vector")
    rows: F32 = (arr / norms).astype(np.float32)
    return rows


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
        health_timeout_s: float = 30.0,
    ) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        self._bridge = bridge
        self._api_key = resolve_api_key(config, env)
        self.policy = policy or RetryPolicy()
        self.breaker = breaker or CircuitBreaker(name=f"embedding provider {config.backend}")
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._health_timeout_s = health_timeout_s
        self.disabled_reason = disabled_reason(config, self._api_key)
        self._format: WireFormat | None = None
        self._local: Any = None
        self.dimensions = config.dimensions
        if self.disabled_reason is None:
            if config.backend == "local":
                from recalld.daemon.providers import local

                self._local = local.LocalEmbedder(config.model_name, limiter=local_limiter)
                self.dimensions = local.LOCAL_DIMENSIONS
            else:
                self._format = FORMATS[config.backend](config, self._api_key)
        self.last_error: str | None = None
        self.last_ok: float | None = None
        self.health: Literal["unknown", "ok", "fail"] = "unknown"

    def __repr__(self) -> str:
        c = self.config
        return (f"EmbeddingClient(backend={c.backend!r}, model={c.model_name!r}, "
                f"dims={self.dimensions}, endpoint={self.endpoint!r}, api_key=***)")

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
    def max_batch_size(self) -> int:
        return max(1, self.config.max_batch_size)

    def vector_space_key(self) -> str:
        """A stable, filename-safe key for (backend, model, dimensions, endpoint)."""
        c = self.config
        model = re.sub(r"[^A-Za-z0-9._-]+", "_", c.model_name.strip()).strip("_") or "none"
        digest = hashlib.sha256(
            f"{c.backend}\n{c.model_name}\n{self.dimensions}\n{self.endpoint.lower()}".encode()
        ).hexdigest()[:10]
        return f"{c.backend}-{model[:48]}-{self.dimensions}-{digest}"

    def _redact(self, text: str) -> str:
        return redact(text, self._api_key)

    def _require_enabled(self) -> None:
        if self.disabled_reason is not None:
            raise ProviderConfigError(self.disabled_reason)

    async def embed(self, texts: list[str], kind: Kind = "passage") -> F32:
        """Embed ``texts``: float32, L2-normalized, shape (len(texts), dimensions).

        ``kind`` selects query or passage encoding where the model distinguishes them
        (the local e5 model); remote backends embed both alike. Inputs are cut to the
        ``max_input_length`` budget and sent in batches of ``max_batch_size``; a failing
        batch raises (ProviderTransient: retry later; ProviderPermanent: do not). On
        cancellation the HTTP attempt in flight is cancelled; nothing is half-returned.
        """
        self._require_enabled()
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        budget = self.config.max_input_length
        prepared = [truncate_to_budget(t, budget) or " " for t in texts]
        parts: list[F32] = []
        try:
            for start in range(0, len(prepared), self.max_batch_size):
                batch = prepared[start:start + self.max_batch_size]
                parts.append(await self._embed_batch(batch, kind))
        except ProviderError as exc:
            self.last_error = self._redact(str(exc))
            raise
        self.last_ok = time.time()
        rows: F32 = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return rows

    async def _embed_batch(self, batch: list[str], kind: Kind) -> F32:
        if self._local is not None:
            rows: F32 = await self._local.embed(batch, is_query=kind == "query")
            return rows
        fmt, bridge = self._format, self._bridge
        assert fmt is not None
        if bridge is None:
            raise ProviderConfigError("no provider bridge to send embedding requests through")
        request = fmt.build(batch)
        what = f"embedding {fmt.name} {self.config.model_name}"

        async def attempt(timeout_s: float) -> F32:
            result = await bridge.request("POST", request.url, headers=request.headers,
                                          json=request.body, timeout_s=timeout_s)
            check_response(result, self.policy, what=what)
            return to_unit_rows(fmt.parse(result.body, len(batch)), len(batch),
                                self.dimensions, what)

        return await call_with_retry(self.policy, attempt, rng=self._rng,
                                     breaker=self.breaker, what=what)

    async def health_check(self, workspace_dir: str | os.PathLike[str]) -> bool:
        """One "ping" embedding with a deadline and a dimension check; logs the outcome.

        Never raises a provider error: returns False and keeps the reason in ``status()``.
        The breaker is bypassed neither way: an open circuit is itself a FAIL reason.
        """
        prefix = f"[EMBEDDING HEALTH CHECK] name=default workspace_dir={Path(workspace_dir)}"
        reason: str | None = None
        try:
            self._require_enabled()
            with trio.move_on_after(self._health_timeout_s) as scope:
                rows = await self.embed(["ping"], kind="query")
            if scope.cancelled_caught:
                reason = f"no answer within {self._health_timeout_s:g}s"
            elif rows.shape != (1, self.dimensions):
                reason = f"unexpected vector shape {rows.shape}"
        except ProviderError as exc:
            reason = str(exc)
        if reason is None:
            self.health = "ok"
            log.info("%s -> OK", prefix)
            return True
        reason = self._redact(reason).replace("\n", " ")
        self.health = "fail"
        self.last_error = reason
        log.warning("%s -> FAIL %s", prefix, reason)
        return False

    def status(self) -> dict[str, Any]:
        """For daemon.status: no secrets, JSON-serializable."""
        c = self.config
        return {
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "backend": c.backend,
            "model": c.model_name,
            "dims": self.dimensions,
            "endpoint": self._redact(self.endpoint),
            "vector_space": self.vector_space_key(),
            "health": self.health,
            "breaker": self.breaker.snapshot().as_dict(),
            "last_error": self.last_error,
            "last_ok": self.last_ok,
        }
