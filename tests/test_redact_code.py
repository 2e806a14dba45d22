"""A user and password pair handed to an auth parameter or class in code pasted into a
conversation or a note (``requests.get(url, auth=("admin", "...")``,
``HTTPBasicAuth("admin", "...")``): the password was kept, as no credential name stood
next to it. Variables, environment lookups and placeholders stay."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import MASK, redact

PASSWORD = "Zx9kLm2Qp"


@pytest.mark.parametrize("template", [
    'requests.get(url, auth=("admin", "{pw}"))',
    "httpx.Client(auth=('admin', '{pw}'))",
    'session.auth = ("bob", "{pw}")',
    'HTTPBasicAuth("admin", "{pw}")',
    "requests.auth.HTTPDigestAuth('admin', '{pw}')",
    "aiohttp.BasicAuth('me', '{pw}')",
])
@pytest.mark.parametrize("pw", [PASSWORD, "hunter2", "correct horse battery"])
def test_the_password_of_an_auth_pair_is_masked(template: str, pw: str) -> None:
    text = template.format(pw=pw)
    out = redact(text)
    assert pw not in out and MASK in out, out
    assert out.replace(MASK, pw) == text  # the user and the code around stay


@pytest.mark.parametrize("text", [
    'auth=("admin", os.environ["PW"])',
    'auth=("admin", "${PW}")',
    'HTTPDigestAuth("u", "<password>")',
    'the auth ("a", "b") pair is a tuple',
])
def test_auth_pairs_without_a_written_password_stay(text: str) -> None:
    assert redact(text) == text


def test_a_plain_password_under_its_key_in_tool_call_arguments_is_masked() -> None:
    """Tool-call arguments are JSON: each value used to be redacted alone, without the
    key that says it is a password; the older ``function_call`` form was not redacted."""
    from recalld.daemon.memory.redact import redact_messages, redact_value

    arguments = ('{"user": "admin", "password": "bluebird7", "db_pass": "correct horse '
                 'battery staple", "note": "hello world", "token": "each"}')
    out = str(redact_messages([
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "login", "arguments": arguments}}]},
        {"role": "assistant", "content": "ok",
         "function_call": {"name": "login", "arguments": arguments}},
    ]))
    for secret in ("bluebird7", "correct horse"):
        assert secret not in out, out
    assert out.count("hello world") == 2 and out.count('"each"') == 2, out
    assert redact_value({"name": "passwords", "session_id": "telegram-12345"}) == {
        "name": "passwords", "session_id": "telegram-12345"}
