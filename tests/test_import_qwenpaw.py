"""``recalld import-qwenpaw``: a QwenPaw workspace opened in place, with what was reused
(ReMe's damaged or unread stores are in ``test_import_reme_reports.py``, agent ids in
``test_import_agent_ids.py``)."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from clirun import run_recalld
from conftest import DaemonHandle
from reme_fixture_util import (
    BASE_URL,
    DIMS,
    MODEL,
    copy_fixture,
    fixture_notes,
    fixture_provider,
    passage_texts,
)
from test_qwenpaw_config import qwenpaw_memory_config
from waits import wait_value

from recalld.daemon.index import reme_import
from recalld.ipc.errors import InvalidParams


def cli(d: DaemonHandle, *args: str) -> subprocess.CompletedProcess[str]:
    return run_recalld(["--socket", str(d.socket_path), *args],
                       env={**d.env, "RECALLD_EMBEDDING_API_KEY": "k"}, timeout=300)


def agent_json(batch: int = 4) -> dict[str, Any]:
    memory = qwenpaw_memory_config()
    memory["embedding_model_config"].update(
        base_url=BASE_URL, model_name=MODEL, dimensions=DIMS, api_key="k",
        max_batch_size=batch, use_dimensions=False, max_input_length=8192)
    memory["dream_cron_enabled"] = False
    return {"id": "coder", "name": "Coder", "running": {"reme_light_memory_config": memory}}


def test_import_reports_what_was_found_and_reused(daemon: DaemonHandle,
                                                  tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "coder-ws")
    (ws / "agent.json").write_text(json.dumps(agent_json()), "utf-8")
    stored = reme_import.read_store(ws / "mem_metadata")
    assert stored is not None
    with fixture_provider() as fake:
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        info = json.loads(proc.stdout)
        assert info["agent_id"] == "coder" and info["path"] == str(ws)
        rep = info["import"]
        assert rep["complete"] is True
        assert rep["notes"] == len(fixture_notes())
        assert rep["chunks"] == {"total": len(stored), "reme_boundaries": len(stored)}
        vec = rep["vectors"]
        assert vec["reused_from_reme"] == len(stored)
        assert vec["to_embed"] == 0 and vec["estimated_provider_calls"] == 0
        assert rep["dream"]["reme_catalog"] is True and rep["dream"]["recognised"] == 20
        settings = rep["settings"]
        assert settings["applied"]["embedding_model_config.model_name"] == MODEL
        assert settings["applied"]["embedding_model_config.api_key"] == "***"
        assert settings["applied"]["dream_cron_enabled"] is False
        assert "auto_memory_search_config" in settings["ignored"]
        assert "reranker" in settings["ignored"]["reranker_config"]
        assert "embedding_model_config.health_check_timeout" in settings["ignored"]
        assert passage_texts(fake) == []

        # Notes changed since ReMe embedded them: the report says what is still to pay.
        # The folder moves to another agent: the old one's record is forgotten first.
        daemon.call("workspace.close", {"agent_id": "coder", "forget": True})
        for rel in fixture_notes()[-6:]:
            with (ws / rel).open("a", encoding="utf-8") as f:
                f.write("\nA line ReMe never saw.\n")
        proc = cli(daemon, "import-qwenpaw", str(ws), "--agent", "coder2")
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        assert "opened " + str(ws) + " as agent coder2" in text
        assert "settings ignored:" in text and "reranker_config:" in text
        proc = cli(daemon, "--json", "workspace", "list")
        assert proc.returncode == 0
        answer = json.loads(proc.stdout)
        assert any(w["agent_id"] == "coder2" for w in answer)
    d2 = daemon.call("workspace.open", {"agent_id": "coder2", "path": str(ws),
                                        "import_report": True})["import"]["vectors"]
    # A line added to a note leaves ReMe's chunks of it as they were: every one is still
    # reused, and only the added lines are to pay (or were, by the backfill meanwhile).
    assert d2["reused_from_reme"] == len(stored)
    assert d2["estimated_provider_calls"] == math.ceil(d2["to_embed"] / 4)


def test_import_without_agent_json_or_vectors(daemon: DaemonHandle, tmp_path: Path) -> None:
    ws = copy_fixture(tmp_path / "plain")
    proc = cli(daemon, "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    assert "as agent plain" in proc.stdout
    assert "vectors:  off" in proc.stdout
    assert "dream:    20 notes ReMe consolidated" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", "utf-8")
    proc = cli(daemon, "import-qwenpaw", str(ws), "--agent-json", str(bad))
    assert proc.returncode == 2
    assert "not valid JSON" in proc.stderr
    proc = cli(daemon, "import-qwenpaw", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "not a directory" in proc.stderr


def test_import_of_an_agent_json_without_memory_settings(daemon: DaemonHandle,
                                                         tmp_path: Path) -> None:
    # QwenPaw's `running` holds more than memory (max_iters, context settings...); an
    # agent.json whose memory settings are left out (or null) means QwenPaw's defaults.
    running = {"max_iters": 50, "max_input_length": 131072, "llm_retry_enabled": True,
               "light_context_config": {"strategy": "scroll"}}
    # A hand-written one may have no `running` part at all, or a null one.
    for name, parts in (("bare", {"running": running}),
                        ("nulled", {"running": {**running, "reme_light_memory_config": None}}),
                        ("unrun", {}), ("nullrun", {"running": None})):
        ws = tmp_path / name
        (ws / "memory" / "2026-01-02").mkdir(parents=True)
        (ws / "memory" / "2026-01-02" / "n.md").write_text("- the fern is on the balcony\n")
        (ws / "agent.json").write_text(json.dumps(
            {"id": f"paw-{name}", "name": "Paw", "language": "zh",
             "channels": {"console": {"enabled": True}}, **parts}), "utf-8")
        proc = cli(daemon, "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        assert f"as agent paw-{name}" in proc.stdout and "notes:    1" in proc.stdout
        hits = daemon.call("memory.search", {"agent_id": f"paw-{name}", "query": "fern"})
        assert [h["path"] for h in hits["results"]] == ["memory/2026-01-02/n.md"]


def test_the_estimate_counts_what_the_provider_will_be_asked(daemon: DaemonHandle,
                                                             tmp_path: Path) -> None:
    # Another model: nothing of ReMe's is reused, and long chunks go out as their windows.
    ws = copy_fixture(tmp_path / "other-ws")
    config = agent_json(batch=4)
    config["running"]["reme_light_memory_config"]["embedding_model_config"][
        "model_name"] = "other"
    (ws / "agent.json").write_text(json.dumps(config), "utf-8")
    with fixture_provider() as fake:
        gate = fake.gate(lambda body: body.get("input") != ["ping"])
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
        gate.open()
        assert proc.returncode == 0, proc.stderr
        vec = json.loads(proc.stdout)["import"]["vectors"]
        wait_value(lambda: daemon.call("daemon.status")["workspaces"],
                   lambda wss: any(w["agent_id"] == "coder" and w["index"]["vectors"]["state"]
                                   == "idle" and w["index"]["vectors"]["coverage"] == 1.0
                                   for w in wss), "every vector")
        sent = passage_texts(fake)
        assert vec["reused_from_reme"] == 0
        assert vec["to_embed"] == len(set(sent)) > len(fixture_notes())
        assert vec["estimated_provider_calls"] == math.ceil(len(set(sent)) / 4)


def test_qwenpaws_default_agent_beside_recallds_default_workspace(daemon: DaemonHandle,
                                                                  tmp_path: Path) -> None:
    # QwenPaw's first agent is `default`, the name of recalld's own workspace (open).
    ws = tmp_path / "qwenpaw" / "workspaces" / "default"
    (ws / "memory" / "2026-01-02").mkdir(parents=True)
    (ws / "memory" / "2026-01-02" / "n.md").write_text("- the fern is on the balcony\n")
    (ws / "agent.json").write_text(json.dumps({"id": "default", "running": {}}), "utf-8")
    for _ in range(2):  # the same id at every import
        proc = cli(daemon, "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        assert f"opened {ws} as agent qwenpaw-default" in proc.stdout
    hits = daemon.call("memory.search", {"agent_id": "qwenpaw-default", "query": "fern"})
    assert [h["path"] for h in hits["results"]] == ["memory/2026-01-02/n.md"]
    # Named explicitly, the id is taken as given (and refused while it serves elsewhere).
    proc = cli(daemon, "import-qwenpaw", str(ws), "--agent", "default")
    assert proc.returncode == 2 and "already open" in proc.stderr


def test_the_import_report_masks_url_secrets_as_settings_do(daemon: DaemonHandle,
                                                            tmp_path: Path) -> None:
    ws = tmp_path / "keyed"
    (ws / "memory" / "2026-01-02").mkdir(parents=True)
    (ws / "memory" / "2026-01-02" / "n.md").write_text("- the fern is on the balcony\n")
    config = {"chat_model_config": {"base_url": "https://me:Pw-81xq@gw.example.org/v1",
                                    "api_key": "chat-Key-77", "model_name": "m"},
              "embedding_model_config": {"base_url": "https://e.example.org/v1?key=AIza-Q9z",
                                         "model_name": "e", "dimensions": 8}}
    info = daemon.call("workspace.open", {"agent_id": "keyed", "path": str(ws),
                                          "config": config, "import_report": True})
    applied = info["import"]["settings"]["applied"]
    assert applied["chat_model_config.base_url"] == "https://me:***@gw.example.org/v1"
    assert applied["embedding_model_config.base_url"] == "https://e.example.org/v1?key=***"
    assert applied["chat_model_config.api_key"] == "***"
    assert not any(s in json.dumps(info) for s in ("Pw-81xq", "AIza-Q9z", "chat-Key-77"))


def test_settings_of_a_workspace_open_already_are_not_reported_as_applied(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The workspace serves already (without QwenPaw's settings): an import does not
    # change them until it is opened again, and says so rather than "applied".
    ws = tmp_path / "paw"
    (ws / "memory" / "2026-01-02").mkdir(parents=True)
    (ws / "memory" / "2026-01-02" / "n.md").write_text("- the fern is on the balcony\n")
    memory = {"dream_cron": "", "embedding_model_config": {
        "backend": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-paw",
        "model_name": "paw-embed", "dimensions": 8}}
    (ws / "agent.json").write_text(json.dumps(
        {"id": "paw", "running": {"reme_light_memory_config": memory}}), "utf-8")
    daemon.call("workspace.open", {"agent_id": "paw", "path": str(ws)})
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)["import"]["settings"]
    assert settings["not_applied"]["embedding_model_config.model_name"] == ""
    assert settings["not_applied"]["dream_cron_enabled"] is True
    assert "embedding_model_config.model_name" not in settings["applied"]
    assert "sk-paw" not in proc.stdout
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert "settings not in use: paw was open already" in text, text
    # Opened again, they apply (an empty dream_cron turns the dream off).
    daemon.call("workspace.close", {"agent_id": "paw"})
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)["import"]["settings"]
    assert "not_applied" not in settings
    assert settings["applied"]["embedding_model_config.model_name"] == "paw-embed"
    assert settings["applied"]["dream_cron_enabled"] is False


def test_qwenpaws_home_is_not_imported_as_one_workspace(daemon: DaemonHandle,
                                                        tmp_path: Path) -> None:
    # ~/.qwenpaw (moved here from another machine) lists its agents in config.json; served
    # as one workspace it would hold all of theirs and keep each from being imported.
    home = tmp_path / "qwenpaw"
    for folder in ("workspaces/default", "elsewhere/my writer"):
        (home / folder / "memory" / "2026-01-02").mkdir(parents=True)
        (home / folder / "memory" / "2026-01-02" / "n.md").write_text("- the fern\n")
    (home / "config.json").write_text(json.dumps({"agents": {"profiles": {
        "default": {"id": "default", "workspace_dir": "/home/ada/.qwenpaw/workspaces/default"},
        "writer": {"id": "writer", "workspace_dir": str(home / "elsewhere/my writer")}}}}))
    proc = cli(daemon, "import-qwenpaw", str(home))
    assert proc.returncode == 2, proc.stdout
    assert f"{home} is QwenPaw's home, not an agent's workspace" in proc.stderr
    assert f"default: recalld import-qwenpaw {home / 'workspaces/default'};" in proc.stderr
    # A folder named with a space is quoted: the command given works as it is pasted.
    suggested = f"recalld import-qwenpaw {shlex.quote(str(home / 'elsewhere/my writer'))}"
    assert f"writer: {suggested})" in proc.stderr
    assert shlex.split(suggested)[-1] == str(home / "elsewhere/my writer")
    assert sorted(p.name for p in home.iterdir()) == ["config.json", "elsewhere", "workspaces"]
    for folder in ("workspaces/default", "elsewhere/my writer"):
        proc = cli(daemon, "import-qwenpaw", str(home / folder))
        assert proc.returncode == 0 and "notes:    1" in proc.stdout, proc.stderr


def test_the_folders_holding_qwenpaws_agents_are_refused_by_the_daemon_too(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # workspace.open (a client, the MCP bridge, `workspace open --path`) served
    # ~/.qwenpaw/workspaces as one workspace, its folders made among the agents', which
    # `import-qwenpaw` refuses.
    home = tmp_path / "Qwen Paw"
    agents = home / "workspaces"
    for agent in ("coder", "the-writer"):
        (agents / agent / "memory").mkdir(parents=True)
        (agents / agent / "agent.json").write_text(json.dumps({"id": agent}))
    (home / "config.json").write_text(json.dumps({"agents": {"profiles": {
        "coder": {"id": "coder"}, "the-writer": {"id": "the-writer"}}}}))
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    for folder in (agents, home):
        said = cli(daemon, "import-qwenpaw", str(folder)).stderr.strip()
        assert said.startswith("recalld: ") and "recalld import-qwenpaw " in said, said
        for config in (None, {"daily_dir": "memory"}):
            with pytest.raises(InvalidParams) as refused:
                daemon.call("workspace.open", {"agent_id": "paws", "path": str(folder),
                                               **({"config": config} if config else {})})
            assert f"recalld: {refused.value.message} (code -32602)" == said, said
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    assert "paws" not in [w["agent_id"] for w in daemon.call("workspace.list")["workspaces"]]
    # A folder holding recalld's own workspaces (no agent.json) is no QwenPaw folder.
    outer = tmp_path / "team"
    daemon.call("workspace.open", {"agent_id": "inner", "path": str(outer / "inner"),
                                   "config": {"shared_with": ["outer"]}})
    opened = daemon.call("workspace.open", {"agent_id": "outer", "path": str(outer),
                                            "config": {"shared_with": ["inner"]}})
    assert opened["state"] == "ready"


def test_status_after_an_import_does_not_wait_for_a_scan_already_made(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # An import with vectors: the vector service waits for the index while the first
    # reconcile applies what its scan found, so health starts after that scan. It must
    # not then wait 30 s for a scan that came already ("first disk scan under way").
    from fakes.provider_server import FakeProvider

    with FakeProvider(dims=8) as fake:
        for n in range(3):
            ws = tmp_path / f"paw{n}"
            (ws / "memory" / "2026-01-02").mkdir(parents=True)
            for i in range(200):
                (ws / "memory" / "2026-01-02" / f"n{i}.md").write_text(f"- fern {i}\n")
            config = {"embedding_model_config": {
                "backend": "openai", "base_url": fake.url + "/v1", "api_key": "k",
                "model_name": f"embed-{n}", "dimensions": 8}}
            daemon.call("workspace.open", {"agent_id": f"paw{n}", "path": str(ws),
                                           "config": config, "import_report": True})

            def reasons(agent: str = f"paw{n}") -> list[str]:
                listed = daemon.call("daemon.status")["workspaces"]
                return next(w["health"]["reasons"] for w in listed if w["agent_id"] == agent)

            wait_value(reasons, lambda r: not any("first disk scan" in x for x in r),
                       "the first disk scan", deadline_s=10.0)
            daemon.call("workspace.close", {"agent_id": f"paw{n}", "forget": True})
