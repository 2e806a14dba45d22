"""QwenPaw's memory settings are accepted as QwenPaw writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonHandle

from recalld.daemon import config, qwenpaw

ROOT = Path(__file__).resolve().parents[1]


def qwenpaw_memory_config() -> dict[str, Any]:
    """Every field of QwenPaw's ``reme_light_memory_config``, current and older releases."""
    return {
        "metadata_dir": "mem_metadata", "session_dir": "mem_session",
        "mem_session_dir": "mem_agent", "resource_dir": "resource", "daily_dir": "memory",
        "digest_dir": "digest", "summarize_when_compact": True, "inbox_push_enabled": None,
        "auto_memory_inbox_push_enabled": True, "auto_dream_inbox_push_enabled": True,
        "daily_paper_inbox_push_enabled": True, "auto_fin_inbox_push_enabled": True,
        "auto_memory_interval": 7, "dream_cron_enabled": True, "dream_cron": "30 22 * * *",
        "daily_paper_cron_enabled": False, "daily_paper_cron": "0 9 * * *",
        "daily_paper_use_hf_mirror": False, "daily_paper_topics": "",
        "auto_fin_cron_enabled": False, "auto_fin_cron": "0 18 * * *",
        "auto_fin_topics": "gold,robotics,semiconductors", "auto_fin_window_hours": 24,
        "auto_memory_search_config": {
            "enabled": True, "max_results": 2, "min_score": 0.3, "timeout": 10.0,
            "enhanced_search_enabled": False, "reflection_enabled": True,
            "persist_to_context": False},
        "embedding_model_config": {
            "backend": "openai", "api_key": "sk-test", "base_url": "http://127.0.0.1:9/v1",
            "model_name": "text-embedding-v4", "dimensions": 256, "enable_cache": True,
            "use_dimensions": True, "max_cache_size": 3000, "max_input_length": 4096,
            "max_batch_size": 8, "health_check_timeout": 15.0},
        "reranker_config": {
            "enabled": False, "api_key": "", "base_url": "", "model_name": "",
            "candidate_multiplier": 3, "timeout": 10.0},
        "needs_reindex": False, "pending_reindex_embedding_config": None,
        "memory_search_enabled": True, "rebuild_memory_index_on_start": False,
        "recursive_file_watcher": False, "enable_search_raw_log": False,
        "file_watcher": {"backend": "full", "file_store": "default",
                         "suffix_filters": [".md"], "recursive": False,
                         "rebuild_index_on_start": False, "watch_paths": []},
    }


def test_every_qwenpaw_field_is_accepted_and_the_honoured_ones_apply() -> None:
    s = config.WorkspaceSettings().merged(qwenpaw_memory_config())
    assert s.auto_memory_interval == 7
    assert s.dream_cron == "30 22 * * *"
    emb = s.embedding_model_config
    assert (emb.model_name, emb.dimensions, emb.max_batch_size, emb.max_cache_size,
            emb.max_input_length, emb.use_dimensions) == (
        "text-embedding-v4", 256, 8, 3000, 4096, True)
    assert s.inbox_push_enabled is True  # None is QwenPaw's "not set"
    ignored = set(s.ignored_fields)
    assert "auto_memory_search_config" in ignored
    assert "embedding_model_config.health_check_timeout" in ignored
    assert "file_watcher" in ignored
    assert not ignored & {"dream_cron", "auto_memory_interval", "daily_dir"}


def test_a_whole_agent_json_is_taken_as_is() -> None:
    agent = {"id": "coder", "name": "Coder", "channels": {"console": {}},
             "running": {"max_iters": 50, "reme_light_memory_config": qwenpaw_memory_config()}}
    s = config.WorkspaceSettings().merged(agent)
    assert s.embedding_model_config.dimensions == 256
    assert "reranker_config" in s.ignored_fields


def test_a_null_table_is_not_set(daemon: DaemonHandle) -> None:
    """A table given as null (pydantic's None in a QwenPaw file, JSON from a client) is
    not set: the workspace keeps the table it had; a chat model or a remote is off."""
    base = config.WorkspaceSettings()
    for table in ("embedding_model_config", "search"):
        assert getattr(base.merged({table: None}), table) == getattr(base, table)
    assert base.merged({"chat_model_config": None}).chat_model_config is None
    for table in ("embedding_model_config", "search", "chat_model_config", "remote"):
        opened = daemon.call("workspace.open", {"agent_id": f"null-{table.replace('_', '-')}",
                                                "config": {table: None}})
        assert opened["state"] == "ready", opened
    assert opened["settings"]["search"]["fusion"] == base.search.fusion


def test_a_negative_auto_memory_interval_turns_it_off(daemon: DaemonHandle) -> None:
    # QwenPaw: "None or <= 0 disables periodic auto memory".
    agent = {"id": "paw", "running": {"reme_light_memory_config": {
        **qwenpaw_memory_config(), "auto_memory_interval": -1}}}
    opened = daemon.call("workspace.open", {"agent_id": "paw", "config": agent})
    assert opened["state"] == "ready", opened
    assert opened["settings"]["auto_memory_interval"] == 0


def test_an_empty_dream_cron_turns_the_dream_off() -> None:
    s = config.WorkspaceSettings().merged({"dream_cron": ""})
    assert s.dream_cron_enabled is False
    assert s.dream_cron == config.WorkspaceSettings().dream_cron


@pytest.mark.parametrize("section", sorted(qwenpaw.KNOWN_SECTIONS))
def test_a_misspelt_key_in_an_ignored_section_is_refused(section: str) -> None:
    with pytest.raises(config.ConfigError, match=f"{section}: unknown field"):
        config.WorkspaceSettings().merged({section: {"enabeld": True}})


def test_unknown_top_level_fields_are_still_refused() -> None:
    with pytest.raises(config.ConfigError, match="unknown field"):
        config.WorkspaceSettings().merged({"dream_crn": "0 1 * * *"})
    with pytest.raises(config.ConfigError, match="ignored_fields"):
        config.WorkspaceSettings().merged({"ignored_fields": []})


def test_the_config_file_can_include_an_agent_json(tmp_path: Path) -> None:
    agent = tmp_path / "agent.json"
    agent.write_text(json.dumps(
        {"running": {"reme_light_memory_config": qwenpaw_memory_config()}}), "utf-8")
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text('[workspaces.coder]\nqwenpaw_agent_json = "agent.json"\n'
                        "auto_memory_interval = 3\n", "utf-8")
    cfg = config.load(config=cfg_file, environ={"HOME": str(tmp_path)})
    s = cfg.workspace_settings("coder")
    assert s.auto_memory_interval == 3  # the TOML table over the included file
    assert s.embedding_model_config.dimensions == 256
    assert "needs_reindex" in s.ignored_fields
    bad = tmp_path / "bad.toml"
    bad.write_text('[workspaces.coder]\nqwenpaw_agent_json = "missing.json"\n', "utf-8")
    with pytest.raises(config.ConfigError, match=r"missing\.json"):
        config.load(config=bad, environ={"HOME": str(tmp_path)})


def test_the_readme_lists_every_ignored_field_with_its_reason() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    for name in [*qwenpaw.IGNORED_WORKSPACE, *(f"embedding_model_config.{k}"
                                               for k in qwenpaw.IGNORED_EMBEDDING)]:
        assert f"`{name}`" in readme, name


def test_an_agent_json_without_memory_settings_means_the_defaults() -> None:
    running = {"max_iters": 50, "max_input_length": 131072, "memory_compact_ratio": 0.75}
    for agent in ({"id": "paw", "running": running},
                  {"id": "paw", "running": {**running, "reme_light_memory_config": None}}):
        assert config.WorkspaceSettings().merged(agent) == config.WorkspaceSettings()


@pytest.mark.parametrize("agent_id", [5, None, ["paw"], {"name": "paw"}, True])
def test_an_agent_json_whose_id_is_not_a_string_is_refused_naming_the_id(
        agent_id: object) -> None:
    # Not taken for an agent.json, it was refused as "unknown field(s) id".
    for agent in ({"id": agent_id}, {"id": agent_id, "running": {"max_iters": 50}}):
        with pytest.raises(config.ConfigError) as caught:
            config.WorkspaceSettings().merged(agent)
        assert "id (an agent.json's agent id) must be a string" in str(caught.value)
        assert "unknown" not in str(caught.value)


def test_an_agent_json_is_read_as_qwenpaw_reads_it(daemon: DaemonHandle,
                                                   tmp_path: Path) -> None:
    """QwenPaw's models take numbers and switches written as strings (a hand-edited
    agent.json) and ignore fields they do not know (a newer QwenPaw's): such an agent.json
    opens with the values QwenPaw would use, the unknown fields listed as ignored."""
    memory = qwenpaw_memory_config()
    memory.update(auto_memory_interval="12", dream_cron_enabled="false",
                  auto_memory_idle_s="90", memory_graph_config={"enabled": True})
    memory["embedding_model_config"].update(dimensions="512", max_batch_size=16.0,
                                            use_dimensions="yes", rate_limit_rpm=600)
    memory["auto_memory_search_config"]["rerank_top_k"] = 4
    memory["file_watcher"] = {**memory["file_watcher"], "ignore_globs": ["*.tmp"]}
    agent = {"id": "paw", "running": {"reme_light_memory_config": memory}}
    opened = daemon.call("workspace.open", {"agent_id": "paw", "path": str(tmp_path / "paw"),
                                            "config": agent, "import_report": True})
    s = opened["settings"]
    assert (s["auto_memory_interval"], s["dream_cron_enabled"], s["auto_memory_idle_s"]) == (
        12, False, 90.0)
    emb = s["embedding_model_config"]
    assert (emb["dimensions"], emb["max_batch_size"], emb["use_dimensions"]) == (512, 16, True)
    new = {"memory_graph_config", "embedding_model_config.rate_limit_rpm",
           "auto_memory_search_config.rerank_top_k", "file_watcher.ignore_globs"}
    settings = opened["import"]["settings"]
    for name in new:
        assert name in s["ignored_fields"], name
        assert "QwenPaw" in settings["ignored"][name], name
        assert name not in settings["applied"]
    assert settings["applied"]["embedding_model_config.dimensions"] == 512
    assert settings["applied"]["auto_memory_interval"] == 12

    # Given as recalld's own settings (not an agent.json), the same values are refused.
    for bad in ({"auto_memory_interval": "12"}, {"memory_graph_config": {}},
                {"embedding_model_config": {"dimensions": "512"}}):
        with pytest.raises(config.ConfigError):
            config.WorkspaceSettings().merged(bad)
    # What QwenPaw refuses stays refused: a number that is not one.
    memory["embedding_model_config"]["dimensions"] = "many"
    with pytest.raises(config.ConfigError, match="dimensions"):
        config.WorkspaceSettings().merged(agent)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32-le"])
def test_an_agent_json_saved_with_a_byte_order_mark_or_in_utf16_is_read(
        daemon: DaemonHandle, tmp_path: Path, encoding: str) -> None:
    """QwenPaw loads ``agent.json`` with ``json.loads`` of its bytes, which takes UTF-8
    with a byte order mark (a Windows editor's save) and UTF-16 or UTF-32: such a file is
    read by ``recalld import-qwenpaw`` and the config file, and a ``config.json`` so saved
    still marks QwenPaw's home."""
    from test_import_qwenpaw import cli

    home = tmp_path / "qwenpaw"
    ws = home / "workspaces" / "writer"
    (ws / "memory" / "2026-01-02").mkdir(parents=True)
    (ws / "memory" / "2026-01-02" / "n.md").write_text("- the heron\n", "utf-8")
    agent = {"id": "writer", "running": {"reme_light_memory_config": {
        "auto_memory_interval": 9, "dream_cron": "15 4 * * *"}}}
    (ws / "agent.json").write_bytes(json.dumps(agent, indent=2).encode(encoding))
    proc = cli(daemon, "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    assert "auto_memory_interval = 9" in proc.stdout, proc.stdout
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    settings = listed["writer"]["settings"]
    assert (settings["auto_memory_interval"], settings["dream_cron"]) == (9, "15 4 * * *")

    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text('[workspaces.writer]\nqwenpaw_agent_json = '
                        '"qwenpaw/workspaces/writer/agent.json"\n', "utf-8")
    s = config.load(config=cfg_file, environ={"HOME": str(tmp_path)}).workspace_settings(
        "writer")
    assert (s.auto_memory_interval, s.dream_cron) == (9, "15 4 * * *")

    profiles = {"writer": {"id": "writer", "workspace_dir": str(ws)}}
    (home / "config.json").write_bytes(json.dumps({"agents": {"profiles": profiles}})
                                       .encode(encoding))
    proc = cli(daemon, "import-qwenpaw", str(home))
    assert proc.returncode == 2, proc.stdout
    assert f"{home} is QwenPaw's home" in proc.stderr, proc.stderr
    assert not (home / "memory").exists()


def test_a_base_url_with_spaces_around_is_taken_as_qwenpaw_takes_it() -> None:
    # QwenPaw hands ReMe base_url.strip(): a hand-edited agent.json with a space or a
    # line break around the URL works there, and was refused here.
    for url in (" http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1 \n", "\thttp://127.0.0.1:9/v1"):
        agent = {"id": "paw", "running": {"reme_light_memory_config": {
            "embedding_model_config": {"backend": "openai", "base_url": url,
                                       "model_name": "text-embedding-v4"}}}}
        s = config.WorkspaceSettings().merged(agent)
        assert s.embedding_model_config.base_url == "http://127.0.0.1:9/v1", url
    # Given as recalld's own settings, such a value stays refused.
    with pytest.raises(config.ConfigError, match="base_url"):
        config.WorkspaceSettings().merged(
            {"embedding_model_config": {"base_url": " http://127.0.0.1:9/v1"}})


def test_the_import_says_when_no_chat_model_will_run_the_jobs_qwenpaw_ran(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # QwenPaw's agent dreamed with QwenPaw's own model, which recalld does not take over:
    # the report said the dream goes on ("not dreamed again") and nothing about the
    # dream, and auto_memory, failing every night for want of a chat model.
    from test_import_qwenpaw import cli

    ws = tmp_path / "paw"
    (ws / "memory" / "2026-01-02").mkdir(parents=True)
    (ws / "memory" / "2026-01-02" / "n.md").write_text("- the heron\n", "utf-8")
    (ws / "agent.json").write_text(json.dumps({"id": "paw", "active_model": {
        "provider_id": "dashscope", "model": "qwen-max"}}), "utf-8")
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["import"]["chat_model"] is None
    text = cli(daemon, "import-qwenpaw", str(ws)).stdout
    assert ("chat:     no chat model configured: auto_memory and the dream do not run until "
            "chat_model_config is set") in text, text
    other = tmp_path / "other"
    (other / "memory").mkdir(parents=True)
    (other / "agent.json").write_text(json.dumps({"id": "other", "running": {
        "reme_light_memory_config": {"chat_model_config": {
            "base_url": "http://127.0.0.1:9/v1", "model_name": "qwen-max"}}}}), "utf-8")
    proc = cli(daemon, "--json", "import-qwenpaw", str(other))
    assert json.loads(proc.stdout)["import"]["chat_model"] == "qwen-max", proc.stdout
    assert "chat:" not in cli(daemon, "import-qwenpaw", str(other)).stdout


def test_a_key_or_model_of_spaces_only_is_none_as_in_qwenpaw(daemon: DaemonHandle,
                                                            tmp_path: Path) -> None:
    # QwenPaw turns vectors on only for model_name.strip() and api_key.strip(): a
    # hand-edited agent.json with "   " there has them off. recalld took "   " for a key
    # and sent it to the provider, or a model name of spaces for a model.
    from recalld.daemon.providers.chat import resolve_chat_api_key
    from recalld.daemon.providers.embedding_keys import resolve_api_key

    for n, (key, model) in enumerate((("   ", "text-embedding-v4"), ("sk-x", " \t"))):
        emb = {"backend": "openai", "api_key": key, "model_name": model,
               "base_url": "http://127.0.0.1:9/v1"}
        agent = {"id": f"paw{n}", "running": {"reme_light_memory_config": {
            "embedding_model_config": emb}}}
        opened = daemon.call("workspace.open", {
            "agent_id": f"paw{n}", "path": str(tmp_path / f"paw{n}"), "config": agent,
            "import_report": True})
        vectors = opened["import"]["vectors"]
        assert not vectors["enabled"], vectors
        assert ("no API key" if n == 0 else "model_name is empty") in vectors[
            "disabled_reason"], vectors
    # A key read from a file into a variable keeps no line break to break the header.
    emb_cfg = config.EmbeddingModelConfig(api_key=" \n")
    assert resolve_api_key(emb_cfg, {"OPENAI_API_KEY": "sk-y\n"}) == "sk-y"
    chat_cfg = config.ChatModelConfig(api_key="  ")
    assert resolve_chat_api_key(chat_cfg, {"RECALLD_CHAT_API_KEY": " sk-z \n"}) == "sk-z"


def test_an_agent_json_larger_than_a_request_imports(daemon: DaemonHandle,
                                                     tmp_path: Path) -> None:
    # An agent.json holds much besides memory settings (channels, prompts, MCP clients):
    # sent whole, one over the daemon's request limit (1 MiB) was refused.
    from test_import_qwenpaw import cli

    ws = tmp_path / "big"
    (ws / "memory").mkdir(parents=True)
    (ws / "agent.json").write_text(json.dumps({
        "id": "big", "system_prompt": "x" * (2 << 20),
        "running": {"max_iters": 50, "reme_light_memory_config": {
            "auto_memory_interval": 4, "memory_graph_config": {"enabled": True}}}}), "utf-8")
    proc = cli(daemon, "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    assert "auto_memory_interval = 4" in proc.stdout, proc.stdout
    assert "memory_graph_config: not a field recalld knows" in proc.stdout, proc.stdout
