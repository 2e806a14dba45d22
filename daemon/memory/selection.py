"""Selection of the topic files relevant to a request, by the chat model, with the search
as the fallback (Agentic Memory's "which memory files to read").

The model gets the query and the list of topic files (path, type, name, description, as
``MEMORY.md`` shows them) and answers with a JSON object ``{"paths": [...]}``; paths it
names that are not topic files are dropped. Without a chat model, or when the model fails
or answers something else, the search picks instead: the digest files of the best hits,
in rank order. The answer says which way was taken (``method``) and why the model was not
used (``fallback``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

import orjson

from recalld.daemon.providers.chat import ChatClient, ChatMessage
from recalld.daemon.providers.errors import ProviderError
from recalld.ipc.answers import Selected, TopicEntry

log = logging.getLogger(__name__)

MAX_SELECT: Final = 20
SELECT_PROMPT: Final = (
    "You pick the long-term memory files that help answer a request. Answer with one JSON "
    'object {"paths": [...]} naming at most LIMIT paths from the list, most useful first; '
    '{"paths": []} when none helps. Never name a path that is not listed.')


def _listing(entries: Sequence[TopicEntry]) -> str:
    return "\n".join(f"- {e['path']} ({e['type']}): {e['name']} — {e['description']}"
                     for e in entries)


def parse_paths(content: str | None) -> list[str]:
    """The ``paths`` of the model's JSON answer (a fenced block is accepted); ValueError
    for anything else."""
    text = (content or "").strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    value = orjson.loads(text)
    paths = value.get("paths") if isinstance(value, dict) else None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ValueError('the answer is not {"paths": [strings]}')
    return paths


async def select_topics(
    agent_id: str, query: str, limit: int, entries: Sequence[TopicEntry],
    chat: ChatClient | None, search_paths: Callable[[], Awaitable[list[str]]],
) -> Selected:
    """Up to ``limit`` topic files for ``query``: the model's choice, else the search's.
    The answer names the query masked, as the index and the model see it."""
    from recalld.daemon.memory.redact import redact_async

    shown = await redact_async(query)
    by_path: Mapping[str, TopicEntry] = {e["path"]: e for e in entries}
    reason: str | None
    if chat is None:
        reason = "no chat model configured"
    elif not entries:
        reason = "no topic files"
    else:
        messages: list[ChatMessage] = [
            {"role": "system", "content": SELECT_PROMPT.replace("LIMIT", str(limit))},
            {"role": "user", "content": f"Request: {query}\n\nMemory files:\n"
                                        f"{_listing(entries)}"}]
        try:
            answer = await chat.complete(messages, temperature=0.0)
            chosen = [p for p in dict.fromkeys(parse_paths(answer.content)) if p in by_path]
            return {"agent_id": agent_id, "query": shown, "method": "model",
                    "fallback": None, "files": [by_path[p] for p in chosen[:limit]]}
        except ProviderError as exc:
            reason = f"chat model failed: {exc}"
        except ValueError as exc:
            reason = f"chat model answer not usable: {exc}"
        log.warning("memory.select agent=%s: search instead (%s)", agent_id, reason)
    files: list[TopicEntry] = []
    for path in dict.fromkeys(await search_paths()):
        entry = by_path.get(path)
        files.append(entry if entry is not None else
                     {"path": path, "name": path.rsplit("/", 1)[-1].removesuffix(".md"),
                      "description": "", "type": ""})
        if len(files) >= limit:
            break
    return {"agent_id": agent_id, "query": shown, "method": "search", "fallback": reason,
            "files": files}
