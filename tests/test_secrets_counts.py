"""A model's tokens counted are no credential, from outside: a real daemon, a real socket,
real files. Agents write down the settings and the usage of the models they call
(``max_tokens: 4096``, ``"total_tokens": 1834``, ``tokens_per_minute = 90000``, a
``token_limit``) and the numbers of their tokenizers' tokens (``eos_token_id: 151645``);
those numbers stay in the note and in search, while a token handed over beside them (a
number after "token", a random-looking value after "tokens") is still masked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recalld.daemon.memory.redact import redact

COUNTS = ("max_tokens: 4096", "MAX_TOKENS=8192", "max_output_tokens = 65536",
          '"usage": {"prompt_tokens": 1210, "completion_tokens": 624, "total_tokens": 1834}',
          "tokens_per_minute: 90000", "token_limit: 128000", "token_budget=2000",
          "--max-tokens 4096", "the max_tokens is 16384", "tokens: 3072",
          "token_expiry_s: 3600", "bos_token_id=151643, eos_token_id: 151645",
          "pad_token_ids = [0, 151643]")
#: Credentials beside them, each with what must not be left of it.
SECRETS = {"token: 739204": "739204", "tokens: Zq8mN2pL4xVb7KcQ9wE3": "Zq8mN2pL4xVb7KcQ9wE3",
           "auth_tokens: Hv5tR8wQ2z": "Hv5tR8wQ2z", "PINs are 4821": "4821",
           "TOKENS=ghp_Wq3Er5Ty7Ui9Op1As3Df5Gh7Jk9Lz1Xc3Vb5N": "Ty7Ui9Op1As3",
           "token_id: Hq8vN3mZ2pLk7Rt5Wx1Y": "Hq8vN3mZ2pLk"}


@pytest.mark.parametrize("line", COUNTS)
def test_a_count_of_tokens_is_left(line: str) -> None:
    assert redact(line) == line


@pytest.mark.parametrize(("line", "secret"), list(SECRETS.items()))
def test_a_token_beside_them_is_masked(line: str, secret: str) -> None:
    assert secret not in redact(line) and "[REDACTED]" in redact(line)


def test_a_note_keeps_the_counts_and_masks_the_tokens(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n')
    content = "model settings of the wombat agent\n" + "\n".join((*COUNTS, *SECRETS))
    note = d.call("memory.add_note", {"agent_id": "w", "name": "model", "content": content})
    written = (root / note["path"]).read_text()
    assert [c for c in COUNTS if c not in written] == []
    assert [s for s in SECRETS.values() if s in written] == []

    d.call("index.sync", {"agent_id": "w"})
    hits = d.call("memory.search", {"agent_id": "w", "query": "wombat max_tokens"})["results"]
    assert hits and "max_tokens: 4096" in hits[0]["text"], hits
    assert [s for s in SECRETS.values() if s in str(hits)] == []
