"""A lock per key (an agent, say), kept only while in use.

Owns nothing and starts nothing. A lock is kept while something refers to it: a task
holding it or waiting for it, or an object it was handed to (a workspace's services).
Then every caller naming the key gets that one lock; once none refers to it, the entry
goes with it, so the memory kept grows with what is in use, not with every key ever
named (a call closing a workspace under a made-up agent id leaves nothing behind).
"""

from __future__ import annotations

import weakref

import trio


class KeyedLocks:
    """The lock of each key, created when first asked for, dropped when unused."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, trio.Lock] = weakref.WeakValueDictionary()

    def of(self, key: str) -> trio.Lock:
        """``key``'s lock: the one in use if any refers to it, else a new one."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = trio.Lock()
        return lock

    def __len__(self) -> int:
        """How many keys have a lock in use."""
        return len(self._locks)
