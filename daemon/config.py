"""Frozen configuration: the daemon's own settings and each workspace's settings.

The daemon runs on its embedded defaults with no file at all. A TOML file adds a
``[daemon]`` table and ``[workspaces.<agent_id>]`` tables; workspace fields keep the names
and defaults of QwenPaw's ``reme_light_memory_config`` so an existing configuration reads
the same. A reload (SIGHUP) builds new objects; nothing here is ever mutated.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from recalld.daemon import config_layout, config_rules, qwenpaw, sharedplace
from recalld.daemon.config_search import SearchConfig as SearchConfig
from recalld.daemon.dsn import mask_dsn
from recalld.daemon.dsn import problem as dsn_problem
from recalld.daemon.refusals import SettingsRefused
from recalld.ipc import paths
from recalld.ipc.agent_ids import workspace_table
from recalld.ipc.types import visible

DEFAULT_AGENT = "default"


class ConfigError(Exception):
    """The configuration file or a workspace config is invalid; the message says where.

    The message is one line: control characters of the values, keys and table names it
    quotes are shown escaped (``"memory\\n"``), so a value can neither end it early nor
    add lines of its own to a terminal, a log or the journal."""

    def __init__(self, message: str) -> None:
        super().__init__(visible(message))


#: Settings fields that are recorded by the loader, never keys a file or a client sets.
NOT_KEYS = frozenset({"ignored_fields", "config_required", "config_found", "qwenpaw_folders"})


@dataclass(frozen=True, slots=True, repr=False)  # a repr masks its secrets
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
    __repr__ = config_rules.masked_repr


@dataclass(frozen=True, slots=True, repr=False)  # a repr masks its secrets
class ChatModelConfig:
    """An OpenAI-compatible chat model used by LLM jobs (off until model_name is set)."""

    backend: str = "openai"
    base_url: str = ""
    api_key: str = ""
    model_name: str = ""
    temperature: float = 0.2
    max_tokens: int = 2048
    timeout_s: float = 120.0
    #: After 5 calls in a row fail for want of the provider, calls wait this long before
    #: one probe is sent; each failed probe doubles the wait, up to ``breaker_open_max_s``.
    breaker_open_s: float = 5.0
    breaker_open_max_s: float = 300.0
    __repr__ = config_rules.masked_repr


@dataclass(frozen=True, slots=True, repr=False)  # a repr masks its secrets
class RemoteConfig:
    """Where a shared workspace's truth lives (``remote = { kind = "postgres", ... }``).

    The password comes from the DSN, from ``passfile`` (libpq's ``.pgpass`` format) or from
    the environment variable named by ``password_env``; it is never logged, and
    :meth:`for_wire` masks it. ``host`` names this replica in the shared workspace
    (author of its changes, suffix of its conflict copies); empty: the machine's name.
    ``search_mode``: ``"local"`` searches the replica's own index, ``"server"`` runs
    searches in PostgreSQL (``recalld.daemon.remote.search``).
    """

    kind: str = "postgres"
    dsn: str = ""
    name: str = ""
    passfile: str = ""
    password_env: str = ""
    host: str = ""
    search_mode: str = "local"
    __repr__ = config_rules.masked_repr

    def check(self, where: str) -> None:
        if self.kind != "postgres":
            raise ConfigError(f"{where}: kind must be \"postgres\"")
        if importlib.util.find_spec("psycopg") is None:  # found now, not as it opens
            raise ConfigError(f"{where}: a shared workspace needs the PostgreSQL driver "
                              "psycopg, which is not installed (pip install 'recalld[postgres]')")
        if not self.dsn:
            raise ConfigError(f"{where}: dsn is required (postgresql://user@host/db)")
        unusable = dsn_problem(self.dsn)  # found now, not as the workspace opens
        if unusable is not None:
            raise ConfigError(f"{where}: {unusable}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ConfigError(f"{where}: name must be 1-64 characters of A-Z a-z 0-9 _ . -")
        if self.host and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.host):
            raise ConfigError(f"{where}: host must be 1-64 characters of A-Z a-z 0-9 _ . -")
        if self.search_mode not in ("local", "server"):
            raise ConfigError(f"{where}: search_mode must be \"local\" or \"server\"")
        if self.passfile:  # read by the daemon, whose working directory is no one's
            try:
                paths.checked_path(self.passfile, f"{where} passfile")
            except paths.PathError as exc:
                raise ConfigError(str(exc)) from None

    def for_wire(self) -> dict[str, str]:
        """The settings as JSON with any password in the DSN masked."""
        return {**dataclasses.asdict(self), "dsn": mask_dsn(self.dsn)}


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
    # Shared through PostgreSQL when set (recalld.daemon.remote); None: local only.
    remote: RemoteConfig | None = None
    # QwenPaw fields given but not acted on (reasons: ``qwenpaw.IGNORED_*``).
    ignored_fields: tuple[str, ...] = ()

    def merged(self, overrides: object) -> WorkspaceSettings:
        """A copy with ``overrides`` (a TOML table or ``workspace.open``'s config) applied;
        ConfigError when it is not a table, a field is wrong or the folders overlap."""
        return _workspace(overrides, self, "workspace config")


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """The daemon's own settings. Units are in the names."""

    socket_path: Path
    data_dir: Path
    config_path: Path
    config_required: bool = False  # named (--config, RECALLD_CONFIG): it must exist
    config_found: bool = False  # the file was there and read (else: the defaults)
    max_request_bytes: int = 1 << 20
    max_batch: int = 100
    max_connections: int = 512
    idle_timeout_s: float = 600.0
    write_timeout_s: float = 10.0
    graceful_timeout_s: float = 5.0
    max_concurrent_calls_per_connection: int = 32
    cpu_threads: int = 2
    # The local embedding backfill: OpenMP threads per passage call (0: every core), so
    # queries and the event loop keep a core, and the nice increment of its thread.
    backfill_threads: int = 1
    backfill_nice: int = 0
    log_level: str = "INFO"
    # Index maintenance: a rescan catches watch events the kernel dropped silently; the
    # persist delay batches commits of derived state after bursts of edits.
    reconcile_interval_s: float = 300.0
    persist_delay_s: float = 2.0
    # The vector backfill's first wait after a failed round (doubled per failed round in a
    # row, to 300 s, with jitter).
    backfill_backoff_s: float = 2.0
    # A workspace nobody searched for this long lets go of the index pages its searches
    # mapped in, and freed heap goes back to the system (0: never).
    idle_trim_s: float = 30.0
    # Scheduled jobs (auto_dream) start this many seconds at most after their cron time, at
    # random, so that the jobs of many workspaces and machines do not all start at once.
    schedule_jitter_s: float = 60.0
    # Measured on LoCoMo (see DEFAULT_MAX_CHARS in daemon/index/chunker.py): 2000
    # characters keep most of whole-session recall at about half the context.
    chunk_max_chars: int = 2000
    workspace_defaults: WorkspaceSettings = field(default_factory=WorkspaceSettings)
    workspaces: Mapping[str, WorkspaceSettings] = field(default_factory=dict)
    workspace_paths: Mapping[str, Path] = field(default_factory=dict)
    # The folder of each [workspaces.X] qwenpaw_agent_json given without a path (the
    # workspace is not there: daemon/config_warnings.py says so).
    qwenpaw_folders: Mapping[str, Path] = field(default_factory=dict)

    def workspace_path(self, agent_id: str) -> Path:
        """Where agent ``agent_id``'s workspace lives unless opened at another path (a
        configured one is not: :meth:`WorkspaceRegistry.open`)."""
        return self.workspace_paths.get(agent_id, self.data_dir / "workspaces" / agent_id)

    def configured_agents(self) -> list[str]:
        """The agents whose workspaces the configuration names: the default one, then
        those of ``[workspaces.X]`` tables and paths, by name. They open at the start at
        their configured place with the file's settings."""
        names = [DEFAULT_AGENT]
        names += [a for a in sorted(set(self.workspaces) | set(self.workspace_paths))
                  if a not in names]
        return names

    def workspace_settings(self, agent_id: str) -> WorkspaceSettings:
        return self.workspaces.get(agent_id, self.workspace_defaults)

    @property
    def state_dir(self) -> Path:
        """The daemon's own state (lock, catalogs shared across workspaces, caches)."""
        return self.data_dir / "state"


#: A settings record: built from a table of the configuration (TOML or JSON).
Settings = TypeVar("Settings", bound="DataclassInstance")

_NESTED: dict[str, type[DataclassInstance]] = {
    "embedding_model_config": EmbeddingModelConfig,
    "chat_model_config": ChatModelConfig,
    "search": SearchConfig,
    "remote": RemoteConfig,
}


#: The tables a workspace may be without (null turns them off).
_NULLABLE: frozenset[str] = frozenset(
    f.name for f in dataclasses.fields(WorkspaceSettings) if f.default is None)


def _coerce(name: str, value: object, default: object, where: str) -> object:
    """``value`` of a table checked against the type of the field's ``default``."""
    def refuse(what: str) -> ConfigError:
        return ConfigError(f"{where} {name} = {config_rules.shown_setting(name, value)}: {what}")

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise refuse("must be true or false")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        if value is None and name == "auto_memory_interval":
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise refuse("must be an integer")
        return value
    if isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise refuse("must be a number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise refuse("must be a string")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise refuse("must be a list of strings")
        return tuple(value)
    return value


def _nested_where(where: str, name: str) -> str:
    return f"{where[:-1]}.{name}]" if where.endswith("]") else f"{where}.{name}"


def _build(cls: type[Settings], table: object, *, base: Settings | None = None,
           where: str) -> Settings:
    """``base`` (default: ``cls()``) with the fields of ``table`` applied and checked."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, not {config_rules.shown(table)}")
    base = base if base is not None else cls()
    if isinstance(base, WorkspaceSettings):
        return cast(Settings, _build_workspace(table, base, where))
    return _build_fields(cls, table, base, where)


def _build_fields(cls: type[Settings], table: Mapping[str, object], base: Settings,
                  where: str) -> Settings:
    known = {f.name for f in dataclasses.fields(cls)} - NOT_KEYS
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: {config_rules.unknown('field', unknown, known)}")
    changes: dict[str, object] = {}
    for name, value in table.items():
        default = getattr(base, name)
        if name in _NESTED:
            if value is None and name not in _NULLABLE:
                continue  # a table that is always set: null is "not set" (as QwenPaw's)
            if value is not None and not isinstance(value, Mapping):
                raise ConfigError(f"{where} {name} = {config_rules.shown_setting(name, value)}"
                                  f": must be a table ([{name}])")
            nested_base = default if default is not None else _NESTED[name]()
            nested = (
                None if value is None
                else _build(_NESTED[name], value, base=nested_base,
                            where=_nested_where(where, name))
            )
            if isinstance(nested, RemoteConfig):
                nested.check(_nested_where(where, name))
            changes[name] = nested
            continue
        if name == "auto_memory_interval":
            interval = _coerce(name, value, 0, where)
            # QwenPaw: None or <= 0 turns periodic auto memory off.
            changes[name] = 0 if isinstance(interval, int) and interval < 0 else interval
        else:
            changes[name] = _coerce(name, value, default, where)
        # The value has the right type; the rules table says whether it is in range.
        wrong = config_rules.problem(cls.__name__, name, changes[name])
        if wrong is not None:
            raise ConfigError(
                f"{where} {name} = {config_rules.shown_setting(name, value)}: {wrong}")
    built = dataclasses.replace(base, **changes)
    across = config_rules.record_problem(
        cls.__name__, {f.name: getattr(built, f.name) for f in dataclasses.fields(cls)})
    if across is not None:
        raise ConfigError(f"{where}: {across}")
    return built


def _workspace(table: object, base: WorkspaceSettings, where: str) -> WorkspaceSettings:
    """A workspace's settings as it is opened: ``base`` with ``table`` applied, then its
    folders checked together (a step towards them, such as a QwenPaw ``agent.json`` under
    a ``[workspaces.X]`` table, is built with :func:`_build` and not checked alone)."""
    built = _build(WorkspaceSettings, table, base=base, where=where)
    wrong = config_layout.layout_problem(
        {name: getattr(built, name) for name in config_layout.LAYOUT_DIRS})
    if wrong is not None:
        raise ConfigError(f"{where} {wrong}")
    # Kept tidy (``./memory/`` is ``memory``): paths are matched against them as strings.
    def tidy(value: str) -> str:
        return "/".join(config_rules.dir_parts(value))

    return dataclasses.replace(
        built, daily_dir=tidy(built.daily_dir), digest_dir=tidy(built.digest_dir),
        metadata_dir=tidy(built.metadata_dir), session_dir=tidy(built.session_dir),
        mem_session_dir=tidy(built.mem_session_dir), resource_dir=tidy(built.resource_dir))


def _build_workspace(table: Mapping[str, object], base: WorkspaceSettings,
                     where: str) -> WorkspaceSettings:
    """Workspace settings from a recalld table, a QwenPaw ``reme_light_memory_config``
    or a whole QwenPaw ``agent.json``: QwenPaw fields recalld does not act on are
    accepted and remembered in ``ignored_fields``."""
    dropped: dict[str, str] = {}
    if "id" in table and not isinstance(table["id"], str):  # not "unknown field(s) id"
        raise ConfigError(f"{where}: id (an agent.json's agent id) must be a string")
    if qwenpaw.looks_like_agent_json(table):  # read as QwenPaw reads it
        table, dropped = qwenpaw.as_qwenpaw_loads(qwenpaw.memory_part(table), base)
    given = sorted(NOT_KEYS & set(table))
    if given:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(given)}")
    try:
        found = qwenpaw.classify(table)
    except qwenpaw.QwenPawConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if "inbox_push_enabled" in found.taken and found.taken["inbox_push_enabled"] is None:
        del found.taken["inbox_push_enabled"]  # QwenPaw's "not set"
    if found.taken.get("dream_cron") == "":
        # QwenPaw's older way to turn the dream off.
        found.taken["dream_cron"] = base.dream_cron
        found.taken["dream_cron_enabled"] = False
    built = _build_fields(WorkspaceSettings, found.taken, base, where)
    ignored = tuple(sorted(set(base.ignored_fields) | set(found.ignored) | set(dropped)))
    return dataclasses.replace(built, ignored_fields=ignored)


def workspace_settings_from_params(
    base: WorkspaceSettings, overrides: object
) -> WorkspaceSettings:
    """Apply ``workspace.open``'s ``config``; bad fields are a client error."""
    if overrides is None:
        return base
    try:
        return base.merged(overrides)
    except ConfigError as exc:
        raise SettingsRefused(str(exc)) from None


_DAEMON_FIELDS = {
    "max_request_bytes", "max_batch", "max_connections", "idle_timeout_s", "write_timeout_s",
    "graceful_timeout_s", "max_concurrent_calls_per_connection", "cpu_threads", "log_level",
    "backfill_threads", "backfill_nice", "reconcile_interval_s", "persist_delay_s",
    "idle_trim_s", "chunk_max_chars", "schedule_jitter_s", "backfill_backoff_s",
}


def load(*, config: str | os.PathLike[str] | None = None,
         socket: str | os.PathLike[str] | None = None,
         environ: Mapping[str, str] | None = None) -> DaemonConfig:
    """Read the configuration. A missing file means defaults; a bad one raises ConfigError
    with one line naming the file, the key and the value."""
    env = os.environ if environ is None else environ
    try:
        cfg_path = paths.config_path(config, env)
        required = config is not None or bool(env.get("RECALLD_CONFIG"))
        table: dict[str, object] = paths.read_config(cfg_path, required=required)
        found = required or cfg_path.is_file()
        daemon_table = dict(paths.daemon_table(cfg_path, table))
    except paths.PathError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return dataclasses.replace(_from_table(table, daemon_table, cfg_path, socket, env),
                                   config_required=required, config_found=found)
    except (paths.PathError, ConfigError) as exc:
        message = str(exc)  # path errors from the command line or environment name those
        if message.startswith(f"{cfg_path}:") or not isinstance(exc, ConfigError):
            raise ConfigError(message) from None
        raise ConfigError(f"{cfg_path}: {message}") from None


def _from_table(table: Mapping[str, object], daemon_table: dict[str, object], cfg_path: Path,
                socket: str | os.PathLike[str] | None, env: Mapping[str, str]) -> DaemonConfig:
    unknown = sorted(set(table) - {"daemon", "workspace_defaults", "workspaces"})
    if unknown:
        raise ConfigError(config_rules.unknown("table", unknown,
                                   {"daemon", "workspace_defaults", "workspaces"}))

    data = daemon_table.pop("data_dir", None)
    sock = daemon_table.pop("socket_path", None)
    socket_path = paths.choose_socket(socket, env, sock, cfg_path)
    data_dir = paths.choose_data_dir(env, data, cfg_path)
    bad = sorted(set(daemon_table) - _DAEMON_FIELDS)
    if bad:
        raise ConfigError(f"[daemon] {config_rules.unknown('field', bad, _DAEMON_FIELDS)}")

    defaults = _workspace(table.get("workspace_defaults", {}), WorkspaceSettings(),
                          "[workspace_defaults]")
    workspaces: dict[str, WorkspaceSettings] = {}
    workspace_paths: dict[str, Path] = {}
    qwenpaw_folders: dict[str, Path] = {}
    named = table.get("workspaces", {})
    if not isinstance(named, Mapping):
        raise ConfigError(f"workspaces = {config_rules.shown(named)}: must be tables "
                          "([workspaces.AGENT])")
    for agent_id, ws_table in named.items():
        where = workspace_table(agent_id)
        if not config_rules.valid_agent_id(agent_id):
            raise ConfigError(f"[workspaces.{config_rules.shown(agent_id)}]: the agent id "
                              f"must be {config_rules.AGENT_ID_RULE}")
        if not isinstance(ws_table, Mapping):
            raise ConfigError(f"{where} must be a table, not {config_rules.shown(ws_table)}")
        ws_table = dict(ws_table)
        if "path" in ws_table:
            path = ws_table.pop("path")
            workspace_paths[agent_id] = paths.checked_path(
                path, f"{cfg_path}: {where} path", environ=env)
        base_ws = defaults
        if "qwenpaw_agent_json" in ws_table:
            json_path = ws_table.pop("qwenpaw_agent_json")
            try:
                agent = qwenpaw.read_agent_json(json_path, cfg_path)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if agent_id not in workspace_paths:
                folder = (cfg_path.parent / paths.expand_home(
                    str(json_path), f"{cfg_path}: {where} qwenpaw_agent_json",
                    env)).parent
                qwenpaw_folders[agent_id] = Path(os.path.abspath(folder))
            base_ws = _build(WorkspaceSettings, agent, base=defaults,
                             where=f"{where} qwenpaw_agent_json")
        workspaces[agent_id] = _workspace(ws_table, base_ws, where)
    if twin := sharedplace.shared_twice({a: w.remote for a, w in workspaces.items()}):
        raise ConfigError(twin)

    base = DaemonConfig(
        socket_path=socket_path,
        data_dir=data_dir,
        config_path=cfg_path,
        workspace_defaults=defaults,
        workspaces=workspaces,
        workspace_paths=workspace_paths,
        qwenpaw_folders=qwenpaw_folders,
    )
    return _build(DaemonConfig, daemon_table, base=base, where="[daemon]")
