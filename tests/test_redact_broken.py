"""Secrets redaction, a token of a fixed prefix and length broken at a line's end (a
terminal or a mail client wrapping a long paste): masked whole, both lines, wherever it
is broken; a line that goes on with more or fewer of its characters is not the rest of
one and stays. From outside: the second half reaches neither the note nor the index."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from conftest import DaemonHandle

from recalld.daemon.memory.redact import MASK, redact
from recalld.ipc.client import Client

RNG = random.Random(20261206)
B62 = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits


def _r(n: int, alphabet: str = B62) -> str:
    return "".join(RNG.choice(alphabet) for _ in range(n))


#: Each token and the length of its prefix.
TOKENS = {
    "github": ("ghp_" + _r(36), 4),
    "github_fine": (f"github_pat_{_r(22)}_{_r(59)}", 11),
    "aws": ("AKIA" + _r(16, UPPER), 4),
    "npm": ("npm_" + _r(36), 4),
    "google": ("AIza" + _r(35, B62 + "_-"), 4),
    "anthropic": ("sk-ant-api03-" + _r(93, B62 + "_-") + "AA", 13),
    "shopify": ("shpat_" + _r(32, "0123456789abcdef"), 6),
}
GITHUB = TOKENS["github"][0]


@pytest.mark.parametrize("kind", sorted(TOKENS))
@pytest.mark.parametrize("cut", [1, 0.5, -2])
@pytest.mark.parametrize("layout", ["my token is {a}\n{b}\n", "key {a}\r\n{b} for CI.",
                                    "- {a}\n  {b}"])
def test_a_token_broken_over_two_lines_is_masked_whole(kind: str, cut: float,
                                                       layout: str) -> None:
    token, prefix = TOKENS[kind]
    at = max(int(len(token) * cut) if isinstance(cut, float) else cut % len(token), prefix)
    text = layout.format(a=token[:at], b=token[at:])
    out = redact(text, keep_lines=True)
    assert token[at:][:8] not in out and token[:at][-8:] not in out, out
    assert MASK in out and out.count("\n") == text.count("\n"), out


@pytest.mark.parametrize("text", [
    "ghp_\nexample text follows",
    "the docs say ghp_1234\nabcdef is a placeholder",
    f"{GITHUB[:20]}\n{GITHUB[20:]}Xtra",  # the line goes on
    f"{GITHUB[:20]}\n{GITHUB[20:-3]}",  # it stops short
    "AKIA\nEXAMPLE",
    "npm_\ninstall went fine",
])
def test_a_prefix_at_a_line_end_without_its_rest_below_stays(text: str) -> None:
    assert redact(text) == text


def test_a_daemon_keeps_the_second_half_out_of_the_note_and_the_index(
        daemon: DaemonHandle) -> None:
    token = GITHUB
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("wrap")["path"])
        note = c.call("memory.add_note", {
            "agent_id": "wrap",
            "content": f"Deploy notes: the CI job reads {token[:34]}\n{token[34:]} at "
                       "start\nrotate it",
        })
        text = (root / note["path"]).read_text()
        read = c.call("memory.read", {"agent_id": "wrap", "path": note["path"]})
        found = c.call("memory.search", {"agent_id": "wrap", "query": token[34:],
                                         "sync": True})
    for shown in (text, read["text"], str(found)):
        assert token[34:] not in shown and token[10:18] not in shown, shown
    assert "rotate it" in text
