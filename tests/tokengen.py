"""Random credential-shaped strings for the secrets tests; each test file passes its own
seeded ``random.Random``, so its strings are the same at every run."""

from __future__ import annotations

import random
import string

B62 = string.ascii_letters + string.digits


def random_token(rng: random.Random, n: int, alphabet: str = B62) -> str:
    """``n`` characters of ``alphabet`` holding a digit, an upper-case and a lower-case
    letter, as generated keys do (and as the shape rules expect of one)."""
    while True:
        s = "".join(rng.choice(alphabet) for _ in range(n))
        if (any(c.isdigit() for c in s) and any(c.isupper() for c in s)
                and any(c.islower() for c in s)):
            return s
