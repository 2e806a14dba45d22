"""Defaults that were chosen by measurement stay in one place, and the README's
configuration shows every key with the default the code has."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

from recalld.daemon import config
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS

ROOT = Path(__file__).resolve().parent.parent
# Fields of the settings classes that are not keys of the file's tables (the last two are
# its tables [workspace_defaults] and [workspaces.X]).
NOT_FILE_KEYS = config.NOT_KEYS | {"config_path", "workspace_paths", "workspace_defaults",
                                   "workspaces"}


def test_daemon_chunk_size_is_the_measured_default(tmp_path: Path) -> None:
    cfg = config.load(environ={"HOME": str(tmp_path)})
    assert cfg.chunk_max_chars == DEFAULT_MAX_CHARS


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _file_keys(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - NOT_FILE_KEYS


def test_every_configuration_key_is_documented() -> None:
    docs = _readme() + (ROOT / "docs" / "remote.md").read_text(encoding="utf-8")
    classes = (config.DaemonConfig, config.WorkspaceSettings, config.EmbeddingModelConfig,
               config.ChatModelConfig, config.SearchConfig, config.RemoteConfig)
    missing = sorted(f"{cls.__name__}.{key}" for cls in classes for key in _file_keys(cls)
                     if f"`{key}`" not in docs and not re.search(rf"^{key} = ", docs, re.M))
    assert missing == []


def test_the_readme_example_configuration_shows_the_defaults() -> None:
    """The example says "every value shown is the default unless marked"."""
    block = re.search(r"```toml\n(\[daemon\]\n.*?)```", _readme(), re.S)
    assert block is not None
    shown = tomllib.loads("\n".join(line for line in block.group(1).splitlines()
                                    if "not a default" not in line))
    daemon = config.DaemonConfig(socket_path=Path("/s"), data_dir=Path("/d"),
                                 config_path=Path("/c"))
    settings = config.WorkspaceSettings()
    tables: dict[str, Any] = {
        "daemon": daemon, "workspace_defaults": settings,
        "embedding_model_config": settings.embedding_model_config,
        "chat_model_config": config.ChatModelConfig(), "search": settings.search}
    differ = []
    for table, values in [("daemon", shown["daemon"]),
                          ("workspace_defaults", shown["workspace_defaults"])]:
        for key, value in values.items():
            if isinstance(value, dict):
                differ += [(key, k, v, getattr(tables[key], k)) for k, v in value.items()
                           if getattr(tables[key], k) != v]
            elif getattr(tables[table], key) != (tuple(value) if isinstance(value, list)
                                                 else value):
                differ.append((table, key, value, getattr(tables[table], key)))
    assert differ == []
    assert len(shown["workspace_defaults"]["embedding_model_config"]) > 5
    # Every [daemon] key shows its default there, but the paths (their own table) and
    # the server's limits (docs/protocol.md's table of limits gives their defaults).
    elsewhere = {"socket_path", "data_dir", "max_request_bytes", "max_batch",
                 "max_concurrent_calls_per_connection"}
    assert _file_keys(config.DaemonConfig) - elsewhere - set(shown["daemon"]) == set()
