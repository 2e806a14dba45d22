"""A secret inside base64, wherever in its text it starts: a ``.env`` file or a config
in a Kubernetes Secret's ``data``, a ``data:text/plain;base64,`` URL, ``echo ... | base64``
of a line with the token after other words (at any of the three byte offsets), wrapped
at 76 columns or not, in either alphabet. Base64 of ordinary text, of an image or of
random bytes, hashes and identifiers stay as they are."""

from __future__ import annotations

import base64
import random

from recalld.daemon.memory.redact import redact

RNG = random.Random(20261207)
TOKEN = "ghp_" + "".join(RNG.choice("abcdefghijkLMNOPQRS0123456789") for _ in range(36))
PASSWORD_LINE = "db:\n  password: Xk9#mQ2vLp7wRz\n"


def _wrapped76(text: str) -> str:
    return "\n".join(text[i:i + 76] for i in range(0, len(text), 76))


def test_a_secret_anywhere_in_base64_text_masks_the_base64() -> None:
    for lead in ("", "x ", "xy ", "DEBUG=1\nLOG=info\n" * 20 + "GITHUB_TOKEN="):
        raw = f"{lead}{TOKEN}\nmore=1\n".encode()
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            blob = encode(raw).decode()
            for text in (f"data:text/plain;base64,{blob}", f".env: {blob}",
                         f"data:\n  .env: |\n{_wrapped76(blob)}\nnext: line"):
                out = redact(text)
                assert "[REDACTED]" in out, (lead, text)
                assert blob[-20:] not in out.replace("\n", ""), (lead, out)
                assert not any(line and line in out.split("\n")
                               for line in _wrapped76(blob).split("\n")[:-1]), out
    # A password stated in the text, found by the context rules.
    blob = base64.b64encode(PASSWORD_LINE.encode()).decode()
    assert redact(f"config: {blob}") == "config: [REDACTED]"


def test_base64_of_ordinary_text_images_and_random_bytes_is_kept() -> None:
    prose = ("the walrus met the carpenter on the beach at noon and they talked "
             "about shoes, ships and sealing wax\n" * 30).encode()
    for text in (base64.b64encode(prose).decode(), _wrapped76(base64.b64encode(prose).decode()),
                 "![x](data:image/png;base64," + base64.b64encode(
                     bytes(RNG.randrange(256) for _ in range(3000))).decode() + ")",
                 "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                 "snake_case_identifier_names_here_and_more_of_them",
                 "id 123e4567-e89b-12d3-a456-426614174000"):
        assert redact(text) == text, text[:60]
