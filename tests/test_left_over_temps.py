"""Writes a kill cut short before their rename leave their temp file, in folders no
generation store or append log tidies: a change log's (``mem_metadata/dream/runs``), a
dialog log's (``mem_session/dialog``), the config file's a restore writes, a restore's
probe of the incoming config (``state/``). The next start, or the workspace's next open,
removes those of the daemon's own naming, never another file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from waits import wait_for

from recalld.daemon.store.fsio import TEMP_RE

# Runs one of the daemon's writers, SIGKILLed where it would rename its temp file into
# place (or, for the config probe, where it would read the probe it wrote).
KILLED_WRITE = """
import os, signal, sys
from pathlib import Path
from types import SimpleNamespace
from recalld.daemon.store import fsio

def kill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

what, where = sys.argv[1], Path(sys.argv[2])
if what != "probe":
    fsio.FS.replace = kill
if what == "changelog":
    from recalld.daemon.memory import changelog
    changelog.write_record(where, "20260501T000000Z-abcdef", {"run_id": "x"}, "# run")
elif what == "dialog":
    from recalld.daemon.memory import dialog_log
    dialog_log.append(where, "mem_session/dialog/s-1.jsonl", [{"seq": 1, "content": "hi"}])
elif what == "config":
    from recalld.daemon.rpc import restore_config
    restore_config.restore_config(SimpleNamespace(config=SimpleNamespace(config_path=where)),
                                  b"# restored")
elif what == "probe":
    from recalld.daemon import config
    from recalld.daemon.rpc import restore_config
    config.load = kill
    restore_config.incoming_config(SimpleNamespace(config=SimpleNamespace(state_dir=where)),
                                   b"# incoming")
"""


def _killed(what: str, where: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_WRITE, what, str(where)], check=False)
    assert done.returncode == -signal.SIGKILL


def _hidden(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob(".*"))


def test_temp_files_of_killed_writes_are_removed_at_the_next_start_and_open(
        daemon_factory: Any, tmp_path: Path) -> None:
    root, data, config_home = tmp_path / "ws", tmp_path / "data", tmp_path / "cfg"
    config = config_home / "recalld" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("", encoding="utf-8")
    (data / "state").mkdir(parents=True, mode=0o700)
    data.chmod(0o700)
    _killed("changelog", root / "mem_metadata" / "dream" / "runs")
    _killed("dialog", root)
    _killed("config", config)
    _killed("probe", data / "state")
    left = _hidden(tmp_path)
    assert len(left) == 4, left
    assert all(TEMP_RE.match(Path(name).name) for name in left)  # of the daemon's naming
    # Not of the daemon's naming, or not a file: the user's, left alone.
    keep = [root / "mem_metadata" / ".draft.tmp-notes", root / "mem_session" / "x.tmp-0123abcd",
            config.parent / ".other.toml.tmp-0123456789ab"]
    for path in keep:
        path.write_text("mine", encoding="utf-8")
    (root / "mem_session" / ".s.tmp-0123456789ab").symlink_to(keep[0])

    d = daemon_factory(XDG_CONFIG_HOME=str(config_home), RECALLD_DATA_DIR=str(data))
    d.call("workspace.open", {"agent_id": "tidy", "path": str(root)})
    kept = ["cfg/recalld/.other.toml.tmp-0123456789ab", "ws/mem_metadata/.draft.tmp-notes",
            "ws/mem_session/.s.tmp-0123456789ab"]
    # (A save of the daemon's own under way, the scheduler's after the open, shows its
    # temp file for a moment: what is left once none is.)
    wait_for(lambda: _hidden(tmp_path) == kept, what="only the user's files left")
    assert all(path.read_text(encoding="utf-8") == "mine" for path in keep)
    assert config.read_text(encoding="utf-8") == ""  # the restore never happened
    assert list((root / "mem_metadata" / "dream" / "runs").iterdir()) == []
    assert not (root / "mem_session" / "dialog" / "s-1.jsonl").exists()


def test_a_sync_cookie_a_kill_left_in_the_notes_is_removed_by_the_next_scan(
        daemon: Any, tmp_path: Path) -> None:
    # A daemon killed while it waited for a sync's cookie left it (empty, hidden) for good.
    root = tmp_path / "ws"
    cookie = root / "memory" / ".recalld-cookie-4242-7"
    cookie.parent.mkdir(parents=True)
    cookie.touch()
    mine = root / "memory" / ".recalld-cookies.md"  # hidden, but not a cookie's name
    mine.write_text("mine", encoding="utf-8")
    # Left before the workspace opens, on the coarse clock file times are taken from (in
    # the same tick it would be as new as the open, which a live sync's cookie is).
    made = cookie.stat().st_ctime_ns
    while time.clock_gettime_ns(5) <= made:  # CLOCK_REALTIME_COARSE
        pass
    daemon.call("workspace.open", {"agent_id": "tidy", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "tidy"})  # its syncs' own cookies come and go
    assert sorted(p.name for p in cookie.parent.iterdir()) == [mine.name]
