"""Calls on a workspace that a client opened and another client may close meanwhile.

A daemon asked about a workspace it does not have open refuses the call
(``UnknownWorkspace``) without doing anything, so the call is safe to make again once
the workspace is open again. The integrations (AgentScope middlewares, the MCP bridge)
open their workspace once and remember it; :func:`on_workspace` is how they call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from recalld.ipc import errors

T = TypeVar("T")


async def on_workspace(open_: Callable[[bool], Awaitable[object]],
                       call: Callable[[], Awaitable[T]]) -> T:
    """``call()`` after ``open_(False)`` (which opens the workspace unless it is known to be
    open). If the daemon no longer has it open, ``open_(True)`` opens it again and the call
    is made once more."""
    await open_(False)
    try:
        return await call()
    except errors.UnknownWorkspace:
        await open_(True)
        return await call()
