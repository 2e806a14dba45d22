"""Places a user may choose that lie in system trees, seen from outside: a data folder or a
workspace on the tmpfs every user may write in (``/dev/shm``) is the user's own, while
the shared folder itself, like ``/tmp``, is not a workspace."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DaemonFactory

from recalld.ipc import errors
from recalld.ipc.client import Client

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
