"""What QwenPaw writes in ``reme_light_memory_config`` and what recalld makes of it.

QwenPaw keeps an agent's memory settings in ``agent.json`` under
``running.reme_light_memory_config`` (older releases: ``running.memory_summary``). recalld
reads the same field names (``config.py``); this module knows the fields it accepts but
does not act on, each with the reason, and finds the memory part inside a whole
``agent.json``. It holds no state and does no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from recalld.ipc import paths
from recalld.ipc.qwenpaw_places import loads_qwenpaw_json

#: Workspace-level fields QwenPaw writes that recalld accepts and ignores, with the reason.
IGNORED_WORKSPACE: dict[str, str] = {
    "auto_memory_inbox_push_enabled":
        "recalld has one inbox switch per workspace (inbox_push_enabled)",
    "auto_dream_inbox_push_enabled":
        "recalld has one inbox switch per workspace (inbox_push_enabled)",
    "daily_paper_inbox_push_enabled": "Daily Paper is a QwenPaw job, not memory",
    "auto_fin_inbox_push_enabled": "Auto Fin is a QwenPaw job, not memory",
    "daily_paper_cron_enabled": "Daily Paper is a QwenPaw job, not memory",
    "daily_paper_cron": "Daily Paper is a QwenPaw job, not memory",
    "daily_paper_use_hf_mirror": "Daily Paper is a QwenPaw job, not memory",
    "daily_paper_topics": "Daily Paper is a QwenPaw job, not memory",
    "auto_fin_cron_enabled": "Auto Fin is a QwenPaw job, not memory",
    "auto_fin_cron": "Auto Fin is a QwenPaw job, not memory",
    "auto_fin_topics": "Auto Fin is a QwenPaw job, not memory",
    "auto_fin_window_hours": "Auto Fin is a QwenPaw job, not memory",
    "auto_memory_search_config":
        "searching before each reply is the agent's side (the AgentScope middleware "
        "or the client calls memory.search)",
    "reranker_config": "recalld has no reranker; results are fused by weighted RRF",
    "needs_reindex":
        "recalld tracks the vector space of every stored vector and re-embeds on a change",
    "pending_reindex_embedding_config":
        "recalld tracks the vector space of every stored vector and re-embeds on a change",
    "memory_search_enabled": "whether an agent gets a search tool is the agent's side",
    "rebuild_memory_index_on_start":
        "recalld checks its saved index at start and catches up with a rescan; "
        "`recalld reindex` rebuilds on demand",
    "recursive_file_watcher": "recalld always watches memory/ and digest/ recursively",
    "enable_search_raw_log": "recalld logs searches in its metrics, not in a raw log",
    "file_watcher":
        "recalld's watcher (inotify plus a periodic rescan) watches daily_dir and digest_dir",
}

#: Fields of ``embedding_model_config`` accepted and ignored, with the reason.
IGNORED_EMBEDDING: dict[str, str] = {
    "health_check_timeout":
        "the health check runs under recalld's provider deadline and retry policy",
}

#: The fields QwenPaw (and ReMeLight) knew in the sections recalld ignores as a whole;
#: others are refused so a misspelt key is not silently dropped.
KNOWN_SECTIONS: dict[str, frozenset[str]] = {
    "auto_memory_search_config": frozenset({
        "enabled", "max_results", "min_score", "timeout", "enhanced_search_enabled",
        "reflection_enabled", "persist_to_context"}),
    "reranker_config": frozenset({
        "enabled", "api_key", "base_url", "model_name", "candidate_multiplier", "timeout"}),
    "file_watcher": frozenset({
        "backend", "file_store", "watch_paths", "suffix_filters", "recursive",
        "rebuild_index_on_start", "poll_delay", "debounce"}),
}

_MEMORY_KEYS = ("reme_light_memory_config", "memory_summary")


class QwenPawConfigError(ValueError):
    """A QwenPaw section has a field recalld does not know."""


@dataclass(slots=True)
class Classified:
    """The fields of one memory config: those recalld takes and those it ignores."""

    taken: dict[str, object] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)


def memory_part(config: Mapping[str, object]) -> Mapping[str, object]:
    """The memory settings inside ``config``: a whole ``agent.json``, its ``running``
    part, or the ``reme_light_memory_config`` itself (returned as is).

    An ``agent.json`` whose ``running`` part holds no memory settings (QwenPaw's
    defaults), or that has no ``running`` part, has none: its other fields
    (``max_iters``, ``channels``...) are not memory settings."""
    running = config.get("running")
    inner = running if isinstance(running, Mapping) else config
    for key in _MEMORY_KEYS:
        part = inner.get(key)
        if isinstance(part, Mapping):
            return part
    return {} if looks_like_agent_json(config) else config


def looks_like_agent_json(config: Mapping[str, object]) -> bool:
    """Whether ``config`` is an ``agent.json`` (or its ``running`` part), not settings:
    it has a ``running`` part or memory settings, or the agent's ``id`` (no field of
    recalld's settings)."""
    return (isinstance(config.get("running"), Mapping) or isinstance(config.get("id"), str)
            or any(isinstance(config.get(k), Mapping) for k in _MEMORY_KEYS))


def classify(config: Mapping[str, object]) -> Classified:
    """Split a memory config into the fields recalld takes and those it ignores.

    Raises QwenPawConfigError for an unknown key inside a section ignored as a whole.
    """
    out = Classified()
    for name, value in config.items():
        if name in IGNORED_WORKSPACE:
            _check_section(name, value)
            out.ignored[name] = IGNORED_WORKSPACE[name]
        elif name == "embedding_model_config" and isinstance(value, Mapping):
            taken: dict[str, object] = {}
            for key, inner in value.items():
                if key in IGNORED_EMBEDDING:
                    out.ignored[f"{name}.{key}"] = IGNORED_EMBEDDING[key]
                else:
                    taken[key] = inner
            out.taken[name] = taken
        else:
            out.taken[name] = value
    return out


def _check_section(name: str, value: object) -> None:
    known = KNOWN_SECTIONS.get(name)
    if known is None or value is None:
        return
    if not isinstance(value, Mapping):
        raise QwenPawConfigError(f"{name} must be a table")
    unknown = sorted(set(value) - known)
    if unknown:
        raise QwenPawConfigError(f"{name}: unknown field(s) {', '.join(unknown)}")


#: Why a field of an ``agent.json`` that recalld does not know is ignored.
UNKNOWN_FIELD = ("not a field recalld knows (a newer QwenPaw's?); QwenPaw ignores the "
                 "fields it does not know too")

# The strings pydantic's lax mode (QwenPaw's models) takes for booleans and integers.
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_INTEGER = re.compile(r"[+-]?[0-9]+")
#: Text fields QwenPaw strips of surrounding whitespace before it uses them (its ReMe
#: setup takes ``base_url.strip()``), so a hand-edited value with a trailing space works.
_STRIPPED: dict[str, frozenset[str]] = {"embedding_model_config": frozenset({"base_url"})}


def as_qwenpaw_loads(part: Mapping[str, object], settings: object,
                     ) -> tuple[dict[str, object], dict[str, str]]:
    """The memory part of an ``agent.json`` as QwenPaw's models load it, and the fields
    left out with the reason.

    QwenPaw (pydantic, lax, ``extra="ignore"``) takes ``"256"`` or ``256.0`` for an
    integer and ``"false"`` or ``0`` for a switch, and ignores fields it does not know,
    so a hand-edited file or one of a newer QwenPaw loads there. Here too: values in those
    forms become the type of the field in ``settings`` (a workspace settings record),
    unknown fields (also inside a known table) are left out (as ``table.field``), and
    text QwenPaw strips before use (:data:`_STRIPPED`) is stripped. A value QwenPaw
    would refuse is passed on as it is, for the settings to refuse."""
    known = ({f.name for f in dataclasses.fields(settings)}  # type: ignore[arg-type]
             - {"ignored_fields"}) | set(IGNORED_WORKSPACE)
    out: dict[str, object] = {}
    dropped: dict[str, str] = {}
    for name, value in part.items():
        if name not in known:
            dropped[name] = UNKNOWN_FIELD
            continue
        current = getattr(settings, name, None)
        if isinstance(value, Mapping) and dataclasses.is_dataclass(current):
            extra = set(IGNORED_EMBEDDING) if name == "embedding_model_config" else set()
            inner, gone = _loads_table(value, current, extra)
            inner.update({k: v.strip() for k, v in inner.items()
                          if k in _STRIPPED.get(name, ()) and isinstance(v, str)})
        elif isinstance(value, Mapping) and name in KNOWN_SECTIONS:
            inner = {k: v for k, v in value.items() if k in KNOWN_SECTIONS[name]}
            gone = [k for k in value if k not in KNOWN_SECTIONS[name]]
        else:
            out[name] = _lax(value, current)
            continue
        out[name] = inner
        dropped.update({f"{name}.{k}": UNKNOWN_FIELD for k in gone})
    return out, dropped


def _loads_table(table: Mapping[str, object], record: object, extra: set[str],
                 ) -> tuple[dict[str, object], list[str]]:
    """One table of an ``agent.json`` against ``record`` (a settings record of that table):
    its fields with values turned as QwenPaw's models would, and the unknown field names
    (``extra``: fields known though not in ``record``)."""
    known = {f.name for f in dataclasses.fields(record)} | extra  # type: ignore[arg-type]
    inner = {k: _lax(v, getattr(record, k, None)) for k, v in table.items() if k in known}
    return inner, [k for k in table if k not in known]


def _lax(value: object, default: object) -> object:
    """``value`` turned into the type of ``default`` where pydantic's lax mode would."""
    if isinstance(default, bool):
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if type(value) is int and value in (0, 1):
            return bool(value)
    elif isinstance(default, int):
        if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
            return int(value.strip())
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif isinstance(default, float) and isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return value
        return number if math.isfinite(number) else value
    return value


__all__ = ["IGNORED_EMBEDDING", "IGNORED_WORKSPACE", "UNKNOWN_FIELD", "Classified",
           "QwenPawConfigError", "as_qwenpaw_loads", "classify", "looks_like_agent_json",
           "memory_part"]


def read_agent_json(value: object, cfg_path: Path) -> Mapping[str, object]:
    """A QwenPaw ``agent.json`` named in the config file ``cfg_path`` (relative to the
    file); ValueError saying what is wrong with it."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{cfg_path}: qwenpaw_agent_json must be a path")
    path = cfg_path.parent / paths.expand_home(value, f"{cfg_path}: qwenpaw_agent_json")
    try:
        data = loads_qwenpaw_json(paths.read_regular_file(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: not a JSON object")
    return data
