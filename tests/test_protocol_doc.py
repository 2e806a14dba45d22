"""docs/protocol.md is tested against the code: error codes against recalld.ipc.errors,
methods against a real daemon (a method is there unless it answers MethodNotFound)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import DaemonHandle

from recalld.ipc import errors
from recalld.ipc._methods import METHODS
from recalld.ipc.client import Client

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def documented_codes() -> dict[int, str]:
    """The error table: ``| -32001 | UnknownWorkspace | meaning |`` rows."""
    rows = re.findall(r"^\| (-\d+) \| (\w+) \| (.+) \|$", doc_text(), flags=re.MULTILINE)
    assert all(meaning.strip() for _, _, meaning in rows), "every code needs a meaning"
    return {int(code): name for code, name, _ in rows}


def documented_methods() -> list[str]:
    """Methods with a ``### `name` `` section."""
    return re.findall(r"^### `([a-z_]+\.[a-z_.]+)`$", doc_text(), flags=re.MULTILINE)


def test_every_error_code_is_documented_with_its_number() -> None:
    assert documented_codes() == errors.CODE_NAMES


def test_standard_and_application_ranges() -> None:
    codes = set(errors.CODE_NAMES)
    assert {-32700, -32600, -32601, -32602, -32603} <= codes
    assert all(-32099 <= c <= -32000 for c in codes if c > -32600)


def test_method_table_matches_sections() -> None:
    methods_section = doc_text().split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
    table = re.findall(r"^\| `([a-z_]+\.[a-z_.]+)` \|", methods_section, flags=re.MULTILINE)
    assert table == documented_methods()
    assert len(set(table)) == len(table)


def test_documented_methods_exist_and_served_ones_are_documented(daemon: DaemonHandle) -> None:
    documented = set(documented_methods())
    served: set[str] = set()
    with Client(daemon.socket_path, timeout_s=10) as client:
        for method in sorted(documented | set(METHODS.values())):
            try:
                client.call(method, {"__probe__": True})
            except errors.MethodNotFound:
                continue
            except errors.RecalldError:
                pass  # refused params: the method exists
            served.add(method)
    assert documented <= served, f"documented but not served: {sorted(documented - served)}"
    missing = sorted(served - documented)
    assert not missing, f"served (and in the client) but not documented: {missing}"


def documented_positional() -> dict[str, int]:
    """Methods the doc says take params by position, with how many: the bullet that
    lists them in groups, each group of methods followed by its params in brackets."""
    text = " ".join(doc_text().split())
    bullet = text.split("by position:", 1)[1].split(". An array", 1)[0]
    counts: dict[str, int] = {}
    for group, names in re.findall(r"((?:`[a-z_]+\.[a-z_]+`(?:,| and|, and)?\s*)+)\(([^)]*)\)",
                                   bullet):
        for method in re.findall(r"`([a-z_]+\.[a-z_]+)`", group):
            counts[method] = len(re.findall(r"`\w+`", names))
    return counts


def test_the_methods_that_take_params_by_position_are_the_documented_ones(
        daemon: DaemonHandle) -> None:
    documented = documented_positional()
    assert documented, "the doc lists the methods that take an array"
    taken: dict[str, int] = {}
    with daemon.connect() as conn:
        for method in documented_methods():
            too_many = ["__probe__"] * 8
            conn.request(method, too_many)
            message = conn.recv_response()["error"]["message"]
            if "takes named params" in message:
                continue
            found = re.search(r"takes at most (\d+) positional", message)
            assert found, (method, message)
            taken[method] = int(found[1])
    assert taken == documented


@pytest.mark.parametrize("topic", ["workspace.opened", "workspace.closed", "workspace.failed",
                                   "events.dropped", "job.state", "job.progress"])
def test_event_topics_are_documented(topic: str) -> None:
    assert f"| `{topic}` |" in doc_text()


# ------------------------------------------------------------------ README and CI

ROOT = DOC.parent.parent


def readme_commands() -> list[str]:
    quick = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1]
    quick = quick.split("\n## ", 1)[0]
    return re.findall(r"```sh\n\s*(.+?)\n\s*```", quick, flags=re.DOTALL)


def test_readme_quick_start_has_exactly_two_commands() -> None:
    run, test = (c.strip() for c in readme_commands())
    assert run.endswith("recalld serve") and "pip install -e ." in run
    assert test.endswith(".venv/bin/pytest") and "'.[test]'" in test


def test_ci_runs_the_readme_test_command() -> None:
    _, test = (c.strip() for c in readme_commands())
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in ci
    assert test in ci
    assert '"$status" -eq 5' in ci, "pytest's exit 5 (no tests) must fail CI"


def test_readme_config_example_loads(tmp_path: Path) -> None:
    from recalld.daemon import config

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```toml\n(.*?)```", text, flags=re.DOTALL)
    assert example is not None
    path = tmp_path / "config.toml"
    path.write_text(example.group(1), encoding="utf-8")
    cfg = config.load(config=path, environ={"HOME": str(tmp_path)})
    assert cfg.workspace_settings("coder").auto_memory_interval == 10
    coder = cfg.workspace_path("coder")
    assert coder.is_absolute() and coder.parts[-3:] == (".qwenpaw", "workspaces", "coder")
