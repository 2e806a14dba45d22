"""A backup holds everything needed to resume elsewhere: config, pending turns, inbox.

Backup on one data dir, restore on an empty one with another socket: the same config,
the same pending turns (written by the next flush), the same inbox. Secrets of the
config are masked unless asked for.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_job

SECRET = "sk-test-" + "Q7w8E9r0T1y2U3i4O5p6"


def note_reply(name: str, body: str) -> list[Reply]:
    return [Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": name, "description": "facts", "content": body})])),
        Reply(json=chat_answer("saved"))]




def test_backup_restores_config_pending_turns_and_inbox_elsewhere(
        daemon_factory: Any, fake: FakeProvider) -> None:
    config = ("[workspace_defaults]\nauto_memory_idle_s = 0\n"
              "[workspace_defaults.chat_model_config]\n"
              f'base_url = "{fake.url}/v1"\napi_key = "{SECRET}"\nmodel_name = "m"\n')
    d1 = daemon_factory(config)
    d1.call("workspace.open", {"agent_id": "w", "config": {"auto_memory_interval": 7}})
    fake.script(*note_reply("tea", "- Drinks green tea"))
    r = d1.call("memory.add_turns", {"agent_id": "w", "session_id": "s0", "flush": True,
                                     "messages": [{"role": "user", "content": "I drink tea."},
                                                  {"role": "assistant", "content": "ok"}]})
    assert wait_job(d1, r["job_id"])["state"] == "succeeded"
    pending = d1.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
        {"role": "user", "content": "My locker code is on the blue card."},
        {"role": "assistant", "content": "Noted."}]})
    assert pending["pending_messages"] == 2
    inbox = d1.call("inbox.list", {"agent_id": "w"})["items"]
    assert len(inbox) == 1

    masked = d1.call("backup.create", {})
    with zipfile.ZipFile(masked["file"]) as zf:
        names = set(zf.namelist())
        assert "daemon/config.toml" in names and "daemon/workspaces.json" in names
        assert "agents/w/mem_metadata/sessions/pending.jsonl" in names
        assert "agents/w/mem_metadata/inbox/inbox.jsonl" in names
        text = zf.read("daemon/config.toml").decode()
        assert SECRET not in text and 'api_key = ""' in text and fake.url in text
    full = d1.call("backup.create", {"include_secrets": True})
    with zipfile.ZipFile(full["file"]) as zf:
        assert zf.read("daemon/config.toml").decode() == config
    d1.kill()  # the original machine is gone; nothing more was flushed

    d2 = daemon_factory(None)
    assert d2.socket_path != d1.socket_path and not d2.config_path.exists()
    restored = d2.call("backup.restore", {"file": full["file"]}, timeout=60)
    assert restored["config_restored"] is True
    assert d2.config_path.read_text() == config
    # Its workspace settings (the chat model) apply to the restored workspace at once.
    listed = {w["agent_id"]: w for w in d2.call("workspace.list")["workspaces"]}
    assert listed["w"]["settings"]["auto_memory_interval"] == 7  # as it was opened
    assert listed["w"]["settings"]["chat_model_config"]["model_name"] == "m"
    assert d2.call("inbox.list", {"agent_id": "w"})["items"] == inbox
    fake.script(*note_reply("locker", "- Locker code is on the blue card"))
    flushed = d2.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "flush": True})
    assert flushed["pending_messages"] == 2
    job = wait_job(d2, flushed["job_id"])
    assert job["state"] == "succeeded", job
    root = Path(listed["w"]["path"])
    assert "blue card" in (root / job["result"]["note"]).read_text()
    prompt = fake.requests[-2].json["messages"][1]["content"]
    assert "My locker code is on the blue card." in prompt
    # And the whole config at the next start: the same workspace, settings and inbox.
    assert d2.stop() == 0
    d3 = daemon_factory(None, XDG_DATA_HOME=d2.env["XDG_DATA_HOME"],
                        XDG_CONFIG_HOME=d2.env["XDG_CONFIG_HOME"])
    listed = {w["agent_id"]: w for w in d3.call("workspace.list")["workspaces"]}
    assert listed["w"]["state"] == "ready"
    assert listed["w"]["settings"]["auto_memory_interval"] == 7
    assert d3.call("inbox.list", {"agent_id": "w"})["items"][:1] == inbox
    assert d3.call("memory.add_turns", {"agent_id": "w", "session_id": "s1"})[
        "pending_messages"] == 0


CHAT_KEY = "sk-agent-" + "Zx9Cv8Bn7Mq6Lw5Ke4"
EMBED_KEY = "dsk-embed-" + "Pp3Oo2Ii1Uu0Yy9Tt8"


def handed_over(fake: FakeProvider) -> dict[str, Any]:
    """The overrides an AgentScope middleware sends for the agent's own models."""
    return {"chat_model_config": {"base_url": f"{fake.url}/v1", "api_key": CHAT_KEY,
                                  "model_name": "agent-chat"},
            "embedding_model_config": {"backend": "openai", "base_url": f"{fake.url}/v1",
                                       "api_key": EMBED_KEY, "model_name": "agent-embed",
                                       "dimensions": 8}}


def test_model_keys_handed_over_by_agents_stay_out_of_backups(
        daemon_factory: Any, fake: FakeProvider) -> None:
    from test_cli import recalld

    d1 = daemon_factory(None)
    d1.call("workspace.open", {"agent_id": "coder", "config": handed_over(fake)})
    d1.call("workspace.open", {"agent_id": "writer.v2", "config": {
        "chat_model_config": {"base_url": "https://u:pg-Secret-99@example.org/v1",
                              "model_name": "x"}}})
    d1.call("workspace.open", {"agent_id": "plain", "config": {"auto_memory_interval": 3}})
    record = (d1.data_dir / "state" / "workspaces.json").read_text()
    assert CHAT_KEY in record and EMBED_KEY in record  # the daemon needs them to run

    masked = d1.call("backup.create", {})
    with zipfile.ZipFile(masked["file"]) as zf:
        text = zf.read("daemon/workspaces.json").decode()
        meta = json.loads(zf.read("meta.json"))
    assert CHAT_KEY not in text and EMBED_KEY not in text and "pg-Secret-99" not in text
    assert "agent-chat" in text and '"auto_memory_interval":3' in text
    assert meta["secrets_left_out"] == {
        "coder": ["chat_model_config.api_key", "embedding_model_config.api_key"],
        "writer.v2": ["chat_model_config.base_url"]}
    assert masked["secrets_left_out"] == meta["secrets_left_out"]
    full = d1.call("backup.create", {"include_secrets": True})
    with zipfile.ZipFile(full["file"]) as zf:
        assert CHAT_KEY in zf.read("daemon/workspaces.json").decode()
        assert json.loads(zf.read("meta.json"))["secrets_left_out"] == {}
    d1.kill()

    # Restored with the keys: they are back, nothing is reported missing.
    d2 = daemon_factory(None)
    restored = d2.call("backup.restore", {"file": full["file"]}, timeout=120)
    assert all("secrets_left_out" not in r for r in restored["restored"]), restored
    assert CHAT_KEY in (d2.data_dir / "state" / "workspaces.json").read_text()
    status = d2.call("daemon.status")
    assert all("secrets_left_out" not in w for w in status["workspaces"])

    # Restored without them: the result, status and workspace.list say what is missing.
    d3 = daemon_factory(None)
    restored = d3.call("backup.restore", {"file": masked["file"]}, timeout=120)
    by_agent = {r["agent_id"]: r for r in restored["restored"]}
    assert by_agent["coder"]["secrets_left_out"] == ["chat_model_config.api_key",
                                                     "embedding_model_config.api_key"]
    assert "hand it over again" in by_agent["coder"]["warning"]
    assert by_agent["writer.v2"]["secrets_left_out"] == ["chat_model_config.base_url"]
    assert "secrets_left_out" not in by_agent["plain"]
    assert CHAT_KEY not in (d3.data_dir / "state" / "workspaces.json").read_text()
    human = recalld("status", env=d3.env)
    assert human.returncode == 0, human.stderr
    assert ("chat_model_config.api_key, embedding_model_config.api_key was left out of the "
            "backup") in human.stdout
    assert "hand its model over again" in human.stdout
    # It stays said across a restart, until the agent hands its model over again.
    assert d3.stop() == 0
    # A key set in the config file instead counts as handed over.
    d4 = daemon_factory('[workspaces.coder.chat_model_config]\napi_key = "from-the-file"\n',
                        XDG_DATA_HOME=d3.env["XDG_DATA_HOME"])
    listed = {w["agent_id"]: w for w in d4.call("workspace.list")["workspaces"]}
    assert listed["coder"]["secrets_left_out"] == ["embedding_model_config.api_key"]
    info = d4.call("workspace.open", {"agent_id": "coder", "config": handed_over(fake)})
    assert info["settings"]["chat_model_config"]["api_key"] == "***"  # in use, masked
    assert "secrets_left_out" not in info
    listed = {w["agent_id"]: w for w in d4.call("workspace.list")["workspaces"]}
    assert "secrets_left_out" not in listed["coder"]
    assert listed["writer.v2"]["secrets_left_out"] == ["chat_model_config.base_url"]
    assert CHAT_KEY in (d4.data_dir / "state" / "workspaces.json").read_text()


def test_several_workspaces_and_sessions_resume_from_a_backup(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    from test_capture_many import scripted_model, session_notes

    fake.chat_default = scripted_model
    config = ("[workspace_defaults]\nauto_memory_idle_s = 0\nauto_memory_interval = 0\n"
              "[workspace_defaults.chat_model_config]\n"
              f'base_url = "{fake.url}/v1"\napi_key = "{SECRET}"\nmodel_name = "m"\n'
              f'[workspaces."team.notes"]\npath = "{tmp_path / "team"}"\n')
    turns = {"研究助手": {"s-1": "我们下周三在杭州开会。", "s:2": "预算上限是五万元。"},
             "team.notes": {"sprint@42": "リリースは金曜日です。",
                            "s-1": "The release train leaves on Friday 🚆"}}
    d1 = daemon_factory(config)
    d1.call("workspace.open", {"agent_id": "research-2", "path": str(tmp_path / "r")})
    agent_of = {"研究助手": "research-2", "team.notes": "team.notes"}
    # One conversation of each workspace is written now (an inbox item), the rest waits.
    for label, sessions in turns.items():
        agent = agent_of[label]
        first, *rest = sessions.items()
        done = d1.call("memory.add_turns", {"agent_id": agent, "session_id": first[0],
                                            "flush": True, "messages": [
                                                {"role": "user", "content": first[1]}]})
        assert wait_job(d1, agent=agent, job_id=done["job_id"])["state"] == "succeeded"
        for session, text in rest:
            d1.call("memory.add_turns", {"agent_id": agent, "session_id": session,
                                         "messages": [{"role": "user", "content": text}]})
    inbox = {a: d1.call("inbox.list", {"agent_id": a})["items"] for a in agent_of.values()}
    assert all(len(items) == 1 for items in inbox.values()), inbox
    archive = d1.call("backup.create", {"include_secrets": True})["file"]
    d1.kill()

    d2 = daemon_factory(None)  # another machine: empty, its own socket and data dir
    restored = d2.call("backup.restore", {"file": archive}, timeout=120)
    assert restored["config_restored"] is True and restored["config_error"] is None
    assert d2.config_path.read_text() == config
    listed = {w["agent_id"]: w for w in d2.call("workspace.list")["workspaces"]}
    # The workspace the config file places goes where it says; the restored settings
    # (its chat model) apply to the restored workspaces at once, without a restart.
    assert listed["team.notes"]["path"] == str((tmp_path / "team").resolve())
    for label, sessions in turns.items():
        agent = agent_of[label]
        assert listed[agent]["state"] == "ready", listed
        assert d2.call("inbox.list", {"agent_id": agent})["items"] == inbox[agent]
        root = Path(listed[agent]["path"])
        _, *rest = sessions.items()
        for session, text in rest:
            flushed = d2.call("memory.add_turns", {"agent_id": agent, "session_id": session,
                                                   "flush": True})
            assert flushed["pending_messages"] == 1, (agent, session, flushed)
            assert wait_job(d2, agent=agent, job_id=flushed["job_id"])["state"] == "succeeded"
            (note,) = session_notes(root, session)
            assert text in note.read_text(encoding="utf-8"), (agent, session)




def test_a_shared_workspaces_server_password_stays_out_of_backups(daemon_factory: Any) -> None:
    # A DSN holds its password in its text (a URI's user part or parameters, a keyword):
    # a backup without secrets keeps the server and drops the password, wherever it is.
    passwords = ["Pa#ss?w0rd&x", "s3 cr3t'q", "Zz9-uri-param"]
    config = ('[workspaces.team]\nremote = { kind = "postgres", name = "team", dsn = '
              '"postgresql://sec:Pa%23ss%3Fw0rd%26x@127.0.0.1:9/mem" }\n')
    d1 = daemon_factory(config)
    d1.call("workspace.open", {"agent_id": "ops", "config": {"remote": {
        "kind": "postgres", "name": "ops",
        "dsn": "host=127.0.0.1 port=9 user=u password='s3 cr3t\\'q' dbname=m"}}})
    d1.call("workspace.open", {"agent_id": "lab", "config": {"remote": {
        "kind": "postgres", "name": "lab",
        "dsn": "postgresql://u@127.0.0.1:9/m?password=Zz9-uri-param&sslmode=disable"}}})
    masked = d1.call("backup.create", {})
    with zipfile.ZipFile(masked["file"]) as zf:
        text = zf.read("daemon/config.toml").decode() + zf.read("daemon/workspaces.json").decode()
        meta = json.loads(zf.read("meta.json"))
    for password in [*passwords, "Pa%23ss"]:
        assert password not in text, password
    assert "127.0.0.1" in text and "sslmode=disable" in text  # the servers are kept
    assert meta["secrets_left_out"] == {"ops": ["remote.dsn"], "lab": ["remote.dsn"]}


def test_keys_in_url_parameters_stay_out_of_backups(daemon_factory: Any) -> None:
    """A key handed over in a base_url's query (Gemini's ``?key=``, a gateway's
    ``&api-key=``), or in one the config file names, as the settings mask it."""
    query_key = "AIza" + "Sy9Zq8Wx7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9F"
    file_key = "tok-" + "Qw3Er4Ty5Ui6Op7As8Df9"
    d = daemon_factory(
        '[workspaces.gw.chat_model_config]\n'
        f'base_url = "https://u:pg-Secret-77@gw.example.org/v1?token={file_key}&region=eu"\n')
    d.call("workspace.open", {"agent_id": "gem", "config": {"embedding_model_config": {
        "backend": "gemini", "base_url": f"https://gen.example.org/v1beta?key={query_key}",
        "model_name": "e", "dimensions": 8}}})
    d.call("workspace.open", {"agent_id": "proxy", "config": {"chat_model_config": {
        "base_url": f"https://proxy.example.org/v1?region=eu&api-key={query_key}#x",
        "model_name": "m"}}})
    masked = d.call("backup.create", {})
    with zipfile.ZipFile(masked["file"]) as zf:
        text = zf.read("daemon/workspaces.json").decode() + zf.read("daemon/config.toml").decode()
    for secret in (query_key, file_key, "pg-Secret-77"):
        assert secret not in text, secret
    assert "region=eu&api-key=#x" in text and "?token=&region=eu" in text
    assert masked["secrets_left_out"] == {"gem": ["embedding_model_config.base_url"],
                                          "proxy": ["chat_model_config.base_url"]}
    full = d.call("backup.create", {"include_secrets": True})
    with zipfile.ZipFile(full["file"]) as zf:
        text = zf.read("daemon/workspaces.json").decode() + zf.read("daemon/config.toml").decode()
    assert query_key in text and file_key in text
