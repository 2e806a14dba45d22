"""Secrets kept out of the channels beyond notes, from outside: a real daemon, a real
socket, a scripted chat and embedding server on 127.0.0.1. Notes holding generated (never
real) tokens of many kinds are dreamt by a model that echoes them into every field of a
node; none may reach a node, a link, the run records, the inbox, a job's result or error,
an embedding request or a backup."""

from __future__ import annotations

import base64
import random
import string
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes.provider_server import FakeProvider, Reply
from test_dream import AGENT, ScriptedModel, dream, run_job, write
from waits import wait_value

RNG = random.Random(20261204)
B62 = string.ascii_letters + string.digits
URL = B62 + "-_"


def _r(n: int, alphabet: str = B62) -> str:
    while True:
        s = "".join(RNG.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in s) and any(c.isupper() for c in s):
            return s


SECRETS = {
    "openai": "sk-proj-" + _r(40),
    "azure": _r(3) + "8Q~" + _r(34, B62 + "_~.-"),
    "discord": "M" + _r(25, URL) + "." + _r(6, URL) + "." + _r(38, URL),
    "telegram": f"{RNG.randrange(10**8, 10**9)}:AA{_r(33, URL)}",
    "stripe": "sk_live_" + _r(30),
    "gitlab": "glpat-" + _r(20),
    "aws": "AKIA" + _r(16, string.ascii_uppercase + string.digits),
    "slack": f"xoxb-{RNG.randrange(10**11, 10**12)}-{RNG.randrange(10**11, 10**12)}-{_r(24)}",
    "wrapped": base64.b64encode(("ghp_" + _r(36)).encode()).decode(),
    "password": "Quill" + str(RNG.randrange(1000, 9999)) + "#x",
}
SENTENCES = {
    "openai": "the openai key is {s}", "azure": "AZURE_CLIENT_SECRET={s}",
    "discord": "discord bot token {s}", "telegram": "bot father gave me {s}",
    "stripe": "stripe live key {s} for billing", "gitlab": "GITLAB_TOKEN: {s}",
    "aws": "aws access key {s} in eu-west-1", "slack": "slack bot {s}",
    "wrapped": "echo {s} | base64 -d", "password": "the router password is {s}",
}


def _leaks(text: str) -> list[str]:
    out = []
    for kind, s in SECRETS.items():
        pieces = [s] + [s[i:i + 14] for i in range(0, len(s) - 13, 7)]
        if any(p in text or p.lower() in text for p in pieces):
            out.append(kind)
    return out


@pytest.fixture
def fake() -> Any:
    with FakeProvider(dims=8) as provider:
        yield provider


def _all_files(root: Path) -> str:
    return "\n".join(p.as_posix() + "\n" + p.read_bytes().decode("utf-8", "replace")
                     for p in root.rglob("*") if p.is_file())


def test_secrets_in_dreamt_notes_reach_no_channel(daemon_factory: Any, fake: FakeProvider,
                                                  tmp_path: Path) -> None:
    root = tmp_path / "ws"
    notes = {}
    for i, (kind, s) in enumerate(SECRETS.items()):
        rel = f"memory/2026-11-{i + 1:02d}/{kind}.md"
        write(root, rel, f"# {kind}\n\n{SENTENCES[kind].format(s=s)}\n")
        notes[kind] = rel
    config = (f'[workspaces.{AGENT}]\npath = "{root}"\ndream_cron_enabled = false\n'
              'embedding_model_config = {backend = "openai", '
              f'base_url = "{fake.url}/v1", api_key = "k", model_name = "m", dimensions = 8}}\n'
              'chat_model_config = {backend = "openai", '
              f'base_url = "{fake.url}/v1", api_key = "k", model_name = "fake"}}\n')
    d = daemon_factory(config)
    d.call("index.sync", {"agent_id": AGENT})
    model = ScriptedModel(fake)
    for kind, rel in notes.items():
        # A password is known only by its context: the model echoes it with that.
        s = SECRETS[kind] if kind != "password" else "password " + SECRETS[kind]
        model.plan[rel] = [[("integrate", {
            "action": "CREATE", "bucket": "procedure", "name": f"{kind} {s}",
            "description": f"holds {s}", "type": SECRETS["aws"],
            "content": f"- the {kind} credential is {s}\n- see [[memory/{s}.md]]",
            "sources": [rel, f"memory/2026-11-01/{s}.md"],
            "related": [f"digest/procedure/{s}.md", f"digest/procedure/{kind}-{s}-2.md"],
            "reason": f"it says {s}"})]]
    result = dream(d)
    assert result["actions"].get("CREATE") == len(notes), (result, model.tool_results)
    assert _leaks(str(result)) == []
    runs = d.call("dream.runs", {"agent_id": AGENT})
    jobs = d.call("jobs.list", {"agent_id": AGENT})
    inbox = d.call("inbox.list", {"agent_id": AGENT, "include_acked": True})
    changes = d.call("memory.changes", {"agent_id": AGENT})
    index = d.call("memory.index", {"agent_id": AGENT})
    for got in (runs, jobs, inbox, changes, index, model.tool_results):
        bad = [x for x in (got if isinstance(got, list) else [got]) if _leaks(str(x))]
        assert not bad, "\n".join(map(str, bad))
    assert _leaks(_all_files(root / "digest")) == []

    # Embedding requests: the texts sent for vectors.
    def embedded() -> list[str]:
        return [t for r in fake.requests if r.path.endswith("/embeddings")
                for t in r.json["input"]]
    wait_value(lambda: _vectors(d)["coverage"], lambda c: c >= 1.0, "vectors")
    assert embedded()
    assert _leaks("\n".join(embedded())) == [], _leaks("\n".join(embedded()))
    chats = [r.body.decode() for r in fake.requests if r.path.endswith("/chat/completions")]
    assert _leaks("\n".join(chats)) == []

    # A person types a key into a node; a later note corrects it: the old claim goes to
    # the node's History.
    node_rel = "digest/procedure/openai-redacted.md"
    typed = (root / node_rel).read_text().replace(
        "- see", f"- the billing key is {SECRETS['stripe']}\n- see", 1)
    write(root, node_rel, typed)
    later = "memory/2026-11-20/rotated.md"
    write(root, later, "# rotated\n\nThe openai key was rotated.\n")
    # Edited by hand: the model reads the node before it rewrites it.
    model.plan[later] = [[("node_read", {"path": node_rel})], [("integrate", {
        "action": "CORRECT", "bucket": "procedure", "node": node_rel, "name": "openai",
        "content": "- the openai credential was rotated", "sources": [later],
        "reason": "rotated"})]]
    second = dream(d)
    history = (root / node_rel).read_text().split("## History", 1)[1]
    assert "[REDACTED]" in history and _leaks(history) == [], history
    for got in (second, d.call("dream.runs", {"agent_id": AGENT}),
                d.call("inbox.list", {"agent_id": AGENT, "include_acked": True}),
                d.call("memory.changes", {"agent_id": AGENT}), model.tool_results,
                _all_files(root / "mem_metadata" / "dream")):
        assert _leaks(str(got)) == [], got

    # A backup of the workspace and its dream history.
    backup = d.call("backup.create", {"agents": [AGENT]})
    path = Path(backup["file"])
    members = _archive_texts(path)
    # The notes are kept as their author wrote them; what the daemon wrote holds none.
    assert any("/dream/runs/" in n for n in members), sorted(members)
    own = {f"agents/{AGENT}/{rel}" for rel in notes.values()}
    written = {n: t for n, t in members.items() if n not in own}
    leaks = {n: _leaks(n + t) for n, t in written.items() if _leaks(n + t)}
    assert not leaks, leaks


def _archive_texts(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n).decode("utf-8", "replace") for n in z.namelist()}


def _config(root: Path, fake: FakeProvider, key: str) -> str:
    return (f'[workspaces.{AGENT}]\npath = "{root}"\ndream_cron_enabled = false\n'
            'embedding_model_config = {backend = "openai", '
            f'base_url = "{fake.url}/v1", api_key = "{key}", model_name = "m", '
            'dimensions = 8}\n'
            'chat_model_config = {backend = "openai", '
            f'base_url = "{fake.url}/v1", api_key = "{key}", model_name = "fake"}}\n')


def _vectors(d: Any) -> dict[str, Any]:
    status = d.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == AGENT)
    vectors: dict[str, Any] = ws["index"]["vectors"]
    return vectors


@pytest.mark.parametrize("status", [200, 400, 401])
def test_a_chat_error_quoting_keys_shows_none_in_the_job(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path, status: int) -> None:
    """Providers quote keys back in their errors ("Incorrect API key provided: ..."), some
    with status 200 and no choices; a proxy may quote other tokens. The job's error, the
    job list and the daemon's log show none of them, not even cut in part."""
    root = tmp_path / "ws"
    key = "sk-proj-" + _r(44)
    write(root, "memory/2026-11-01/a.md", "# a\n\nThe cat is called Miso.\n")
    quoted = [key, SECRETS["gitlab"], SECRETS["azure"], SECRETS["discord"], SECRETS["telegram"]]
    # The cut of a quote (500 characters) falls inside the last token.
    said = {"error": {"message": "x" * (480 - 120 * len(quoted[:-1])) + " ".join(
        f"Incorrect API key provided: {s}." for s in quoted), "type": "invalid_request_error"}}
    if status == 200:
        fake.chat_default = lambda req: said
    else:
        fake.script(*[Reply(status=status, raw=orjson.dumps(said))] * 10)
    d = daemon_factory(_config(root, fake, key))
    job = run_job(d, "auto_dream")
    assert job["state"] == "failed" and "Incorrect API key provided" in job["error"], job
    shown = str([job, d.call("jobs.list", {"agent_id": AGENT}), _vectors(d)])
    assert d.stop() == 0
    for text in (shown, d.log_path.read_text()):
        assert not [s[:16] for s in quoted if any(
            s[i:i + 12] in text for i in range(len(s) - 11))], text


def test_an_embedding_error_quoting_keys_shows_none_in_the_status(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    key = "sk-proj-" + _r(44)
    write(root, "memory/2026-11-01/a.md", "# a\n\nThe cat is called Miso.\n")
    quoted = [key, SECRETS["gitlab"], SECRETS["azure"], SECRETS["discord"]]
    body = orjson.dumps({"error": {"message": " ".join(f"bad key {s}" for s in quoted)}})
    fake.script(*[Reply(status=401, raw=body)] * 50)
    d = daemon_factory(_config(root, fake, key))
    vectors = wait_value(lambda: _vectors(d), lambda v: v["provider"]["last_error"],
                         "the embedding error")
    assert d.stop() == 0
    for text in (str(vectors), d.log_path.read_text()):
        assert "HTTP 401" in str(vectors)
        assert not [s[:16] for s in quoted if any(
            s[i:i + 12] in text for i in range(len(s) - 11))], text
