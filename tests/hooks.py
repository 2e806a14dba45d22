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


def sessions_held() -> tuple[str, ...]:
    """A daemon launcher (``daemon_factory(..., launcher=sessions_held(), HOLD=fifo,
    HOLD_AGENT=agent)``) whose sessions store of ``agent`` starts only once a writer opened
    the FIFO ``fifo`` and closed it: that workspace's start held after its search stage,
    in a worker thread, as a file on a hung mount would hold it."""
    return (sys.executable, "-c", "\n".join([
        "import os, runpy, sys, trio",
        "from recalld.daemon.memory.sessions import SessionStore",
        "real = SessionStore.open",
        "async def held(self):",
        "    if self.agent_id == os.environ['HOLD_AGENT']:",
        "        await trio.to_thread.run_sync(lambda: open(os.environ['HOLD'], 'rb').read())",
        "    await real(self)",
        "SessionStore.open = held",
        "sys.argv[0] = 'recalld'",
        "runpy.run_module('recalld.daemon.main', run_name='__main__')"]))
