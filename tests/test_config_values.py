"""Every configuration key with a bad value: exit 2 and one line naming file, key and value.

The table is generated from the settings classes, so a key added later is covered: each
key gets a value of the wrong type, and each key with a rule in ``config_rules.RULES`` a
value of the right type that the rule refuses. Every number must have a range.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from recalld.daemon import config, config_rules
from recalld.daemon import main as daemon_main

# Tables of the config file and the settings class each holds.
WORKSPACE_TABLES = {
    "": config.WorkspaceSettings,
    "embedding_model_config": config.EmbeddingModelConfig,
    "chat_model_config": config.ChatModelConfig,
    "search": config.SearchConfig,
}
# Fields that are not keys of [daemon] (set from paths, or tables of their own).
NOT_DAEMON_KEYS = {"socket_path", "data_dir", "config_path", "workspace_defaults",
                   "workspaces", "workspace_paths"}
# Free text: any string is a valid value.
FREE_TEXT = {("EmbeddingModelConfig", "api_key"), ("EmbeddingModelConfig", "model_name"),
             ("ChatModelConfig", "api_key"), ("ChatModelConfig", "model_name")}


def _wrong_type(default: Any) -> Any:
    if isinstance(default, bool):
        return "yes"
    if isinstance(default, int | float):
        return "many"
    if isinstance(default, str):
        return 5
    if isinstance(default, tuple):
        return 5
    return 5  # a nested table given as a number


def _cases() -> list[tuple[str, str, str, Any]]:
    """(table header, key, settings class name, bad value)."""
    cases: list[tuple[str, str, str, Any]] = []
    base = config.DaemonConfig(socket_path=Path("/s"), data_dir=Path("/d"),
                               config_path=Path("/c"))
    for f in dataclasses.fields(config.DaemonConfig):
        if f.name in NOT_DAEMON_KEYS or f.name in config.NOT_KEYS:
            continue
        cases.append(("daemon", f.name, "DaemonConfig", _wrong_type(getattr(base, f.name))))
    cases += [("daemon", "socket_path", "DaemonConfig", ["a"]),
              ("daemon", "data_dir", "DaemonConfig", 5),
              ("daemon", "socket_path", "DaemonConfig", "relative/r.sock")]
    for sub, cls in WORKSPACE_TABLES.items():
        header = "workspace_defaults" + (f".{sub}" if sub else "")
        instance = cls()
        for f in dataclasses.fields(cls):
            if f.name in config.NOT_KEYS:
                continue
            value = getattr(instance, f.name)
            if f.name == "auto_memory_interval":
                value = 5
            cases.append((header, f.name, cls.__name__, _wrong_type(value)))
    for (cls_name, key), rule in config_rules.RULES.items():
        if cls_name == "DaemonConfig":
            cases.append(("daemon", key, cls_name, rule.bad))
            continue
        sub = next(s for s, c in WORKSPACE_TABLES.items() if c.__name__ == cls_name)
        header = "workspace_defaults" + (f".{sub}" if sub else "")
        cases.append((header, key, cls_name, rule.bad))
    # A URL the parser itself refuses (an unclosed IPv6 bracket).
    # ... or takes apart without a word (a space in the host, a line break or tab).
    cases += [(f"workspace_defaults.{sub}", "base_url", cls.__name__, url)
              for sub, cls in WORKSPACE_TABLES.items() if sub.endswith("model_config")
              for url in ("http://[::1/v1", "http://exa mple.com/v1", "https://h\u00a0x/v1",
                          "https://h\t/v1", " https://h/v1")]
    return cases


CASES = _cases()


def _write(tmp_path: Path, header: str, key: str, value: Any) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f"[{header}]\n{key} = {config_rules.shown(value)}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("header", "key", "cls_name", "value"), CASES,
                         ids=[f"{h}.{k}={v!r}" for h, k, _, v in CASES])
def test_bad_value_is_exit_2_naming_file_key_and_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        header: str, key: str, cls_name: str, value: Any) -> None:
    path = _write(tmp_path, header, key, value)
    for name in ("RECALLD_SOCKET", "RECALLD_DATA_DIR", "RECALLD_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    frozen = gc.get_freeze_count()
    assert daemon_main.main(["--config", str(path)]) == daemon_main.EXIT_CONFIG
    # Refused before the process is tuned for serving (collector, allocator).
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"recalld: configuration error: {path}: "), line
    assert f"{key} = {config_rules.shown_setting(key, value)}" in line, line
    assert "must" in line or "never fires" in line, line


def test_every_number_has_a_range_and_every_text_a_rule_or_is_free_text() -> None:
    base = config.DaemonConfig(socket_path=Path("/s"), data_dir=Path("/d"),
                               config_path=Path("/c"))
    classes = [(config.DaemonConfig, base)] + [(c, c()) for c in WORKSPACE_TABLES.values()]
    missing = []
    for cls, instance in classes:
        for f in dataclasses.fields(cls):
            if f.name in config.NOT_KEYS:
                continue
            value = getattr(instance, f.name)
            if f.name in NOT_DAEMON_KEYS or dataclasses.is_dataclass(value) or value is None:
                continue
            if isinstance(value, bool):
                continue
            if (cls.__name__, f.name) in FREE_TEXT:
                continue
            if (cls.__name__, f.name) not in config_rules.RULES:
                missing.append(f"{cls.__name__}.{f.name}")
    assert not missing, f"keys without a rule in config_rules.RULES: {missing}"


def test_every_default_passes_its_rule() -> None:
    base = config.DaemonConfig(socket_path=Path("/s"), data_dir=Path("/d"),
                               config_path=Path("/c"))
    instances = {"DaemonConfig": base, **{c.__name__: c() for c in WORKSPACE_TABLES.values()}}
    for (cls_name, key), rule in config_rules.RULES.items():
        assert rule.check(getattr(instances[cls_name], key)) is None, (cls_name, key)


def test_embedding_backends_are_the_providers() -> None:
    from recalld.daemon.providers.embedding_formats import BACKENDS

    assert set(config_rules.EMBEDDING_BACKENDS) == set(BACKENDS)


@pytest.mark.parametrize(("text", "needle"), [
    ('[workspaces."../x"]\n', '[workspaces."../x"]'),
    ('[workspaces.a]\npath = "relative/dir"\n', '[workspaces.a] path = "relative/dir"'),
    ("workspaces = 5\n", "workspaces = 5"),
    ("daemon = 3\n", "daemon must be a table"),
    ('[workspace_defaults]\ndream_cron = "every night"\n', 'dream_cron = "every night"'),
    # Five fields, one of them out of range: the field is named, not the count.
    ('[workspace_defaults]\ndream_cron = "0 25 * * *"\n',
     'dream_cron = "0 25 * * *": must have a valid hour field (0-23), not \'25\''),
    ('[workspaces.a]\ndream_cron = "30 4 * * 9"\n',
     'dream_cron = "30 4 * * 9": must have a valid weekday field'),
    ('[workspace_defaults]\ndream_cron = "*/0 4 * * *"\n', "valid minute field (0-59), not '*/0'"),
    ('[workspace_defaults]\ndream_cron = "R 23 * * *"\n',
     'dream_cron = "R 23 * * *": must not have a random field (R)'),
    ('[workspace_defaults.search]\nvector_weight = 0\nkeyword_weight = 0\n',
     "must not both be 0"),
    ('[workspace_defaults.chat_model_config]\nbreaker_open_s = 60\nbreaker_open_max_s = 30\n',
     "breaker_open_max_s = 30 must not be below breaker_open_s = 60"),
    ('[workspaces.a.chat_model_config]\nbreaker_open_max_s = 2\n',
     "breaker_open_max_s = 2 must not be below breaker_open_s = 5"),
    ("[workspace_defaults]\nsearch = 5\n", "search = 5: must be a table"),
    ("[daemon]\ncpu_thread = 2\nfoo = 1\n",
     "[daemon] unknown field(s) cpu_thread, foo (cpu_thread: did you mean cpu_threads?)"),
    ('[workspace_defaults.search]\nvectr_weight = 0.5\n',
     "unknown field(s) vectr_weight (vectr_weight: did you mean vector_weight?)"),
    ("[workspace_default]\nx = 1\n",
     "unknown table(s) workspace_default (workspace_default: did you mean "
     "workspace_defaults?)"),
    ('[workspace_defaults.embedding_model_config]\nbackend = "local"\n'
     'model_name = "multilingual-e5-smal"\n',
     '[workspace_defaults.embedding_model_config]: model_name = "multilingual-e5-smal": '
     'must name a local model'),
    ('[workspace_defaults.embedding_model_config]\nbackend = "local"\n'
     '[workspaces.a.embedding_model_config]\nmodel_name = "text-embedding-3-small"\n',
     '[workspaces.a.embedding_model_config]: model_name = "text-embedding-3-small"'),
    ("[daemon\n", "config.toml"),
    # Control characters of a value, a key or a table name are shown escaped: one line,
    # which no value can end early or follow with lines of its own.
    ('[workspace_defaults]\ndaily_dir = "memory\\nforged: line"\n',
     'daily_dir = "memory\\nforged: line": must be a directory name without control'),
    ('[daemon]\nlog_level = "INFO\\r\\u001b[2J"\n', 'log_level = "INFO\\r\\u001B[2J": must be'),
    ('[daemon]\n"cpu\\nthreads" = 2\n', "[daemon] unknown field(s) cpu\\nthreads"),
    ('[workspaces."a\\u2028b"]\nauto_memory_interval = 3\n',
     '[workspaces."a\\u2028b"]: the agent id'),
])
def test_structure_errors_are_one_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(config.ConfigError) as info:
        config.load(config=path, environ={"HOME": str(tmp_path)})
    message = str(info.value)
    assert message.startswith(f"{path}: ") and needle in message and message.isprintable()


def test_serve_with_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[daemon]\ndata_dir = 5\n", encoding="utf-8")
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "serve", "--config", str(path)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"recalld: configuration error: {path}: "
                                   "[daemon] data_dir = 5: must be a non-empty path string")


def test_tilde_is_expanded_and_paths_agree(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[daemon]\nsocket_path = "~/run/r.sock"\ndata_dir = "~/data"\n'
                    '[workspaces.a]\npath = "~/ws/a"\n', encoding="utf-8")
    env = {"HOME": str(tmp_path), "RECALLD_CONFIG": str(path)}
    cfg = config.load(environ=env)
    assert cfg.socket_path == tmp_path / "run" / "r.sock"
    assert cfg.data_dir == tmp_path / "data"
    assert cfg.workspace_path("a") == tmp_path / "ws" / "a"
    # The clients' resolution reads the same file the same way.
    from recalld.ipc import paths

    assert paths.socket_path(environ=env) == cfg.socket_path
    assert paths.data_dir(env) == cfg.data_dir
    # The environment still wins over the file, as the README's table says.
    assert paths.socket_path(environ={**env, "RECALLD_SOCKET": "/x/y.sock"}) == Path(
        "/x/y.sock")
    assert config.load(environ={**env, "RECALLD_SOCKET": "/x/y.sock"}).socket_path == Path(
        "/x/y.sock")


@pytest.mark.parametrize(("text", "shown", "secret"), [
    ('[workspace_defaults.chat_model_config]\napi_key = ["sk-proj-Zq8Wx7Vc6Bn5Mm4Ll3Kk2"]\n',
     "api_key = ***: must be a string", "Zq8Wx7Vc6Bn5Mm4Ll3Kk2"),
    ('[workspaces.a.embedding_model_config]\nbase_url = "ftp://me:Pw-77x@h/v1?key=AIzaQ1"\n',
     'base_url = "ftp://me:***@h/v1?key=***": must be', "Pw-77x"),
    ('[workspace_defaults.chat_model_config]\nbase_url = "gopher://h/v1?token=Tok-99x&a=1"\n',
     'base_url = "gopher://h/v1?token=***&a=1": must be', "Tok-99x"),
])
def test_serve_with_a_bad_secret_value_does_not_print_it(tmp_path: Path, text: str,
                                                         shown: str, secret: str) -> None:
    """The error line goes to the journal or the start log: a credential's value, a URL's
    password or key, is masked there as in settings."""
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "serve", "--config", str(path)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert shown in proc.stderr and secret not in proc.stderr, proc.stderr


@pytest.mark.parametrize(("shape", "found"), [
    ("private", True), ("absent", False), ("group-writable", False), ("symlink", False),
    ("file", False)])
def test_without_xdg_runtime_dir_the_login_runtime_dir_is_used_when_it_is_ours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str, found: bool) -> None:
    """Under cron or ``sudo -u`` XDG_RUNTIME_DIR is unset while the user's systemd service
    listens under /run/user/<uid>: daemon and clients both pick that folder when it is a
    private folder of this user, and /tmp/recalld-<uid> otherwise."""
    from recalld.ipc import paths

    root = tmp_path / "run-user"
    root.mkdir()
    mine = root / str(os.getuid())
    if shape in ("private", "group-writable"):
        mine.mkdir(mode=0o700)
        if shape == "group-writable":
            mine.chmod(0o770)
    elif shape == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        mine.symlink_to(tmp_path / "elsewhere")
    elif shape == "file":
        mine.write_text("", encoding="utf-8")
    monkeypatch.setattr(paths, "SYSTEMD_RUNTIME_ROOT", root)
    env = {"HOME": str(tmp_path), "RECALLD_CONFIG": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text("", encoding="utf-8")
    want = (mine / "recalld" / "recalld.sock" if found
            else Path(f"/tmp/recalld-{os.getuid()}") / "recalld.sock")
    assert paths.socket_path(environ=env) == want
    assert config.load(environ=env).socket_path == want
    # A session's own XDG_RUNTIME_DIR still decides first.
    other = {**env, "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    assert paths.socket_path(environ=other) == tmp_path / "xdg" / "recalld" / "recalld.sock"


def test_relative_xdg_variables_are_ignored_by_daemon_and_clients(tmp_path: Path) -> None:
    """A relative XDG_* variable is ignored, as the XDG specification says: taken from the
    working directory, a daemon and a client started in different folders would look for
    different sockets, files and data."""
    from recalld.ipc import install, paths

    relative = {"XDG_RUNTIME_DIR": "run", "XDG_CONFIG_HOME": "cfg", "XDG_DATA_HOME": "data"}
    env = {"HOME": str(tmp_path), **relative}
    cfg = config.load(environ=env)
    assert cfg.config_path == tmp_path / ".config" / "recalld" / "config.toml"
    assert cfg.data_dir == tmp_path / ".local" / "share" / "recalld"
    assert cfg.socket_path.is_absolute(), cfg.socket_path
    assert paths.socket_path(environ=env) == cfg.socket_path
    assert paths.data_dir(env) == cfg.data_dir
    assert install.unit_dir(env) == tmp_path / ".config" / "systemd" / "user"
    # The unit gets neither the relative value nor %t for a socket %t does not name.
    assert install.listen_path(cfg.socket_path, env) == cfg.socket_path


def test_a_runtime_dir_too_long_for_the_socket_is_a_configuration_error(
        tmp_path: Path) -> None:
    runtime = tmp_path / ("r" * max(1, 100 - len(str(tmp_path))))
    runtime.mkdir(mode=0o700)
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime), "PATH": "/usr/bin:/bin",
           "RECALLD_DATA_DIR": str(tmp_path / "data")}
    for args in (["serve"], ["ping"], ["--json", "status"]):
        proc = subprocess.run([sys.executable, "-m", "recalld.ipc", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == "", (args, proc)
        assert proc.stderr.startswith("recalld: configuration error: $XDG_RUNTIME_DIR"), \
            (args, proc.stderr)
        assert "longer than the 107 bytes" in proc.stderr, (args, proc.stderr)
        assert "a shorter one with --socket, RECALLD_SOCKET" in proc.stderr, proc.stderr


def test_a_path_that_is_not_utf8_is_a_configuration_error(tmp_path: Path) -> None:
    """A data directory or socket named in another encoding (bytes an environment
    variable may hold) is refused at start, naming it, rather than served by a daemon
    whose status and workspaces then fail with an internal error."""
    latin1 = os.fsdecode(b"caf\xe9")
    base = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for name, value, command in (
            ("RECALLD_DATA_DIR", f"{tmp_path}/{latin1}", "serve --check-config"),
            ("XDG_DATA_HOME", f"{tmp_path}/{latin1}", "serve --check-config"),
            ("RECALLD_SOCKET", f"{tmp_path}/{latin1}.sock", "status"),
            ("XDG_RUNTIME_DIR", f"{tmp_path}/{latin1}", "ping")):
        proc = subprocess.run([sys.executable, "-m", "recalld.ipc", *command.split()],
                              env={**base, name: value}, capture_output=True, timeout=120,
                              check=False)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and "Traceback" not in err, (name, err)
        assert err.startswith("recalld: configuration error: ") and "caf\\xe9" in err, err
        assert "is not valid UTF-8" in err, (name, err)


def test_a_utf8_path_under_a_locale_that_reads_names_as_ascii_is_read_as_utf8(
        tmp_path: Path) -> None:
    # A C locale with Python's UTF-8 mode and locale coercion off reads file names as
    # ASCII: a home named in UTF-8 was refused as "not valid UTF-8". The command runs in
    # UTF-8 mode whatever the locale, and shows the name in the locale's encoding.
    home = tmp_path / "hö 北"
    base = {"HOME": str(home), "XDG_RUNTIME_DIR": str(home / "run"), "PATH": "/usr/bin:/bin",
            "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    checked = subprocess.run([sys.executable, "-m", "recalld.ipc", "serve", "--check-config"],
                             env=base, capture_output=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stderr
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "status"],
                          env=base, capture_output=True, timeout=120, check=False)
    err = proc.stderr.decode("ascii")
    assert proc.returncode == 3 and "Traceback" not in err, err
    assert "daemon not running at " + str(home).replace("hö 北", "h\\xf6 \\u5317") in err, err
