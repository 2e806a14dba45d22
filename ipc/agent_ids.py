"""Agent and session ids in any script (QwenPaw agents, AgentScope agents, users, chats).

A recalld agent id is 1-64 characters of ``A-Z a-z 0-9 _ . -``. A name in another script
would lose most of its characters and collide with every other one ("研究助手" and
"写作助手" both become empty), so :func:`non_latin_agent_id` keeps its ASCII letters
(accents folded, ``agent`` if none) and adds a digest of the whole name: distinct names,
distinct ids, the same one every time. :func:`session_key` does the same for the
conversation ids of agent frameworks, which the daemon takes in a narrower alphabet.
No I/O.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

#: A run of characters no agent id has.
NOT_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
#: An agent id, but for the names '.' and '..' (checked apart).
AGENT_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def non_latin_agent_id(name: str) -> str:
    """The agent id of a name that is not all ASCII."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    base = NOT_ID_CHARS.sub("_", folded).strip("._-")[:55] or "agent"
    return f"{base}-{hashlib.blake2s(name.encode(), digest_size=4).hexdigest()}"


def workspace_name(name: str) -> str:
    """A valid recalld agent id derived from an AgentScope agent name.

    An ASCII name keeps its letters, digits and ``_.-`` (others become ``_``). A name in
    another script would lose most of its characters and collide with every other one
    ("研究助手" and "写作助手" both became ``_``), so it becomes its ASCII letters (accents
    folded, ``agent`` if none) and a digest of the whole name: distinct names, distinct
    workspaces, the same one every time. So does an ASCII name longer than an agent id
    (64 characters): cut short, names alike up to there would share one workspace.

    A name that makes no id (empty, ``.``, ``..``) raises ValueError: it would be taken
    for the ``default`` workspace, another agent's memory. Names that make the same id
    ("Sales Bot", "Sales_Bot") are told apart by the daemon, which refuses the second
    (``workspace.open``'s ``name``)."""
    if name.isascii():
        short = NOT_ID_CHARS.sub("_", name).strip(".")
        if not short:
            raise ValueError(f"the agent name {name!r} makes no workspace name: name the "
                             "agent with a letter or digit, or give an agent id")
        if len(short) <= 64:
            return short
    return non_latin_agent_id(name)


def same_id_refusal(agent_id: str, name: str, owner: str) -> str:
    """Why agent ``name`` may not use the workspace ``agent_id``: it is the workspace of
    agent ``owner``, another name that makes the same id ("Sales Bot", "Sales_Bot")."""
    return (f"agent {name!r} and agent {owner!r} both have the agent id {agent_id!r}, whose "
            f"workspace is {owner!r}'s: give {name!r} another name or agent id (or close "
            f"workspace {agent_id!r} with forget, to give it to {name!r})")


def workspace_id(name: str) -> str:
    """``name`` itself if it is a recalld agent id, else its :func:`workspace_name`: the
    workspace an ``agent_id`` given to a middleware names."""
    if AGENT_ID.fullmatch(name) and name not in (".", ".."):
        return name
    return workspace_name(name)


#: A session id the daemon takes (``memory.add_turns``), but for a leading ``.``.
SESSION_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
#: A run of characters no session id has.
NOT_SESSION_CHARS = re.compile(r"[^A-Za-z0-9_.:@-]+")


def session_key(session: str) -> str:
    """The daemon's session id for an agent framework's conversation id.

    An id the daemon takes (1-128 characters of ``A-Z a-z 0-9 _ . : @ -``, not starting
    with ``.``) stays as it is. Any other (``user 42/chat``, ``会话-1``, a 200-character
    id) keeps its ASCII letters and digits (accents folded, others ``_``, at most 100)
    and gets a digest of the whole id: distinct conversations, distinct sessions, the same
    one every time."""
    if SESSION_ID.fullmatch(session) and not session.startswith("."):
        return session
    folded = unicodedata.normalize("NFKD", session).encode("ascii", "ignore").decode()
    base = NOT_SESSION_CHARS.sub("_", folded)[:100].strip("._-") or "session"
    return f"{base}-{hashlib.blake2s(session.encode(), digest_size=4).hexdigest()}"
