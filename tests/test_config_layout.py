"""A workspace's folders that are or lie inside one another where that cannot work are refused.

- ``config_layout.layout_problem`` over a table of layouts, refused and accepted, compared
  by path parts (``memory2`` is not inside ``memory``, ``./memory/`` is ``memory``);
- every way settings are built runs it once on the whole: ``[workspace_defaults]``, each
  ``[workspaces.X]`` (over its ``qwenpaw_agent_json``) and ``workspace.open``'s ``config``;
- the defaults and every layout the docs and the tests use pass;
- a real daemon refuses such a config file (exit 2, one line on stderr) and such a
  ``workspace.open`` (invalid params), and keeps serving.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from conftest import DaemonFactory
from test_qwenpaw_config import qwenpaw_memory_config

from recalld.daemon import config, config_layout, config_rules, watchpaths
from recalld.daemon import main as daemon_main
from recalld.ipc import errors
from recalld.ipc.errors import InvalidParams

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = config.WorkspaceSettings()

# (overrides of the defaults, the folder that may not be where it is, the one it is in)
REFUSED = [
    ({"metadata_dir": "memory/state"}, "metadata_dir", "daily_dir"),
    ({"metadata_dir": "memory"}, "metadata_dir", "daily_dir"),
    ({"resource_dir": "digest"}, "resource_dir", "digest_dir"),
    ({"session_dir": "memory/sessions"}, "session_dir", "daily_dir"),
    ({"mem_session_dir": "digest/agent"}, "mem_session_dir", "digest_dir"),
    ({"digest_dir": "memory"}, "digest_dir", "daily_dir"),
    ({"digest_dir": "memory/digest"}, "digest_dir", "daily_dir"),
    ({"daily_dir": "digest/daily"}, "daily_dir", "digest_dir"),
    ({"metadata_dir": "state", "daily_dir": "state/notes"}, "daily_dir", "metadata_dir"),
    ({"metadata_dir": "state", "resource_dir": "state/res"}, "resource_dir", "metadata_dir"),
    ({"metadata_dir": "state", "session_dir": "state"}, "session_dir", "metadata_dir"),
    ({"metadata_dir": "."}, "daily_dir", "metadata_dir"),
    ({"metadata_dir": "resource/meta"}, "metadata_dir", "resource_dir"),
    ({"resource_dir": "files", "daily_dir": "files/notes"}, "daily_dir", "resource_dir"),
    ({"daily_dir": "resource/memory"}, "daily_dir", "resource_dir"),
    ({"session_dir": "resource/sessions"}, "session_dir", "resource_dir"),
    ({"mem_session_dir": "resource"}, "mem_session_dir", "resource_dir"),
    ({"digest_dir": "mem_session/digest"}, "digest_dir", "session_dir"),
    ({"daily_dir": "mem_agent/notes"}, "daily_dir", "mem_session_dir"),
    ({"session_dir": "."}, "daily_dir", "session_dir"),
    # Compared by parts: "." and empty parts do not hide an overlap.
    ({"daily_dir": "./memory/", "metadata_dir": "memory//state/"}, "metadata_dir", "daily_dir"),
    ({"daily_dir": "notes/daily", "digest_dir": "notes/daily/./digest"},
     "digest_dir", "daily_dir"),
    # A restore removes from a session folder what the backup does not put back there.
    ({"session_dir": "data", "metadata_dir": "data/meta"}, "metadata_dir", "session_dir"),
    ({"mem_session_dir": "sess", "metadata_dir": "sess/state"}, "metadata_dir",
     "mem_session_dir"),
]

ACCEPTED = [
    {},
    # A shared prefix of the name is not a folder inside another.
    {"daily_dir": "memory2", "metadata_dir": "memory"},
    {"daily_dir": "memory", "digest_dir": "memory2"},
    {"daily_dir": "resourceful", "resource_dir": "resource"},
    {"metadata_dir": "mem_metadata2", "daily_dir": "mem_metadata2x"},
    # Side by side under one folder.
    {"daily_dir": "notes/daily", "digest_dir": "notes/digest", "resource_dir": "notes/res"},
    {"metadata_dir": "state", "daily_dir": "daily", "digest_dir": "digest"},
    {"metadata_dir": ".recalld"},
    # Session folders may share a folder, and hold the resources.
    {"session_dir": "sessions", "mem_session_dir": "sessions"},
    {"resource_dir": "mem_session/resource"},
]


def _layout(overrides: dict[str, str]) -> dict[str, str]:
    return {name: overrides.get(name, getattr(DEFAULTS, name))
            for name in config_layout.LAYOUT_DIRS}


@pytest.mark.parametrize(("overrides", "inner", "outer"), REFUSED,
                         ids=[json.dumps(o) for o, _, _ in REFUSED])
def test_a_folder_where_it_cannot_work_is_refused_naming_both(
        overrides: dict[str, str], inner: str, outer: str) -> None:
    dirs = _layout(overrides)
    problem = config_layout.layout_problem(dirs)
    assert problem is not None
    named = (f"{inner} = {config_rules.shown(dirs[inner])} ",
             f"{outer} = {config_rules.shown(dirs[outer])}: ")
    assert problem.startswith(named[0]) and named[1] in problem, problem
    assert "must not" in problem and "\n" not in problem
    with pytest.raises(config.ConfigError) as info:
        DEFAULTS.merged(overrides)
    assert str(info.value) == f"workspace config {problem}"


@pytest.mark.parametrize("overrides", ACCEPTED, ids=[json.dumps(o) for o in ACCEPTED])
def test_folders_apart_are_accepted(overrides: dict[str, str]) -> None:
    assert config_layout.layout_problem(_layout(overrides)) is None
    settings = DEFAULTS.merged(overrides)
    assert all(getattr(settings, k) == v for k, v in overrides.items())


@pytest.mark.parametrize(("given", "kept"), [
    ("./{}/", "{}"), ("{}//", "{}"), ("notes/./{}", "notes/{}"), ("notes/{}/", "notes/{}"),
])
def test_folders_are_kept_tidy(given: str, kept: str, tmp_path: Path) -> None:
    # Notes are matched against the folders as strings (``daily_dir + "/"``): a folder
    # written untidily is kept as its parts.
    for key in config_layout.LAYOUT_DIRS:
        name = f"the_{key}"
        assert getattr(DEFAULTS.merged({key: given.format(name)}), key) == kept.format(name)
    path = tmp_path / "c.toml"
    path.write_text(f'[workspace_defaults]\ndigest_dir = "{given.format("d")}"\n'
                    f'[workspaces.w]\ndaily_dir = "{given.format("n")}"\n')
    cfg = config.load(config=str(path))
    assert cfg.workspaces["w"].daily_dir == kept.format("n")
    assert cfg.workspaces["w"].digest_dir == kept.format("d")
    assert cfg.workspace_defaults.digest_dir == kept.format("d")


@pytest.mark.parametrize(("value", "why"), [
    (".", "not the workspace itself"),
    ("./", "not the workspace itself"),
    ("mem_metadata/notes", "folder named mem_metadata"),
    ("notes/mem_metadata", "folder named mem_metadata"),
])
@pytest.mark.parametrize("key", config_layout.NOTE_DIRS)
def test_a_note_folder_the_index_could_not_watch_is_a_field_error(
        key: str, value: str, why: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        DEFAULTS.merged({key: value, "metadata_dir": "state"})
    assert str(info.value).startswith(f"workspace config {key} = {config_rules.shown(value)}: ")
    assert why in str(info.value)


@pytest.mark.parametrize("value", ["memory\n", "notes\tdaily", "mem\x1bory", "a/b\x7f"])
@pytest.mark.parametrize("key", [*config_layout.NOTE_DIRS, "metadata_dir", "resource_dir"])
def test_a_folder_setting_with_a_control_character_is_a_field_error(key: str,
                                                                   value: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        DEFAULTS.merged({key: value})
    assert str(info.value).startswith(f"workspace config {key} = {config_rules.shown(value)}: ")
    assert "control characters" in str(info.value)


@pytest.mark.parametrize(("value", "why"), [
    (".", "not the workspace itself"),
    (".resources", "not hidden"),
    ("files/.in", "not hidden"),
])
def test_a_resource_folder_the_watcher_could_not_watch_is_a_field_error(
        value: str, why: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        DEFAULTS.merged({"resource_dir": value})
    assert str(info.value).startswith(
        f"workspace config resource_dir = {config_rules.shown(value)}: ")
    assert why in str(info.value)


@pytest.mark.parametrize(("overrides", "accepted"), [
    ({"resource_dir": "files/mem_metadata"}, False),
    ({"metadata_dir": "state", "resource_dir": "inbox/state"}, False),
    ({"metadata_dir": "state", "resource_dir": "inbox/mem_metadata"}, True),
    ({"metadata_dir": "var/state", "resource_dir": "inbox/state"}, True),
])
def test_a_resource_folder_named_as_metadata_dir_is_refused(
        overrides: dict[str, str], accepted: bool) -> None:
    # The resource watcher passes folders named as metadata_dir (one part) by.
    problem = config_layout.layout_problem(_layout(overrides))
    if accepted:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(
            f"resource_dir = {config_rules.shown(overrides['resource_dir'])} must not be "
            "in a folder named as metadata_dir")


def test_the_names_passed_by_are_the_watchers() -> None:
    # Every folder name the watchers pass by, wherever it is, is refused in a note folder.
    for name in watchpaths.IGNORE_DIRS:
        for key in config_layout.NOTE_DIRS:
            with pytest.raises(config.ConfigError, match=f"folder named {name}"):
                DEFAULTS.merged({key: f"notes/{name}/more", "metadata_dir": "state"})


# -------------------------------------------------------------- where settings are built


def _load(tmp_path: Path, text: str) -> config.DaemonConfig:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return config.load(config=path, environ={"HOME": str(tmp_path)})


@pytest.mark.parametrize(("text", "needle"), [
    ('[workspace_defaults]\ndigest_dir = "memory/digest"\n',
     '[workspace_defaults] digest_dir = "memory/digest" must not lie inside '
     'daily_dir = "memory": '),
    ('[workspaces.x]\nmetadata_dir = "memory"\n',
     '[workspaces.x] metadata_dir = "memory" must not be the same folder as '
     'daily_dir = "memory": '),
    # The defaults are fine alone; the workspace's table over them is not.
    ('[workspace_defaults]\ndaily_dir = "notes"\n[workspaces.x]\nresource_dir = "notes/r"\n',
     '[workspaces.x] resource_dir = "notes/r" must not lie inside daily_dir = "notes": '),
])
def test_the_config_file_is_refused_in_one_line_naming_the_table(
        tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        _load(tmp_path, text)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'config.toml'}: {needle}"), message
    assert "\n" not in message


def test_a_qwenpaw_agent_json_is_checked_with_its_table_not_alone(tmp_path: Path) -> None:
    agent = {"id": "coder", "running": {"reme_light_memory_config": {
        "daily_dir": "notes", "metadata_dir": "memory/state"}}}
    (tmp_path / "agent.json").write_text(json.dumps(agent), encoding="utf-8")
    head = '[workspaces.coder]\nqwenpaw_agent_json = "agent.json"\n'
    # memory/state lies in the default daily_dir, which agent.json moves away: fine.
    coder = _load(tmp_path, head).workspace_settings("coder")
    assert (coder.daily_dir, coder.metadata_dir) == ("notes", "memory/state")
    with pytest.raises(config.ConfigError, match=re.escape(
            '[workspaces.coder] metadata_dir = "memory/state" must not lie inside '
            'daily_dir = "memory": ')):
        _load(tmp_path, head + 'daily_dir = "memory"\n')


def test_each_workspace_is_checked_once(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[dict[str, str]] = []
    real = config_layout.layout_problem

    def counting(dirs: Mapping[str, str]) -> str | None:
        checked.append(dict(dirs))
        return real(dirs)

    monkeypatch.setattr(config_layout, "layout_problem", counting)
    (tmp_path / "agent.json").write_text(json.dumps(
        {"reme_light_memory_config": {"daily_dir": "daily"}}), encoding="utf-8")
    cfg = _load(tmp_path, '[workspace_defaults]\ndigest_dir = "nodes"\n'
                          '[workspaces.a]\nresource_dir = "files"\n'
                          '[workspaces.b]\nqwenpaw_agent_json = "agent.json"\n'
                          'session_dir = "talks"\n')
    assert [d["digest_dir"] for d in checked] == ["nodes"] * 3
    assert [(d["resource_dir"], d["daily_dir"], d["session_dir"]) for d in checked[1:]] == [
        ("files", "memory", "mem_session"), ("resource", "daily", "talks")]
    checked.clear()
    # A workspace.open without config keeps the checked settings; with one, checks them.
    assert config.workspace_settings_from_params(cfg.workspace_settings("a"), None) is \
        cfg.workspace_settings("a")
    assert not checked
    with pytest.raises(InvalidParams) as info:
        config.workspace_settings_from_params(cfg.workspace_settings("a"),
                                              {"daily_dir": "files/daily"})
    assert len(checked) == 1
    assert info.value.message == ('workspace config daily_dir = "files/daily" must not lie '
                                  'inside resource_dir = "files": every file under '
                                  'resource_dir is cataloged as a resource')


# ---------------------------------------------------------- the layouts in use all pass


def test_the_defaults_and_every_layout_in_the_docs_and_tests_pass(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```toml\n(.*?)```", readme, flags=re.DOTALL)
    assert example is not None
    cfg = _load(tmp_path, example.group(1))
    built = [DEFAULTS, cfg.workspace_defaults, *cfg.workspaces.values(),
             DEFAULTS.merged(qwenpaw_memory_config()),  # QwenPaw's, every field as written
             DEFAULTS.merged({"reme_light_memory_config": qwenpaw_memory_config()})]
    # Folder settings the tests open workspaces with (test_api.py).
    built += [DEFAULTS.merged({"daily_dir": d}) for d in ("daily", "days")]
    for settings in built:
        dirs = {name: getattr(settings, name) for name in config_layout.LAYOUT_DIRS}
        assert config_layout.layout_problem(dirs) is None, dirs
    # The defaults are QwenPaw's (ReMe's) folder names, as its workspaces have them.
    assert {n: getattr(DEFAULTS, n) for n in config_layout.LAYOUT_DIRS} == {
        "daily_dir": "memory", "digest_dir": "digest", "metadata_dir": "mem_metadata",
        "session_dir": "mem_session", "mem_session_dir": "mem_agent",
        "resource_dir": "resource"}
    reme = ROOT / "tests" / "fixtures" / "reme-0.4.2"
    assert {"memory", "digest", "mem_metadata"} <= {p.name for p in reme.iterdir()}


# ------------------------------------------------------------------------- a real daemon


def test_a_daemon_refuses_overlapping_folders_and_keeps_serving(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    ws = tmp_path / "x"
    refused = daemon_factory(f'[workspaces.x]\npath = "{ws}"\ndaily_dir = "notes"\n'
                             'metadata_dir = "notes/state"\n', wait=False)
    assert refused.proc.wait(timeout=60) == daemon_main.EXIT_CONFIG
    assert refused.log().strip() == (
        f"recalld: configuration error: {refused.config_path}: [workspaces.x] "
        'metadata_dir = "notes/state" must not lie inside daily_dir = "notes": every .md '
        "file under daily_dir is a daily note (the index watches it, the dream reads it)")
    assert not ws.exists()

    daemon = daemon_factory()
    for overrides, needle in [
        ({"digest_dir": "memory"},
         'digest_dir = "memory" must not be the same folder as daily_dir = "memory"'),
        ({"daily_dir": ".", "metadata_dir": "state"},
         'daily_dir = ".": must be a directory inside the workspace, not the workspace'),
        ({"metadata_dir": "resource/state"},
         'metadata_dir = "resource/state" must not lie inside resource_dir = "resource"'),
    ]:
        with pytest.raises(errors.InvalidParams) as info:
            daemon.call("workspace.open", {"agent_id": "x", "path": str(ws),
                                           "config": overrides})
        assert needle in info.value.message, info.value.message
    names = [w["agent_id"] for w in daemon.call("workspace.list")["workspaces"]]
    assert names == ["default"]
    opened = daemon.call("workspace.open", {"agent_id": "x", "path": str(ws), "config": {
        "daily_dir": "memory2", "metadata_dir": "memory"}})
    assert opened["state"] == "ready" and opened["settings"]["metadata_dir"] == "memory"
    assert daemon.call("daemon.ping")["pong"] is True
    assert daemon.stop() == 0


def test_a_recorded_workspace_whose_config_no_longer_fits_is_refused_saying_why(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Opened with a config that fit then; the configuration file changed since. At the
    # next start it is refused, the error saying where the other half came from and
    # what to do; the other workspaces serve.
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "c")}
    ws = tmp_path / "x"
    first = daemon_factory(None, **env)
    first.call("workspace.open", {"agent_id": "x", "path": str(ws),
                                  "config": {"metadata_dir": "notes/state"}})
    assert first.stop() == 0
    second = daemon_factory('[workspace_defaults]\ndaily_dir = "notes"\n', **env)
    listed = {w["agent_id"]: w for w in second.call("workspace.list")["workspaces"]}
    assert listed["default"]["state"] == "ready"
    assert listed["x"]["state"] == "failed" and listed["x"]["refused"] is True
    assert listed["x"]["refused_for"] == "settings"
    error = listed["x"]["error"]
    assert 'metadata_dir = "notes/state" must not lie inside daily_dir = "notes"' in error
    assert "config recorded for it in workspaces.json" in error and "forget" in error
    assert error in second.log()
    assert second.stop() == 0


@pytest.mark.parametrize("folder", ["daily_dir", "digest_dir"])
def test_notes_of_a_folder_named_otherwise_since_leave_the_index(
        daemon_factory: DaemonFactory, tmp_path: Path, folder: str) -> None:
    # The notes of the folder the settings named before stayed indexed, never looked at
    # again: one deleted was still found, one edited was found by its old words, and
    # verify listed them all while health went from clean to pending and back.
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "c")}
    ws = tmp_path / "x"
    old = "memory/2026-12-05" if folder == "daily_dir" else "digest/wiki"
    for name, text in [("a", "Steinpilz unter der Buche"), ("b", "松茸 Steinpilz im Herbst")]:
        (ws / old).mkdir(parents=True, exist_ok=True)
        (ws / old / f"{name}.md").write_text(f"# {name}\n\n{text}\n", encoding="utf-8")
    first = daemon_factory(f'[workspaces.x]\npath = "{ws}"\n', **env)
    first.call("index.sync", {"agent_id": "x"})
    assert len(first.call("memory.search", {"agent_id": "x", "query": "Steinpilz"})["results"]) == 2
    assert first.stop() == 0
    (ws / "journal").mkdir()
    (ws / "journal" / "j.md").write_text("# j\n\nKein Pilz heute\n", encoding="utf-8")
    second = daemon_factory(f'[workspaces.x]\npath = "{ws}"\n{folder} = "journal"\n', **env)
    second.call("index.sync", {"agent_id": "x"})
    assert second.call("memory.search", {"agent_id": "x", "query": "Steinpilz"})["results"] == []
    assert [r["path"] for r in second.call("memory.search", {"agent_id": "x",
                                                                "query": "Pilz"})["results"]] \
        == ["journal/j.md"]
    verified = second.call("index.verify", {"agent_id": "x"})
    assert verified["ok"] is True, verified
    assert second.stop() == 0
