"""Secrets redaction: many credential shapes masked, ordinary text left alone."""

from __future__ import annotations

import time

import pytest

from recalld.daemon.memory.redact import (
    MASK,
    redact,
    redact_count,
    redact_messages,
    redact_parts,
    redact_value,
)
from recalld.daemon.memory.secret_values import entropy_bits

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
    # A web session's cookie is one, and a session id that looks random.
    ("sessionid=chat20260701x", "sessionid=", "chat20260701x"),
    ("session_id=Zx81kq2lP0aQ7mR4vB9n", "session_id=", "Zx81kq2lP0aQ7mR4vB9n"),
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
    # A conversation's id, as in the frontmatter of every note the daemon writes.
    "---\nsession_id: chat-2026-07-01\n---\n- Lives in Basel",
    "session_id: 3f2a9c1e-8b7d-4e6f-9a0b-1c2d3e4f5a6b",
    '{"session_id": "telegram_12345", "turns": 4}',
    "<session-id>mcp-1</session-id>",
    # A note's path naming a credential word: words and dates, no secret.
    "See [[memory/2026-07-01/api-key-rotation.md]] and docs/setup/github-token-expiry.md",
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
    ("chinese_space", "服务器 密码 Ocean-Breeze-77 别外传", ["Ocean-Breeze-77"]),
    ("chinese_glued", "账号admin 密码Ocean-Breeze-77", ["Ocean-Breeze-77"]),
    ("chinese_key_variant", "秘钥是 9f8e7d6c5b4a39281706f5e4d3c2b1a0", ["9f8e7d6c5b4a3928"]),
    ("password_env_glued", "PGPASSWORD=Tr0ub4dor77 psql -h db", ["Tr0ub4dor77"]),
    ("password_name_glued", "dbpassword: kestrel-42", ["kestrel-42"]),
    ("mysql_p", "mysql -h db -u root -pRootPassw0rd123 app", ["RootPassw0rd123"]),
    ("mysqldump_p_quoted", "mysqldump -uroot -p'S3cr3t!pw' app > dump.sql", ["S3cr3t!pw"]),
    ("sshpass", "sshpass -p 'Gh7kLm22' ssh deploy@web1", ["Gh7kLm22"]),
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
    "我喜欢骑自行车上班，密码学很有意思；密钥 SHA256 指纹见附件，设置密码 (Settings) 即可。",
    "忘了密码 README.md 里写了怎么重置；重置密码 x86_64 和 aarch64 的步骤一样，"
    "见密码 CVE-2024-3094。",
    "mysql -u root -p app asks for it; mysql -p$MYSQL_PWD reads it; the mysql server -port.",
    "sshpass -p $SSHPASS ssh host; my passport number changed; bypass=true; compass: N45",
])
def test_more_prose_is_left_alone(text: str) -> None:
    assert redact(text) == text


# -- phrasings as people write them (both directions) ------------------------------------

STATED_SECRETS = [
    ("Don't forget: the root password on the NAS is Tr0ub4dor&3", "Tr0ub4dor&3"),
    ("My passphrase is correct horse battery staple", "horse battery"),
    ("my passphrase is correct horse battery staple.", "horse battery"),
    ("passphrase = 'winter is coming soon'", "winter is coming"),
    ("The password for prod is hunter2", "hunter2"),
    ("the password for prod is swordfish", "swordfish"),
    ("pw: hunter2", "hunter2"), ("PWD=hunter2", "hunter2"), ("password=s3cr3t!", "s3cr3t!"),
    ("user=admin password=letmein123", "letmein123"),
    ("my AWS secret access key is wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("AWS creds: AKIAIOSFODNN7EXAMPLE / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("here you go wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY thanks", "wJalrXUtnFEMI"),
    ("gitlab token glpat-ABCDEFGHIJKLMNOPQRST", "glpat-ABCD"),
    ("slack: xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx", "abcdefghijklmnop"),
    ("telegram bot token: 110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw", "AAHdqTcvCH1v"),
    ("SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
     "abcdefghijklmnopqrstuvwxyz0123"),
    ("mongodb://admin:secret@localhost:27017", ":secret@"),
    ("connect with postgres://app:password@db/app", ":password@"),
    ('"password": "secret"', '"secret"'), ("password=changeme", "changeme"),
    ("wifi: MyHomeNet / pass: bluebird42", "bluebird42"), ("PIN: 4821", "4821"),
    ("my bank pin is 4821", "4821"), ("my PIN is 4821.", "4821"),
    ("TWILIO_AUTH_TOKEN=a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6", "a1b2c3d4e5f6"),
    ("The secret key is 'sup3r-s3cret'", "sup3r-s3cret"),
    ("Server=myServer;Database=myDB;User Id=myUser;Password=myPassword;", "myPassword"),
    ("password: correct horse battery staple", "horse battery"),
    ("The password is: Summer2024", "Summer2024"),
    ("password -> Summer2024", "Summer2024"),
    ("Use the password 'Summer2024' to log in", "Summer2024"),
    ("log in with password Summer2024!", "Summer2024!"),
    ("the login for the router is admin/Summer2024", "Summer2024"),
    ("our vault passphrase: blue-falcon-orange-river", "blue-falcon"),
    ("Twilio Account SID AC0123456789abcdef0123456789abcdef auth token 012"
     "3456789abcdef0123456789abcdef",
     "0123456789abcdef0123456789abcdef"),
    ("npm token npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "npm_AbCd"),
    ("pypi-AgEIcHlwaS5vcmcCJGQ0ZDM3ZWQ1LTIzZjMtNDlmYS04ZjA0LWU2YjI2ZjY1YjI0MgACKlsz",
     "AgEIcHlwaS5vcmc"),
    ("discord: MTIzNDU2Nzg5MDEyMzQ1Njc4.GhIjKl.MnOpQrStUvWxYzAbCdEfGhIjKlMnOpQrSt", "MnOpQrStUvWx"),
    ("mailgun key-1234567890abcdef1234567890abcdef", "key-1234567890abcdef"),
    ("hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "hf_abcdefgh"),
    ("dop_v1_" + "ab12"*16, "ab12ab12"), ("shpat_" + "ab12"*8, "shpat_ab12"),
    ("the stripe key: sk_live_51ABCdefGHIjklMNOpqrSTUvwx", "sk_live_51"),
    ("sk-ant-api03-" + "AbCd1234"*11 + "AA", "AbCd1234AbCd"),
    ("Google: AIzaSyAbCdEfGhIjKlMnOpQrStUvWxYz0123456", "AIzaSyAbCd"),
    ("my github token is ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", "ghp_ABCDEF"),
    ("gho_16C7e42F292c6912E7710c838347Ae178B4a", "gho_16C7"),
    ("I set DB_PASSWORD to Kx9#mPq2 in the .env", "Kx9#mPq2"),
    ("password is hunter2 and user is bob", "hunter2"),
    ("secret: 7Gh2Kp9Lm4", "7Gh2Kp9Lm4"),
    ("my password's Pa$$w0rd", "Pa$$w0rd"),
    ("password - Pa$$w0rd", "Pa$$w0rd"),
    ("Passwort: geheim123", "geheim123"),
    ("the api key for openweather is 8f14e45fceea167a5a36dedd4bea2543", "8f14e45fceea"),
    ("token=8f14e45fceea167a5a36dedd4bea2543", "8f14e45f"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
     "MIIEvQIBADAN"),
    ("azure: DefaultEndpointsProtocol=https;AccountName=x;AccountKey=abc12"
     "3DEF456ghi789JKL012mno345PQR678stu901VWX234yz==;EndpointSuffix=core.windows.net",
     "abc123DEF456"),
    ("https://user:hunter2@example.com/path", "hunter2"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",
     "dBjftJeZ4CVP"),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;"
     "SharedAccessKey=Qm9vT2tEeHh5WlJ0c1ZqNkx3cEdIN2t3dFpzMkE1cz0=", "Qm9vT2tEeHh5WlJ0"),
    ("https://acct.blob.core.windows.net/c?sv=2021-08-06&sr=b&sig=abcDEF123ghiJKL456mno%2Bs%3D",
     "abcDEF123ghi"),
    ('"private_key_id": "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"', "a1b2c3d4e5f6071829"),
    ("twilio auth token is 9f8e7d6c5b4a39281706f5e4d3c2b1a0", "9f8e7d6c5b4a3928"),
    ("Redis password: foobared", "foobared"),
    ("jdbc:postgresql://db:5432/app?user=app&password=Sup3r", "Sup3r"),
    ("machine api.github.com login bob password gh0stRider99", "gh0stRider99"),
    ("Her new phone passcode is 482913", "482913"),
    ("my ssh key passphrase: tangerine submarine", "tangerine submarine"),
    ('Passphrase - "blue whale singing"', "blue whale singing"),
    ("credentials: admin / Winter2025!", "Winter2025!"),
    ("user: alice, pass: Sunshine#9", "Sunshine#9"),
    ("x-api-key: 3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", "3f9a8b7c6d5e4f3a"),
    ('api_key: "AbCdEfGh12345678"', "AbCdEfGh12345678"),
    ("bot token 7012345678:AAHx-abcdefGHIJKLmnopQRSTuvwxYZ01234", "AAHx-abcdef"),
    ("mongodb+srv://svc:BmQwoHn71@@cluster0.example.net/", "BmQwoHn71"),
    ("password: correctvelvet thanks!", "correctvelvet"),
    ("the wifi password is rocketorange thanks!", "rocketorange"),
    ("my password is correct silver harbor, don't tell anyone", "silver harbor"),
    ("Redis password: foobared", "foobared"),
]


@pytest.mark.parametrize(("text", "fragment"), STATED_SECRETS)
def test_stated_secrets_are_masked(text: str, fragment: str) -> None:
    assert fragment not in redact(text)


TALK_ABOUT_CREDENTIALS = """I forgot my password again, so I had to reset it.
The password is stored in 1Password, don't worry.
My password is too weak, I should change it.
Passwords are annoying but necessary.
The key to a good relationship is communication.
She finally found the key to the garage.
The secret to her cookies is brown butter.
The secret is out: we're having a baby!
I passed the exam with flying colors!
Can you pass me the salt?
We got tokens for the arcade games.
Each token is worth 25 cents.
The login page was down this morning.
My login is the same as yours.
Her PIN was stolen at the ATM last week, so she called the bank.
The pin is in the drawer.
Key takeaways: be kind, be curious, be brave.
Access key cards are required for the lab.
The auth service was migrated to Kubernetes 1.29 last sprint.
Use OAuth2 with PKCE for mobile apps.
The password policy requires 12 characters.
I'll pass on the party, thanks.
We used the session-based approach for login handling.
My credentials expired, so IT sent new ones.
The api key rotation happens every 90 days.
Set the token expiry to 3600 seconds.
Token: the smallest unit of text in NLP.
The passphrase should be long and memorable.
Secret Santa is on Friday!
Key: value pairs are stored in the config map.
I changed my password to something longer.
I set my password to expire every month.
The password for the wifi is on the fridge.
Password for the guest network is written on the card.
My passport number changed after renewal.
Passover dinner at 7pm with the family.
The key was under the mat, as always.
The token was accepted by the vending machine.
Melanie: I'm so proud of you, Caroline! Keep it up!
Caroline: Thanks! I went to the LGBTQ support group yesterday and it was so powerful.
version 2.3.1-beta.4 released; see build 20240115.1 and commit a1b2c3d.
Call me at +1 (555) 123-4567 or email jane.doe@example.com.
The meeting ID is 845 2231 9987 and the passcode is on the invite.
Visit https://www.example.com/articles/2024/05/how-to-bake-bread?ref=homepage
The function getUserById2 returns a UserDTO object.
Order #A1B2C3D4 shipped via UPS tracking 1Z999AA10123456784.
My flight code is BA2490 and seat 14C.
the secret ingredient is love
the key is 42
the key question is whether it scales.
my pin code is the same as my birthday
The access token lifetime is 1h by default.
Bearer of good news, as always!
basic training starts Monday
token economy is a behavioral therapy technique
her password was hacked last year
His password was leaked online yesterday.
See password policy.md for the rules.
The pin codes.txt file is in the shared folder.
Follow otp setup.md, then auth token notes.md.
""".strip().split("\n")


@pytest.mark.parametrize("text", TALK_ABOUT_CREDENTIALS)
def test_talk_about_credentials_is_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", ["key=" * 7_500, "password=" * 3_333, "密码是" * 10_000])
def test_a_run_of_credential_words_costs_linear_time(text: str) -> None:
    # 30,000 characters (a note's limit is 32,000): each credential word starts a
    # statement whose value reads at most 400 characters, not the rest of the run
    # (that took 17-19 s a note, in a thread the other workspaces share). This thread's
    # CPU time, not the clock's: a busy machine stretches the one, not the other.
    started = time.thread_time()
    redact(text)
    assert time.thread_time() - started < 6.0


def test_a_stated_value_longer_than_the_patterns_read_is_masked_whole() -> None:
    value = "Zq8" + "xY4kP9mW2vR7tL3s" * 44  # 707 characters
    for text in (f"the api token is {value}", f"token: {value}", f"set the token to {value}."):
        out = redact(text)
        assert value[-40:] not in out and value[380:420] not in out, out
        assert out.endswith(MASK) or out.endswith(MASK + "."), out
