"""Secrets redaction, credentials in layouts the other rules did not read: a Telegram bot
token glued to ``bot`` as its API URLs write it, a password stated with the verb last
(Hindi, Persian, Japanese, Korean), and a credential in a Markdown table or in CSV,
TSV or semicolon-separated rows; their
look-alikes stay; and from outside, none of them reaches memory, the index or a chat
model."""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_job

from recalld.daemon.memory.redact import MASK, redact
from recalld.daemon.memory.secret_anchors import anchors
from recalld.daemon.memory.secret_tables import find_in_delimited

RNG = random.Random(20261205)
B62 = string.ascii_letters + string.digits


def _r(n: int, alphabet: str = B62) -> str:
    while True:
        s = "".join(RNG.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in s) and any(c.isupper() for c in s):
            return s


TELEGRAM = f"{RNG.randrange(10**9, 10**10)}:AA{_r(33, B62 + '_-')}"


@pytest.mark.parametrize("template", [
    "https://api.telegram.org/bot{s}/sendMessage?chat_id=42",
    "curl -s api.telegram.org/bot{s}/getUpdates", "TG_URL=https://api.telegram.org/bot{s}",
    "the alert bot is bot{s}", "Bot{s}",
])
def test_a_telegram_token_glued_to_bot_is_masked(template: str) -> None:
    out = redact(template.format(s=TELEGRAM))
    assert TELEGRAM.split(":")[1] not in out and MASK in out, out
    assert "bot" in out.lower()  # only the token goes


PASSWORD = "Tq7" + _r(6)


@pytest.mark.parametrize(("text", "secret"), [
    (f"मेरा पासवर्ड {PASSWORD} है", PASSWORD),
    (f"जीमेल का पासवर्ड {PASSWORD} है।", PASSWORD),
    ("वाईफ़ाई का पासवर्ड lighthouse है", "lighthouse"),
    (f"पासवर्ड तो \"{PASSWORD}\" था", PASSWORD),
    (f"رمز عبور من {PASSWORD} است", PASSWORD),
    (f"パスワード {PASSWORD} です", PASSWORD),
    (f"비밀번호 {PASSWORD}입니다", PASSWORD),
])
def test_a_password_stated_with_the_verb_last_is_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "पासवर्ड weak है", "पासवर्ड reset करना है", "मेरा पासवर्ड बहुत लंबा है", "पासवर्ड OTP है",
    "पासवर्ड expired है", "मेरा पासवर्ड secure नहीं है", "पासवर्ड 8 characters का होना चाहिए",
    "رمز عبور من قوی است", "パスワード 忘れた です",
])
def test_talk_about_a_password_with_the_verb_last_stays(text: str) -> None:
    assert redact(text) == text


TABLE_PW, KEY, TOKEN = "Zq8" + _r(8) + "!", _r(24), "Qk3" + _r(10)


@pytest.mark.parametrize("table", [
    f"| service | user | password |\n|---|---|---|\n| prod db | admin | {TABLE_PW} |\n",
    f"| host | Admin password |\n|:--|--:|\n| a | `{TABLE_PW}` |\n| b | **{TABLE_PW}** |\n",
    f"service | password\n--- | ---\nprod | {TABLE_PW}\n",
    f"| Name | Value |\n| --- | --- |\n| PORT | 5432 |\n| **DB_PASSWORD** | {TABLE_PW} |\n",
    f"| Password | {TABLE_PW} |\n|---|---|\n| Notes | rotate monthly |\n",
    f"Text before.\n\n| key | secret |\n|---|---|\n| api | {TABLE_PW} |\n\nText after.\n",
])
def test_a_credential_in_a_markdown_table_is_masked(table: str) -> None:
    out = redact(table)
    assert TABLE_PW.rstrip("!") not in out and MASK in out, out
    assert out.count("|") == table.count("|")  # the table keeps its shape


def test_every_credential_of_a_table_is_masked() -> None:
    table = (f"| Setting | Value |\n|---|---|\n| API key | {KEY} |\n| GITHUB_TOKEN | {TOKEN} |\n"
             f"| timeout_s | 30 |\n")
    out = redact(table)
    assert KEY not in out and TOKEN not in out and "| timeout_s | 30 |" in out, out


HEX_TOKEN = "".join(RNG.choice("0123456789abcdef") for _ in range(32))


@pytest.mark.parametrize("text", [
    f"| service | api_token |\n|---|---|\n| github | {HEX_TOKEN} |\n",
    f"| Service | Token |\n|---|---|\n| ci | `{HEX_TOKEN.upper()}` |\n",
    f"| Name | Value |\n|---|---|\n| ACCESS_TOKEN | {HEX_TOKEN} |\n",
    "| user | session token |\n|---|---|\n| bob | 550e8400-e29b-41d4-a716-446655440000 |\n",
    f"service,api_token\ngithub,{HEX_TOKEN}\n",
    f"host\tauth_token\nprod\t{HEX_TOKEN[:20]}\n",
])
def test_a_machine_made_key_under_a_token_column_is_masked(text: str) -> None:
    """A hex key or a UUID in a cell a credential's name heads is masked as it is after
    ``api_token:``; the header and the other cells stay."""
    out = redact(text)
    assert MASK in out and HEX_TOKEN[:20] not in out.lower() and "550e8400" not in out, out
    assert out.splitlines()[0] == text.splitlines()[0]


@pytest.mark.parametrize("text", [
    "| Token | Meaning |\n|---|---|\n| `IDENT` | identifier |\n| `NUM_42` | number |\n",
    "| service | token |\n|---|---|\n| ci | 3f9a1c2e |\n| api | abc123 |\n",
    "| name | token |\n|---|---|\n| eos | </s> |\n| pad | [PAD] |\n",
    f"| commit | sha |\n|---|---|\n| main | {HEX_TOKEN} |\n",
])
def test_short_or_named_values_under_a_token_column_stay(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("table", [
    "| password | rule |\n|---|---|\n| length | at least 12 |\n| rotation | 90 days |\n",
    "| Setting | Default |\n|---|---|\n| password_min_length | 12 |\n| token_ttl | 3600 |\n",
    "| id | api_key_created_at |\n|---|---|\n| 1 | 2025-01-01 |\n",
    "| col | password |\n|---|---|\n| a | see vault |\n| b | ******** |\n| c | ${DB_PASS} |\n"
    "| d | os.environ[\"PW\"] |\n",
    "| Model | tokens | cost |\n|---|---|---|\n| gpt-4o | 1834 | $0.02 |\n",
    "| key | meaning |\n|---|---|\n| Ctrl-C | copy |\n| F5 | refresh |\n",
    "| Release | Secret rotation |\n|---|---|\n| v2.3.1 | 2026-01-05 |\n",
    "| Session | Started |\n|---|---|\n| s-2026-01-05-a | 10:30 |\n",
])
def test_tables_about_credentials_stay(table: str) -> None:
    assert redact(table) == table


def test_a_daemon_keeps_them_out_of_notes_index_reads_and_chat_requests(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """From outside: turns and an agent's note holding each shape, and a note written by
    hand with a table of them. None reaches a note, the dialog log, a search's answer, a
    masked read or a request to the chat model."""
    root = tmp_path / "ws"
    hand = root / "memory" / "2026-01-05" / "creds.md"
    hand.parent.mkdir(parents=True)
    hand.write_text(f"# Creds\n\n| service | user | password |\n|---|---|---|\n"
                    f"| prod db | admin | {TABLE_PW} |\n")
    d = daemon_factory(
        f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
        f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "test-key", '
        f'model_name = "fake-model", timeout_s = 10.0}}\n')
    said = (f"alerts: https://api.telegram.org/bot{TELEGRAM}/sendMessage\n"
            f"मेरा पासवर्ड {PASSWORD} है\n| Name | Value |\n|---|---|\n| GITHUB_TOKEN | {TOKEN} |\n")
    secrets = [TELEGRAM.split(":")[1], PASSWORD, TOKEN, TABLE_PW.rstrip("!")]
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "ops", "description": "ops notes", "content": said})])),
        Reply(json=chat_answer("saved")))
    added = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "flush": True,
                                        "messages": [{"role": "user", "content": said}]})
    assert wait_job(d, added["job_id"])["state"] == "succeeded"
    note = d.call("memory.add_note", {"agent_id": "w", "content": said, "name": "ops2"})
    assert "alerts: https://api.telegram.org/bot" in (root / note["path"]).read_text()
    d.call("index.sync", {"agent_id": "w"})
    read = d.call("memory.read", {"agent_id": "w", "path": "memory/2026-01-05/creds.md",
                                  "masked": True})
    assert "| prod db | admin | [REDACTED] |" in read["text"]
    texts = [read["text"], (root / "mem_session" / "dialog" / "s1.jsonl").read_text(),
             *(p.read_text() for p in (root / "memory").rglob("*.md") if p != hand),
             *(r.body.decode() for r in fake.requests)]
    texts += [str(d.call("memory.search", {"agent_id": "w", "query": s})) for s in secrets]
    found = d.call("memory.search", {"agent_id": "w", "query": "prod db admin"})
    assert [h["path"] for h in found["results"]][:1] == ["memory/2026-01-05/creds.md"]
    assert fake.requests
    assert [s for s in secrets for t in texts if s in t] == []


@pytest.mark.parametrize(("text", "secrets"), [
    ("user,password,email\nbob,Hunter2Pass,bob@x.com\namy,Tr0ub4dor&3,amy@x.com\n",
     ("Hunter2Pass", "Tr0ub4dor&3")),
    ("user;password;email\r\nbob;Hunter2Pass;bob@x.com\r\n", ("Hunter2Pass",)),
    ("host\tdb_password\nprod\tZq8mN2pL4x\nstaging\tKp7#vW2qLm\n", ("Zq8mN2pL4x", "Kp7#vW2qLm")),
    ('"service","secret","note"\n"api","S3cr3t!xyz","prod"\n', ("S3cr3t!xyz",)),
    ("```csv\nname, passwort\nrouter, Sonnenblume7\n```", ("Sonnenblume7",)),
    ("key,value\nhost,db.internal\npassword,Hunter2Pass\n", ("Hunter2Pass",)),
    # Two credential columns, four anchors on the header line.
    ("user,db_password,api_token\nbob,Hunter2Pass,Kp7vW2qLmZx9Rt4Qa\n"
     "amy,Tr0ub4dor&3,Zq8mN2pL4xWc6Yh1Ub\n",
     ("Hunter2Pass", "Kp7vW2qLmZx9Rt4Qa", "Tr0ub4dor&3", "Zq8mN2pL4xWc6Yh1Ub")),
])
def test_a_credential_column_of_delimited_rows_is_masked(text: str,
                                                         secrets: tuple[str, ...]) -> None:
    """CSV, TSV and semicolon-separated rows (a resource file, an export pasted into a
    note) under a header naming a credential, or a name and its value a row: the values
    are masked, the other fields and the header kept."""
    out = redact(text)
    assert not any(s in out for s in secrets) and out.count(MASK) == len(secrets), out
    assert out.splitlines()[0] == text.splitlines()[0]


@pytest.mark.parametrize("text", [
    "user,password\nbob,changeme\namy,2024-01-01\ncat,v1.2.3\n",
    "id,name,token_count\n1,alpha,4096\n2,beta,512\n",
    "name,password_hint\nbob,my dog's name\n",
    "commit,author\n3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39,bob\n",
    "The password, as we said, is required\nWe, the people, agree\n",
])
def test_delimited_rows_without_a_credential_value_are_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("text", [
    "password\tZq8xT4mR9vLw2pK7", "The hosts we keep\npassword;Zq8xT4mR9vLw2pK7",
])
def test_a_lone_delimited_line_at_the_end_is_no_block_of_rows(text: str) -> None:
    # A name's field says what the next holds only in a block of such rows (the other
    # rules may still read the line as a statement).
    assert list(find_in_delimited(text, anchors(text, text.lower()))) == []


@pytest.mark.parametrize(("text", "secret"), [
    ("Password\n: Hunter2Pass\n", "Hunter2Pass"),
    ("**DB password**\n:   `Tr0ub4dor&3`\n\nHost\n: db.internal", "Tr0ub4dor&3"),
    ("api_token\n: 9b2f1c7d8e4a6b3c5d7e9f0a1b2c3d4e", "9b2f1c7d8e4a6b3c5d7e9f0a1b2c3d4e"),
])
def test_a_credential_in_a_definition_list_is_masked(text: str, secret: str) -> None:
    """A Markdown definition list (Pandoc, PHP Markdown Extra; an HTML page's ``<dl>``
    as a resource is read) sets a term on its line and ``: definition`` below it."""
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "Password\n: forgotten\n", "Password\n: changeme later\n", "Token\n: v1.2.3\n",
    "Password\n: 2026-01-05\n", "Host\n: db.internal\n",
])
def test_definitions_that_hold_no_credential_are_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (f"| 服务 | 令牌 |\n|---|---|\n| github | {HEX_TOKEN} |\n", HEX_TOKEN),
    (f"| 服务 | API密钥 |\n|---|---|\n| github | {HEX_TOKEN} |\n", HEX_TOKEN),
    ("| 服务 | 密码 |\n|---|---|\n| db | Zq8mN2pL4x |\n", "Zq8mN2pL4x"),
    ("| 服務 | 密碼 |\n|---|---|\n| db | Zq8mN2pL4x |\n", "Zq8mN2pL4x"),
    ("| Сервис | Пароль |\n|---|---|\n| db | Zq8mN2pL4x |\n", "Zq8mN2pL4x"),
    (f"| Dienst | Zugangstoken |\n|---|---|\n| ci | {HEX_TOKEN} |\n", HEX_TOKEN),
])
def test_a_column_named_in_another_language_is_read_as_in_english(text: str,
                                                                  secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out and out.splitlines()[0] == text.splitlines()[0]


@pytest.mark.parametrize("text", [
    "| 服务 | 密码 |\n|---|---|\n| db | 见保险库 |\n| b | 12 |\n",
    "| 服务 | 令牌 |\n|---|---|\n| db | abc123 |\n",
])
def test_columns_named_in_another_language_without_a_credential_stay(text: str) -> None:
    assert redact(text) == text
