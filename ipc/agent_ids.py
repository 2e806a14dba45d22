"""Agent and session ids in any script (QwenPaw agents, AgentScope agents, users, chats).

A recalld agent id is 1-64 characters of ``A-Z a-z 0-9 _ . -``. A name in another script
would lose most of its characters and collide with every other one ("研究助手" and
"写作助手" both become empty), so :func:`non_latin_agent_id` keeps its ASCII letters
(accents folded, ``agent`` if none) and adds a digest of the whole name: distinct names,
distinct ids, the same one every time. :func:`session_key` does the same for the
conversation ids of agent frameworks, which the daemon takes in a narrower alphabet.
Digests are of a name's NFC form: "Café" typed and "Café" decomposed (as macOS file
names are) are one name. :func:`earlier_ids` tells the ids earlier versions gave a name
that it no longer gets, :func:`owner_name` the form of a name the daemon records as a
workspace's owner, :func:`workspace_table` the config table of an id as a hint must
print it. No I/O.
"""

from __future__ import annotations

import re
import unicodedata

#: A run of characters no agent id has.
NOT_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
#: An agent id, but for the names '.' and '..' (checked apart).
MAX_AGENT_ID_CHARS = 64
AGENT_ID = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_AGENT_ID_CHARS}}}")


#: A TOML bare key: an agent id with a dot (``ops.team-2``) is a dotted key, so it is quoted.
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def workspace_table(agent_id: str) -> str:
    """``[workspaces.X]``, X the agent id as a TOML key (``[workspaces."ops.team-2"]``), so a
    hint that names the table names the one the config file must hold."""
    if _BARE_KEY.fullmatch(agent_id):
        return f"[workspaces.{agent_id}]"
    quoted = agent_id.replace("\\", "\\\\").replace('"', '\\"')
    return f'[workspaces."{quoted}"]'


#: The longest name the daemon records as a workspace's owner (``workspace.open``'s ``name``).
MAX_NAME_CHARS = 256


def _digest(text: str) -> str:
    # Imported here: only a name beyond Latin letters needs it, and hashlib's import
    # (OpenSSL's library) is some 3 ms of CPU at the start of every command.
    import hashlib

    return hashlib.blake2s(text.encode(), digest_size=4).hexdigest()


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _non_latin_id(name: str, digest: str) -> str:
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    base = NOT_ID_CHARS.sub("_", folded).strip("._-")[:55] or "agent"
    return f"{base}-{digest}"


def non_latin_agent_id(name: str) -> str:
    """The agent id of a name that is not all ASCII (the digest is of its NFC form)."""
    return _non_latin_id(name, _digest(_nfc(name)))


def workspace_name(name: str) -> str:
    """A valid recalld agent id derived from an AgentScope agent name.

    An ASCII name keeps its letters, digits and ``_.-`` (others become ``_``). A name in
    another script would lose most of its characters and collide with every other one
    ("研究助手" and "写作助手" both became ``_``), so it becomes its ASCII letters (accents
    folded, ``agent`` if none) and a digest of the whole name: distinct names, distinct
    workspaces, the same one every time. So does an ASCII name longer than an agent id
    (64 characters): cut short, names alike up to there would share one workspace.

    Dots that begin or end a name are left out (``.alice`` is ``alice``). A name that
    makes no id (empty, all dots) raises ValueError: it would be taken for the
    ``default`` workspace, another agent's memory. Names that make the same id
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


def stand_in_name(name: str) -> str:
    """A name to record in place of ``name`` where the daemon refuses it as looking like
    a credential (an agent id that is an API key): ``agent-`` and a digest of it, the
    same every time, which tells nothing of it and never looks like one."""
    return f"agent-{_digest(_nfc(name))}"


def author_name(name: str) -> str:
    """The name recorded as the ``author`` of the notes an agent named ``name`` writes:
    ``name``, or where the daemon takes no author of it (one with no letter or digit,
    ``~``, ``🤖``, ``.md``) its :func:`stand_in_name`, as a name looking like a credential
    is recorded, so that its notes are stored and its scoped searches find them."""
    stem = name.strip()
    stem = stem[:-3] if stem.lower().endswith(".md") else stem
    return name if any(ch.isalnum() for ch in stem) else stand_in_name(name)


def same_id_refusal(agent_id: str, name: str, owner: str) -> str:
    """Why agent ``name`` may not use the workspace ``agent_id``: it is the workspace of
    agent ``owner``, another name that makes the same id ("Sales Bot", "Sales_Bot")."""
    return (f"agent {name!r} and agent {owner!r} both have the agent id {agent_id!r}, whose "
            f"workspace is {owner!r}'s: give {name!r} another name or agent id (or close "
            f"workspace {agent_id!r} with forget, to give it to {name!r})")


def workspace_id(name: str) -> str:
    """The workspace an ``agent_id`` given to a middleware or the MCP bridge names: its
    :func:`workspace_name`, so that an agent is found under one id whichever way it is
    named (a recalld agent id without a dot at either end is itself)."""
    return workspace_name(name)


def earlier_ids(name: str, *, given_as_id: bool) -> tuple[str, ...]:
    """The ids earlier versions gave ``name`` that it no longer gets, most likely first:
    an agent id with a dot at either end (or all dots) was itself when given as an id
    (``given_as_id``: an ``agent_id``, an ``agents`` entry, ``recalld mcp --agent``),
    and a name not in NFC form had the digest of its form as given. A client keeps using
    the one the daemon already has, where the agent's memory is. Empty for every other
    name (nearly all)."""
    out: list[str] = []
    if given_as_id and AGENT_ID.fullmatch(name) and name not in (".", ".."):
        out.append(name)
    if _nfc(name) != name:  # then not ASCII: made a non-Latin id
        out.append(_non_latin_id(name, _digest(name)))
    try:
        current: str | None = workspace_name(name)
    except ValueError:
        current = None
    return tuple(i for i in dict.fromkeys(out) if i != current)


def owner_name(name: str) -> str:
    """The form of an agent's name the daemon records as its workspace's owner
    (``workspace.open``'s ``name``: 1-256 printable characters, not only spaces): its NFC
    form; a name that is not one of those (a tab or a no-break space in it, longer, only
    spaces) shows what it can of itself, characters that do not print as spaces, with a
    digest of the whole name, so that two such names stay two owners."""
    nfc = _nfc(name)
    if nfc.strip() and len(nfc) <= MAX_NAME_CHARS and nfc.isprintable():
        return nfc
    tag = f" #{_digest(nfc)}"
    shown = "".join(c if c.isprintable() else " " for c in nfc)
    return (" ".join(shown.split())[:MAX_NAME_CHARS - len(tag)] + tag).strip()


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
    one every time (the digest is of its NFC form)."""
    if SESSION_ID.fullmatch(session) and not session.startswith("."):
        return session
    return _session_key(session, _digest(_nfc(session)))


def note_session_key(given: object) -> str | None:
    """The session of a note (``memory.add_note``'s ``session_id``) for a conversation
    id given to the MCP bridge or ``recalld note --session``: its :func:`session_key`
    ("chat 42" is ``chat_42-<digest>`` in both), as the turns of that conversation and
    the AgentScope middleware's notes map it (an empty id too); None (the daemon's
    default session) for none."""
    return session_key(given) if isinstance(given, str) else None


def _session_key(session: str, digest: str) -> str:
    folded = unicodedata.normalize("NFKD", session).encode("ascii", "ignore").decode()
    base = NOT_SESSION_CHARS.sub("_", folded)[:100].strip("._-") or "session"
    return f"{base}-{digest}"
