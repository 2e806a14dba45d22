"""Shared workspaces whose server asks for a password: the password comes from a
``passfile`` or ``password_env``, and a source libpq cannot use is named in status.

A role of its own must authenticate by password on the server of ``pg_server`` (the
other roles stay trusted); the rule is removed again after the test.
"""

from __future__ import annotations

import os
import pwd
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.sql
import pytest
from clirun import run_recalld
from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import remote_status
from waits import wait_for

ROLE = "recalld_pw"
#: Characters a .pgpass line must escape (``:`` and ``\\``), and a few a URI would.
PASSWORD = "p:a\\ss w#@rd"


@pytest.fixture
def password_role(pg_server: PgServer) -> Iterator[str]:  # noqa: F811
    """A DSN naming a role that must give its password (scram-sha-256)."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        # Kept for the session: what it created first (the schema) stays its own.
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone() is None:
            conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                psycopg.sql.Identifier(ROLE), psycopg.sql.Literal(PASSWORD)))
        row = conn.execute("SHOW hba_file").fetchone()
    assert row is not None
    hba = Path(str(row[0]))
    rules = hba.read_text()
    hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n{rules}")
    try:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield f"postgresql://{ROLE}@127.0.0.1:{pg_server.port}/postgres"
    finally:
        hba.write_text(rules)
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")


def shared(daemon_factory: DaemonFactory, dsn: str, name: str, extra: str,
           data: Path | None = None, **env: str) -> DaemonHandle:
    if data:
        env["RECALLD_DATA_DIR"] = str(data)
    return daemon_factory(f'[workspaces.default]\nremote = {{ kind = "postgres", dsn = '
                          f'"{dsn}", name = "{name}", host = "h1"{extra} }}\n', **env)


def settled(d: DaemonHandle) -> dict[str, object]:
    return wait_for(lambda: (lambda s: s if s["state"] == "online" or s["last_error"]
                             else None)(remote_status(d)), what="online or an error")


def test_a_passfile_libpq_ignores_is_named_in_status(
        daemon_factory: DaemonFactory, password_role: str, tmp_path: Path) -> None:
    passfile = tmp_path / "pgpass"
    port = password_role.rsplit(":", 1)[1].split("/")[0]
    passfile.write_text(f"127.0.0.1:{port}:postgres:{ROLE}:"
                        + PASSWORD.replace("\\", "\\\\").replace(":", "\\:") + "\n")
    passfile.chmod(0o600)
    name = "t" + uuid.uuid4().hex[:12]
    extra = f', passfile = "{passfile}"'
    d = shared(daemon_factory, password_role, name, extra)
    assert settled(d)["state"] == "online"
    d.stop()

    # Readable by others, libpq skips the file and the server finds no password: status
    # says which file and why, not only the server's "no password supplied".
    passfile.chmod(0o644)
    d = shared(daemon_factory, password_role, name, extra, d.data_dir)
    status = settled(d)
    assert status["state"] == "offline", status
    assert f"passfile {passfile} is ignored by libpq: its mode 0644" in str(
        status["last_error"]), status
    assert PASSWORD not in d.log()
    # Put right, the file is read at the next attempt: no restart needed.
    passfile.chmod(0o600)
    wait_for(lambda: remote_status(d)["state"] == "online", what="online once chmod 600")
    d.stop()

    passfile.unlink()
    d = shared(daemon_factory, password_role, name, extra, d.data_dir)
    assert f"passfile {passfile} does not exist" in str(settled(d)["last_error"])


def test_an_unset_password_variable_is_named_in_status(
        daemon_factory: DaemonFactory, password_role: str) -> None:
    name = "t" + uuid.uuid4().hex[:12]
    d = shared(daemon_factory, password_role, name, ', password_env = "RECALLD_PW_UNSET"')
    status = settled(d)
    assert status["state"] == "offline", status
    assert "password_env names RECALLD_PW_UNSET, which is not set" in str(
        status["last_error"]), status


def test_a_password_file_libpq_looks_for_by_itself_is_named_when_skipped(
        daemon_factory: DaemonFactory, password_role: str, tmp_path: Path) -> None:
    # Not in the config: the file of PGPASSFILE (or ~/.pgpass), and one the DSN names.
    passfile = tmp_path / "pgpass"
    passfile.write_text("*:*:*:*:" + PASSWORD.replace("\\", "\\\\").replace(":", "\\:")
                        + "\n")
    passfile.chmod(0o640)
    name = "t" + uuid.uuid4().hex[:12]
    d = shared(daemon_factory, password_role, name, "", PGPASSFILE=str(passfile))
    status = settled(d)
    assert status["state"] == "offline", status
    assert f"passfile {passfile} is ignored by libpq: its mode 0640" in str(
        status["last_error"]), status
    d.stop()

    keywords = password_role.replace("postgresql://", "user=").replace(
        "@127.0.0.1:", " host=127.0.0.1 port=").replace("/postgres", " dbname=postgres")
    d = shared(daemon_factory, f"{keywords} passfile={passfile}", name, "", d.data_dir)
    assert f"passfile {passfile} is ignored by libpq" in str(settled(d)["last_error"])
    passfile.chmod(0o600)
    wait_for(lambda: remote_status(d)["state"] == "online", what="online once chmod 600")


def test_a_passfile_the_dsn_names_from_home_is_told_libpq_does_not_expand_it(
        daemon_factory: DaemonFactory, password_role: str, tmp_path: Path) -> None:
    # The file is there, under the daemon's home, with mode 0600: but libpq takes a
    # DSN's passfile as written, "~" and all, so it reads none and the server finds no
    # password. Status says why, not that the file is fine.
    (tmp_path / "pgpass").write_text("*:*:*:*:" + PASSWORD.replace("\\", "\\\\").replace(
        ":", "\\:") + "\n")
    (tmp_path / "pgpass").chmod(0o600)
    keywords = password_role.replace("postgresql://", "user=").replace(
        "@127.0.0.1:", " host=127.0.0.1 port=").replace("/postgres", " dbname=postgres")
    name = "t" + uuid.uuid4().hex[:12]
    d = shared(daemon_factory, f"{keywords} passfile=~/pgpass", name, "", HOME=str(tmp_path))
    status = settled(d)
    assert status["state"] == "offline", status
    assert "passfile ~/pgpass does not exist: libpq does not expand ~" in str(
        status["last_error"]), status


def test_a_password_the_server_rejects_is_a_refused_login_not_offline(
        daemon_factory: DaemonFactory, password_role: str, tmp_path: Path) -> None:
    # The server answers and refuses the login: status said "offline", as if it could
    # not be reached. Whichever source gives the wrong password.
    wrong = "not-" + PASSWORD.replace("\\", "")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:*:{wrong}\n")
    passfile.chmod(0o600)
    name = "t" + uuid.uuid4().hex[:12]
    for extra, env in ((', password_env = "RECALLD_PW"', {"RECALLD_PW": wrong}),
                       (f', passfile = "{passfile}"', {})):
        d = shared(daemon_factory, password_role, name, extra, **env)
        status = settled(d)
        assert status["state"] == "denied", status
        assert f'password authentication failed for user "{ROLE}"' in str(
            status["last_error"]), status
        proc = run_recalld(("status",), env=d.env)
        assert "remote:  denied, outbox 0" in proc.stdout, proc.stdout
        assert "the server refused the login" in proc.stdout, proc.stdout
        assert wrong not in d.log() and wrong not in proc.stdout
        d.stop()


def test_a_table_passfile_under_an_empty_home_is_the_users_home(
        daemon_factory: DaemonFactory, password_role: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty HOME is no home: "~/x" was "/x"; it is the user's home, as libpq finds it.
    own = Path(pwd.getpwuid(os.getuid()).pw_dir)
    if own == Path("/"):
        pytest.skip("this user's home is /, where ~/x and /x are one")
    monkeypatch.chdir(tmp_path)  # the daemon's log, under an empty HOME
    name = "t" + uuid.uuid4().hex[:12]
    d = shared(daemon_factory, password_role, name,
               ', passfile = "~/recalld-no-such-pgpass"', HOME="")
    assert f"passfile {own}/recalld-no-such-pgpass does not exist" in str(
        settled(d)["last_error"])
