"""Secrets redaction, more shapes: tokens joined to names (file names), key blocks split
over two texts and SSH2's, passwords on more command lines, plain passwords stated in
Chinese; and settings about a credential (its file, its lifetime) left alone."""

from __future__ import annotations

import pytest
from test_redact import (
    ANTHROPIC,
    AWS_ID,
    AWS_SECRET,
    GITHUB,
    GITHUB_PAT,
    GOOGLE,
    JWT,
    OPENAI,
    SLACK,
    STRIPE,
)

from recalld.daemon.memory.redact import MASK, redact


@pytest.mark.parametrize("secret", [OPENAI, ANTHROPIC, AWS_ID, GITHUB, GITHUB_PAT, SLACK,
                                    GOOGLE, STRIPE, JWT])
def test_a_prefixed_token_glued_to_a_name_is_masked(secret: str) -> None:
    """File names and identifiers join a token with ``-`` or ``_``: its prefix still
    tells it."""
    for text in (f"deploy-{secret}.txt", f"key_{secret}", f"resource/old-{secret}-2.md"):
        assert secret not in redact(text), text
    for text in ("lightgbm_ghp_estimator", "task-sk-12", "risk-sk-model",
                 "AKIAKIA_settings_module"):
        assert redact(text) == text


@pytest.mark.parametrize("secret", [OPENAI, AWS_ID, AWS_SECRET, GITHUB, SLACK, STRIPE, JWT])
def test_a_token_after_an_escaped_character_is_masked(secret: str) -> None:
    """An escape ends in a letter or digit, yet the token after it stands apart: a
    percent-encoded query in a URL, quoted-printable mail, a JSON or C string's escape."""
    for text in (f"https://app.example/cb?next=%2Fhome%3Ftoken%3D{secret}%26x%3D1",
                 f"q=a%20b%0A{secret}", f"cb%3Fnext%3D%252Fa%253Ftoken%253D{secret}",
                 f"token=3D{secret}", f'{{"log": "line\\n{secret}"}}',
                 f"cols\\t{secret}", f"\\u0022{secret}\\u0022", f"s = '\\x3d{secret}'"):
        out = redact(text)
        assert secret not in out and MASK in out, text
    for text in ("100%ABghp_estimator", "C:\\new\\tmp\\notes", "50%2Fday\\nAKIAKIA_settings",
                 "nnnghp_estimator_of_the_light_model_01"):
        assert redact(text) == text


KEY_BODY = ["MIIEowIBAAKCAQEAx1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v2W3x4",
            "Y5z6A7b8C9d0E1f2G3h4I5j6K7l8M9n0O1p2Q3r4S5t6U7v8W9x0Y1z2A3b4C5d6",
            "E7f8G9h0I1j2K3l4M5n6O7p8Q9r0S1t2U3v4W5x6Y7z8A9b0C1d2E3f4G5h6=="]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_key_block_split_across_two_texts_is_masked_in_both(newline: str) -> None:
    """Two messages (or two notes) each hold a part of one key block: the second starts
    inside the body, cut mid-line."""
    first = (f"here is my key:{newline}-----BEGIN OPENSSH PRIVATE KEY-----{newline}"
             f"{KEY_BODY[0]}{newline}{KEY_BODY[1][:20]}")
    second = (f"{KEY_BODY[1][20:]}{newline}{KEY_BODY[2]}{newline}"
              f"-----END OPENSSH PRIVATE KEY-----{newline}thanks, keep it")
    out = redact(first) + redact(second)
    assert not any(part in out for part in (KEY_BODY[0], KEY_BODY[1][:20],
                                            KEY_BODY[1][20:], KEY_BODY[2])), out
    assert out.startswith("here is my key:") and out.endswith(f"{newline}thanks, keep it")
    for talk in ("the footer is -----END RSA PRIVATE KEY----- as usual",
                 "cat key.pem\n-----END RSA PRIVATE KEY-----"):
        assert redact(talk) == talk


def test_an_ssh2_key_block_is_masked() -> None:
    block = ("---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: \"rsa-key-2026\"\n"
             + "\n".join(KEY_BODY) + "\n---- END SSH2 ENCRYPTED PRIVATE KEY ----")
    out = redact(f"my old key:\n{block}\nafter")
    assert out == f"my old key:\n{MASK}\nafter"


@pytest.mark.parametrize(("text", "secret"), [
    ("WiFi密码是bluebird", "bluebird"),
    ("路由器密码是 sunshine，记住了", "sunshine"),
    ("密码: bluebird", "bluebird"),
    ("密码：「marigold」", "marigold"),
    ('口令为 "tangerine"', "tangerine"),
    ("我的密码是 correct horse battery staple", "horse battery staple"),
])
def test_a_plain_password_stated_in_chinese_is_masked(text: str, secret: str) -> None:
    """As "the wifi password is bluebird" is in English."""
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "密码是必须的", "密码是一个很长的字符串", "密码是 required", "密码学是 cryptography",
    "密码是 the same as before", "密码是 wrong", "验证码是 email", "令牌是 Bearer",
    "密码长度是 twelve characters",
])
def test_chinese_talk_about_passwords_is_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("curl -u admin:S3cretPw https://api.example.org", "S3cretPw"),
    ('curl -s --user "bob:hunter2x" https://api', "hunter2x"),
    ("curl --user=me:pa55word https://x", "pa55word"),
    ("redis-cli -h cache -p 6379 -a myRedisPass123 ping", "myRedisPass123"),
    ("docker login -u me -p S3cretPw registry.example.org", "S3cretPw"),
])
def test_passwords_on_more_command_lines_are_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "curl -u admin https://x", "curl -u $USER:$TOKEN_VAR -s https://x", "redis-cli -p 6379 ping",
    "docker run -p 8080:80 nginx",
])
def test_command_lines_without_passwords_are_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", [
    "token_ttl: 3600", "TOKEN_EXPIRY_SECONDS=86400", "auth_timeout_ms = 30000",
    "passwordResetTokenExpirySeconds = 3600", "password_file: /etc/app/pw.txt",
    'api_key_env = "OPENAI_API_KEY"', 'auth_type = "oauth2"', "signature_algorithm: RS256",
    "secret_name: prod/db/creds", "docker login -u me --password-stdin registry.io",
    "token_type: Bearer",
])
def test_settings_about_a_credential_are_left_alone(text: str) -> None:
    """A name ending in file, env, ttl, type, name ... holds where a credential is or what
    it is like, not the credential."""
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("db_password: S3cr3t!", "S3cr3t!"), ("token_secret = Xyz123abcQQ", "Xyz123abcQQ"),
    ("password_file_pw = Tr0ub4dor9", "Tr0ub4dor9"), ("api_key_env: sk-" + "Ab3dEf6hIj9kLm2nOp5q",
                                                      "Ab3dEf6hIj9kLm2nOp5q"),
])
def test_credentials_next_to_such_settings_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)


@pytest.mark.parametrize(("text", "secret"), [
    ("use Tr0ub4dor&3 as the password", "Tr0ub4dor&3"),
    ("use bluebird as the password for wifi", "bluebird"),
    ("Enter 4821 as your PIN.", "4821"),
    ("try 'sunset beach' as the passphrase", "sunset beach"),
    ("I typed hunter22 as my password again", "hunter22"),
    ("bluebird is the wifi password", "bluebird"),
    ("OK. Zq8mN2pL4x is the new password now", "Zq8mN2pL4x"),
    ("notes:\n- Xq9vB2nM is the admin password", "Xq9vB2nM"),
    ("Hi! quick one - Rg7YMq23@ is the wifi password", "Rg7YMq23@"),
    ("Ot7hxAI707& is the wifi password thanks!", "Ot7hxAI707&"),
    ("FYI Eq7Hs17! is the wifi password", "Eq7Hs17!"),
    ("ok so Ib7mK$ is the wifi password.", "Ib7mK$"),
])
def test_a_value_named_as_the_credential_before_its_word_is_masked(text: str,
                                                                   secret: str) -> None:
    """The value comes first: "use X as the password", "X is the password"."""
    out = redact(text)
    assert secret not in out and MASK in out, out


def test_media_blocks_of_a_chat_request_are_redacted_but_their_data_kept() -> None:
    """An image's URL carries a password or a token as often as text does; a data URL's
    payload is an image, not text, and stays byte for byte."""
    from recalld.daemon.memory.redact import redact_messages

    data_url = "data:image/png;base64," + "iVBORw0KGgo" + "QUJD" * 5000
    blocks: list[object] = [
        {"type": "text", "text": "what is in these?"},
        {"type": "image_url", "image_url": {"url": "https://bob:Wq7rT2mK9z@img.example.org/a.png",
                                             "detail": "low"}},
        {"type": "input_image", "image_url": "https://cdn.example.org/b.png?token=Wq7rT2mK9zAb"},
        {"type": "image_url", "image_url": {"url": data_url}},
        {"type": "file", "file": {"filename": f"{GITHUB}.txt"}},
    ]
    out = redact_messages([{"role": "user", "content": blocks}])[0]["content"]
    assert isinstance(out, list)
    text = repr(out)
    assert "Wq7rT2mK9z" not in text and GITHUB not in text, text
    assert out[1] == {"type": "image_url", "image_url": {
        "url": f"https://bob:{MASK}@img.example.org/a.png", "detail": "low"}}
    assert out[3] == blocks[3] and out[0] == blocks[0]


@pytest.mark.parametrize(("first", "second"), [
    ("sounds good", "Great thanks"), ("see README.md", "config.yaml is next"),
    ("the build id is 20260105", "1432 was the run"), ("path: /usr/local", "/bin is on it"),
])
def test_messages_that_only_touch_are_left_alone(first: str, second: str) -> None:
    """The seam between two messages is read as one text only for a secret cut there."""
    from recalld.daemon.memory.turns import last_text, sanitize_messages

    messages = [{"role": "user", "content": first}, {"role": "user", "content": second}]
    assert [t["content"] for t in sanitize_messages(messages)] == [first, second]
    assert sanitize_messages(messages[1:], last_text(messages[:1]))[0]["content"] == second


@pytest.mark.parametrize(("text", "secret"), [
    ("mongosh -u admin -p Wq7rT2mK9z", "Wq7rT2mK9z"),
    ("az login -u bob@example.org -p Wq7rT2mK9z", "Wq7rT2mK9z"),
    ("ldapsearch -x -D cn=admin,dc=example -w Wq7rT2mK9z -b dc=example", "Wq7rT2mK9z"),
    ("zip -P Wq7rT2mK9z out.zip notes.txt", "Wq7rT2mK9z"),
    ("7z a -pWq7rT2mK9z out.7z notes", "Wq7rT2mK9z"),
    ("openssl enc -aes-256-cbc -k Wq7rT2mK9z -in f", "Wq7rT2mK9z"),
    ("openssl pkcs12 -export -passout pass:Wq7rT2mK9z -out c.p12", "Wq7rT2mK9z"),
    ("htpasswd -b .htpasswd bob Wq7rT2mK9z", "Wq7rT2mK9z"),
    ("sqlplus scott/Wq7rT2mK9z@orcl", "Wq7rT2mK9z"),
    (r"net use Z: \\srv\share /user:bob Wq7rT2mK9z", "Wq7rT2mK9z"),
    ("echo Wq7rT2mK9z | docker login -u bob --password-stdin", "Wq7rT2mK9z"),
])
def test_passwords_on_still_more_command_lines_are_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "zip -r out.zip dir", "7z a archive.7z dir", "openssl enc -k $PASS -in f",
    "sqlplus / as sysdba", "sqlplus scott@orcl", r"net use Z: \\srv\share /user:bob",
    'echo "$CR_PAT" | docker login ghcr.io -u bob --password-stdin',
    "ldapsearch -x -W -D cn=admin", "mongosh -u admin -p", "htpasswd -c .htpasswd bob",
    "the mongo cluster -p 27017",
])
def test_those_command_lines_without_a_password_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", [
    "we dropped the token passing-scheme-for-rings in 2019",
    "the token ring-2-network-topology is obsolete",
    "our secret sauce-recipe-of-grandma stays in the family",
    "see password reset-flow-for-mobile in the tracker",
    "otp generator-app-on-phone is the fallback",
    "the token ring_buffer_size_limit was raised",
    "token ring.buffer.size.limit",
    "secret santa-list-2026 is done",
])
def test_words_joined_into_one_after_a_credential_word_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("passwd hunter-2", "hunter-2"), ("passwd Tidy-Plank-Roast-7", "Tidy-Plank-Roast-7"),
    ("token ab3-xyz-qqq today", "ab3-xyz-qqq"), ("pin 4821-7730", "4821-7730"),
])
def test_values_with_joins_after_a_credential_word_are_still_masked(text: str,
                                                                    secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


BCRYPT = "$2y$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"
SHA512_CRYPT = ("$6$rounds=5000$Qx7saltz$Jh3kL9mN2pQ5rS8tU1vW4xY7zA0bC3dE6fG9hI2jK5lM8nO1pQ4r"
                "S7tU0vW3xY6zA9bC2dE5fG8hI1jK4lM7nO0p")


@pytest.mark.parametrize(("text", "secret"), [
    ("bob:$apr1$Xy7z1AbC$kQ3pZ9mN2wR5tY8uI0oPl.", "$apr1$Xy7z1AbC$kQ3pZ9mN2wR5tY8uI0oPl."),
    (f"root:{SHA512_CRYPT}:19000:0:99999:7:::", SHA512_CRYPT),
    (f"admin:{BCRYPT}", BCRYPT),
    (f"the .htpasswd line is `deploy:{BCRYPT.replace('2y', '2b')}`", BCRYPT[7:]),
    ("root:$1$abcdefgh$ABCDEFGHIJKLMNOPQRSTUV:19000::", "ABCDEFGHIJKLMNOPQRSTUV"),
    ("me:$y$j9T$F5Jx5fExrKuJdK0ux8aFm1$zkuLbPg3lR0abcdefghijklmnopqrstuvwxyzABCD:20000::",
     "zkuLbPg3lR0abcdefghijk"),
    ("userPassword: {SSHA}W6ph5Mm5Pz8GgiULbPgzG37mj9gABCD", "W6ph5Mm5Pz8GgiULbPgzG37mj9g"),
    ("carol:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "W6ph5Mm5Pz8GgiULbPgzG37mj9g="),
    ("hash = '$argon2id$v=19$m=65536,t=3,p=4$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG'",
     "RdescudvJCsgt3ub+b+dWRWJTmaaJObG"),
    ("pbkdf2_sha256$600000$Q7xk2LmZ$ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop=",
     "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
])
def test_password_hashes_of_shadow_and_htpasswd_lines_are_masked(text: str,
                                                                 secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize(("text", "secret"), [
    ("SSHPASS='Tr0ub4dor&3' sshpass -e ssh root@host", "Tr0ub4dor&3"),
    ("export SSHPASS=hunter2xyz", "hunter2xyz"),
    ("ROOTPASS=Plum4821 ./install.sh", "Plum4821"),
    ("DBPASS: Vx81qLmz", "Vx81qLmz"),
    ("keytool -importcert -storepass Kp9x2Lq -keypass Zt7w4Rn", "Kp9x2Lq"),
    ("keytool -importcert -storepass Kp9x2Lq -keypass Zt7w4Rn", "Zt7w4Rn"),
    ("sshpass -p 'Tr0ub4dor&3' ssh root@host", "Tr0ub4dor&3"),
])
def test_passwords_named_owner_and_pass_in_one_word_are_masked(text: str,
                                                               secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "BYPASS=true", "COMPASS=north-east", "SURPASS: 3", "highpass=200 lowpass=8000",
    "TRESPASS=forbidden", "s/(a)(b)/$1$2/g", "perl -pe 's/$1$2$3/x/'",
    "it costs $1$ or $5$ a month", "daemon:*:18000:0:99999:7:::",
    "the $6$ scheme is sha512crypt; $2y$ is bcrypt", "bob:!:19000:0:99999:7:::",
    "{SHA} alone names the scheme",
])
def test_words_ending_in_pass_and_hash_scheme_names_stay(text: str) -> None:
    assert redact(text) == text


PUBLIC_B64 = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYzHFfZMXIfwTuZPsWUwpqJuaQbs9"
PRIVATE_B64 = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="


@pytest.mark.parametrize("text", [
    f"-----BEGIN PUBLIC KEY-----\n{PUBLIC_B64}\n-----END PUBLIC KEY-----",
    f"Our public key: {PUBLIC_B64}",
    f"the server's public key is {PUBLIC_B64}",
    f"[Peer]\nPublicKey = {PRIVATE_B64}\n",
    f"public_key: {PUBLIC_B64}",
    f'{{"pub_key": "{PUBLIC_B64}"}}',
])
def test_public_keys_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (f"[Interface]\nPrivateKey = {PRIVATE_B64}\n", PRIVATE_B64),
    (f"the public key is fine, the secret key is {PRIVATE_B64}", PRIVATE_B64),
    (f"public key: {ANTHROPIC}", ANTHROPIC),
    (f"publishable key: {PRIVATE_B64}", PRIVATE_B64),
])
def test_secrets_beside_public_keys_are_still_masked(text: str, secret: str) -> None:
    assert secret not in redact(text)
    assert MASK in redact(text)
