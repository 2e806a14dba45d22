"""Frozen configuration: the daemon's own settings and each workspace's settings.

The daemon runs on its embedded defaults with no file at all. A TOML file adds a
``[daemon]`` table and ``[workspaces.<agent_id>]`` tables; workspace fields keep the names
and defaults of QwenPaw's ``reme_light_memory_config`` so an existing configuration reads
the same. A reload (SIGHUP) builds new objects; nothing here is ever mutated.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recalld.ipc import paths
from recalld.ipc.errors import InvalidParams

DEFAULT_AGENT = "default"


class ConfigError(Exception):
    """The configuration file or a workspace config is invalid; the message says where."""


@dataclass(frozen=True, slots=True)
class EmbeddingModelConfig:
    """QwenPaw's ``embedding_model_config`` (vectors are off until model_name is set)."""

    backend: str = "openai"
    api_key: str = ""
    base_url: str = ""
    model_name: str = ""
    dimensions: int = 1024
    enable_cache: bool = True
    use_dimensions: bool = False
    max_cache_size: int = 10000
    max_input_length: int = 8192
    max_batch_size: int = 10


@dataclass(frozen=True, slots=True)
class ChatModelConfig:
    """An OpenAI-compatible chat model used by LLM jobs (off until model_name is set)."""

    backend: str = "openai"
    base_url: str = ""
    api_key: str = ""
    model_name: str = ""
    temperature: float = 0.2
    max_tokens: int = 2048
    timeout_s: float = 120.0


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """Hybrid search settings; QwenPaw's weights stay available as configuration."""

    # Chosen by measurement (docs/adr/0010-hybrid-fusion.md): with multilingual-e5-small on
    # LoCoMo dev, recall@10 was BM25 0.863, 0.7/0.3 hybrid 0.854, 0.35/0.65 hybrid 0.867.
    # QwenPaw's 0.7/0.3 stays available as configuration.
    vector_weight: float = 0.35
    keyword_weight: float = 0.65
    rrf_k: int = 60
    candidate_multiplier: int = 3
    max_candidates: int = 200
    link_expansion: bool = True


@dataclass(frozen=True, slots=True)
class WorkspaceSettings:
    """One workspace's settings, with QwenPaw's field names and defaults."""

    metadata_dir: str = "mem_metadata"
    session_dir: str = "mem_session"
    mem_session_dir: str = "mem_agent"
    resource_dir: str = "resource"
    daily_dir: str = "memory"
    digest_dir: str = "digest"
    summarize_when_compact: bool = True
    inbox_push_enabled: bool = True
    auto_memory_interval: int | None = 5
    # A session with pending turns and no new turn for this long goes to auto_memory.
    auto_memory_idle_s: float = 600.0
    dream_cron_enabled: bool = True
    dream_cron: str = "0 23 * * *"
    memory_isolation: bool = True
    # Agents that may search and read this workspace ("*": every agent).
    shared_with: tuple[str, ...] = ()
    embedding_model_config: EmbeddingModelConfig = field(default_factory=EmbeddingModelConfig)
    chat_model_config: ChatModelConfig | None = None
    search: SearchConfig = field(default_factory=SearchConfig)

    def merged(self, overrides: Mapping[str, Any]) -> WorkspaceSettings:
        """A copy with ``overrides`` (a TOML table or ``workspace.open``'s config) applied."""
        merged: WorkspaceSettings = _build(
            WorkspaceSettings, overrides, base=self, where="workspace config"
        )
        return merged


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """The daemon's own settings. Units are in the names."""

    socket_path: Path
    data_dir: Path
    config_path: Path
    max_request_bytes: int = 1 << 20
    max_batch: int = 100
    max_connections: int = 512
    idle_timeout_s: float = 600.0
    write_timeout_s: float = 10.0
    graceful_timeout_s: float = 5.0
    max_concurrent_calls_per_connection: int = 32
    cpu_threads: int = 2
    log_level: str = "INFO"
    # Index maintenance: a rescan catches watch events the kernel dropped silently; the
    # persist delay batches commits of derived state after bursts of edits.
    reconcile_interval_s: float = 300.0
    persist_delay_s: float = 2.0
    # Measured on LoCoMo (see DEFAULT_MAX_CHARS in daemon/index/chunker.py): 2000
    # characters keep most of whole-session recall at about half the context.
    chunk_max_chars: int = 2000
    workspace_defaults: WorkspaceSettings = field(default_factory=WorkspaceSettings)
    workspaces: Mapping[str, WorkspaceSettings] = field(default_factory=dict)
    workspace_paths: Mapping[str, Path] = field(default_factory=dict)

    def workspace_path(self, agent_id: str) -> Path:
        """Where agent ``agent_id``'s workspace lives unless opened at another path."""
        return self.workspace_paths.get(agent_id, self.data_dir / "workspaces" / agent_id)

    def workspace_settings(self, agent_id: str) -> WorkspaceSettings:
        return self.workspaces.get(agent_id, self.workspace_defaults)

    @property
    def state_dir(self) -> Path:
        """The daemon's own state (lock, catalogs shared across workspaces, caches)."""
        return self.data_dir / "state"


_NESTED: dict[str, type[Any]] = {
    "embedding_model_config": EmbeddingModelConfig,
    "chat_model_config": ChatModelConfig,
    "search": SearchConfig,
}


def _coerce(name: str, value: Any, default: Any, where: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {name} must be true or false")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        if value is None and name == "auto_memory_interval":
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}: {name} must be an integer")
        return value
    if isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{where}: {name} must be a number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {name} must be a string")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: {name} must be a list of strings")
        return tuple(value)
    return value


def _build(cls: type[Any], table: Mapping[str, Any], *, base: Any = None, where: str) -> Any:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table")
    base = base if base is not None else cls()
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    changes: dict[str, Any] = {}
    for name, value in table.items():
        default = getattr(base, name)
        if name in _NESTED:
            nested_base = default if default is not None else _NESTED[name]()
            changes[name] = (
                None if value is None
                else _build(_NESTED[name], value, base=nested_base, where=f"{where}.{name}")
            )
        elif name == "auto_memory_interval":
            changes[name] = _coerce(name, value, 0, where)
        else:
            changes[name] = _coerce(name, value, default, where)
    return dataclasses.replace(base, **changes)


def workspace_settings_from_params(
    base: WorkspaceSettings, overrides: Any
) -> WorkspaceSettings:
    """Apply ``workspace.open``'s ``config``; bad fields are a client error."""
    if overrides is None:
        return base
    try:
        return base.merged(overrides)
    except ConfigError as exc:
        raise InvalidParams(str(exc)) from None


_DAEMON_FIELDS = {
    "max_request_bytes", "max_batch", "max_connections", "idle_timeout_s", "write_timeout_s",
    "graceful_timeout_s", "max_concurrent_calls_per_connection", "cpu_threads", "log_level",
    "reconcile_interval_s", "persist_delay_s", "chunk_max_chars",
}


def load(
    *,
    config: str | os.PathLike[str] | None = None,
    socket: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> DaemonConfig:
    """Read the configuration. A missing file means defaults; a bad one raises ConfigError."""
    env = os.environ if environ is None else environ
    cfg_path = paths.config_path(config, env)
    table: dict[str, Any] = {}
    if cfg_path.exists():
        try:
            table = tomllib.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{cfg_path}: {exc}") from None
    elif config is not None or env.get("RECALLD_CONFIG"):
        raise ConfigError(f"{cfg_path}: no such file")

    unknown = sorted(set(table) - {"daemon", "workspace_defaults", "workspaces"})
    if unknown:
        raise ConfigError(f"{cfg_path}: unknown table(s) {', '.join(unknown)}")

    daemon_table = dict(table.get("daemon", {}))
    data = daemon_table.pop("data_dir", None)
    sock = daemon_table.pop("socket_path", None)
    bad = sorted(set(daemon_table) - _DAEMON_FIELDS)
    if bad:
        raise ConfigError(f"{cfg_path}: [daemon] unknown field(s) {', '.join(bad)}")

    defaults = _build(
        WorkspaceSettings, table.get("workspace_defaults", {}), where="[workspace_defaults]"
    )
    workspaces: dict[str, WorkspaceSettings] = {}
    workspace_paths: dict[str, Path] = {}
    for agent_id, ws_table in dict(table.get("workspaces", {})).items():
        if not isinstance(ws_table, Mapping):
            raise ConfigError(f"{cfg_path}: [workspaces.{agent_id}] must be a table")
        ws_table = dict(ws_table)
        if "path" in ws_table:
            workspace_paths[agent_id] = Path(str(ws_table.pop("path"))).expanduser()
        workspaces[agent_id] = _build(
            WorkspaceSettings, ws_table, base=defaults, where=f"[workspaces.{agent_id}]"
        )

    base = DaemonConfig(
        socket_path=paths.socket_path(socket or (env.get("RECALLD_SOCKET") or sock), env),
        data_dir=Path(data).expanduser() if data and not env.get("RECALLD_DATA_DIR")
        else paths.data_dir(env),
        config_path=cfg_path,
        workspace_defaults=defaults,
        workspaces=workspaces,
        workspace_paths=workspace_paths,
    )
    return _build(DaemonConfig, daemon_table, base=base, where="[daemon]")  # type: ignore[no-any-return]
