"""``workspace.open`` of a workspace that is open already, with another ``config``: the
running workspace keeps the settings it was opened with, and the answer's
``not_applied`` names each given setting it does not use, with the value in use (secrets
masked); a close and an open take them. From a real daemon, the chat model a real HTTP
server on 127.0.0.1."""

from __future__ import annotations

from typing import Any

from fakes.provider_server import FakeProvider

OLD_KEY = "sk-" + "old" * 10
NEW_KEY = "sk-" + "new" * 10


def test_settings_given_to_an_open_workspace_that_it_does_not_use_are_named(
        daemon_factory: Any, fake: FakeProvider) -> None:
    d = daemon_factory()
    chat = {"base_url": f"{fake.url}/v1", "model_name": "m", "api_key": OLD_KEY}
    first = d.call("workspace.open", {"agent_id": "coder", "config": {
        "chat_model_config": chat, "dream_cron": "0 3 * * *"}})
    assert "not_applied" not in first
    # The same settings again, and none: nothing to say.
    again = d.call("workspace.open", {"agent_id": "coder", "config": {
        "dream_cron": "0 3 * * *", "chat_model_config": chat}})
    assert "not_applied" not in again
    assert "not_applied" not in d.call("workspace.open", {"agent_id": "coder"})

    # A rotated key, another model and another cron: each named, the value in use shown
    # (the key masked, and neither key anywhere in the answer).
    other = d.call("workspace.open", {"agent_id": "coder", "config": {
        "chat_model_config": {**chat, "api_key": NEW_KEY, "model_name": "m2"},
        "dream_cron": "0 4 * * *", "search": {"rrf_k": 30}}})
    assert other["not_applied"] == {
        "chat_model_config.api_key": "***", "chat_model_config.model_name": "m",
        "dream_cron": "0 3 * * *", "search.rrf_k": 60}
    assert NEW_KEY not in str(other) and OLD_KEY not in str(other)
    assert other["settings"]["dream_cron"] == "0 3 * * *"
    # Given as in use but for one field: only that one.
    one = d.call("workspace.open", {"agent_id": "coder", "config": {
        "chat_model_config": chat, "dream_cron": "0 3 * * *", "shared_with": ["reviewer"]}})
    assert one["not_applied"] == {"shared_with": []}
    # ``config: {}`` asks for the config file's settings alone.
    plain = d.call("workspace.open", {"agent_id": "coder", "config": {}})
    assert plain["not_applied"] == {"chat_model_config": {
        "base_url": f"{fake.url}/v1", "model_name": "m", "api_key": "***",
        **{k: v for k, v in plain["settings"]["chat_model_config"].items()
           if k not in ("base_url", "model_name", "api_key")}},
        "dream_cron": "0 3 * * *"}

    # Opened again, it takes them.
    d.call("workspace.close", {"agent_id": "coder"})
    reopened = d.call("workspace.open", {"agent_id": "coder", "config": {
        "chat_model_config": {**chat, "api_key": NEW_KEY}, "dream_cron": "0 4 * * *"}})
    assert "not_applied" not in reopened
    assert reopened["settings"]["dream_cron"] == "0 4 * * *"
