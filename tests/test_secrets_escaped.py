"""Keys spelled with escapes inside them, from outside: a real daemon, a real socket, real
files. A token copied out of a URL, a JSON or C string, an HTML page or a mail comes
with some of its characters escaped (``ghp%5F...``, ``sk%2Dproj%2D...``, ``gh\\x70_...``,
``&#95;``, a quoted-printable soft line break inside it); it is the same key, and no piece
of it may reach a note, a note's name as memory.read and memory.list give it, or a
search's answer. The same holds for an AWS secret key with its "/" and "+" escaped
(``%2F``, JSON's ``\\/``). A URL's escapes (``%2F``, ``%20``, ``caf%C3%A9``), "n=48",
base64's padding at a line's end and an image's data URL stay as they are.
"""

from __future__ import annotations

import base64
import random
import string
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tokengen import random_token

from recalld.daemon.memory.redact import redact
from recalld.daemon.memory.secret_names import could_hold, mask_path

RNG = random.Random(20261206)
_rand = partial(random_token, RNG)


KEYS = ("ghp_" + _rand(36), "sk-proj-" + _rand(48), "glpat-" + _rand(20),
        "AKIA" + "".join(RNG.choice(string.ascii_uppercase + string.digits) for _ in range(16)),
        "xoxb-1234567890-" + _rand(24), "hf_" + _rand(34))
#: An AWS secret key: base64's "/" and "+" inside, escaped in a URL or a JSON string.
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzEXAMPLEKE"
AWS_ESCAPED = (AWS_SECRET.replace("/", "%2F").replace("+", "%2B"),
               AWS_SECRET.replace("/", "%2f").replace("+", "%252B"),
               AWS_SECRET.replace("/", "\\/"), AWS_SECRET.replace("+", "\\u002b"))

#: Ways of writing one character escaped, by the encoders and writers that do.
ESCAPES: dict[str, Callable[[str], str]] = {
    "percent": lambda c: f"%{ord(c):02X}",
    "percent twice": lambda c: f"%25{ord(c):02x}",
    "json": lambda c: f"\\u{ord(c):04x}",
    "c": lambda c: f"\\x{ord(c):02x}",
    "html": lambda c: f"&#{ord(c)};",
    "html hex": lambda c: f"&#x{ord(c):x};",
}
#: Quoted-printable escapes only what it must ("_", "-", "." here).
QP = {"_": "=5F", "-": "=2D", ".": "=2E"}

CLEAN = ("https://example.com/search?q=caf%C3%A9%20au%20lait&page=2%2F3 see you",
         "placebo (n=48) or (n=50); 90.00% (n=9/10) and 75.61% of them, 100%2B more",
         "dGVzdCBzdHJpbmcgZm9yIGJhc2U2NA==\nnext line of text",
         "The value=\nsome text continues here", 's = "\\u0048\\u0065llo world"',
         "caf&#233; &amp; r&#xe9;sum&#xe9;", "commit 3f786850e387550fdab836ed7e6dc881de23001b",
         "id 123e4567-e89b-12d3-a456-426614174000",
         "![x](data:image/png;base64,"
         + base64.b64encode(bytes(range(256)) * 8).decode() + ")")


def _escaped(key: str) -> list[str]:
    """``key`` with one of its characters escaped (a letter of its prefix, its joiner, one
    near its end), and with every character escaped, in each way there is."""
    joiner = next((i for i, c in enumerate(key) if c in "_-"), 3)
    out = []
    for escape in ESCAPES.values():
        for at in (1, joiner, len(key) - 5):
            out.append(key[:at] + escape(key[at]) + key[at + 1:])
        out.append("".join(escape(c) for c in key))
    if key[joiner] in QP:
        out.append(key[:joiner] + QP[key[joiner]] + key[joiner + 1:])
    out.append(key[:10] + "=\n" + key[10:])
    out.append(key[:10] + "=\r\n" + key[10:])
    return out


def _leaks(text: str) -> list[str]:
    """The keys a piece of which (8 characters) shows in ``text``."""
    return [key[:8] for key in (*KEYS, AWS_SECRET)
            if any(key[i:i + 8] in text for i in range(2, len(key) - 7, 4))]


def test_redaction_reads_a_key_through_the_escapes_inside_it() -> None:
    for key in KEYS:
        for form in _escaped(key):
            out = redact(f"see {form} ok")
            assert out == "see [REDACTED] ok", (form, out)
    for form in AWS_ESCAPED:
        assert redact(f'["{form}"]') == '["[REDACTED]"]', form
    for clean in CLEAN:
        assert redact(clean) == clean


def test_a_name_holding_an_escaped_key_is_one_the_rules_could_mask() -> None:
    # could_hold turns a name away only when the rules find nothing in it.
    for key in KEYS:
        for form in _escaped(key):
            if "\n" in form or "\\" in form:
                continue  # not in a file name
            name = f"deploy-{form}.md"
            assert could_hold(name), name
            assert mask_path(f"memory/{name}") == "memory/deploy-[REDACTED].md", name


def test_an_escaped_key_in_notes_names_and_turns_is_masked_everywhere(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n')
    github, openai, _, aws = KEYS[:4]
    named = f"memory/2026-12-01/{github[:3]}%{ord(github[3]):02X}{github[4:]}.md"
    typed = (f"# keys\nwalrus {github[:2]}\\x{ord(github[2]):02x}{github[3:]} and "
             f"{openai[:2]}%2D{openai[3:7]}%2D{openai[8:]} and {aws[:8]}=\n{aws[8:]}\n"
             f'["{AWS_ESCAPED[2]}"]\n'
             + "\n".join(CLEAN) + "\n")
    (root / "memory" / "2026-12-01").mkdir(parents=True)
    (root / named).write_text(typed)
    d.call("index.sync", {"agent_id": "w"})

    read = d.call("memory.read", {"agent_id": "w", "path": named, "masked": True})
    assert read["path"] == "memory/2026-12-01/[REDACTED].md"
    assert _leaks(str(read)) == [] and "walrus [REDACTED] and [REDACTED]" in read["text"]
    for clean in CLEAN:
        assert clean in read["text"], clean
    # Read again by the name shown for it.
    again = d.call("memory.read", {"agent_id": "w", "path": read["path"], "masked": True})
    assert again["text"] == read["text"]
    listed = d.call("memory.list", {"agent_id": "w"})
    assert [f["path"] for f in listed["files"]] == [read["path"]]
    hits = d.call("memory.search", {"agent_id": "w", "query": "walrus"})
    assert hits["results"] and _leaks(str(hits)) == []

    d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "messages": [
        {"role": "user", "content": f"token is in {typed}"}]})
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "walrus [REDACTED]" in pending and _leaks(pending) == []
    note = d.call("memory.add_note", {"agent_id": "w", "name": "k", "content": typed})
    written = (root / note["path"]).read_text()
    assert "walrus [REDACTED]" in written and _leaks(written) == []
