"""Folders named by a credential, from outside: a real daemon. A workspace's folder
(its path, ``daily_dir`` and the other folder settings) shows in its settings, status,
the watcher's roots and the log: one given a token's name by ``workspace.open`` or by a
reload of the config file is refused, naming the param or the setting, never the
token, and nothing is made on disk; names that merely hold a credential's word open."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from waits import wait_for

from recalld.ipc.errors import InvalidParams, refused_as_credential

if TYPE_CHECKING:
    from conftest import DaemonFactory

GITHUB = "ghp_Xb7Kq2Lm9Vw4Rt8Yn3Pz6Dc1Hf5Ja0Ge2Us4"
AWS = "AKIAQ4ZK7XW2M9RL3TBV"
SLACK = "xoxb-" + "20417-5593-Qw8ErT2yUi6OpA4sDf"
TOKENS = (GITHUB, AWS, SLACK)


def _leaks(value: object) -> list[str]:
    return [t[:8] for t in TOKENS if t in str(value)]


@pytest.mark.parametrize(("params", "param"), [
    ({"config": {"daily_dir": GITHUB}}, "config.daily_dir"),
    ({"config": {"digest_dir": f"notes/{AWS}"}}, "config.digest_dir"),
    ({"config": {"resource_dir": f"in-{SLACK}"}}, "config.resource_dir"),
    ({"config": {"reme_light_memory_config": {"metadata_dir": GITHUB}}},
     "config.metadata_dir"),
])
def test_a_folder_setting_named_by_a_token_is_refused(
        daemon_factory: DaemonFactory, tmp_path: Path,
        params: dict[str, object], param: str) -> None:
    d = daemon_factory()
    root = tmp_path / "ws"
    with pytest.raises(InvalidParams, match="credential") as refused:
        d.call("workspace.open", {"agent_id": "w", "path": str(root), **params})
    assert refused_as_credential(refused.value) == param
    assert _leaks(refused.value) == [] and _leaks(refused.value.data) == []
    assert not root.exists()
    assert _leaks(d.call("daemon.status")) == [] and _leaks(d.log()) == []
    opened = d.call("workspace.open", {"agent_id": "w", "path": str(root),
                                       "config": {"daily_dir": "token-notes"}})
    assert opened["settings"]["daily_dir"] == "token-notes"


def test_a_workspace_path_holding_a_token_is_refused(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = daemon_factory()
    for root in (tmp_path / GITHUB, tmp_path / f"agents-{AWS}" / "ws"):
        with pytest.raises(InvalidParams, match="credential") as refused:
            d.call("workspace.open", {"agent_id": "w", "path": str(root)})
        assert refused_as_credential(refused.value) == "path"
        assert _leaks(refused.value) == [] and not root.exists()
    plain = tmp_path / "api-token-agent"
    assert d.call("workspace.open", {"agent_id": "w", "path": str(plain)})["state"] == "ready"
    # Opened again as recorded, as a client does after each restart.
    assert d.call("workspace.open", {"agent_id": "w", "path": str(plain)})["state"] == "ready"
    assert _leaks(d.call("daemon.status")) == [] and _leaks(d.log()) == []


def test_a_reload_giving_a_folder_a_token_name_is_refused(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """The reload keeps the running configuration and says why, naming the table and
    the setting; the workspace's folders stay as they were."""
    root = tmp_path / "ws"
    good = f'[workspaces.w]\npath = "{root}"\ndaily_dir = "daily"\n'
    d = daemon_factory(good)
    cases = ((good.replace('"daily"', f'"{GITHUB}"'), "[workspaces.w] daily_dir"),
             (good.replace(f'"{root}"', f'"{tmp_path / SLACK}"'), "[workspaces.w] path"),
             (f'[workspace_defaults]\nresource_dir = "in-{AWS}"\n' + good,
              "[workspace_defaults] resource_dir"))
    for text, setting in cases:
        d.config_path.write_text(text, encoding="utf-8")
        d.signal(signal.SIGHUP)
        error = wait_for(lambda: d.call("daemon.status")["queues"]["config"]["reload_error"],
                         "the refused reload")
        assert f"{setting}: the folder's name looks like a credential" in error, error
        assert _leaks(error) == [] and _leaks(d.log()) == []
        listed = [w for w in d.call("workspace.list")["workspaces"] if w["agent_id"] == "w"]
        assert [(w["path"], w["settings"]["daily_dir"]) for w in listed] == [
            (str(root), "daily")]
        assert _leaks([p.name for p in tmp_path.rglob("*")]) == []
        d.config_path.write_text(good, encoding="utf-8")
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.call("daemon.status")["queues"]["config"]["reload_error"] is None,
                 "the good reload")


def test_an_agent_shared_with_named_by_a_token_is_refused_or_warned_of(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """A key pasted into ``shared_with`` was taken as an agent id: recorded with the
    workspace, shown in clear in workspace.list and logged when a reload applied it.
    workspace.open refuses it, naming the param; the config file is warned of, the token
    never shown; an id that merely holds a credential's word, or a table's, is taken."""
    d = daemon_factory(f'[workspaces.w]\nshared_with = ["reader", "{SLACK}"]\n'
                       f'[workspaces.{"a" * 40}]\n[workspaces.x]\nshared_with = ["{"a" * 40}"]\n')
    warnings = d.call("daemon.status")["queues"]["config"]["warnings"]
    assert [w["what"] for w in warnings if "shared_with" in w["what"]] == [
        f"{d.config_path}: [workspaces.w] shared_with names an agent by what looks like a "
        "credential (no agent can open a workspace by it; it shows in workspace.list)"]
    root = tmp_path / "ws"
    for readers in ([GITHUB], ["reader", f"bot-{AWS}"]):
        with pytest.raises(InvalidParams, match="credential") as refused:
            d.call("workspace.open", {"agent_id": "v", "path": str(root),
                                      "config": {"shared_with": readers}})
        assert refused_as_credential(refused.value) == "config.shared_with"
        assert _leaks(refused.value) == [] and not root.exists()
    opened = d.call("workspace.open", {"agent_id": "v", "path": str(root),
                                       "config": {"shared_with": ["api-token-bot", "w"]}})
    assert opened["settings"]["shared_with"] == ["api-token-bot", "w"]
    assert _leaks(d.call("workspace.list")["workspaces"][-1]) == []
    # A reload that applies such an entry logs it masked.
    d.config_path.write_text(f'[workspaces.w]\nshared_with = ["{GITHUB}"]\n', encoding="utf-8")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "from now on" in d.log(), "the reload's log line")
    assert "shared_with = ['[REDACTED]']" in d.log() and _leaks(d.log()) == []
