"""The messages AgentScope middlewares read from and add to an agent's context.

The user's text of a reply's inputs, the user and assistant turns written back, the
context message that carries recalled memory (named :data:`MEMORY_MSG_NAME`, never
written back), the search hits formatted for a model and what the memory middleware
adds to the system prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeVar

from agentscope.event import ReplyEndEvent, RequireExternalExecutionEvent, RequireUserConfirmEvent
from agentscope.message import AssistantMsg, DataBlock, HintBlock, Msg, TextBlock

from recalld.ipc.answers import JsonObject
from recalld.ipc.media import media_placeholder
from recalld.ipc.recall_tags import inert_recall_tags
from recalld.ipc.shown import names_nothing
from recalld.ipc.textcut import cut_text
from recalld.ipc.types import (
    SearchResponse,
    render_linked,
    render_skipped,
    shown_part,
    visible,
)

#: Name of the context message that carries recalled memory (never written back).
MEMORY_MSG_NAME = "memory"
MAX_HIT_CHARS = 1200
#: The longest speaker name put into an exchange note (as the daemon bounds a turn's).
MAX_NAME_CHARS = 64
#: Replies waiting for the user (a tool call to confirm) remembered per middleware.
MAX_PARKED = 1000
V = TypeVar("V")

TOOL_INSTRUCTIONS = (
    "## Long-term memory\n\n"
    "You have a long-term memory shared across conversations. Call `memory_search` "
    "when the request may depend on something from an earlier session (a preference, a "
    "name, a decision, how something was done). Call `add_memory` to keep a durable fact "
    "the user states or asks you to remember; the conversation itself is recorded "
    "automatically."
)
INDEX_HEADER = "## Memory index (long-term notes: name — when to read it)"


def format_hits(response: SearchResponse, query: str = "") -> list[str]:
    """One text per hit: where it comes from (the lines shown), then the text (cut to a
    bound, around ``query``'s words when its start misses them: ``shown_part``)."""
    out = []
    for hit in response:
        text, first, last = shown_part(hit.text, hit.start_line, hit.end_line, MAX_HIT_CHARS,
                                       query)
        owner = hit.extra.get("agent_id")
        where = f"{visible(owner)}:" if isinstance(owner, str) else ""
        out.append(f"[{where}{visible(hit.path)}:{first}-{last}]\n{text}")
    return out


def hit_texts(response: SearchResponse, query: str = "") -> list[str]:
    """A search answer for ``query`` as texts for a model: each hit (:func:`format_hits`),
    the linked context, then the workspaces of ``agents`` not searched and why (a model
    told nothing would take their silence for having nothing)."""
    hits, skipped = format_hits(response, query), render_skipped(response)
    if skipped and not hits:
        hits = ["(nothing found in the workspaces searched)"]
    linked = render_linked(response, MAX_HIT_CHARS, query)
    return hits + [text for text in (linked, skipped) if text]


def _msg_text(msg: Msg) -> str:
    text = msg.get_text_content()
    return text.strip() if text else ""


def _content(msg: Msg) -> str | list[JsonObject]:
    """What ``msg`` says: its text; with data blocks (an image, a recording, a file), its
    text and data blocks in order, each data block without its bytes or URL (the daemon
    puts a placeholder naming it, as for every client)."""
    if not any(isinstance(b, DataBlock) for b in msg.content):
        return _msg_text(msg)
    out: list[JsonObject] = []
    for block in msg.content:
        if isinstance(block, TextBlock) and block.text.strip():
            out.append({"type": "text", "text": block.text})
        elif isinstance(block, DataBlock):
            out.append({"type": "data", "name": block.name,
                        "source": {"media_type": block.source.media_type}})
    return out


def chat_turns(msgs: Sequence[Msg]) -> list[JsonObject]:
    """The user and assistant messages of ``msgs`` that say something, as chat messages
    with their speaker's ``name`` (whose fact is whose when several people or agents
    share the conversation; the daemon drops a name that only repeats the role)."""
    return [{"role": m.role, "content": content, "name": m.name} for m in msgs
            if m.role in ("user", "assistant") and (content := _content(m))]


def memory_message(hits: Sequence[str]) -> Msg:
    """The context message carrying recalled hits. The tag lets the daemon drop the block
    if the message is ever written back."""
    body = inert_recall_tags("\n\n".join(hits))  # a note's own tag would end the block
    hint = ("## Relevant memories\nNotes from long-term memory that may be relevant; use "
            f"them only if pertinent.\n<recalled-memory>\n{body}\n</recalled-memory>")
    return AssistantMsg(name=MEMORY_MSG_NAME, content=[HintBlock(hint=hint)])


def recalled(msg: Msg) -> bool:
    """Whether ``msg`` is a recalled-memory message (:func:`memory_message`): named so
    and carrying only hints. An agent's own message is never one, even an agent named
    ``memory``: its answers are written back like any other's."""
    return msg.name == MEMORY_MSG_NAME and all(isinstance(b, HintBlock) for b in msg.content)


def heard(agent: object) -> list[Msg]:
    """The messages in an agent's context after the last one it said: what it took in
    (``observe``: the user, or other agents of a group chat) and has not answered yet."""
    context = [m for m in getattr(getattr(agent, "state", None), "context", ())
               if isinstance(m, Msg)]
    name = getattr(agent, "name", None)
    said = [i for i, m in enumerate(context)
            if m.role == "assistant" and m.name == name and not recalled(m)]
    return context[said[-1] + 1:] if said else context


def _said(msg: Msg) -> str:
    """What ``msg`` says, as text: its text, and each data block (an image, a recording,
    a file) the placeholder naming it that the daemon keeps in its place
    (:func:`~recalld.ipc.media.media_placeholder`), in order."""
    content = _content(msg)
    if isinstance(content, str):
        return content
    return "\n".join(str(b["text"]) if b["type"] == "text" else media_placeholder("data", b)
                     for b in content).strip()


def _query_text(inputs: object, said: Callable[[Msg], str] = _msg_text) -> str | None:
    """The user's text in the reply inputs (None for resumption events); with
    ``said=_said``, its media named too."""
    msgs = inputs if isinstance(inputs, list) else [inputs]
    texts = [said(m) for m in msgs if isinstance(m, Msg) and m.role == "user"]
    joined = "\n".join(t for t in texts if t)
    return joined or None


def _asker(inputs: object) -> str:
    """Who asked in the reply inputs, as an exchange note labels them: ``User``, with
    the names of the users who spoke when their messages name them (several people
    may share one agent: ``User (Alice)``); a name that only says ``user`` is none."""
    msgs = inputs if isinstance(inputs, list) else [inputs]
    names = dict.fromkeys(
        cut_text(" ".join(m.name.split()), MAX_NAME_CHARS) for m in msgs
        if isinstance(m, Msg) and m.role == "user" and isinstance(m.name, str))
    # Blank, or only what shows nothing (a zero-width space): nobody.
    shown = [n for n in names if n.casefold() != "user" and not names_nothing(n)]
    return f"User ({', '.join(shown)})" if shown else "User"


def session_of(agent: object) -> str | None:
    """The session an agent's turns go under: read live from its state at hook time,
    never stored per middleware, so one middleware serves agents of many sessions."""
    session = getattr(getattr(agent, "state", None), "session_id", None)
    return session if isinstance(session, str) and session else None


class Parked(OrderedDict[int, V]):
    """What a reply that ended before the agent answered (it waits for the user to
    confirm a tool call, or for an external execution) leaves for the reply that resumes
    it, by the id of the agent's state; the oldest is forgotten past ``MAX_PARKED``."""

    def park(self, key: int, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > MAX_PARKED:
            self.popitem(last=False)


def still_waiting(item: object, waiting: bool) -> bool:
    """Whether a reply waits for the user (to confirm a tool call) or for a tool run
    elsewhere, after ``item`` of its stream: it then ends without its answer, and the
    reply given the user's decision resumes it (without a user message of its own)."""
    if isinstance(item, RequireUserConfirmEvent | RequireExternalExecutionEvent):
        return True
    return False if isinstance(item, ReplyEndEvent) else waiting
