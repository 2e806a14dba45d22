"""A test's hook run at the start of a daemon function, in whatever thread calls it:
to hold a merge or a copy at a known point, or to make it fail there."""

from __future__ import annotations

import sys
from collections.abc import Callable

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


#: Launcher lines: the sessions store of agent $HOLD_AGENT starts only once a writer opened
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

#: Launcher lines: while a FIFO is at $HOLD_CONFIG, a read of the configuration file reads
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


def launcher(*lines: str) -> tuple[str, ...]:
    """A daemon launcher (``daemon_factory(..., launcher=launcher(...))``): the daemon,
    started as ``recalld serve`` after ``lines`` (Python) have run."""
    return (sys.executable, "-c", "\n".join([
        "import runpy, sys", *lines, "sys.argv[0] = 'recalld'",
        "runpy.run_module('recalld.daemon.main', run_name='__main__')"]))


def sessions_held() -> tuple[str, ...]:
    """A daemon launcher (``daemon_factory(..., launcher=sessions_held(), HOLD=fifo,
    HOLD_AGENT=agent)``) whose sessions store of ``agent`` starts only once a writer opened
    the FIFO ``fifo`` and closed it: that workspace's start held after its search stage,
    in a worker thread, as a file on a hung mount would hold it."""
    return launcher(SESSIONS_HELD)
