"""Secrets never reach memory, from outside: a real daemon, a real socket, a scripted chat
server on 127.0.0.1.

Conversation turns (string content and content blocks, a key split across two blocks)
go through ``memory.add_turns`` and an ``auto_memory`` job whose model echoes every secret
back in its note; ``memory.add_note`` gets secrets in each field; a note written by hand
holds one too. None of them may appear in the notes, the dialog log, the pending-turns
log, the index (searching for them) or any request the chat server received.
"""

from __future__ import annotations

import random
import string
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from tokengen import B62, random_token
from waits import wait_for, wait_job

from recalld.ipc.errors import InvalidParams

RNG = random.Random(20261201)
_rand = partial(random_token, RNG)


PGP_BODY = [_rand(64, B62 + "+/") for _ in range(4)]
PGP = ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + "\n".join(PGP_BODY)
       + "\n=Ab3x\n-----END PGP PRIVATE KEY BLOCK-----")
AWS_SECRET = _rand(40, B62 + "/+")
PASSWORD = "Plum" + str(RNG.randrange(1000, 9999)) + "!"
PASSPHRASE = "purple giraffe tambourine lighthouse"
PROD_PASSWORD = "Vx" + _rand(8) + "#"
PW = "k" + _rand(9)
GITLAB = "glpat-" + _rand(20)
SLACK = f"xoxb-{RNG.randrange(10**11, 10**12)}-{RNG.randrange(10**11, 10**12)}-{_rand(24)}"
TELEGRAM = f"{RNG.randrange(10**8, 10**9)}:AA{_rand(33)}"
SENDGRID = f"SG.{_rand(22)}.{_rand(43)}"
SPLIT = "ghp_" + _rand(36)
DESCRIPTION_KEY = "sk-proj-" + _rand(40)
HAND_KEY = "AKIA" + "".join(RNG.choice(string.ascii_uppercase + string.digits) for _ in range(16))
# Stated in Chinese with a full-width colon, and in other languages.
FULLWIDTH_PW = "Qz" + _rand(8) + "7"
JA_PW, KO_PW, RU_PW = ("Ja" + _rand(8) + "1", "Ko" + _rand(8) + "2", "Ru" + _rand(8) + "3")
# A password holding characters that end a value in a URL's query or a parenthesis.
SYMBOL_PW = "Ab3(" + _rand(6) + ")z&" + _rand(5)

# Set apart from their names, named first, wrapped, or in a shape of their own.
YAML_PW, K8S_PW, USE_PW = "Ym" + _rand(10), "Kp" + _rand(10), "Us" + _rand(8) + "&3"
MAILCHIMP = "".join(RNG.choice("0123456789abcdef") for _ in range(32)) + "-us14"
URL_TOKEN = _rand(28)
WRAPPED = __import__("base64").b64encode(f"{GITLAB}x{_rand(8)}".encode()).decode()
PIN = str(RNG.randrange(100000, 999999))
# Apart from a credential's name: a key wrapped onto the line below it, a password that
# PowerShell or a Windows command takes, a session cookie handed to curl, a PAT stated.
WRAP_KEY = _rand(40, B62 + "/+")
PS_PW, NET_PW = "Ps" + _rand(8) + "!", "Nu" + _rand(8) + "#"
COOKIE = "".join(RNG.choice("0123456789abcdef") for _ in range(32))
ADO_PAT = "".join(RNG.choice("abcdefghijklmnopqrstuvwxyz234567") for _ in range(52))

TURN_TEXT = (
    f"Here is my PGP key, keep it:\n{PGP}\n"
    f"The AWS secret key is {AWS_SECRET} for the backup user.\n"
    f"config: password={PASSWORD}\n"
    f"my passphrase is {PASSPHRASE}\n"
    f"the password for prod is {PROD_PASSWORD}\n"
    f"pw: {PW}\n"
    f"tokens: gitlab {GITLAB}, slack {SLACK}, telegram {TELEGRAM}, sendgrid {SENDGRID}.\n"
    f"服务器的 password：{FULLWIDTH_PW}\nパスワードは {JA_PW} です\n비밀번호: {KO_PW}\n"
    f"пароль: {RU_PW}\nthe wifi password is {SYMBOL_PW}\n"
    f"db:\n  password: >-\n    {YAML_PW}\nenv:\n- name: DB_PASS\n  value: {K8S_PW}\n"
    f"use {USE_PW} as the password for staging\nmailchimp {MAILCHIMP}\n"
    f"git clone https://{URL_TOKEN}@git.example.org/x/y\necho {WRAPPED} | base64 -d\n"
    f"银行卡 PIN码：{PIN}\n"
    f"aws_secret_access_key = {WRAP_KEY[:20]}\n    {WRAP_KEY[20:]}\n"
    f"$cred = ConvertTo-SecureString '{PS_PW}' -AsPlainText -Force\n"
    f"net use Z: \\\\fs01\\data {NET_PW} /user:bob\n"
    f"curl -b 'PHPSESSID={COOKIE}' https://intranet.example\nmy azure devops PAT is {ADO_PAT}\n"
)
SECRETS = {
    "pgp": PGP_BODY, "aws": [AWS_SECRET], "password": [PASSWORD], "passphrase": [PASSPHRASE],
    "prod": [PROD_PASSWORD], "pw": [PW], "gitlab": [GITLAB], "slack": [SLACK],
    "telegram": [TELEGRAM], "sendgrid": [SENDGRID],
    # The split key: whole, and each block's piece of it.
    "split": [SPLIT, SPLIT[:20], SPLIT[20:]],
    "description": [DESCRIPTION_KEY], "hand": [HAND_KEY], "fullwidth": [FULLWIDTH_PW],
    "japanese": [JA_PW], "korean": [KO_PW], "russian": [RU_PW],
    "symbols": [SYMBOL_PW, SYMBOL_PW[4:]],
    "yaml": [YAML_PW], "k8s": [K8S_PW], "use": [USE_PW], "mailchimp": [MAILCHIMP],
    "url_token": [URL_TOKEN], "wrapped": [WRAPPED[:24]], "pin": [PIN],
    "wrapped_key": [WRAP_KEY[20:]], "powershell": [PS_PW], "net_use": [NET_PW],
    "cookie": [COOKIE], "pat": [ADO_PAT],
}


def _config(root: Path, fake: FakeProvider) -> str:
    return (f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
            f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "test-key", '
            f'model_name = "fake-model", timeout_s = 10.0}}\n')


def _leaks(text: str) -> list[str]:
    return [f"{kind}: {s[:12]}..." for kind, values in SECRETS.items() for s in values
            if s in text]


def _workspace_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*")
                     if p.is_file() and p.suffix in (".md", ".jsonl", ".json", ".yaml", ""))


def test_secrets_reach_no_note_log_index_or_chat_request(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    # A note written by hand that holds a key: the index must not take it in.
    hand = root / "memory" / "2026-01-05" / "aws.md"
    hand.parent.mkdir(parents=True)
    hand.write_text(f"# AWS\nThe deploy user uses access key {HAND_KEY} in eu-west-1.\n")
    d = daemon_factory(_config(root, fake))
    # The model echoes every secret it could have seen into its note and description.
    echo = TURN_TEXT + f"\nsplit key {SPLIT}\n"
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "keys", "description": f"keys incl. {DESCRIPTION_KEY}", "content": echo})])),
        Reply(json=chat_answer("saved")))
    added = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "flush": True,
                                        "messages": [
        {"role": "user", "content": TURN_TEXT},
        {"role": "user", "content": [{"type": "text", "text": f"the new key is {SPLIT[:20]}"},
                                     {"type": "text", "text": f"{SPLIT[20:]} (rotate monthly)"}]},
        {"role": "assistant", "content": "Noted, I will keep them safe."},
    ]})
    pending_log = root / "mem_metadata" / "sessions" / "pending.jsonl"
    assert _leaks(pending_log.read_text()) == []
    job = wait_job(d, added["job_id"])
    assert job["state"] == "succeeded", job

    note = d.call("memory.add_note", {
        "agent_id": "w", "content": f"deploy notes: password={PASSWORD}, token {GITLAB}",
        "description": f"creds {SLACK} and passphrase: {PASSPHRASE}", "name": "deploy"})
    note_text = (root / note["path"]).read_text()
    assert "[REDACTED]" in note_text and "deploy notes" in note_text
    assert _leaks(note_text) == []

    dialog = root / "mem_session" / "dialog" / "s1.jsonl"
    assert "Noted, I will keep them safe" in dialog.read_text()
    assert _leaks(dialog.read_text()) == []
    assert _leaks(pending_log.read_text()) == []
    model_note = root / job["result"]["note"]
    assert "[REDACTED]" in model_note.read_text()
    assert _leaks(_workspace_text(root)) == ["hand: " + HAND_KEY[:12] + "..."]

    # The index: the hand-written note is found, its key is not in it, and searching for
    # any secret finds no text holding it.
    d.call("index.sync", {"agent_id": "w"})
    hits = d.call("memory.search", {"agent_id": "w", "query": "deploy user access key"})
    assert any(h["path"] == "memory/2026-01-05/aws.md" for h in hits["results"])
    for values in SECRETS.values():
        for secret in values:
            found = d.call("memory.search", {"agent_id": "w", "query": secret, "max_results": 20})
            assert _leaks(str(found)) == [], secret[:12]
    # The chat server never received any of them (prompt, tool results, echoed calls).
    assert fake.requests, "the chat model was called"
    for request in fake.requests:
        assert _leaks(request.body.decode()) == []


def test_ids_that_are_credentials_are_refused(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    d = daemon_factory(_config(tmp_path / "ws", fake))
    with pytest.raises(InvalidParams, match="credential"):
        d.call("memory.add_note", {"agent_id": "w", "content": "x", "session_id": GITLAB})
    with pytest.raises(InvalidParams, match="credential"):
        d.call("memory.add_turns", {"agent_id": "w", "session_id": SPLIT,
                                    "messages": [{"role": "user", "content": "hi"}]})
    # An agent id names a workspace's folder and shows in its log lines and status.
    for agent in (GITLAB, DESCRIPTION_KEY):
        with pytest.raises(InvalidParams, match="credential"):
            d.call("workspace.open", {"agent_id": agent})
    assert d.call("workspace.open", {"agent_id": "token-helper"})["state"] == "ready"
    # An agent's name is recorded with its workspace and shown in workspace.list.
    for name in (f"bot {GITLAB}", f"the password is {PASSWORD}"):
        with pytest.raises(InvalidParams, match="credential"):
            d.call("workspace.open", {"agent_id": "named", "name": name})
    assert d.call("workspace.open", {"agent_id": "named", "name": "Token Helper 2"})
    assert _leaks(str(d.call("workspace.list"))) == []
    # A request id is kept in the pending-turns log to answer a retry.
    for request_id in (SLACK, f"retry pw: {PW}"):
        with pytest.raises(InvalidParams, match="credential"):
            d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "request_id":
                                        request_id, "messages": [{"role": "user",
                                                                  "content": "hi"}]})
    added = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "request_id":
                                        "token-refresh-7", "messages": [{"role": "user",
                                                                         "content": "hi"}]})
    assert added["added_messages"] == 1
    # A job's free-text param is kept in its record, the journal and its events.
    for occurrence in (GITLAB, f"pw: {PW}"):
        with pytest.raises(InvalidParams, match="credential"):
            d.call("jobs.submit", {"agent_id": "w", "kind": "auto_dream",
                                   "params": {"occurrence": occurrence}})
    d.call("jobs.submit", {"agent_id": "w", "kind": "auto_dream",
                           "params": {"occurrence": "2026-12-05T23:00:00+01:00"}})
    assert _leaks((d.data_dir / "state" / "jobs.journal").read_text(errors="replace")) == []
    assert _leaks(_workspace_text(tmp_path / "ws")) == []
    assert d.call("daemon.ping")["pong"] is True


def test_ids_and_names_redaction_would_mask_where_written_are_refused(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A session id, an author or a topic file's name that is a credential by its words
    (not its shape) would be masked in the note's link, the frontmatter or MEMORY.md: a
    link naming nothing, an author no filter finds. They are refused; ids and names that
    merely mention a credential word are taken and kept whole."""
    d = daemon_factory(_config(tmp_path / "ws", fake))
    turns = [{"role": "user", "content": "hi"}]
    for sid in (f"pw:{PW}", f"passwd:{PW}", f"token@{PW}", f"pin:{PIN}"):
        with pytest.raises(InvalidParams, match="credential"):
            d.call("memory.add_note", {"agent_id": "w", "content": "x", "session_id": sid})
        with pytest.raises(InvalidParams, match="credential"):
            d.call("memory.add_turns", {"agent_id": "w", "session_id": sid, "messages": turns})
    with pytest.raises(InvalidParams, match="credential"):
        d.call("memory.add_note", {"agent_id": "w", "content": "x", "author": f"pw {PW}"})
    with pytest.raises(InvalidParams, match="credential"):
        d.call("memory.topic_write", {"agent_id": "w", "path": f"my pin {PIN}.md",
                                      "name": "n", "description": "d", "type": "user",
                                      "body": "b"})
    note = d.call("memory.add_note", {"agent_id": "w", "content": "rotated the keys",
                                      "session_id": "api-key-rotation-2024",
                                      "author": "token-rotation-bot"})
    text = (tmp_path / "ws" / note["path"]).read_text()
    assert "[[mem_session/dialog/api-key-rotation-2024.jsonl]]" in text, text
    found = d.call("memory.search", {"agent_id": "w", "query": "rotated keys",
                                     "filters": {"author": "token-rotation-bot"}})
    assert [r["path"] for r in found["results"]] == [note["path"]]
    assert _leaks(str(d.call("daemon.status"))) == []


def test_frontmatter_the_model_sets_is_masked_as_the_index_masks_it(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A value the model puts under a credential's name with ``frontmatter_update`` (a
    plain word, which only its key tells) is masked in the note, not only in the index."""
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    rel = "memory/2026-03-09/wifi.md"
    plain = "bluebird" + str(RNG.randrange(10, 99))
    fake.script(
        Reply(json=chat_answer(None, [tool_call("daily_write", {
            "name": "wifi", "content": "- The home wifi was set up."})])),
        Reply(json=chat_answer(None, [tool_call("frontmatter_update", {
            "path": rel, "changes": {"wifi_password": plain, "router": "the hall cupboard",
                                     "tags": ["home", f"pw: {plain}"]}}, "call_2")])),
        Reply(json=chat_answer("saved")))
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1",
                                "messages": [{"role": "user", "content": "wifi is set up"}]})
    job = d.call("jobs.submit", {"agent_id": "w", "kind": "auto_memory",
                                 "params": {"session_id": "s1", "date": "2026-03-09"}})
    assert wait_job(d, job["job_id"])["state"] == "succeeded"
    text = (root / rel).read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("wifi_password:"))
    assert "[REDACTED]" in line and "router: the hall cupboard" in text, text
    assert plain not in text, text


def test_an_edit_is_masked_with_the_line_it_goes_into(
        daemon_factory: Any, tmp_path: Path) -> None:
    """A plain word is a password after "wifi_password:": an edit putting it there is
    masked in the file, as the index masks the line (not only the word alone)."""
    root = tmp_path / "ws"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    plain = "canary" + str(RNG.randrange(10, 99))
    d.call("memory.topic_write", {"agent_id": "w", "path": "home.md", "name": "Home",
                                  "description": "the flat", "type": "user",
                                  "body": "- wifi_password: TBD\n- router: hall"})
    d.call("memory.topic_edit", {"agent_id": "w", "path": "home.md", "old": "TBD",
                                 "new": plain})
    text = (root / "digest" / "home.md").read_text()
    assert plain not in text and "- wifi_password: [REDACTED]\n- router: hall" in text, text


def test_frontmatter_written_by_hand_is_served_without_its_secrets(
        daemon_factory: Any, tmp_path: Path) -> None:
    """The names and descriptions a person typed into notes' frontmatter reach MEMORY.md
    (which the daemon writes), ``memory.select``, ``memory.index`` and the recall block's
    index masked, as the index holds them."""
    root = tmp_path / "ws"
    digest = root / "digest"
    (digest / "wiki").mkdir(parents=True)
    (digest / "db.md").write_text(
        f"---\nname: prod db {DESCRIPTION_KEY}\ndescription: the db password is "
        f"{PROD_PASSWORD}\ntype: reference\n---\nThe primary runs in eu-west-1.\n")
    (digest / "wiki" / "deploy.md").write_text(
        f"---\nname: deploy {GITLAB}\ndescription: 'pw: {PW}'\n---\nDeploys on Fridays.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})
    memory_md = digest / "MEMORY.md"
    text = wait_for(lambda: memory_md.exists() and memory_md.read_text())
    assert "the db password is [REDACTED]" in text and _leaks(text) == []
    selected = d.call("memory.select", {"agent_id": "w", "query": "prod db"})
    assert selected["files"] and _leaks(str(selected)) == []
    index = d.call("memory.index", {"agent_id": "w"})
    assert {e["path"] for e in index["entries"]} >= {"digest/db.md", "digest/wiki/deploy.md"}
    assert "pw: [REDACTED]" in index["rendered"] and _leaks(str(index)) == []
    recall = d.call("memory.recall", {"agent_id": "w", "query": "primary eu-west-1",
                                      "include_index": True})
    assert recall["index_included"] and _leaks(str(recall)) == []


def test_model_text_cut_short_keeps_no_piece_of_a_secret(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """The job result quotes the start of the model's last answer: a key that the cut
    falls inside is masked whole, not left as a piece too short to be recognised."""
    d = daemon_factory(_config(tmp_path / "ws", fake))
    for cut_at in (5, 12, 20):  # where in the key the 500 characters end
        answer = "n" * (500 - cut_at) + " " + DESCRIPTION_KEY + " is kept."
        fake.script(Reply(json=chat_answer(answer)))
        added = d.call("memory.add_turns", {
            "agent_id": "w", "session_id": f"cut{cut_at}", "flush": True,
            "messages": [{"role": "user", "content": "I moved to Lisbon in May."}]})
        job = wait_job(d, added["job_id"])
        assert job["state"] == "succeeded", job
        text = job["result"]["model_text"]
        assert text.startswith("nnnn") and DESCRIPTION_KEY[:cut_at - 1] not in text, text[-40:]


def test_secret_typed_into_a_session_note_does_not_block_its_rewrite(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A person adds a bullet holding a password to a session's note; the model, shown
    the note masked, rewrites it keeping the bullet as it saw it. The rewrite is not
    refused as dropping that bullet, and no record quotes the password."""
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "infra", "content": "- the primary database runs in Lisbon"})])),
        Reply(json=chat_answer("saved")))
    first = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s9", "flush": True,
                                        "messages": [{"role": "user", "content": "db in Lisbon"}]})
    note = root / wait_job(d, first["job_id"])["result"]["note"]
    note.write_text(note.read_text() + f"- db password: {PASSWORD}\n")
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "infra", "content": "- the primary database runs in Lisbon\n"
                                    "- db password: [REDACTED]\n- backups run nightly"})])),
        Reply(json=chat_answer("saved")))
    second = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s9", "flush": True,
                                         "messages": [{"role": "user", "content": "backups?"}]})
    job = wait_job(d, second["job_id"])
    assert job["state"] == "succeeded", job
    assert job["result"]["refused"] == [], job["result"]
    assert "backups run nightly" in note.read_text()
    changes = d.call("memory.changes", {"agent_id": "w"})
    assert _leaks(str(job) + str(changes)) == []


def test_a_key_block_pasted_over_two_turns_is_masked_in_both(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A chat client splits a long paste into two messages, handed over in two calls."""
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    head, tail = PGP.split(PGP_BODY[1])
    for n, text in enumerate((f"my signing key, keep it:\n{head}{PGP_BODY[1][:30]}",
                              f"{PGP_BODY[1][30:]}{tail}\nthat was all of it")):
        d.call("memory.add_turns", {"agent_id": "w", "session_id": "paste", "messages": [
            {"role": "user", "content": text}], "request_id": f"paste-{n}"})
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "that was all of it" in pending and "my signing key" in pending
    assert not [p for p in (*PGP_BODY, PGP_BODY[1][:30], PGP_BODY[1][30:]) if p in pending]


def test_a_token_split_over_two_messages_is_masked_in_both(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A chat client cuts a long paste in the middle of a token: the two messages come in
    one call, or in two calls (then the first half is logged before the second comes:
    it is masked for what it is alone, as the credential it is said to be)."""
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    token, key = "ghp_" + _rand(36), AWS_SECRET
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "cut", "messages": [
        {"role": "user", "content": f"my new github token is {token[:18]}"},
        {"role": "user", "content": f"{token[18:]} keep it"}]})
    for n, text in enumerate((f"aws secret: {key[:13]}", f"{key[13:]}\nthat is the aws one")):
        d.call("memory.add_turns", {"agent_id": "w", "session_id": "cut", "messages": [
            {"role": "user", "content": text}], "request_id": f"cut-{n}"})
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "keep it" in pending and "that is the aws one" in pending
    assert not [p for p in (token[:18], token[18:], key[:13], key[13:]) if p in pending], pending


def test_the_other_speakers_answer_is_not_taken_for_the_rest_of_a_secret(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A message that ends in a secret or inside a key block, answered by the other
    speaker ("OK", "Noted, ..."): the answer's first words were read as the secret's
    rest and masked (an "OK" lost whole), in one call and across calls."""
    from test_capture_shapes import pending_said

    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    token, pw = "ghp_" + _rand(36), "hunter" + _rand(8)
    open_key = f"my key:\n-----BEGIN PRIVATE KEY-----\n{PGP_BODY[0]}\n{PGP_BODY[1]}"
    said = [("user", f"my new github token is {token}"), ("assistant", "Noted, I keep it."),
            ("user", f"the vpn password is {pw}"), ("assistant", "OK"),
            ("assistant", f"Your token: {token}"), ("user", "Great"),
            ("user", open_key), ("assistant", "Thanks")]
    messages = [{"role": role, "content": text} for role, text in said]
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "one-call",
                                "messages": messages})
    for n, message in enumerate(messages):  # one message a call
        d.call("memory.add_turns", {"agent_id": "w", "session_id": "calls",
                                    "messages": [message], "request_id": f"m-{n}"})
    for session in ("one-call", "calls"):
        got = pending_said(root, session)
        assert [text for _, text in got if "[REDACTED]" not in text] == [
            "Noted, I keep it.", "OK", "Great", "Thanks"], (session, got)
        assert [role for role, _ in got] == [role for role, _ in said], (session, got)
        assert not [s for s in (token, pw, *PGP_BODY[:2]) if s in repr(got)], (session, got)


def test_a_url_cut_inside_its_password_is_masked_in_both_calls(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """The cut falls inside a connection URL's password, before its ``@``: the first call
    is logged before the second comes, and ends in what can only be a password (a port
    is digits); the second starts with the rest of it. A URL ending in a port stays."""
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    pw = "Zx" + _rand(10)
    for n, text in enumerate((f"the db is postgres://app:{pw[:6]}",
                              f"{pw[6:]}@db.internal:5432/prod ok",
                              "and the api runs at http://localhost:8080")):
        d.call("memory.add_turns", {"agent_id": "w", "session_id": "url", "messages": [
            {"role": "user", "content": text}], "request_id": f"url-{n}"})
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "postgres://app:[REDACTED]" in pending and "http://localhost:8080" in pending
    assert not [p for p in (pw[:6], pw[6:]) if p in pending], pending


def test_session_ids_in_notes_recalld_writes_are_indexed_as_written(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A conversation's id (a random-looking slug, a chat's number, a ULID, a nanoid, a
    Feishu chat id) is written into a note's ``session_id`` and named by its
    ``source_conversation`` link: the index shows it in both, not masked in one and
    plain in the other. An id shaped like a credential is still refused at write."""
    d = daemon_factory(_config(tmp_path / "ws", fake))
    ids = {"a8f3k2m9x7q4w1z6": "walrus", "telegram:12345678": "heron", "qq:123456789": "otter",
           "01HGW2N7Q4Z8X9K3M5P6R7T8V9": "badger", "V1StGXR8_Z5jdHi6B-myT": "lynx",
           "oc_5ad11d72b830411d72b836c20b3a1f2e": "ibis",
           "discord:1187654321098765432": "marmot"}
    for sid, word in ids.items():
        d.call("memory.add_note", {"agent_id": "w", "content": f"the {word} was seen",
                                   "session_id": sid, "name": word})
    d.call("index.sync", {"agent_id": "w"})
    for sid, word in ids.items():
        hits = d.call("memory.search", {"agent_id": "w", "query": word})["results"]
        assert len(hits) == 1, (sid, hits)
        text = hits[0]["text"]
        assert "[REDACTED]" not in text, text
        assert f"/dialog/{sid}.jsonl]]" in text and f"session_id: {sid}" in text.replace(
            '"', ""), text
    jwt = ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
           "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")
    for sid in (HAND_KEY, jwt, "ghp_" + _rand(36)):
        with pytest.raises(InvalidParams, match="credential"):
            d.call("memory.add_note", {"agent_id": "w", "content": "x", "session_id": sid})
