"""The workspace inbox: what memory jobs changed, for agents to pick up.

Owns one workspace's inbox items and their log ``<metadata_dir>/inbox/inbox.jsonl`` (an
:class:`AppendLog`: CRC-checked lines, torn tail repaired at open). The log lives in the
workspace, not in the daemon's state directory, because items describe that workspace's
files and must follow it when it is opened at another path or by another daemon; it sits
under ``metadata_dir`` because it is daemon-written and never hand-edited. Losing it
loses notifications only, never memory.

An item is ``{id, time, kind, summary, changes: [paths], job_id, details, acked}``; ids
are digits, in push order, and never given twice: each is at least its push time in
milliseconds, so ids stay ahead of any a client saw before the log went back. Jobs call
:meth:`Inbox.push` only when they changed memory (an empty ``changes`` list is refused).
Each push is published on the event bus as topic ``inbox.item`` with payload
``{agent_id, item}``. With the workspace's ``inbox_push_enabled`` off nothing is recorded
nor published.

As a workspace service (``WorkspaceServices.inbox``) :meth:`Inbox.run` opens the log,
serves until cancelled, then closes the log.
Writes are shielded under a deadline, so an item whose files were written is recorded
even if its job is cancelled right then.

Agents read the inbox: a note named by what looks like a credential (a token dropped in
as a file name) is named in an item as search and status show it (:func:`shown_item`:
masked, folder and suffix kept, and read back by that name), in its changes, its summary
and its details, when it is pushed and again when it is listed (an item kept before the
rules masked that name).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final, TypedDict, cast

import trio

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.safepath import masked
from recalld.daemon.store.applog import AppendLog
from recalld.daemon.store.errors import StorageError
from recalld.daemon.workspaces import Workspace
from recalld.ipc.answers import InboxItem
from recalld.ipc.errors import InvalidParams, RecalldError, UnknownWorkspace

log = logging.getLogger(__name__)

# How long a job's inbox item waits for a workspace still opening to start its inbox.
INBOX_WAIT_S: Final = 10.0

Publish = Callable[[str, Mapping[str, object]], object]
INBOX_TOPIC = "inbox.item"
KINDS = frozenset({"auto_memory", "auto_dream", "auto_resource", "sync_conflict",
                   "sync_restored"})
DEFAULT_MAX_ITEMS = 1000
WRITE_TIMEOUT_S = 10.0


class Acked(TypedDict):
    acked: list[str]
    unknown: list[str]


class InboxStatus(TypedDict):
    items: int
    unacked: int


def inbox_path(ws: Workspace) -> Path:
    return ws.root / ws.settings.metadata_dir / "inbox" / "inbox.jsonl"


class Inbox:
    """One workspace's inbox. ``open`` before use (the service does), ``close`` after.

    Keeps the newest ``max_items`` items (older ones are dropped when the log is
    compacted). ``push_enabled`` is read on every push (a callable, so a settings reload
    applies at once).
    """

    def __init__(
        self,
        path: Path,
        agent_id: str,
        *,
        publish: Publish | None = None,
        push_enabled: Callable[[], bool] = lambda: True,
        max_items: int = DEFAULT_MAX_ITEMS,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.agent_id = agent_id
        self._publish = publish
        self._push_enabled = push_enabled
        self._max_items = max_items
        self._wall = wall
        # id -> item (an InboxItem, as recovered from the log), in push order
        self._items: dict[str, JsonObject] = {}
        self._seq = 0
        self._log = AppendLog(path)
        self._lines = 0
        self._lock = trio.Lock()
        self._open = False

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Recover the log (blocking work in a thread)."""
        records, report = await trio.to_thread.run_sync(self._log.open)
        for bad in report.bad_lines:
            log.warning("inbox of %s: skipped a damaged record: %s", self.agent_id, bad)
        for rec in records:
            self._apply(rec)
        self._lines = len(records)
        self._trim()
        self._open = True

    def close(self) -> None:
        self._open = False
        self._log.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open, serve until cancelled, close."""
        await self.open()
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._open = False
            # Closed under a worker thread's append, the log's descriptor number could be
            # another file's by the time the thread writes: the write under way ends first.
            with trio.CancelScope(shield=True):
                async with self._lock:
                    self.close()

    # -- operations ------------------------------------------------------------------

    async def push(
        self,
        kind: str,
        summary: str,
        changes: Sequence[str],
        *,
        job_id: str | None = None,
        details: Mapping[str, object] | None = None,
    ) -> InboxItem | None:
        """Record (and publish) one memory change; returns the new item, or None when
        ``inbox_push_enabled`` is off (nothing recorded).

        ``kind`` is auto_memory, auto_dream or auto_resource; ``changes`` the workspace-
        relative paths that changed (must not be empty: no change, no item).
        """
        if kind not in KINDS:
            raise ValueError(f"unknown inbox item kind {kind!r}")
        if not changes:
            raise ValueError("an inbox item needs at least one changed path")
        self._require_open()
        if not self._push_enabled():
            return None
        async with self._lock:
            now = self._wall()
            # Never an id given before, also when the log went back (a backup restored) or
            # was lost: a client's ``since`` cursor would skip the item, its ack hit it.
            self._seq = max(self._seq + 1, int(now * 1000))
            item = cast(InboxItem, shown_item({
                "id": f"{self._seq:010d}",
                "time": now,
                "kind": kind,
                "summary": summary,
                "changes": list(changes),
                "job_id": job_id,
                "details": dict(details or {}),
                "acked": False,
            }))
            await self._append([{"op": "push", "item": item}])
        if self._publish is not None:
            try:
                self._publish(INBOX_TOPIC, {"agent_id": self.agent_id, "item": item.copy()})
            except Exception:
                log.exception("publishing an inbox item failed")
        return item.copy()

    def list(self, since: str | None = None, include_acked: bool = False) -> list[JsonObject]:
        """Items after ``since`` (an item id, or an ISO-8601 time), oldest first.

        Acknowledged items are left out unless ``include_acked``.
        """
        items: Iterable[JsonObject] = self._items.values()
        if since is not None:
            if since.isascii() and since.isdigit():
                after = _seq_of(since)
                items = [i for i in items if _seq_of(i["id"]) > after]
            else:
                t = _parse_time(since)
                items = [i for i in items if float(i["time"]) > t]
        return [shown_item(i) for i in items if include_acked or not i.get("acked")]

    async def ack(self, ids: Iterable[str]) -> Acked:
        """Mark items as seen: ``{acked: [...], unknown: [...]}`` (already acked counts)."""
        self._require_open()
        wanted = list(dict.fromkeys(ids))
        known = [i for i in wanted if i in self._items]
        unknown = [i for i in wanted if i not in self._items]
        new = [i for i in known if not self._items[i].get("acked")]
        if new:
            async with self._lock:
                await self._append([{"op": "ack", "ids": new, "time": self._wall()}])
        return {"acked": known, "unknown": unknown}

    @property
    def is_open(self) -> bool:
        """True while the log is open: from the start of :meth:`run` until it stops."""
        return self._open

    def status(self) -> InboxStatus:
        unacked = sum(1 for i in self._items.values() if not i.get("acked"))
        return {"items": len(self._items), "unacked": unacked}

    # -- internals -------------------------------------------------------------------

    def _require_open(self) -> None:
        if not self._open:
            raise UnknownWorkspace(f"the inbox of {self.agent_id!r} is not open (its "
                                   "workspace closed or failed): nothing was saved")

    async def _append(self, records: Sequence[Mapping[str, object]]) -> None:
        """Append (caller holds the lock); compacts when the log grew large."""
        self._require_open()  # it closed while the caller waited for the lock
        written = False
        with trio.CancelScope(shield=True), trio.move_on_after(WRITE_TIMEOUT_S):
            await trio.to_thread.run_sync(self._log.append, records)
            written = True
            for rec in records:  # the in-memory effect is exactly what a replay does
                self._apply(rec)
            self._trim()
            self._lines += len(records)
            if self._lines > 2 * self._max_items + 100:
                self._trim()
                snapshot = [{"op": "push", "item": dict(i)} for i in self._items.values()]
                await trio.to_thread.run_sync(self._log.rewrite, snapshot)
                self._lines = len(snapshot)
        if not written:
            # Never a silent skip: the caller would take the item or the ack for recorded.
            raise StorageError(f"the inbox log of {self.agent_id!r} took no write within "
                               f"{WRITE_TIMEOUT_S:g} s (the daemon's worker threads are "
                               "busy); nothing was saved", self.path)

    def _apply(self, rec: Mapping[str, object]) -> None:
        """Apply one log record (JSON as replayed from disk, or one just written)."""
        op, pushed, ids = rec.get("op"), rec.get("item"), rec.get("ids")
        if op == "push" and isinstance(pushed, dict):
            item = dict(pushed)
            if isinstance(item.get("id"), str):
                self._items[item["id"]] = item
                self._seq = max(self._seq, _seq_of(item["id"]))
        elif op == "ack" and isinstance(ids, list):
            for item_id in ids:
                if item_id in self._items:
                    self._items[item_id]["acked"] = True

    def _trim(self) -> None:
        excess = len(self._items) - self._max_items
        if excess > 0:
            for item_id in list(self._items)[:excess]:
                del self._items[item_id]


def shown_item(item: Mapping[str, object]) -> JsonObject:
    """A copy of ``item`` naming each path it holds as search shows it: every path of its
    ``changes`` and every text of its ``details`` masked where a part of it looks like a
    credential (:func:`safepath.masked`), and so masked wherever the summary or a detail
    quotes it."""
    listed = item.get("changes")
    changes = [c for c in listed if isinstance(c, str)] if isinstance(listed, list) else []
    named = {raw: shown for raw in (*changes, *_texts(item.get("details")))
             if (shown := masked(raw)) != raw}
    out = dict(item)
    if not named:
        out["changes"] = list(dict.fromkeys(changes))
        return out
    order = sorted(named, key=len, reverse=True)  # a path before a part of it

    def mask(text: str) -> str:
        for raw in order:
            text = text.replace(raw, named[raw])
        return text

    out["changes"] = list(dict.fromkeys(mask(c) for c in changes))
    out["summary"] = mask(str(item.get("summary", "")))
    out["details"] = _mapped(item.get("details") or {}, mask)
    return out


def _texts(value: object) -> Iterable[str]:
    """The texts in a JSON value (an item's details)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


def _mapped(value: object, mask: Callable[[str], str]) -> object:
    """``value`` (JSON) with each text in it (keys too) passed through ``mask``."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, Mapping):
        return {mask(str(k)): _mapped(v, mask) for k, v in value.items()}
    if isinstance(value, list):
        return [_mapped(v, mask) for v in value]
    return value


def _seq_of(item_id: str) -> int:
    try:
        return int(item_id)
    except ValueError:
        return 0


def _parse_time(text: str) -> float:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidParams("since must be an inbox item id or an ISO-8601 time") from None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is local, as a person would write it
    return when.timestamp()


async def push_inbox(ws: Workspace, kind: str, summary: str, changes: list[str], *,
                     job_id: str | None, details: Mapping[str, object]) -> bool:
    """Push one inbox item; a workspace without an inbox only logs it."""
    if not changes:
        return False
    inbox = None
    # A job started while its workspace is still opening may finish before the inbox
    # service is up: wait for it a little rather than lose the item.
    with trio.move_on_after(INBOX_WAIT_S):
        while inbox is None:
            try:
                candidate = ws.services.inbox
            except UnknownWorkspace:
                candidate = None
            if candidate is not None and candidate.is_open:
                inbox = candidate
            elif ws.state != "opening":
                break
            else:
                await ws.wait_changed()  # a service started, or it stopped opening
    if inbox is None:
        log.info("%s: no inbox to tell about %s", ws.agent_id, shown_item(
            {"summary": summary, "changes": changes, "details": details})["summary"])
        return False
    try:
        await inbox.push(kind, summary, changes, job_id=job_id, details=dict(details))
    except (RecalldError, ValueError) as exc:
        log.warning("%s: inbox push failed: %s", ws.agent_id, exc)
        return False
    return True
