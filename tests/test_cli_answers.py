"""An answer the command cannot show (a daemon of another version, one whose answer lacks
a key or has another shape) is one error line and exit status 1, never a traceback. The
daemon is the fake JSON-RPC server of the client tests, answering a bare string."""

from __future__ import annotations

import pytest
from fakes.rpc_daemon import FakeDaemon, fake, sockdir

from recalld.ipc.cli import main

__all__ = ["fake", "sockdir"]  # fixtures, used by name

# (command, the method it calls that answers out of shape). A list that is not one
# (dream --runs, inbox list, changes) the client refuses itself, in one line too.
COMMANDS = [
    (["note", "a heron by the pond"], "memory.add_note"),
    (["read", "memory/2026-07-23/heron.md"], "memory.read"),
    (["backup", "list"], "backup.list"),
    (["metrics"], "daemon.metrics"),
    (["verify"], "index.verify"),
    (["jobs", "get", "j1", "--agent", "default"], "jobs.get"),
]


@pytest.mark.parametrize(("args", "method"), COMMANDS)
def test_an_answer_out_of_shape_is_one_line_and_exit_1(
        fake: FakeDaemon, capsys: pytest.CaptureFixture[str], args: list[str],
        method: str) -> None:
    fake.misshapen.add(method)
    code = main(["--socket", str(fake.path), *args])
    err = capsys.readouterr().err
    assert code == 1, (code, err)
    assert err.startswith("recalld: unexpected answer from the daemon (") and \
        err.count("\n") == 1, err
    assert "another version" in err and "Traceback" not in err
