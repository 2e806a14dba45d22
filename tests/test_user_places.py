"""The daemon's places in unusual environments, seen from outside.

- A data folder or a workspace on the tmpfs every user may write in (``/dev/shm``) is the
  user's own, while the shared folder itself, like ``/tmp``, is not a workspace.
- ``~`` in a path a client sends is the home of the user the daemon runs as, by the rule
  the config file's paths follow: an empty or relative ``HOME`` is not taken for it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DaemonFactory

from recalld.ipc import errors
from recalld.ipc.client import Client
from recalld.ipc.errors import RecalldError

SHM = Path("/dev/shm")


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    if not SHM.is_dir():
        pytest.skip("no /dev/shm on this system")
    made = Path(tempfile.mkdtemp(prefix="recalld-test-", dir=SHM))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_a_data_folder_and_workspaces_on_dev_shm_are_served(daemon_factory: DaemonFactory,
                                                             shm_dir: Path) -> None:
    daemon = daemon_factory(RECALLD_DATA_DIR=str(shm_dir / "data"))
    with Client(daemon.socket_path) as c:
        c.add_note("default", "the heron waits in the reeds at dusk")
        assert c.search("default", "heron", sync=True).results
        c.call("workspace.open", {"agent_id": "scratch", "path": str(shm_dir / "scratch")})
        c.add_note("scratch", "a note kept in memory only")
        assert c.search("scratch", "memory", sync=True).results
        for place in (SHM, Path("/dev"), Path("/dev/shm/../null"), Path("/run/user")):
            with pytest.raises(errors.InvalidParams, match="system folder"):
                c.call("workspace.open", {"agent_id": "other", "path": str(place)})
    assert (shm_dir / "data" / "workspaces" / "default" / "memory").is_dir()
    assert daemon.stop() == 0  # before the folder goes


def test_a_runtime_folder_is_a_place_only_for_its_own_user_and_only_where_it_is(
        daemon_factory: DaemonFactory) -> None:
    # Any folder below /run/user was taken for a user's: another uid's, or a runtime
    # folder that did not exist, which the open then made (as root, /run/user/0, 0755).
    others = [u for u in range(60000, 60100) if not Path(f"/run/user/{u}").exists()]
    missing = Path(f"/run/user/{others[0]}")
    assert not os.path.lexists(missing)
    daemon = daemon_factory()
    with Client(daemon.socket_path) as c:
        for place in (missing / "notes", Path("/run/user/../user") / str(others[1]) / "x"):
            with pytest.raises(errors.InvalidParams, match="system folder"):
                c.call("workspace.open", {"agent_id": "other", "path": str(place)})
    assert not os.path.lexists(missing)
    # The user's own runtime folder, where the login manager made it, is the user's.
    own = Path(f"/run/user/{os.getuid()}")
    if own.is_dir() and own.lstat().st_uid == os.getuid():
        with Client(daemon.socket_path) as c, tempfile.TemporaryDirectory(dir=own) as mine:
            c.call("workspace.open", {"agent_id": "mine", "path": mine})
            c.call("workspace.close", {"agent_id": "mine", "forget": True})
    assert daemon.stop() == 0


@pytest.mark.parametrize("home", ["", "relative-home"])
def test_a_tilde_under_an_unusable_home_is_the_users_home(
        daemon_factory: DaemonFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        home: str) -> None:
    own = Path(pwd.getpwuid(os.getuid()).pw_dir)
    if own == Path("/"):
        pytest.skip("this user's home is /, where ~/x and /x are one")
    monkeypatch.chdir(tmp_path)  # the daemon's log, under a relative HOME
    daemon = daemon_factory(HOME=home)
    up = "../" * (len(own.parts) - 1)
    asked = {  # each refused before anything is written: a place that is not there
        ("workspace.open", "path"): {"agent_id": "elsewhere", "path": f"~/{up}etc"},
        ("backup.restore", "file"): {"file": "~/recalld-no-such-backup.zip"},
        ("backup.create", "out"): {"out": "~/recalld-no-such-folder/b.zip"},
    }
    with Client(daemon.socket_path) as c:
        for (method, key), params in asked.items():
            with pytest.raises(RecalldError) as caught:
                c.call(method, params)
            expanded = f"{own}{str(params[key])[1:]}"
            assert expanded in caught.value.message, (method, caught.value.message)
    assert not (own / "recalld-no-such-folder").exists()
