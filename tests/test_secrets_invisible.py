"""Keys cut by characters that show nothing, from outside: a real daemon, a real socket,
real files. A zero-width space, a soft hyphen, a word joiner or a byte order mark inside
a token (a page or a chat that breaks long words puts them there; so can someone who
wants a key kept) leaves it reading and copying as one: no piece of it may reach a note,
the pending-turns log or a search's answer. Text whose invisible characters belong to
it (a Persian word's joiner, an emoji's, a soft hyphen in a long word) stays as it is.
"""

from __future__ import annotations

import random
import string
from functools import partial
from pathlib import Path
from typing import Any

from tokengen import random_token

from recalld.daemon.memory.redact import redact

RNG = random.Random(20261205)
_rand = partial(random_token, RNG)


GITHUB = "ghp_" + _rand(36)
ANTHROPIC = "sk-ant-api03-" + _rand(60)
AWS_ID = "AKIA" + "".join(RNG.choice(string.ascii_uppercase + string.digits) for _ in range(16))
SLACK = f"xoxb-{RNG.randrange(10**11, 10**12)}-{RNG.randrange(10**11, 10**12)}-{_rand(24)}"
PASSWORD = "Qv" + _rand(8)
#: Each key with invisible characters put inside it, as it is sent.
CUT = {
    GITHUB: GITHUB[:14] + "\u200b" + GITHUB[14:],
    ANTHROPIC: ANTHROPIC[:20] + "\u00ad" + ANTHROPIC[20:50] + "\u00ad" + ANTHROPIC[50:],
    AWS_ID: AWS_ID[:4] + "\u2060" + AWS_ID[4:],
    SLACK: "\ufeff".join(SLACK),
    PASSWORD: PASSWORD[:5] + "\u200c" + PASSWORD[5:],
}
CLEAN = ("می\u200cخواهم توکن را تمدید کنم", "family 👨\u200d👩\u200d👧 photo ❤\ufe0f",
         "a long\u00adword hyphen\u00adated in prose", "hello\u200bworld, a commit "
         "3f9a8b7c6d5e\u200b4f3a2b1c0d9e8f7a6b5c4d3e2f1a")


def _pieces(key: str) -> list[str]:
    """Every piece of ``key`` long enough to matter (a leak of part of it is a leak)."""
    return [key[i:i + 8] for i in range(0, len(key) - 7, 4)]


def _leaks(text: str) -> list[str]:
    seen = "".join(c for c in text if c.isprintable() and c not in "\u00ad")
    return [key[:8] for key in CUT if any(p in seen for p in _pieces(key))]


def test_a_key_cut_by_invisible_characters_is_masked_whole(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n')
    text = (f"github {CUT[GITHUB]}, anthropic {CUT[ANTHROPIC]}, aws {CUT[AWS_ID]}, "
            f"slack {CUT[SLACK]}, password: {CUT[PASSWORD]}\n" + "\n".join(CLEAN))
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "messages": [
        {"role": "user", "content": text}]})
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "anthropic [REDACTED], aws [REDACTED]" in pending
    assert _leaks(pending) == []

    note = d.call("memory.add_note", {"agent_id": "w", "name": "keys",
                                      "content": f"deploy walrus\n{text}"})
    written = (root / note["path"]).read_text()
    assert "deploy walrus" in written and _leaks(written) == []
    for clean in CLEAN:
        assert clean in written, clean

    d.call("index.sync", {"agent_id": "w"})
    hits = d.call("memory.search", {"agent_id": "w", "query": "deploy walrus"})["results"]
    assert hits and _leaks(str(hits)) == []
    for key in CUT:
        found = d.call("memory.search", {"agent_id": "w", "query": key[4:20]})
        assert _leaks(str(found)) == [], key[:8]


def test_a_key_cut_between_two_messages_at_an_invisible_character_is_masked(
        daemon_factory: Any, tmp_path: Path) -> None:
    """A chat client cuts a long paste in two messages where an invisible character sits
    inside the key: it ends the first message or starts the second."""
    root = tmp_path / "ws"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n')
    for n, (head, tail) in enumerate(((GITHUB[:14] + "\u200b", GITHUB[14:]),
                                      (ANTHROPIC[:30], "\u00ad\u2060" + ANTHROPIC[30:]))):
        d.call("memory.add_turns", {"agent_id": "w", "session_id": f"cut{n}", "messages": [
            {"role": "user", "content": f"pasting it: {head}"},
            {"role": "user", "content": f"{tail} and that is all"}]})
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert pending.count("pasting it: [REDACTED]") == 2, pending
    assert pending.count("[REDACTED] and that is all") == 2, pending
    assert _leaks(pending) == []


def test_redaction_reads_a_key_through_invisible_characters() -> None:
    """The rules read a token as it shows: whatever invisible characters are inside it,
    however many, and wherever in it."""
    for invisible in ("\u200b", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u200e", "\u202c",
                      "\ufe0f", "\U000e0041", "\u200b\u00ad\u2063"):
        for key in CUT:
            for cut in (key[:9] + invisible + key[9:], invisible.join(key)):
                out = redact(f"the password is {cut} and more")
                assert _leaks(out.replace(invisible, "")) == [], (invisible, out)
                assert out.startswith("the password is [REDACTED]") and out.endswith(" and more")
    for clean in CLEAN:
        assert redact(clean) == clean
