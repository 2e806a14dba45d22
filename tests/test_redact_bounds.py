"""Secrets redaction masks the secret and no more: the settings that follow it in the same
run (a query string's next parameter, a connection string's next field), the bracket a
note closes after it, and values that only name where a credential comes from (a call,
an attribute, an environment variable, a YAML tag) stay as written."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact

VALUE = "Wq7rT2mK9z"


@pytest.mark.parametrize(("text", "rest"), [
    (f"token={VALUE}&user=bob", "&user=bob"),
    (f"https://api.example.org/v1?access_token={VALUE}&page=2", "&page=2"),
    (f"Password={VALUE};Server=db01;Database=sales", ";Server=db01;Database=sales"),
    (f"Server=db01;Pwd={VALUE};Encrypt=true", ";Encrypt=true"),
    (f"password:{VALUE},user:bob", ",user:bob"),
    (f"secret={VALUE}|region=eu", "|region=eu"),
    (f"the api token is {VALUE}&env=prod", "&env=prod"),
    (f"(my password is {VALUE})", ")"),
    (f"[token {VALUE}]", "]"),
])
def test_what_follows_a_secret_in_its_run_stays(text: str, rest: str) -> None:
    out = redact(text)
    assert VALUE not in out and MASK in out, out
    assert out.endswith(MASK + rest), out


@pytest.mark.parametrize("text", [
    "see the rules [token limit]",
    "notes on passwords {pin reset}",
    "ask about the <secret handshake>",
])
def test_a_closing_bracket_after_a_credential_word_is_no_secret(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", [
    "password = get_password()",
    "db_password := prompt_for('database')",
    "PASSWORD=getpass.getpass()",
    "token: config.get('token')",
    "api_token = os.getenv('API_TOKEN')",
    'secret_key = os.environ["SECRET_KEY"]',
    "client_secret = self.client_secret",
    "apiKey: process.env.STRIPE_KEY",
    "SECRET_KEY = settings.SECRET_KEY",
    "auth_token = vault.read(path).token",
    "password: see(docs)",
    "password: (see the wiki)",
    "token: !vault |",
    "my api token is keyring.get_password(service)",
])
def test_code_naming_where_a_credential_comes_from_stays(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (f"password = decrypt('{VALUE}')", VALUE),
    (f"password: Ab3({VALUE})z", VALUE),
    (f"token: !{VALUE}", VALUE),
    (f"PASSWORD=self.{VALUE}", VALUE),
    (f"password: ({VALUE})", VALUE),
    ("password: hunter.sunrise", "hunter.sunrise"),
])
def test_secrets_shaped_like_code_are_still_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


UUID = "550e8400-e29b-41d4-a716-446655440000"
SHA1 = "3f786850e387550fdab836ed7e6dc881de23001b"


@pytest.mark.parametrize("text", [
    f"the key is {UUID}",
    f"the primary key is {UUID}",
    f"key: {UUID}",
    f"partition_key = {UUID}",
    f'"cache_key": "{UUID}"',
    f"the idempotency key was {UUID}",
    f"the token bucket holds {SHA1} commits",
    f"pushed the token fix in {SHA1}",
    f"secret santa list at commit {SHA1}",
    f"password reset landed in {SHA1}",
])
def test_ids_and_digests_after_talk_of_keys_and_tokens_stay(text: str) -> None:
    """A bare "key" or a data key's name holds a row's UUID; a digest after other words
    is what they name, a commit."""
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (f"api_key: {UUID}", UUID),
    (f"the license key is {UUID}", UUID),
    (f'"encryption_key": "{SHA1}"', SHA1),
    (f"the key is {VALUE}XyZ", VALUE),
    (f"key: {SHA1}", SHA1),
    (f"the session token is {SHA1}", SHA1),
    (f"token: {SHA1}", SHA1),
    (f"the deploy secret for CI is {SHA1}", SHA1),
    (f"token (hex) = {SHA1}", SHA1),
])
def test_keys_and_hex_tokens_stated_as_such_are_still_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "Length is the password's main strength",
    "use bcrypt as the password hash",
    "use it as the password",
    "Below is the password:",
    "Her dog's name is the password",
    "FYI bluebird is the password",
    "use Redis as the session store",
    "Patience is the key to success",
    "use caution as the token expires",
])
def test_talk_that_names_something_as_a_credential_stays(text: str) -> None:
    assert redact(text) == text
