"""docs/protocol.md is tested against the code: error codes against recalld.ipc.errors,
methods against a real daemon (a method is there unless it answers MethodNotFound)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import orjson
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



def test_every_method_of_the_daemons_table_is_documented() -> None:
    """The daemon's method table, its handler modules imported on first use included, is
    the doc's list: a method no client names is documented too."""
    from recalld.daemon.rpc.methods import all_methods

    assert sorted(documented_methods()) == all_methods().names()

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


# ------------------------------------------------------------------ the examples, run


def documented_exchanges() -> list[tuple[str, list[object]]]:
    """The ``socat`` examples: each ``>`` line with the ``<`` lines that answer it."""
    block = doc_text().split("\n## Examples\n", 1)[1].split("```text\n", 1)[1]
    exchanges: list[tuple[str, list[object]]] = []
    for line in block.split("```", 1)[0].splitlines():
        if line.startswith("> "):
            exchanges.append((line[2:], []))
        elif line.startswith("< "):
            exchanges[-1][1].append(orjson.loads(line[2:]))
    return exchanges


_PER_RUN = frozenset({"time", "stream", "seq"})


def _timeless(message: object) -> object:
    """``message`` with what differs on every run blanked: its clock readings (``time``)
    and places in the run's event stream (``stream``, ``seq``)."""
    if isinstance(message, list):
        return sorted((_timeless(m) for m in message), key=repr)
    if isinstance(message, dict):
        return {k: None if k in _PER_RUN else _timeless(v) for k, v in message.items()}
    return message


def test_the_examples_answer_as_shown(daemon: DaemonHandle, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Every socat example, sent as written, gets the answers and events the doc shows
    (a workspace an event names is opened meanwhile), and the Python one prints them."""
    note = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-23" / "commute.md"
    note.parent.mkdir(parents=True)
    note.write_text("# Commute\nbike on Mondays\ntrain otherwise\n", encoding="utf-8")
    daemon.call("index.sync", {"agent_id": "default"})
    exchanges = documented_exchanges()
    assert len(exchanges) >= 5
    for request, expected in exchanges:
        with daemon.connect(timeout=10) as conn:
            conn.send_bytes(request.encode() + b"\n")
            got: list[object] = []
            for shown in expected:
                if isinstance(shown, dict) and shown.get("method") == "event":
                    params = shown["params"]
                    folder = tmp_path / params["agent_id"]
                    daemon.call("workspace.open", {"agent_id": params["agent_id"],
                                                   "path": str(folder)})
                    params["path"] = str(folder)
                got.append(conn.recv())
        assert _timeless(got) == _timeless(expected), request
    python = doc_text().split("The same from Python:", 1)[1].split("```python\n", 1)[1]
    monkeypatch.setenv("RECALLD_CONFIG", str(daemon.config_path))
    monkeypatch.setenv("RECALLD_SOCKET", str(daemon.socket_path))
    exec(python.split("```", 1)[0], {})  # the doc's own example
    out = capsys.readouterr().out
    assert out.startswith("{'pong': True, 'time': ")
    assert out.endswith("}\nbike on Mondays\ntrain otherwise\n\n")


def test_the_method_table_names_the_params_of_each_params_table() -> None:
    """A method whose section has a ``| param | type | meaning |`` table takes exactly
    those params, as the method table at the top lists them."""
    methods = doc_text().split("\n## Methods\n", 1)[1].split("\n### ", 1)[0]
    listed = {m: set(re.findall(r"`(\w+)\??`", params)) for m, params in
              re.findall(r"^\| `([a-z_]+\.[a-z_.]+)` \| ([^|]*) \|", methods, flags=re.M)}
    sections = re.split(r"^### `([a-z_]+\.[a-z_.]+)`$", doc_text(), flags=re.MULTILINE)
    tabled = 0
    for method, body in zip(sections[1::2], sections[2::2], strict=True):
        if "\n| param | type | meaning |\n" not in body:
            continue
        table = body.split("\n| param | type | meaning |\n", 1)[1].split("\n\n", 1)[0]
        assert set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M)) == listed[method], method
        tabled += 1
    assert tabled >= 4


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_readme_lists_every_command_with_flags_it_takes() -> None:
    """The README's command list names every command and subcommand of ``recalld``, and
    each line's options are options of its command."""
    from recalld.daemon import main as daemon_main
    from recalld.ipc import cli

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("\n## Command line\n", 1)[1].split("```text\n", 1)[1]
    lines = [line.split("   ")[0].split()[1:] for line in block.split("```", 1)[0].splitlines()
             if line.startswith("recalld ")]
    listed: set[str] = set()
    for words in lines:
        parser = _subcommands(cli.build_parser())[words[0]]
        if words[0] == "serve":
            parser = daemon_main.build_parser()
        command = words[0]
        for name in words[1].split("|") if len(words) > 1 else ():
            if name in _subcommands(parser):
                command = f"{words[0]} {name}"
                listed.add(command)
        parser = _subcommands(parser).get(command.partition(" ")[2], parser)
        listed.add(words[0])
        options = {o for action in parser._actions for o in action.option_strings}
        flags = {f for w in words for f in w.strip("[]").split("|") if f[:1] == "-" and f != "-"}
        assert flags <= options, (command, flags - options)
    commands = set()
    for name, parser in _subcommands(cli.build_parser()).items():
        commands.add(name)
        commands.update(f"{name} {sub}" for sub in _subcommands(parser))
    assert listed == commands


def test_the_readme_memory_capture_example_runs(daemon: DaemonHandle,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's capture example, run as written against a daemon with no chat model,
    opens its workspace and stores the turns (the flush's job then waits for a model)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Memory capture\n", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("RECALLD_CONFIG", str(daemon.config_path))
    monkeypatch.setenv("RECALLD_SOCKET", str(daemon.socket_path))
    exec("from recalld.ipc.client import Client\n" + example, {})  # the README's own example
    workspaces = daemon.call("workspace.list")["workspaces"]
    assert "coder" in {ws["agent_id"] for ws in workspaces if ws.get("state") == "ready"}


def _undocumented_keys(value: object, where: str, doc: str) -> list[str]:
    """The keys of an answer, at any depth, that docs/protocol.md never names in backticks
    (maps keyed by data, such as per vector space, are passed by)."""
    if isinstance(value, list):
        return [k for item in value[:1] for k in _undocumented_keys(item, where, doc)]
    if not isinstance(value, dict):
        return []
    missing = []
    for key, inner in value.items():
        if not re.search(rf"`[^`\n]*\b{re.escape(key)}\b[^`\n]*`", doc):
            missing.append(where + key)
        if key not in ("vector_spaces", "settings"):
            missing += _undocumented_keys(inner, f"{where}{key}.", doc)
    return missing


def test_every_field_of_status_and_verify_is_documented(daemon: DaemonHandle) -> None:
    note = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-23" / "a.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("# A\nbike on Mondays\n", encoding="utf-8")
    daemon.call("index.sync", {"agent_id": "default"})
    status = daemon.call("daemon.status")
    assert status["workspaces"] and status["workspaces"][0]["index"]["watcher"]
    verify = daemon.call("index.verify", {"agent_id": "default"})
    assert verify["chunks"]["chunks"] == 1
    assert _undocumented_keys(status, "", doc_text()) == []
    assert _undocumented_keys(verify, "", doc_text()) == []


def _section(method: str) -> str:
    """The text of ``method``'s ``### `method` `` section of docs/protocol.md."""
    return re.split(rf"^### `{re.escape(method)}`$", doc_text(), flags=re.MULTILINE)[1].split(
        "\n### ", 1)[0]


def test_the_fields_of_recall_note_and_topic_answers_are_named_in_their_sections(
        daemon: DaemonHandle) -> None:
    """Each field of these answers is named where the method is documented, not only
    somewhere in the file (a field of the same name elsewhere says nothing of this one)."""
    daemon.call("memory.add_note", {"agent_id": "default", "content": "bike on Mondays"})
    answers = {
        "memory.recall": daemon.call("memory.recall", {
            "agent_id": "default", "query": "bike", "include_index": True,
            "include_interests": True}),
        "memory.add_note": daemon.call("memory.add_note", {
            "agent_id": "default", "content": "train otherwise"}),
        "memory.list": daemon.call("memory.list", {"agent_id": "default"}),
        "memory.index": daemon.call("memory.index", {"agent_id": "default"}),
        "memory.topic_write": daemon.call("memory.topic_write", {
            "agent_id": "default", "path": "tea.md", "name": "Tea", "type": "user",
            "description": "what tea they like", "body": "green tea"}),
    }
    answers["memory.select"] = daemon.call("memory.select", {"agent_id": "default",
                                                             "query": "tea"})
    assert answers["memory.select"]["files"]
    assert answers["memory.recall"]["items"]
    for method, answer in answers.items():
        assert _undocumented_keys(answer, "", _section(method)) == [], method


def test_the_docs_name_the_sockets_clients_look_for_in_one_order() -> None:
    """docs/protocol.md's transport table and the README's table of paths name the places
    a client looks for the socket (ipc/paths.py), all of them and in the same order."""
    order = ("--socket", "RECALLD_SOCKET", "socket_path", "XDG_RUNTIME_DIR", "/run/user/",
             "/tmp/recalld-")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for row in (re.search(r"^\| socket \| (.+) \|$", text, flags=re.M)
                for text in (doc_text(), readme)):
        assert row is not None
        places = [row.group(1).find(name) for name in order]
        assert -1 not in places and places == sorted(places), row.group(1)


def test_the_table_of_limits_gives_the_defaults_of_the_settings_it_names() -> None:
    """Each row of the Limits table that names a [daemon] setting gives its default."""
    from recalld.daemon import config

    daemon = config.DaemonConfig(socket_path=Path("/s"), data_dir=Path("/d"),
                                 config_path=Path("/c"))
    keys = {f.name for f in dataclasses.fields(daemon)}
    table = doc_text().split("\n## Limits\n", 1)[1].split("\n## ", 1)[0]
    checked = {}
    for cell in re.findall(r"^\| [^|]+ \| ([^|]+) \|", table, flags=re.M):
        named = [k for k in re.findall(r"`(?:\[daemon\] )?(\w+)`", cell) if k in keys]
        number = re.search(r"(\d+(?:\.\d+)?) ?(MiB)?", cell)
        if named and number:
            scale = 1 << 20 if number.group(2) else 1
            checked[named[0]] = float(number.group(1)) * scale
    assert {k: float(getattr(daemon, k)) for k in checked} == checked
    assert len(checked) >= 7
