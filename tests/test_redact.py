"""Secrets redaction: many credential shapes masked, ordinary text left alone."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import (
    MASK,
    entropy_bits,
    redact,
    redact_count,
    redact_messages,
    redact_parts,
    redact_value,
)

OPENAI = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1w"
ANTHROPIC = "sk-ant-api03-" + "x7Yz" * 8
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0" + "x" * 30
SLACK = "xoxb-" + "1234567890-0987654321-" + "AbCdEfGhIjKlMnOp"
GOOGLE = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
       "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234567890abcdef\n"
       "bm90IGEgcmVhbCBrZXk=\n-----END RSA PRIVATE KEY-----")


@pytest.mark.parametrize("secret", [OPENAI, ANTHROPIC, AWS_ID, GITHUB, GITHUB_PAT, SLACK,
                                    GOOGLE, STRIPE, JWT])
def test_token_shapes_are_masked_anywhere(secret: str) -> None:
    for text in (secret, f"use {secret} please", f"({secret})", f'"{secret}"',
                 f"key={secret}\n", f"汉字{secret}汉字"):
        out = redact(text)
        assert secret not in out, text
        assert MASK in out


def test_private_key_block() -> None:
    text = f"here is my key:\n{PEM}\nthanks"
    out = redact(text)
    assert "MIIEow" not in out and "bm90IGEg" not in out
    assert out.startswith("here is my key:\n") and out.endswith("\nthanks")
    # A block cut off at the end of a message is masked to the end.
    cut = redact("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA")
    assert "b3Blbn" not in cut


@pytest.mark.parametrize(("text", "kept", "gone"), [
    ("password=hunter22", "password=", "hunter22"),
    ("PASSWORD: Tr0ub4dor&3", "PASSWORD: ", "Tr0ub4dor&3"),
    ('{"api_key": "abc123def456"}', '"api_key": "', "abc123def456"),
    ("export OPENAI_API_KEY=someLongValue123", "OPENAI_API_KEY=", "someLongValue123"),
    (f"aws_secret_access_key = {AWS_SECRET}", "aws_secret_access_key = ", AWS_SECRET),
    ("db_pass := 'correct horse battery'", "db_pass := '", "correct horse battery"),
    ("client_secret: 9f8e7d6c5b4a3f2e1d0c", "client_secret: ", "9f8e7d6c5b4a3f2e1d0c"),
    ("github_token=" + "a" * 8 + "0123456789abcdef0123456789abcdef", "github_token=",
     "0123456789abcdef0123456789abcdef"),
    ("Authorization: Bearer abcdefghijklmnop1234", "Bearer ", "abcdefghijklmnop1234"),
    ("curl -H 'Authorization: token 0123456789abcdefABCDEF'", "token ",
     "0123456789abcdefABCDEF"),
    ("postgres://admin:s3cr3tP4ss@db.local:5432/app", "postgres://admin:", "s3cr3tP4ss"),
    ("my wifi password is Tr0ub4dor&3 ok", "password is ", "Tr0ub4dor&3"),
    ("the PIN was 'x9y8z7'", "PIN was '", "x9y8z7"),
    ("session_key=5f0c2a1e-7b3d-4c9a-8e2f-1a2b3c4d5e6f", "session_key=",
     "5f0c2a1e-7b3d-4c9a-8e2f-1a2b3c4d5e6f"),
])
def test_assignments_and_contexts(text: str, kept: str, gone: str) -> None:
    out = redact(text)
    assert gone not in out, out
    assert kept in out, out
    assert MASK in out


@pytest.mark.parametrize("text", [
    "I commute by bike every morning and prefer window seats.",
    "Fixed in commit 3f786850e387550fdab836ed7e6dc881de23001b, see the log.",
    "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b4c0b822cd15d6c15b0f00a08",
    "request id 123e4567-e89b-12d3-a456-426614174000 failed",
    "Token: each word becomes a token in BM25.",
    "The password field is required; the token is refreshed hourly.",
    "password: required",
    "api_key: ${OPENAI_API_KEY}",
    "token = <your token here>",
    "set password=******** in the form",
    "Our meeting is at 10:30, room B2; budget is 4500 EUR.",
    "Use handleWebSocketReconnect() when ECONNREFUSED happens.",
    "See https://example.com/path?q=1 and /home/user/.config/app.toml",
    "我喜欢骑自行车上班，密码学很有意思。",
    "The skeleton key problem: sk-ills and ask-me-later flows.",
    "bearer of bad news",
    "passwords should be long; tokens expire.",
])
def test_no_false_positives(text: str) -> None:
    assert redact(text) == text


def test_count_and_nested_values() -> None:
    out, n = redact_count(f"a {OPENAI} b password=hunter22 c")
    assert n == 2 and OPENAI not in out and "hunter22" not in out
    assert redact_count("nothing here")[1] == 0
    value = {"role": "user", "content": [{"type": "text", "text": f"key {GITHUB}"}],
             "n": 3, "ok": True}
    red = redact_value(value)
    assert GITHUB not in str(red)
    assert red["n"] == 3 and red["ok"] is True and red["role"] == "user"


def test_idempotent() -> None:
    text = f"password=hunter22 and {OPENAI} and Bearer abcdefghijklmnop1234"
    once = redact(text)
    assert redact(once) == once


def test_entropy() -> None:
    assert entropy_bits("") == 0.0
    assert entropy_bits("aaaa") == 0.0
    assert entropy_bits("abcd") == pytest.approx(2.0)


# -- one case per kind (strings made up here, in the issuer's format) ---------------------

def _b64(n: int, seed: int) -> str:
    import random
    rng = random.Random(seed)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    return "".join(rng.choice(alphabet) for _ in range(n))


KEY_LINES = [_b64(64, i) for i in range(3)]
KINDS: list[tuple[str, str, list[str]]] = [
    ("pem_rsa", "-----BEGIN RSA PRIVATE KEY-----\n{k}\n-----END RSA PRIVATE KEY-----", KEY_LINES),
    ("pem_ec", "-----BEGIN EC PRIVATE KEY-----\n{k}\n-----END EC PRIVATE KEY-----", KEY_LINES),
    ("pem_dsa", "-----BEGIN DSA PRIVATE KEY-----\n{k}\n-----END DSA PRIVATE KEY-----", KEY_LINES),
    ("openssh", "-----BEGIN OPENSSH PRIVATE KEY-----\n{k}\n-----END OPENSSH PRIVATE KEY-----",
     KEY_LINES),
    ("encrypted", "-----BEGIN ENCRYPTED PRIVATE KEY-----\n{k}\n-----END ENCRYPTED PRIVATE KEY-----",
     KEY_LINES),
    ("pgp", "-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: x\n\n{k}\n=q1Zx\n"
            "-----END PGP PRIVATE KEY BLOCK-----", KEY_LINES),
    ("putty", "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nPublic-Lines: 1\nAAAAB3Nz\n"
              "Private-Lines: 3\n{k}\nPrivate-MAC: 9a8b7c6d5e4f30211203", KEY_LINES),
    ("gcp_json", '{{"private_key": "-----BEGIN PRIVATE KEY-----\\n{k1}\\n-----END PRIVATE KEY-----'
                 '\\n", "client_email": "svc@p.iam.gserviceaccount.com"}}', KEY_LINES[:1]),
    ("aws_id", "aws key id ASIAY34FZKBOKMUTVV7A in use", ["ASIAY34FZKBOKMUTVV7A"]),
    ("aws_secret_prose", "I think the secret was Tq9/Xv3LmZp8Rk2Wn7Hs4Jd6Fb1Gc5Ye0Ua+Ko3Ni okay",
     ["Tq9/Xv3LmZp8Rk2Wn7Hs4Jd6Fb1Gc5Ye0Ua+Ko3Ni"]),
    ("aws_secret_bare", "creds file: Tq9/Xv3LmZp8Rk2Wn7Hs4Jd6Fb1Gc5Ye0Ua+Ko3Ni",
     ["Tq9/Xv3LmZp8Rk2Wn7Hs4Jd6Fb1Gc5Ye0Ua+Ko3Ni"]),
    ("azure_conn", "AccountName=acme;AccountKey=" + _b64(86, 9) + "==;EndpointSuffix=core",
     [_b64(86, 9)]),
    ("github", "ghs_" + "Zq4" * 12 + " was leaked", ["ghs_" + "Zq4" * 12]),
    ("github_pat", "github_pat_11AAQ3ZTQ0aBcD9eFgHiJk_" + "Lm4" * 19, ["Lm4" * 19]),
    ("gitlab", "runner uses glpat-Vh3kPq9LmZx2Rt7Wn4Ys", ["glpat-Vh3kPq9LmZx2Rt7Wn4Ys"]),
    ("slack", "SLACK=xoxp-2345678901-3456789012-4567890123-abcdef0123456789abcdef0123456789",
     ["abcdef0123456789abcdef0123456789"]),
    ("slack_webhook", "hook https://hooks.slack.com/services/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",
     ["Kl5mNo6pQr7sTu8vWx9yZa0b"]),
    ("telegram", "bot 987654321:AAF" + "k3J" * 11 + " ok", ["AAF" + "k3J" * 11]),
    ("sendgrid", "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",
     ["wX7zA9cE1gI3kM5oQ7sU9wY1aC3eG5iK7mO9qS1uW3y"]),
    ("stripe", "rk_live_51HxYz2AbCdEfGhIjKlMnOpQr", ["rk_live_51HxYz2AbCdEfGhIjKlMnOpQr"]),
    ("twilio", "twilio SK0123456789abcdef0123456789abcdef", ["SK0123456789abcdef0123456789abcdef"]),
    ("npm", "npm_" + "a1B2" * 9, ["a1B2" * 9]),
    ("pypi", "pypi-AgEIcHlwaS5vcmcCJDk" + "x9Y_" * 15, ["x9Y_" * 15]),
    ("openai", "sk-svcacct-" + "Hq7_Lp2" * 7, ["Hq7_Lp2" * 7]),
    ("anthropic", "sk-ant-admin01-" + "Rt5-Wq8" * 12, ["Rt5-Wq8" * 12]),
    ("google",
     "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", ["AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"]),
    ("discord", "MTA4NjQ3NzE5OTU3MjE0NjI0Mw.GkP3xZ.Abc9dEf8GhI7jKl6MnO5pQr4StU3vWx2Yz",
     ["Abc9dEf8GhI7jKl6MnO5pQr4StU3vWx2Yz"]),
    ("mailgun",
     "mailgun key-3ax6xnjp29jd6fds4gc373sgvjxteol0", ["3ax6xnjp29jd6fds4gc373sgvjxteol0"]),
    ("huggingface",
     "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh", ["hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"]),
    ("digitalocean", "dop_v1_" + "0123456789abcdef" * 4, ["0123456789abcdef" * 4]),
    ("shopify", "shpat_" + "0123456789abcdef" * 2, ["shpat_" + "0123456789abcdef" * 2]),
    ("jwt", "cookie=" + JWT, [JWT]),
    ("url_password", "mysql://root:Hunter2x@10.0.0.5/app", ["Hunter2x"]),
    ("db_conn", "Server=db;User Id=sa;Password=Winter2026;Encrypt=true", ["Winter2026"]),
    ("password_json", '{{"user": "bob", "password": "zebra42"}}', ["zebra42"]),
    ("password_yaml", "db:\n  password: plainword\n  host: x", ["plainword"]),
    ("password_env", "DB_PASS=q1w2e3r4", ["q1w2e3r4"]),
    ("pw_colon", "pw: tortoise77", ["tortoise77"]),
    ("pwd_flag", "mysqldump --password=Gh7kLm app", ["Gh7kLm"]),
    ("passphrase", "my passphrase is purple monkey dishwasher robot", ["purple monkey dishwasher"]),
    ("passphrase_colon", "passphrase: lemon tiger cloud marble", ["lemon tiger cloud"]),
    ("prose_for", "The password for the staging db is Qz8!mKt, use it carefully.", ["Qz8!mKt"]),
    ("prose_plain_word", "the wifi password is bluebird", ["bluebird"]),
    ("prose_set", "I changed my password to Spring2026! yesterday", ["Spring2026!"]),
    ("api_key_prose",
     "api key: 7c9e6679f4e64f1d8a5c2b3e4f5a6b7c", ["7c9e6679f4e64f1d8a5c2b3e4f5a6b7c"]),
    ("entropy_near_word",
     "here's the access token, kT8vQ2mX9pL4rW7nZ3bY6", ["kT8vQ2mX9pL4rW7nZ3bY6"]),
    ("chinese", "我的密码是 abc12345，别告诉别人", ["abc12345"]),
    ("age", "AGE-SECRET-KEY-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGP",
     ["QYQSZQGPQYQSZQGPQYQSZQGP"]),
]


@pytest.mark.parametrize(("kind", "template", "hidden"), KINDS, ids=[k[0] for k in KINDS])
def test_each_kind_is_masked(kind: str, template: str, hidden: list[str]) -> None:
    text = template.format(k="\n".join(KEY_LINES), k1=KEY_LINES[0])
    out = redact(text)
    assert MASK in out, kind
    for secret in hidden:
        assert secret not in out, (kind, out)


def test_a_key_split_across_blocks_is_masked_in_both() -> None:
    key = "glpat-" + "Wd4kR9" * 4
    parts = redact_parts(["deploy with " + key[:11], key[11:] + " tonight", "unrelated"])
    assert key[:11] not in parts[0] and key[11:] not in parts[1]
    assert parts[0].startswith("deploy with ") and parts[1].endswith(" tonight")
    assert parts[2] == "unrelated"


def test_masks_keep_line_breaks_when_asked() -> None:
    text = f"a\n{PEM}\nb\nc"
    out = redact(text, keep_lines=True)
    assert out.count("\n") == text.count("\n")
    assert out.splitlines()[-2:] == ["b", "c"] and "MIIEow" not in out


def test_chat_messages_are_redacted_in_content_blocks_and_tool_calls() -> None:
    key = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8t"
    msgs = redact_messages([
        {"role": "user", "content": [{"type": "text", "text": key[:10]},
                                     {"type": "text", "text": key[10:]}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "write", "arguments": f'{{"content": "key {key}"}}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": f"password={key}"},
    ])
    assert key[:10] not in str(msgs) and key[10:] not in str(msgs)
    assert msgs[1]["tool_calls"][0]["function"]["name"] == "write"


@pytest.mark.parametrize("text", [
    "The basic helix-loop-helix factor NeuroD1 and NLRP12-associated disease are key topics.",
    "PINs are initially delivered to the plasma membrane in a non-polar manner.",
    "The password is required; my password is too weak and the token is refreshed hourly.",
    "passwords are long; the secret is to practise daily; key points: 1) plan 2) act",
    "Run test_disk_full_while_writing_keeps_old_file and handleWebSocketReconnect2 now.",
    "the key to success is patience; the key is 42 minutes away",
    "United States Secret Service，缩写USSS）是美国联邦政府的执法机构",
    "image at https://example.com/a/b/c/PhotoOfTheDay2024.jpg and /usr/lib/x86_64-linux-gnu/",
    "sha512: cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0",
    "The auth flow uses OAuth2; see RFC 6749 section 4.1.",
    "I passed the exam with 95 points; pin the tab please.",
])
def test_more_prose_is_left_alone(text: str) -> None:
    assert redact(text) == text
