"""The client flavours of the method table: one bound method per builder.

:func:`sync_method` and :func:`async_method` turn each builder of
:mod:`recalld.ipc._methods` into a bound method with the builder's exact signature that runs
its :class:`~recalld.ipc._call.Call`; :class:`SyncMethods` and :class:`AsyncMethods` hold
every method of the table that way, mixed into the blocking and the async client, so the
two flavours cannot drift apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from recalld.ipc._call import Call
from recalld.ipc._methods import (
    add_note,
    add_turns,
    backup_create,
    backup_list,
    backup_restore,
    backup_rollback,
    backup_verify,
    dream_runs,
    dream_undo,
    end_session,
    inbox_ack,
    inbox_list,
    index_compact,
    index_sync,
    index_verify,
    interests,
    jobs_cancel,
    jobs_get,
    jobs_list,
    jobs_submit,
    memory_changes,
    memory_index,
    memory_list,
    metrics,
    ping,
    read,
    recall,
    search,
    select,
    status,
    topic_edit,
    topic_write,
    workspace_close,
    workspace_list,
    workspace_open,
)

P = ParamSpec("P")
T = TypeVar("T")


class SyncRunner(Protocol):
    def _run(self, call: Call[T]) -> T: ...


class AsyncRunner(Protocol):
    async def _run(self, call: Call[T]) -> T: ...


def sync_method(builder: Callable[P, Call[T]]) -> Callable[Concatenate[SyncRunner, P], T]:
    """A blocking client method with ``builder``'s signature."""

    @functools.wraps(builder)
    def method(self: SyncRunner, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(builder(*args, **kwargs))

    return method


def async_method(
    builder: Callable[P, Call[T]],
) -> Callable[Concatenate[AsyncRunner, P], Coroutine[Any, Any, T]]:
    """An async client method with ``builder``'s signature."""

    @functools.wraps(builder)
    async def method(self: AsyncRunner, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(builder(*args, **kwargs))

    return method



class SyncMethods:
    """Every method of the table as a blocking method (mixed into the sync client)."""

    ping = sync_method(ping)
    status = sync_method(status)
    workspace_open = sync_method(workspace_open)
    workspace_list = sync_method(workspace_list)
    workspace_close = sync_method(workspace_close)
    read = sync_method(read)
    search = sync_method(search)
    index_sync = sync_method(index_sync)
    jobs_submit = sync_method(jobs_submit)
    jobs_get = sync_method(jobs_get)
    jobs_list = sync_method(jobs_list)
    jobs_cancel = sync_method(jobs_cancel)
    add_turns = sync_method(add_turns)
    end_session = sync_method(end_session)
    add_note = sync_method(add_note)
    memory_index = sync_method(memory_index)
    memory_list = sync_method(memory_list)
    recall = sync_method(recall)
    topic_write = sync_method(topic_write)
    topic_edit = sync_method(topic_edit)
    interests = sync_method(interests)
    select = sync_method(select)
    inbox_list = sync_method(inbox_list)
    inbox_ack = sync_method(inbox_ack)
    dream_runs = sync_method(dream_runs)
    memory_changes = sync_method(memory_changes)
    dream_undo = sync_method(dream_undo)
    backup_create = sync_method(backup_create)
    backup_list = sync_method(backup_list)
    backup_verify = sync_method(backup_verify)
    backup_restore = sync_method(backup_restore)
    backup_rollback = sync_method(backup_rollback)
    index_verify = sync_method(index_verify)
    index_compact = sync_method(index_compact)
    metrics = sync_method(metrics)


class AsyncMethods:
    """Every method of the table as an async method (mixed into the async client)."""

    ping = async_method(ping)
    status = async_method(status)
    workspace_open = async_method(workspace_open)
    workspace_list = async_method(workspace_list)
    workspace_close = async_method(workspace_close)
    read = async_method(read)
    search = async_method(search)
    index_sync = async_method(index_sync)
    jobs_submit = async_method(jobs_submit)
    jobs_get = async_method(jobs_get)
    jobs_list = async_method(jobs_list)
    jobs_cancel = async_method(jobs_cancel)
    add_turns = async_method(add_turns)
    end_session = async_method(end_session)
    add_note = async_method(add_note)
    memory_index = async_method(memory_index)
    memory_list = async_method(memory_list)
    recall = async_method(recall)
    topic_write = async_method(topic_write)
    topic_edit = async_method(topic_edit)
    interests = async_method(interests)
    select = async_method(select)
    inbox_list = async_method(inbox_list)
    inbox_ack = async_method(inbox_ack)
    dream_runs = async_method(dream_runs)
    memory_changes = async_method(memory_changes)
    dream_undo = async_method(dream_undo)
    backup_create = async_method(backup_create)
    backup_list = async_method(backup_list)
    backup_verify = async_method(backup_verify)
    backup_restore = async_method(backup_restore)
    backup_rollback = async_method(backup_rollback)
    index_verify = async_method(index_verify)
    index_compact = async_method(index_compact)
    metrics = async_method(metrics)
