"""Whether an embedding configuration can be used, and with which API key: the key from
the config, else ``RECALLD_EMBEDDING_API_KEY``, else the backend's conventional variable
(OPENAI_API_KEY, DASHSCOPE_API_KEY, GEMINI_API_KEY/GOOGLE_API_KEY); and why vectors are
off for a configuration (QwenPaw's enable conditions). Pure functions: no I/O."""

from __future__ import annotations

from collections.abc import Mapping

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
