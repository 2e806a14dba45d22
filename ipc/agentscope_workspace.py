"""The workspace an AgentScope middleware serves, and how it opens it.

What both middlewares of :mod:`recalld.ipc.agentscope` share about it: the retrieval
``mode`` and ``top_k`` they check, the workspace named after an agent or a user
(:func:`workspace_name`), the agent's own models handed to the daemon as that
workspace's ``config`` overrides when it is opened (:func:`model_overrides`), and the
daemon failures they log and their tools report. AgentScope's model classes are
imported only when a model object is given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal, TypedDict

from recalld.ipc import errors
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import owner_name
from recalld.ipc.answers import JsonObject
from recalld.ipc.types import shown_part, visible

# The adapter logs under its public module's name, wherever the code lives.
log = logging.getLogger("recalld.ipc.agentscope")

Mode = Literal["static_control", "agent_control", "both"]
MODES: tuple[Mode, ...] = ("static_control", "agent_control", "both")
_DAEMON_ERRORS = (errors.RecalldError, OSError, TimeoutError)
#: Write-backs kept to send again while the daemon is away (oldest dropped first).
MAX_UNSENT = 1000
#: Failures after which a write-back is sent again: the daemon was away (not running,
#: restarting, stopping, overloaded) and took nothing, or its answer was lost.
_AWAY = (errors.DaemonNotRunning, errors.ConnectionLost, errors.ShuttingDown,
         errors.Overloaded, OSError, TimeoutError)


class ChatModelOverride(TypedDict, total=False):
    """The daemon's ``chat_model_config`` fields a middleware hands over."""

    backend: str
    base_url: str
    api_key: str
    model_name: str


class EmbeddingModelOverride(TypedDict, total=False):
    """The daemon's ``embedding_model_config`` fields a middleware hands over."""

    backend: str
    base_url: str
    api_key: str
    model_name: str
    dimensions: int
    use_dimensions: bool


class ModelOverrides(TypedDict, total=False):
    """``workspace.open``'s ``config`` carrying the agent's models."""

    chat_model_config: ChatModelOverride
    embedding_model_config: EmbeddingModelOverride


def _credential(model: object, what: str) -> tuple[str, str]:
    """The API key and base URL of an AgentScope model's credential ("" for the
    provider's default URL)."""
    credential = getattr(model, "credential", None)
    secret = getattr(credential, "api_key", None)
    get = getattr(secret, "get_secret_value", None)
    key = get() if callable(get) else secret
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what}: the model's credential has no API key")
    base_url = getattr(credential, "base_url", None)
    return key, base_url if isinstance(base_url, str) else ""


def chat_model_override(model: object) -> ChatModelOverride:
    """The daemon's ``chat_model_config`` for an AgentScope chat model speaking OpenAI's
    wire format (``OpenAIChatModel``; ``DashScopeChatModel``, whose credential names
    DashScope's OpenAI-compatible endpoint), or a mapping of those fields as given."""
    if isinstance(model, Mapping):
        return ChatModelOverride(**{k: v for k, v in model.items()})  # type: ignore[typeddict-item]
    from agentscope.model import DashScopeChatModel, OpenAIChatModel

    if not isinstance(model, (OpenAIChatModel, DashScopeChatModel)):
        raise ValueError(
            f"chat_model: {type(model).__name__} does not speak OpenAI's wire format; pass "
            "OpenAIChatModel, DashScopeChatModel or a mapping of chat_model_config fields")
    key, base_url = _credential(model, "chat_model")
    return ChatModelOverride(backend="openai", base_url=base_url, api_key=key,
                             model_name=str(model.model))


def embedding_model_override(model: object) -> EmbeddingModelOverride:
    """The daemon's ``embedding_model_config`` for ``OpenAIEmbeddingModel`` or
    ``DashScopeEmbeddingModel`` (text or multimodal), or a mapping of those fields."""
    if isinstance(model, Mapping):
        return EmbeddingModelOverride(**{k: v for k, v in model.items()})  # type: ignore[typeddict-item]
    from agentscope.embedding import DashScopeEmbeddingModel, OpenAIEmbeddingModel

    if not isinstance(model, (OpenAIEmbeddingModel, DashScopeEmbeddingModel)):
        raise ValueError(
            f"embedding_model: {type(model).__name__} is not supported; pass "
            "OpenAIEmbeddingModel, DashScopeEmbeddingModel or a mapping of "
            "embedding_model_config fields")
    key, base_url = _credential(model, "embedding_model")
    if isinstance(model, OpenAIEmbeddingModel):
        override = EmbeddingModelOverride(backend="openai", base_url=base_url, api_key=key,
                                          model_name=str(model.model),
                                          use_dimensions=bool(model.pass_dimensions))
    elif isinstance(model, DashScopeEmbeddingModel):
        backend = "dashscope_multimodal" if model.supports_multimodal else "dashscope"
        override = EmbeddingModelOverride(backend=backend, base_url=base_url, api_key=key,
                                          model_name=str(model.model))
    if isinstance(model.dimensions, int):
        override["dimensions"] = model.dimensions
    return override


def model_overrides(chat_model: object = None, embedding_model: object = None
                    ) -> ModelOverrides:
    """``workspace.open``'s ``config`` for the agent's own models (empty: none given)."""
    config = ModelOverrides()
    if chat_model is not None:
        config["chat_model_config"] = chat_model_override(chat_model)
    if embedding_model is not None:
        config["embedding_model_config"] = embedding_model_override(embedding_model)
    return config


def _warn_if_other_models(workspace: str, wanted: ModelOverrides,
                          settings: Mapping[str, object]) -> None:
    """A workspace already open keeps its models: say so when they are not the agent's."""
    names = {"chat_model_config": wanted.get("chat_model_config", {}).get("model_name"),
             "embedding_model_config": wanted.get("embedding_model_config", {}).get(
                 "model_name")}
    for key, want in names.items():
        have = settings.get(key)
        if want and isinstance(have, Mapping) and have.get("model_name") != want:
            log.warning("recalld workspace %s was already open with another %s (%s); it "
                        "keeps that one until it is closed", workspace, key,
                        have.get("model_name") or "none")


async def _open_workspace(client: AsyncClient, workspace: str,
                          models: ModelOverrides, name: str | None = None) -> JsonObject:
    """Open ``workspace`` with the agent's models; its settings as the daemon answered.
    ``name``: the agent's or user's name the workspace's id was made of, so that the
    daemon refuses another whose id is the same."""
    info = await client.workspace_open(workspace, config=models or None,
                                       name=owner_name(name) if name is not None else None)
    settings = info.get("settings")
    opened = dict(settings) if isinstance(settings, Mapping) else {}
    _warn_if_other_models(workspace, models, opened)
    return opened


async def selected_files(client: AsyncClient, workspace: str, query: str, limit: int,
                         budget_chars: int) -> list[str]:
    """The topic files the chat model picks for ``query`` (``memory.select``), each
    labelled with its path and lines, within ``budget_chars``; empty when the daemon fell
    back to the search (the recall block then serves)."""
    answer = await client.select(workspace, query, limit=limit)
    files = answer.get("files") if answer.get("method") == "model" else None
    out: list[str] = []
    left = budget_chars
    for entry in files or []:
        path = str(entry.get("path", ""))
        read = await client.read(workspace, path, masked=True)  # it goes to the model
        end = read.get("end_line")
        end = end if isinstance(end, int) else 1
        # Shown escaped, as recall labels are: a file name cannot add a line of its own.
        # A label of the part shown is no longer than the whole file's.
        room = left - len(f"[{visible(path)}:1-{end}]") - 1
        if room <= 0:
            break
        # Cut to the budget (around the query's words when the start misses them), the
        # label naming the lines shown.
        body, first, last = shown_part(str(read.get("text") or ""), 1, end, room - 1, query)
        label = f"[{visible(path)}:{first}-{last}]"
        out.append(f"{label}\n{body}")
        left -= len(label) + 1 + len(body)
    return out


def _check_mode(mode: str, top_k: int) -> None:
    """Refuse the constructor arguments both middlewares take, when out of range."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    _check_count(top_k, "top_k")


def _check_count(value: int, name: str) -> None:
    """Refuse a constructor argument that is a count (``top_k``, ``index_max_entries``)
    unless it is a whole number, 1 or more, naming it: else the daemon refused each
    request made of it later, naming its own parameter, which the caller never set."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number, 1 or more, not {value!r}")

