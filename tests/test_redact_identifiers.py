"""Secrets redaction and the identifiers of technical notes: values after a credential
word that name data (a cache key, an object's path, a public key's id, a user name, a
version, a file path, another setting), not a credential, are left alone; credentials
beside them are still masked, and so are Asana's tokens, a credential given in parts and
a password to log in with."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact
from recalld.daemon.rpc.echo import shown_message

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


ETH_KEY = "0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"


@pytest.mark.parametrize("text", [
    "key ID 0x3AA5C34371567BD2",
    "GPG key 0x3AA5C34371567BD2 signed the release",
    "key fingerprint: SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8",
    "the host key fingerprint is SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8",
    "curl --pinnedpubkey sha256//YhKJKSzoTt2b5FP18fvpHo7fJYqQCjAa3HWY3tvRMwE= https://api",
    "lockfile token entry: integrity sha512-Q3d9kLmZ2pX8vR4tY7wB1nC6fJ0hA5sD9gE2uI4oP7qW3eR8t==",
])
def test_public_key_ids_and_fingerprints_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (f"private key: {ETH_KEY}", ETH_KEY),
    (f"the wallet's private key is {ETH_KEY}", ETH_KEY),
    (f"the token is {RANDOM_KEY}", RANDOM_KEY),
    (f"token: SHA256{RANDOM_KEY}", RANDOM_KEY),
])
def test_keys_beside_them_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert MASK in redact(text)


@pytest.mark.parametrize("text", [
    "refusing backup /etc/passwd: BadZipFile File is not a zip file",
    "cannot read ~/.config/app/token: PermissionError: [Errno 13] denied",
    r"open C:\Users\bob\secrets\password: FileNotFoundError",
    "error in ./config/secret: ValueError bad header",
])
def test_a_file_named_like_a_credential_keeps_what_follows_its_path(text: str) -> None:
    assert redact(text) == text
    assert shown_message(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("user/password: bob / Hunter2xyz", "Hunter2xyz"),
    ("username/password: admin/S3cretPw9", "S3cretPw9"),
    ("cat /etc/app.env: password=S3cretPw9", "S3cretPw9"),
])
def test_credentials_named_with_a_slash_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)


@pytest.mark.parametrize("text", [
    "login: alice@example.com",
    "Login: bob.smith",
    'Login: "bob.smith"',
    "the login is carol_ops",
])
def test_a_user_name_after_login_stays(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("the login for the router is admin/Summer2024", "Summer2024"),
    ("login: admin / Winter2025x", "Winter2025x"),
    (f"login: {RANDOM_KEY}", RANDOM_KEY),
    ("login: bob password: Hunter2xyz", "Hunter2xyz"),
])
def test_passwords_and_tokens_after_login_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)


@pytest.mark.parametrize("text", [
    "pin: numpy==1.26.4",
    "pin: node 20.11.1",
    "pin: actions/checkout@v4",
    "pin: ubuntu:22.04",
    'pin = "requests>=2.31,<3"',
    "pins: numpy==1.26.4, pandas==2.2.1",
    "the pin is lodash@4.17.21",
    "pin: v1.4.2",
])
def test_a_version_pinned_after_pin_stays(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("PIN: 4821", "4821"),
    ("the pin for the door is 7391", "7391"),
    ("pin code: 123456", "123456"),
    ("PIN: 12.34", "12.34"),
])
def test_pins_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)


ASANA = "1/1204982374823:8f3a9c2b7d1e4f6a8b0c2d4e6f8a0b1c"
ASANA_APP = "2/1204982374823/1206123456789:8f3a9c2b7d1e4f6a8b0c2d4e6f8a0b1c"


@pytest.mark.parametrize(("text", "secret"), [
    (f"asana: {ASANA}", ASANA),
    (f'curl -H "Authorization: Bearer {ASANA}" https://app.asana.com/api/1.0/users/me', ASANA),
    (f"use {ASANA_APP} for the sync", ASANA_APP),
])
def test_asana_personal_access_tokens_are_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert MASK in redact(text)


@pytest.mark.parametrize(("text", "secrets"), [
    ("token part 1: Zx9kL2mQ part 2: 7pR4tV8w part 3: Y1aB3cD5",
     ["Zx9kL2mQ", "7pR4tV8w", "Y1aB3cD5"]),
    ("the API token, in two pieces:\npart 1/2: Zx9kL2mQ\npart 2/2: 7pR4tV8w",
     ["Zx9kL2mQ", "7pR4tV8w"]),
    ("secret (part 2 of 2) = Y1aB3cD5", ["Y1aB3cD5"]),
    ("password first half: Hunter, second half: 2xyz", ["Hunter", "2xyz"]),
])
def test_a_credential_given_in_parts_is_masked_in_each(text: str,
                                                        secrets: list[str]) -> None:
    assert not [s for s in secrets if s in redact(text)]


@pytest.mark.parametrize("text", [
    "the token ring has part 1: overview and part 2: routing",
    "the API key rotation, part 3: rollout",
    "secret santa part 2: gifts",
])
def test_chapters_after_a_credential_word_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("log in with admin / Zq8#mK2pL9vX", "Zq8#mK2pL9vX"),
    ("sign in as bob@example.com / Tr0ub4dor&3.", "Tr0ub4dor&3"),
    ("logged in using root/hunter22", "hunter22"),
    ("Login with user ops / Winter2025, then open the console", "Winter2025"),
    ("LOGGED ON AS admin / Winter2025x", "Winter2025x"),
    ("(Signing in via ops/Kx7#tQ2mW9)", "Kx7#tQ2mW9"),
])
def test_a_password_to_log_in_with_is_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert MASK in redact(text)


@pytest.mark.parametrize("text", [
    "sign in with Google / Apple", "login with SSO / SAML", "log in via web/mobile apps",
    "sign in with email/password", "log in with your usual account / the SSO page",
    # Inside a word, "log" and "sign" begin no sign-in.
    "relog in with admin / Winter2025x", "design in as ops / Winter2025x",
])
def test_ways_to_log_in_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", [
    'PASSWORD_HASHERS = ["django.contrib.auth.hashers.Argon2PasswordHasher"]',
    'AUTH_PASSWORD_VALIDATORS = [{"NAME": "django.contrib.auth.password_validation.'
    'MinimumLengthValidator"}]',
    "password_hasher: Argon2id",
])
def test_settings_naming_what_hashes_or_checks_a_password_stay(text: str) -> None:
    assert redact(text) == text


def test_a_password_hash_set_beside_them_is_still_masked() -> None:
    text = 'password_hash = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$Zx9kL2mQ7pR4tV8wY1aB3"'
    assert "Zx9kL2mQ7pR4tV8wY1aB3" not in redact(text)


@pytest.mark.parametrize("text", [
    "ssh_key: ~/.ssh/id_ed25519.pub",
    "ssh key: ~/.ssh/id_rsa_work2",
    "the deploy key is ~/.ssh/deploy_ed25519",
])
def test_a_key_files_path_after_key_stays(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", ["ssh_key: Zx9kL2mQ7pR4tV8wY1aB3cD5",
                                  "license key: ab12-cd34-ef56-gh78-ij90"])
def test_a_key_made_of_short_mixed_pieces_is_still_masked(text: str) -> None:
    assert MASK in redact(text)


@pytest.mark.parametrize("text", [
    "auth-service:2.14.3 image pinned",
    "docker pull ghcr.io/acme/auth-service:v2.14.3",
    "secret-manager: 1.2.0",
])
def test_a_version_after_a_credential_word_stays(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", ["api_token: 1234.5678.9012", "token: v1234",
                                  "password: 2.14.3"])
def test_numbers_not_made_like_versions_are_still_masked(text: str) -> None:
    assert MASK in redact(text)


@pytest.mark.parametrize("text", [
    "INFO auth: user=alice@example.com method=oidc session=web-7 took 42ms",
    "secret: name=db-creds namespace=prod",
])
def test_a_setting_after_a_credential_word_stays(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (f"auth: token={RANDOM_KEY} user=bob", RANDOM_KEY),
    ("password: Abc=123xyz", "Abc=123xyz"),
])
def test_credentials_among_settings_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)
