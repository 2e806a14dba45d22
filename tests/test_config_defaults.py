"""Defaults that were chosen by measurement stay in one place, and the README's
configuration shows every key with the default the code has."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

from recalld.daemon import config, config_rules
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
    # So does every workspace key, but the credentials and a shared workspace's `remote`
    # (docs/remote.md).
    defaults = tomllib.loads(block.group(1))["workspace_defaults"]  # "not a default" too
    unshown = {f"{cls.__name__}.{key}" for cls, table in [
        (config.WorkspaceSettings, defaults),
        (config.EmbeddingModelConfig, defaults["embedding_model_config"]),
        (config.ChatModelConfig, defaults["chat_model_config"]),
        (config.SearchConfig, defaults["search"])] for key in _file_keys(cls) - set(table)}
    assert unshown == {"WorkspaceSettings.remote", "EmbeddingModelConfig.api_key",
                       "ChatModelConfig.api_key"}


_UNITS = {"": 1.0, "s": 1.0, "days": 86400.0, "KiB": 1024.0, "GiB": float(1 << 30)}
_NUMBER = r"(-?\d[\d,]*(?:\.\d+)?)(?: (s|days|KiB|GiB)\b)?"


def _readme_ranges() -> list[tuple[list[str], str]]:
    """The README's table of ranges: each row's backticked names and what it allows."""
    table = _readme().split("The ranges (`daemon/config_rules.py` has the one table):", 1)[1]
    rows = re.findall(r"^\| (.+?) \| (.+) \|$", table.split("\n\n", 2)[1], flags=re.M)
    return [(re.findall(r"`([a-z_*]+)`", names), allowed) for names, allowed in rows[2:]]


def _ranges_in(allowed: str) -> list[tuple[float, float]]:
    found = []
    for low, low_unit, high, high_unit in re.findall(f"{_NUMBER}–{_NUMBER}", allowed):
        scale = _UNITS[high_unit or ""]
        found.append((float(low.replace(",", "")) * _UNITS[low_unit or high_unit or ""],
                      float(high.replace(",", "")) * scale))
    return found


def test_the_readme_table_of_ranges_is_config_rules() -> None:
    """Every key with a rule is in the README's table, each range and list of choices
    there the one the rule checks (its message when refusing a value says it)."""
    messages = {(cls, key): rule.check(rule.bad) or ""
                for (cls, key), rule in config_rules.RULES.items()}
    named: set[str] = set()
    choices = {rule: m.removeprefix("must be one of ") for rule, m in messages.items()
               if m.startswith("must be one of ")}
    choices_shown = set()
    for names, allowed in _readme_ranges():
        named.update(names)
        keys = [n for n in names if any(k == n for _, k in messages)]
        ranged = [n for n in keys
                  if any(k == n and " from " in m for (_, k), m in messages.items())]
        shown_ranges = _ranges_in(allowed) if ranged else []  # agent ids' 1-64: no key's
        if len(shown_ranges) == 1:  # one range for them all ("0–1, not both 0")
            shown_ranges *= len(ranged)
        assert len(ranged) == len(shown_ranges), (names, allowed)
        for key, shown in zip(ranged, shown_ranges, strict=True):
            rules = {m for (_, k), m in messages.items() if k == key}
            want = {(float(lo), float(hi)) for m in rules
                    for lo, hi in re.findall(r"from (\S+) to (\S+)$", m)}
            assert want == {shown}, (key, allowed)
            if any(m.startswith("must be 0 ") for m in rules):
                assert re.search(r"\b0 (\(|or )", allowed), (key, allowed)
        choices_shown.update(rule for rule, listed in choices.items()
                             if rule[1] in keys and allowed.startswith(listed))
    unnamed = sorted(f"{cls}.{key}" for cls, key in messages
                     if key not in named and not (key.endswith("_dir") and "*_dir" in named))
    assert unnamed == []
    assert sorted(set(choices) - choices_shown) == []


def test_docs_remote_md_lists_every_field_of_a_remote_table() -> None:
    remote = (ROOT / "docs" / "remote.md").read_text(encoding="utf-8")
    table = remote.split("| field | meaning |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert sorted(listed) == sorted(_file_keys(config.RemoteConfig))
