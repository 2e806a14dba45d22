"""Whether an embedding configuration can be used, and with which API key: the key from
the config, else ``RECALLD_EMBEDDING_API_KEY``, else the backend's conventional variable
(OPENAI_API_KEY, DASHSCOPE_API_KEY, GEMINI_API_KEY/GOOGLE_API_KEY); and why vectors are
off for a configuration (QwenPaw's enable conditions). Pure functions: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.providers.embedding_formats import BACKENDS

_ENV_KEYS = {
    "openai": ("OPENAI_API_KEY",),
    "dashscope": ("DASHSCOPE_API_KEY",),
    "dashscope_multimodal": ("DASHSCOPE_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "ollama": (),
    "local": (),
}
_NO_KEY_NEEDED = frozenset({"ollama", "local"})


def first_key(given: str, environ: Mapping[str, str], names: Iterable[str]) -> str:
    """The first of ``given`` and the variables ``names`` of ``environ`` that holds a
    key, without the whitespace around it: a value of spaces only (a hand-edited
    agent.json) is no key, as QwenPaw takes it, and a variable set from a file keeps
    no line break to break the request's header."""
    for value in (given, *(environ.get(name, "") for name in names)):
        if value.strip():
            return value.strip()
    return ""


def resolve_api_key(config: EmbeddingModelConfig, environ: Mapping[str, str]) -> str:
    """The API key: config value, then RECALLD_EMBEDDING_API_KEY, then the backend's var."""
    return first_key(config.api_key, environ,
                     ("RECALLD_EMBEDDING_API_KEY", *_ENV_KEYS.get(config.backend, ())))


def disabled_reason(config: EmbeddingModelConfig, api_key: str) -> str | None:
    """Why vectors are off for this config (QwenPaw's enable conditions), or None."""
    if config.backend not in BACKENDS:
        return f"unknown embedding backend {config.backend!r} (one of {', '.join(BACKENDS)})"
    if not config.model_name.strip():
        return "no embedding model configured (model_name is empty)"
    if config.backend not in _NO_KEY_NEEDED and not api_key:
        return f"no API key for embedding backend {config.backend!r}"
    return None
