"""Embedding wire formats, sans-IO: build a provider's request, parse its answer.

One class per remote backend, in the provider's real format: ``openai`` (any
OpenAI-compatible server), ``dashscope`` (native text-embedding API),
``dashscope_multimodal``, ``gemini`` (batchEmbedContents) and ``ollama`` (/api/embed). Also
the input budget (a conservative token estimate, CJK-aware) and the answer check that turns
vectors into L2-normalized float32 rows. No I/O, no state: embedding.py does the calling.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

import numpy as np
import orjson

from recalld.daemon.arraytypes import F32
from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.providers.errors import (
    DimensionMismatch,
    ProviderBadResponse,
    mask_model,
    redact_url,
    snippet,
)
from recalld.daemon.providers.json_answers import not_json, without_bom
from recalld.daemon.textcost import chars_within

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


# --------------------------------------------------------------------- input budget

def truncate_to_budget(text: str, max_tokens: int) -> str:
    """Cut ``text`` so its estimated token count stays within ``max_tokens``.

    Conservative on purpose, so the provider never refuses an input for its length (a
    refused text is parked: its chunk gets no vector): an ASCII character counts a third
    of a token (real tokenizers average ~4 per token for English), any other character
    as many tokens as its UTF-8 bytes, the most a byte-level tokenizer makes of it (CJK
    3, Devanagari and Thai 3, Cyrillic 2, an emoji 4; their real counts vary from one
    tokenizer to the next and reach that for rare characters): :mod:`~recalld.daemon.textcost`,
    the estimator of every budget of what is sent to a model. The default budget
    (8192) holds a chunk of the default size (2,000 characters) in any script.
    """
    if max_tokens <= 0 or 4 * len(text) <= max_tokens:
        return text
    return text[:chars_within(text, 3 * max_tokens)]  # in thirds of a token: exact


# ----------------------------------------------------------------- wire formats

class OpenAIEmbeddingRequest(TypedDict):
    """``openai`` and ``ollama`` (which has no ``encoding_format``)."""

    model: str
    input: list[str]
    encoding_format: NotRequired[Literal["float"]]
    dimensions: NotRequired[int]


class TextPart(TypedDict):
    text: str


class DashScopeTexts(TypedDict):
    texts: list[str]


class DashScopeContents(TypedDict):
    contents: list[TextPart]


class DashScopeParameters(TypedDict):
    dimension: int


class DashScopeRequest(TypedDict):
    model: str
    input: DashScopeTexts | DashScopeContents
    parameters: NotRequired[DashScopeParameters]


class GeminiContent(TypedDict):
    parts: list[TextPart]


class GeminiEmbedRequest(TypedDict):
    model: str
    content: GeminiContent
    outputDimensionality: NotRequired[int]


class GeminiBatchRequest(TypedDict):
    requests: list[GeminiEmbedRequest]


EmbeddingRequest = OpenAIEmbeddingRequest | DashScopeRequest | GeminiBatchRequest


@dataclass(frozen=True, slots=True)
class WireRequest:
    """One embedding request as sent: its URL, headers and body."""

    url: str
    headers: dict[str, str]
    body: EmbeddingRequest


def _strip_suffixes(url: str, suffixes: tuple[str, ...]) -> str:
    url = url.rstrip("/")
    for suffix in suffixes:
        if url.endswith(suffix):
            return url[: -len(suffix)].rstrip("/")
    return url


def _loads(body: bytes, what: str, secret: str = "") -> object:
    body = without_bom(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProviderBadResponse(f"{what}: {not_json(body, exc, secret)}") from None


def _field(obj: object, *path: str, what: str) -> object:
    """``obj[path[0]][path[1]]...`` of a parsed answer; ProviderBadResponse if missing."""
    cur = obj
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            dotted = ".".join(path)
            raise ProviderBadResponse(f"{what}: answer has no {dotted}")
        cur = cur[key]
    return cur


def _error_said(answer: object) -> bytes | None:
    """What an error answer says: its ``error`` (OpenAI, Ollama, Gemini) or its
    ``code`` and ``message`` (DashScope), else None."""
    if not isinstance(answer, dict):
        return None
    error = answer.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        error = error["message"]
    if error is None and "message" in answer and "code" in answer:
        error = f"{answer['code']}: {answer['message']}"
    if error is None:
        return None
    return error.encode() if isinstance(error, str) else orjson.dumps(error)


def _in_order(items: list[object], keys: tuple[str, ...], *, what: str) -> list[object]:
    """The vectors' ``items`` in the order of the texts, by their index: the first of
    ``keys`` an item has (one API family names it two ways; an answer of the other name
    is no answer without indices). A missing one counts as 0 (answers in protobuf style
    leave zero values out); when every one is 0 (an answer without indices) the answer's
    order stands. Otherwise the indices must name each position once: an index that is
    not an integer, repeats or points past the answer is a broken answer (no text may get
    another text's vector)."""
    key = keys[0]

    def index(item: object) -> object:
        if isinstance(item, dict):
            for k in keys:
                if k in item:
                    return item[k]
        return 0

    found = [index(item) for item in items]
    indices = [i for i in found if type(i) is int]
    if len(indices) != len(found):
        raise ProviderBadResponse(f"{what}: a vector's '{key}' is not an integer")
    if not any(indices):
        return items
    if sorted(indices) != list(range(len(items))):
        raise ProviderBadResponse(
            f"{what}: the vectors' '{key}' values are not 0 to {len(items) - 1}, each once")
    return [items[j] for j in sorted(range(len(items)), key=indices.__getitem__)]


class WireFormat:
    """One provider's request/response format. Pure functions of config and data."""

    name = "base"

    def __init__(self, config: EmbeddingModelConfig, api_key: str) -> None:
        self.config = config
        self._api_key = api_key
        self.base_url = (config.base_url or DEFAULT_BASE_URLS[config.backend]).rstrip("/")

    def __repr__(self) -> str:
        url = redact_url(self.endpoint, self._api_key)
        return f"<{type(self).__name__} model={mask_model(self.config.model_name)!r} url={url}>"

    @property
    def endpoint(self) -> str:
        raise NotImplementedError

    def build(self, texts: list[str]) -> WireRequest:
        raise NotImplementedError

    def parse(self, body: bytes, n: int) -> list[object]:
        raise NotImplementedError

    def _answer(self, body: bytes, *path: str) -> object:
        """``path`` of the answer; an answer that is an error (some gateways send them
        with HTTP 200, some beside an empty or null list of vectors) is refused quoting
        what the provider said, not for a missing field or a count of none."""
        answer = _loads(body, self.name, self._api_key)
        said = _error_said(answer)
        try:
            found = _field(answer, *path, what=self.name)
        except ProviderBadResponse:
            if said is None:
                raise
            found = None
        if said is not None and not found:
            raise ProviderBadResponse(f"{self.name}: the provider answered an error, not "
                                      f"vectors: {snippet(said, 200, self._api_key)}")
        return found

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
        body: OpenAIEmbeddingRequest = {"model": self.config.model_name, "input": texts,
                                         "encoding_format": "float"}
        if self._dims is not None:
            body["dimensions"] = self._dims
        return WireRequest(self.endpoint, self._bearer(), body)

    def parse(self, body: bytes, n: int) -> list[object]:
        data = self._answer(body, "data")
        if not isinstance(data, list):
            raise ProviderBadResponse(f"{self.name}: 'data' is not a list")
        return [_from_base64(_field(item, "embedding", what=self.name), self.name)
                for item in _in_order(data, ("index",), what=self.name)]


def _from_base64(vector: object, what: str) -> object:
    """A vector sent as base64 of little-endian float32 values (the API's
    ``encoding_format: base64``, which some compatible servers answer whatever was asked)
    as a list of numbers; any other vector as it came."""
    if not isinstance(vector, str):
        return vector
    refused = ProviderBadResponse(f"{what}: a vector is a string, not base64 of float32 values")
    try:
        raw = base64.b64decode(vector, validate=True)
    except binascii.Error:
        raise refused from None
    if len(raw) % 4:
        raise refused
    floats: list[float] = np.frombuffer(raw, dtype="<f4").tolist()
    return floats


class DashScopeFormat(WireFormat):
    name = "dashscope"
    path = "/api/v1/services/embeddings/text-embedding/text-embedding"
    #: Where an answer says which text a vector is of: this API's name first, then the
    #: other DashScope embedding API's (a gateway may answer with either).
    index_keys: tuple[str, ...] = ("text_index", "index")

    @property
    def endpoint(self) -> str:
        root = _strip_suffixes(self.base_url, ("/compatible-mode/v1", "/api/v1"))
        return root if root.endswith(self.path) else root + self.path

    def _input(self, texts: list[str]) -> DashScopeTexts | DashScopeContents:
        return {"texts": texts}

    def build(self, texts: list[str]) -> WireRequest:
        body: DashScopeRequest = {"model": self.config.model_name,
                                  "input": self._input(texts)}
        if self._dims is not None:
            body["parameters"] = {"dimension": self._dims}
        return WireRequest(self.endpoint, self._bearer(), body)

    def parse(self, body: bytes, n: int) -> list[object]:
        embs = self._answer(body, "output", "embeddings")
        if not isinstance(embs, list):
            raise ProviderBadResponse(f"{self.name}: 'output.embeddings' is not a list")
        return [_field(item, "embedding", what=self.name)
                for item in _in_order(embs, self.index_keys, what=self.name)]


class DashScopeMultimodalFormat(DashScopeFormat):
    name = "dashscope_multimodal"
    path = "/api/v1/services/embeddings/multimodal-embedding/multimodal-embedding"
    index_keys = ("index", "text_index")

    def _input(self, texts: list[str]) -> DashScopeTexts | DashScopeContents:
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
            req: GeminiEmbedRequest = {"model": f"models/{self._model}",
                                       "content": {"parts": [{"text": text}]}}
            if self._dims is not None:
                req["outputDimensionality"] = self._dims
            requests.append(req)
        headers = {"x-goog-api-key": self._api_key} if self._api_key else {}
        return WireRequest(self.endpoint, headers, {"requests": requests})

    def parse(self, body: bytes, n: int) -> list[object]:
        embs = self._answer(body, "embeddings")
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
        body: OpenAIEmbeddingRequest = {"model": self.config.model_name, "input": texts}
        if self._dims is not None:
            body["dimensions"] = self._dims
        return WireRequest(self.endpoint, self._bearer(), body)

    def parse(self, body: bytes, n: int) -> list[object]:
        embs = self._answer(body, "embeddings")
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


def _numbers(vector: object) -> bool:
    """Whether ``vector`` is a list of numbers (a boolean is none)."""
    return isinstance(vector, list) and all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in vector)


def to_unit_rows(vectors: Sequence[object], n: int, dims: int, what: str) -> F32:
    """Validate count, types and dimension, then L2-normalize into float32 rows.

    The norm is taken in float64 after scaling each row by its largest value, so a finite
    vector of any magnitude keeps its direction (float32 squares overflow near 1e19)."""
    if len(vectors) != n:
        raise ProviderBadResponse(f"{what}: asked for {n} vectors, got {len(vectors)}")
    try:
        arr = np.asarray(vectors)
    except (TypeError, ValueError):
        lengths = sorted({len(v) for v in vectors if isinstance(v, list)})
        if len(lengths) > 1 and all(_numbers(v) for v in vectors):
            # Lists of numbers all the same, of other lengths than one another: a broken
            # answer, not the configuration's fault (one dimension for some texts, another
            # for others, the configured one among them or not), so a text the provider
            # keeps answering wrongly is singled out, not blamed on ``dimensions``.
            raise ProviderBadResponse(
                f"{what}: vectors of mixed dimensions {lengths}, configured {dims}") from None
        raise ProviderBadResponse(f"{what}: vectors are not lists of numbers") from None
    # Strings, booleans or nulls alone make another kind of array than numbers do; a
    # boolean among numbers is taken for 1 or 0, so the types met are looked at too
    # (``map(type, ...)`` runs in C: a batch of long vectors costs a few milliseconds).
    if (arr.ndim != 2 or arr.dtype.kind not in "iuf"
            or bool in set().union(*(map(type, row) for row in vectors))):  # type: ignore[call-overload]
        raise ProviderBadResponse(f"{what}: vectors are not lists of numbers")
    if arr.shape[1] == 0:
        raise ProviderBadResponse(f"{what}: vectors are empty")
    if arr.shape[1] != dims:
        raise DimensionMismatch(
            f"{what}: provider returned {arr.shape[1]}-dimensional vectors but dimensions="
            f"{dims} is configured (set dimensions={arr.shape[1]}, or use_dimensions=true "
            "if the model can shorten its vectors)"
        )
    if not np.isfinite(arr).all():
        raise ProviderBadResponse(f"{what}: vectors contain NaN or infinity")
    arr = arr.astype(np.float64)
    peaks = np.abs(arr).max(axis=1, keepdims=True)
    if (peaks == 0).any():
        raise ProviderBadResponse(f"{what}: provider returned an all-zero vector")
    arr /= peaks
    rows: F32 = (arr / np.linalg.norm(arr, axis=1, keepdims=True)).astype(np.float32)
    return rows
