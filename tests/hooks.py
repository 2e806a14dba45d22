"""A test's hook run at the start of a daemon function, in whatever thread calls it:
to hold a merge or a copy at a known point, or to make it fail there."""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


def run_first(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
              hook: Callable[[], None]) -> None:
    """Replace ``owner.name`` (for the test) by a function that calls ``hook()`` and then
    the real one with the same arguments."""
    real = getattr(owner, name)

    def first(*args: object, **kwargs: object) -> object:
        hook()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, first)


#: Start hook lines: the sessions store of agent $HOLD_AGENT starts only once a writer opened
#: the FIFO $HOLD and closed it.
SESSIONS_HELD = "\n".join([
    "import os, trio",
    "from recalld.daemon.memory.sessions import SessionStore",
    "real_open = SessionStore.open",
    "async def held(self):",
    "    if self.agent_id == os.environ['HOLD_AGENT']:",
    "        await trio.to_thread.run_sync(lambda: open(os.environ['HOLD'], 'rb').read())",
    "    await real_open(self)",
    "SessionStore.open = held"])

#: Start hook lines: while a FIFO is at $HOLD_CONFIG, a read of the configuration file reads
#: it instead, waiting for a writer as a file on a hung mount would hold its reader, and
#: takes what the writer wrote as the file's text (the daemon itself refuses a FIFO).
CONFIG_READ_HELD = "\n".join([
    "import os, stat",
    "from recalld.ipc import paths",
    "real_read = paths.read_regular_file",
    "def held_read(path):",
    "    hold = os.environ['HOLD_CONFIG']",
    "    if os.path.exists(hold) and stat.S_ISFIFO(os.stat(hold).st_mode):",
    "        with open(hold, 'rb') as f:",
    "            return f.read()",
    "    return real_read(path)",
    "paths.read_regular_file = held_read"])


def start_hook(tmp_path: Path, *lines: str) -> dict[str, str]:
    """The environment (``daemon_factory(..., **start_hook(tmp_path, ...))``) of a daemon
    that runs ``lines`` (Python) at its start, before ``main``: a folder on ``PYTHONPATH``
    holding only a ``sitecustomize.py`` (tests/test_daemon_hooks.py), so the daemon is
    forked from the worker's server as the others are, not a fresh interpreter as a
    launcher makes it. The daemon runs them once: it takes ``START_HOOK`` out of its
    environment, and the processes it spawns run nothing. The modules are imported when
    they run (a fork's are already): patch what a call looks up at its time (a module's
    or a class's attribute), never a name another module imported by ``from``."""
    text = "import os\nif os.environ.pop('START_HOOK', None):\n" + textwrap.indent(
        "\n".join(lines), "    ") + "\n"
    folder = tmp_path / f"hook-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(text, encoding="utf-8")
    return {"PYTHONPATH": str(folder), "START_HOOK": "1"}


def held_after_install(wait: list[str], *before: str) -> str:
    """Start hook lines: once a shared workspace's replica has written $HOLD_PATH (the first
    time), it goes on only after ``wait`` (lines run in ``install``, where ``self`` is the
    ``ReplicaFiles``; ``os`` and ``trio`` are imported) has ended. ``before``: lines run
    first, at the hook's top level (more imports, other patches)."""
    return "\n".join([
        "import os, trio",
        "from recalld.daemon.remote import replicafiles",
        *before,
        "real_install = replicafiles.ReplicaFiles._install",
        "done = []",
        "async def install(self, path, row, expect=replicafiles.ANY):",
        "    base = await real_install(self, path, row, expect)",
        "    if path == os.environ['HOLD_PATH'] and not done:",
        "        done.append(path)",
        *("        " + line for line in wait),
        "    return base",
        "replicafiles.ReplicaFiles._install = install"])
