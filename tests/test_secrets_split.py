"""A private key given in parts never reaches memory, from outside: a real daemon, a
real socket, real files.

``memory.add_note`` gets a key in three calls (its BEGIN line, its body, its END line) or
cut inside its body, in every armour; ``memory.add_turns`` gets one over several messages,
in one call and over several calls. No body line may stay in the note, the pending-turns
log, ``memory.read`` or a search's snippets; prose after a closed key stays as it was.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from conftest import DaemonHandle

from recalld.daemon.memory.redact import redact
from recalld.ipc.client import Client

RNG = random.Random(20261205)
B64 = string.ascii_letters + string.digits + "+/"


def _line(n: int = 64) -> str:
    return "".join(RNG.choice(B64) for _ in range(n))


def _block(begin: str, end: str, headers: str = "") -> list[str]:
    return [begin, *([headers, ""] if headers else []), *(_line() for _ in range(6)),
            _line(24) + "==", end]


KEYS = {
    "pem": _block("-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----"),
    "rsa-encrypted": _block("-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----",
                            "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,0F1E2D3C4B5A6978"),
    "openssh": _block("-----BEGIN OPENSSH PRIVATE KEY-----",
                      "-----END OPENSSH PRIVATE KEY-----"),
    "pgp": _block("-----BEGIN PGP PRIVATE KEY BLOCK-----", "-----END PGP PRIVATE KEY BLOCK-----",
                  "Version: GnuPG v2"),
    "ssh2": _block("---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----",
                   "---- END SSH2 ENCRYPTED PRIVATE KEY ----", 'Comment: "rsa-key-2026"'),
}
PROSE = "After the key: the deploy host is build-7, port 2222."


def _body(key: list[str]) -> list[str]:
    return [line for line in key if len(line) > 20 and "-" not in line and ":" not in line]


def _leaked(text: str) -> list[str]:
    return [line for key in KEYS.values() for line in _body(key) if line in text]


def test_a_key_noted_in_parts_is_masked_whole(daemon: DaemonHandle) -> None:
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("keeper")["path"])
        paths = []
        for name, key in KEYS.items():
            # The armour lines alone, and a cut inside the body (mid-line).
            cuts = ([key[:1], key[1:-1], key[-1:]] if name != "openssh" else
                    [key[:3], [key[3][:30]], [key[3][30:], *key[4:]]])
            for part in cuts:
                added = c.call("memory.add_note", {"agent_id": "keeper", "name": name,
                                                   "content": "\n".join(part)})
            added = c.call("memory.add_note", {"agent_id": "keeper", "name": name,
                                               "content": PROSE})
            paths.append(added["path"])
        for path in paths:
            note = (root / path).read_text(encoding="utf-8")
            assert not _leaked(note), note
            assert note.endswith(f"\n[REDACTED]\n\n{PROSE}\n"), note
            read = c.call("memory.read", {"agent_id": "keeper", "path": path})["text"]
            assert not _leaked(read) and PROSE in read
        for line in _body(KEYS["pem"])[:2]:
            hits = c.call("memory.search", {"agent_id": "keeper", "query": line})["results"]
            assert not _leaked(repr(hits))


def test_a_key_said_over_several_messages_is_masked_whole(daemon: DaemonHandle) -> None:
    key = KEYS["pem"]
    messages = [{"role": "user", "content": line} for line in
                (key[0], "\n".join(key[1:4]), "\n".join(key[4:-1]), key[-1])]
    done = {"role": "assistant", "content": PROSE}
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("talker")["path"])
        c.call("memory.add_turns", {"agent_id": "talker", "session_id": "one-call",
                                    "messages": [*messages, done]})
        for message in (*messages, done):  # each message its own call
            c.call("memory.add_turns", {"agent_id": "talker", "session_id": "calls",
                                        "messages": [message]})
    logged = "".join(p.read_text(encoding="utf-8")
                     for p in (root / "mem_metadata" / "sessions").rglob("*.jsonl"))
    assert logged.count(PROSE) == 2  # the log is the one read, and holds both sessions
    assert not _leaked(logged), logged


def test_a_key_block_not_closed_keeps_its_begin_line_and_the_prose_below() -> None:
    text = "-----BEGIN PRIVATE KEY-----\nMIIEvQ\nab+/cd==\n\nthe rest is in the vault, ask me"
    kept = "-----BEGIN PRIVATE KEY-----\n[REDACTED]\n\nthe rest is in the vault, ask me"
    assert redact(text) == kept and redact(kept) == kept
    # On one line (a JSON string): the rest of that line is masked.
    one_line = redact('{"key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQab\\ncd==", "n": 1}')
    assert "MIIEvQab" not in one_line and "cd==" not in one_line, one_line


def _token(prefix: str, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    while True:
        body = "".join(RNG.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in body) and (alphabet.isupper() or any(
                c.islower() for c in body)):
            return prefix + body


#: Tokens known by their prefix alone, each cut (no credential word near it) where a chat
#: client splitting a paste in two calls could cut it.
CUT_TOKENS = [
    (_token("ghp_", 36), 21), (_token("sk-proj-", 48), 14), (_token("glpat-", 20), 17),
    (_token("AKIA", 16, string.ascii_uppercase + string.digits), 12),
    (_token("hf_", 34), 20), (_token("AIza", 35), 30), (_token("npm_", 36), 11),
    (f"xoxb-{RNG.randrange(10**10, 10**11)}-{RNG.randrange(10**11, 10**12)}-{_token('', 24)}",
     13),
]
#: Texts that end in a run of token characters that is no token's start: kept.
PLAIN_ENDS = ["the fix is in handleWebSocketReconnect", "I like sk-learning_tools",
              "the commit was 3f9a0c7e1b5d2a8f6e4c", "UUID 123e4567-e89b-12d3-a456-426614174000",
              "it lives at /usr/local/share/recalld/glass_pattern"]


def test_a_token_cut_at_the_end_of_a_call_is_masked_before_it_is_written(
        daemon: DaemonHandle) -> None:
    """A call's text ends in the start of a token whose rest comes in the next call: the
    pending-turns log is written before that call, so what starts like a token is masked
    at once (the start of a ``ghp_`` token kept its prefix and 17 of its 36 characters on
    disk for good); the rest is masked when it comes; texts ending in identifiers stay."""
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("paster")["path"])
        log = root / "mem_metadata" / "sessions" / "pending.jsonl"
        for n, (token, cut) in enumerate(CUT_TOKENS):
            c.call("memory.add_turns", {"agent_id": "paster", "session_id": f"cut-{n}",
                                        "messages": [{"role": "user",
                                                      "content": f"paste {token[:cut]}"}]})
            assert token[:cut] not in log.read_text(encoding="utf-8"), token
            c.call("memory.add_turns", {"agent_id": "paster", "session_id": f"cut-{n}",
                                        "messages": [{"role": "user",
                                                      "content": f"{token[cut:]} done"}]})
        for n, text in enumerate(PLAIN_ENDS):
            c.call("memory.add_turns", {"agent_id": "paster", "session_id": f"plain-{n}",
                                        "messages": [{"role": "user", "content": text}]})
    logged = log.read_text(encoding="utf-8")
    assert not [t for t, cut in CUT_TOKENS if t[:cut] in logged or t[cut:] in logged], logged
    assert logged.count("paste [REDACTED]") == len(CUT_TOKENS), logged
    assert all(text in logged for text in PLAIN_ENDS), logged
