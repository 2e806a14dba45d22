"""Settings records and provider clients never show a secret in their ``repr``.

A record reaches a log line or a traceback as its ``repr`` (a workspace's settings in an
error, a client in a debug line), so every class that holds a key, a URL or a DSN masks
them there; the rest of the record stays readable. The classes are found from the
settings module, so a secret field added later is covered.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest
from conftest import DaemonFactory
from fakes.provider_server import FakeProvider, Reply
from test_cli import recalld
from waits import wait_for

from recalld.daemon import config, config_rules
from recalld.daemon.providers.chat import ChatClient
from recalld.daemon.providers.embedding import EmbeddingClient

KEY = "sk-live-7Qf2Zr9XwPm4"
PASSWORD = "Tr0ub4dor&3"
# Each secret-holding field with a value that carries a secret, and the part that must stay.
SECRET_VALUES = {
    "api_key": (KEY, None),
    "base_url": (f"https://svc:{PASSWORD}@llm.example.net:8443/v1?api_key={KEY}",
                 "llm.example.net:8443/v1"),
    "dsn": (f"postgresql://memory:{PASSWORD}@db.example.net:6432/mem?sslmode=require",
            "db.example.net"),
}
SECRET_CLASSES = [cls for cls in vars(config).values()
                  if dataclasses.is_dataclass(cls) and isinstance(cls, type)
                  and {f.name for f in dataclasses.fields(cls)} & set(SECRET_VALUES)]


def test_every_secret_holding_settings_class_is_found() -> None:
    assert {c.__name__ for c in SECRET_CLASSES} >= {
        "EmbeddingModelConfig", "ChatModelConfig", "RemoteConfig"}


@pytest.mark.parametrize("cls", SECRET_CLASSES, ids=lambda c: c.__name__)
def test_settings_repr_masks_secrets_and_keeps_the_rest(cls: type) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    values = {n: v for n, (v, _) in SECRET_VALUES.items() if n in names}
    record = cls(**values, **({"name": "shared-notes"} if "name" in names else {}))
    nested = config.WorkspaceSettings(**{
        f.name: record for f in dataclasses.fields(config.WorkspaceSettings)
        if f.type in (cls.__name__, f"{cls.__name__} | None")})
    for text in (repr(record), str(record), repr(nested)):
        assert KEY not in text
        assert PASSWORD not in text
        assert "***" in text
        for name in values:
            kept = SECRET_VALUES[name][1]
            assert f"{name}=" in text
            if kept:
                assert kept in text
    assert cls.__name__ in repr(nested) or cls is config.WorkspaceSettings


def test_provider_clients_repr_masks_the_endpoint_password() -> None:
    url = SECRET_VALUES["base_url"][0]
    clients = [
        ChatClient(config.ChatModelConfig(model_name="m", api_key=KEY, base_url=url),
                   None, environ={}),
        EmbeddingClient(config.EmbeddingModelConfig(model_name="m", api_key=KEY,
                                                    base_url=url), None, environ={}),
    ]
    for client in clients:
        text = repr(client)
        assert KEY not in text and PASSWORD not in text
        assert "llm.example.net:8443" in text
    assert PASSWORD not in repr(clients[1]._format)


@pytest.mark.parametrize("url", [
    "https://svc:Tr0@ub4dor@llm.example.net:8443/v1",
    "https://svc@corp:Tr0@ub4:dor@llm.example.net/v1?region=eu",
])
def test_a_url_password_holding_an_at_sign_is_masked_whole(url: str) -> None:
    # The HTTP client takes the user part up to the last "@" before the path.
    password = httpx.URL(url).password
    assert "ub4" in password
    for shown in (config_rules.mask_url(url), config_rules.url_without_secrets(url)):
        assert "ub4" not in shown, shown
        assert httpx.URL(shown).host == httpx.URL(url).host
    assert "ub4" not in repr(config.ChatModelConfig(model_name="m", base_url=url))


@pytest.mark.parametrize("url", [
    "https://ghp_Aq8Lm2Rt5Vx9Bn3Kc7Hw1Jd4Fg6Ps0Ya2Ue5@llm.example.net/v1",
    "https://ghp_Aq8Lm2Rt5Vx9Bn3Kc7Hw1Jd4Fg6Ps0Ya2Ue5:x-oauth-basic@llm.example.net/v1",
    "https://b3Kx9Qw2Lm7Zr4Tp8Vn1@llm.example.net:8443/v1?region=eu",
])
def test_a_token_as_a_url_user_name_is_masked(url: str) -> None:
    """A token may stand as the whole user part (HTTP Basic with the token as user):
    shown, repr'd and backed up without it, as redaction masks it in a note."""
    from recalld.daemon.backup_secrets import mask_secrets

    token = httpx.URL(url).username
    backed_up = mask_secrets(f'[chat_model_config]\nbase_url = "{url}"\n')
    for shown in (config_rules.mask_url(url), config_rules.url_without_secrets(url),
                  repr(config.ChatModelConfig(model_name="m", base_url=url)), backed_up):
        assert token not in shown, shown
        assert "llm.example.net" in shown
    for plain in ("https://bob@llm.example.net/v1", "https://svc-account-name@h.example/v1"):
        assert config_rules.mask_url(plain) == config_rules.url_without_secrets(plain) == plain


def test_a_key_in_a_url_path_is_masked_wherever_the_url_is_shown(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """Some gateways take the key in the URL's path (``https://gw.example/<key>/v1``):
    the settings in answers, the provider's endpoint in status and the log lines of its
    failed calls show the URL with the key masked as redaction masks it."""
    token = "ghp_" + "Pa7hSe9gMe3nTx5yKe1yAb3dEf6hIj9kLm2nOp5q"
    with FakeProvider(dims=8) as fake:
        fake.script(*[Reply(status=500)] * 3)
        root = tmp_path / "ws"
        (root / "memory").mkdir(parents=True)
        (root / "memory" / "a.md").write_text("# a\nalpha\n", encoding="utf-8")
        url = f"{fake.url}/{token}/v1"
        d = daemon_factory(
            f'[workspaces.w]\npath = "{root}"\n'
            f'chat_model_config = {{base_url = "{url}", model_name = "m", api_key = "x"}}\n'
            f'embedding_model_config = {{backend = "openai", base_url = "{url}", '
            f'api_key = "x", model_name = "e", dimensions = 8}}\n')
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: len(fake.requests) >= 3, "three failed embedding calls")
        shown = [str(d.call("workspace.list")), str(d.call("daemon.status")),
                 recalld("status", "--verbose", env=d.env).stdout]
        assert all(f"{fake.url}/[REDACTED]/v1" in text for text in shown[:2]), shown
        wait_for(lambda: " failed (" in d.log(), "a failed call logged")
        for text in [*shown, d.log()]:
            assert token not in text, text
    assert config_rules.mask_url(url) == f"{fake.url}/[REDACTED]/v1"
    assert token not in repr(config.ChatModelConfig(model_name="m", base_url=url))


def test_a_key_pasted_as_a_model_name_is_masked_wherever_the_model_is_shown(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """A key pasted into ``model_name`` (chat or embedding) is shown masked, as redaction
    masks it, in the settings, status, the vector space's name and the log lines of the
    provider's failed calls; a real model id (a fine-tuned one) is shown as it is."""
    token = "sk-proj-" + "Mo7dElNa9mEk3yXq5Wz1Rt4Uv8Bn2Cd6Ef0Gh3Jk"
    tuned = "ft:gpt-4o-mini-2024-07-18:acme-labs:notes:9Xy7ZabC"
    with FakeProvider(dims=8) as fake:
        fake.script(*[Reply(status=500)] * 3)
        root = tmp_path / "ws"
        (root / "memory").mkdir(parents=True)
        (root / "memory" / "a.md").write_text("# a\nalpha\n", encoding="utf-8")
        d = daemon_factory(
            f'[workspaces.w]\npath = "{root}"\n'
            f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "{token}"}}\n'
            f'embedding_model_config = {{backend = "openai", base_url = "{fake.url}/v1", '
            f'api_key = "x", model_name = "{token}", dimensions = 8}}\n'
            f'[workspaces.v]\npath = "{tmp_path / "v"}"\n'
            f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "{tuned}"}}\n')
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: len(fake.requests) >= 3, "three failed embedding calls")
        shown = [str(d.call("workspace.list")), str(d.call("daemon.status")),
                 recalld("status", "--verbose", env=d.env).stdout]
        wait_for(lambda: " failed (" in d.log(), "a failed call logged")
        for text in [*shown, d.log()]:
            assert token not in text, text
        assert all("[REDACTED]" in text and tuned in text for text in shown[:2]), shown
        assert "embedding openai [REDACTED] failed" in d.log()
        assert [p.name for p in d.data_dir.rglob(f"*{token[8:]}*")] == []
        report = d.call("workspace.open", {"agent_id": "w", "import_report": True})
        assert report["import"]["chat_model"] == "[REDACTED]", report
