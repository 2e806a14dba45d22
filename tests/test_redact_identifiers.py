"""Secrets redaction and the identifiers of technical notes: values after a credential
word that name data (a cache key, an object's path, a public key's id), not a credential,
are left alone; credentials beside them are still masked."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact

RANDOM_KEY = "Zx9kL2mQ7pR4tV8wY1aB3cD5"


@pytest.mark.parametrize("text", [
    "cache key: user:42:profile:v3",
    "sort key: createdAt#2024-05-03",
    "the object key is uploads/2024/05/photo_8f3a21c9.jpg",
    "the S3 key is backups/db/2024-05-03T10:00:00Z.sql.gz",
    "idempotency key: order-2024-05-03-0042",
    "routing key = orders.eu.created.v2",
    "the cache key is tenant:eu:user:42:v7",
])
def test_keys_built_of_words_and_numbers_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (f"api key: {RANDOM_KEY}", RANDOM_KEY),
    (f"the key is {RANDOM_KEY}", RANDOM_KEY),
    ("secret key: a8Kd:Xq93:Lm2P:zz7R", "a8Kd:Xq93:Lm2P:zz7R"),
    ("key: prod:Xk29Lmq8Zt4v:Pw", "prod:Xk29Lmq8Zt4v:Pw"),
    ("credentials: admin / Winter2025", "Winter2025"),
])
def test_machine_made_keys_among_them_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert MASK in redact(text)
