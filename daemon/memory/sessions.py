"""Conversation turns waiting for auto_memory: sanitizing, counting, persisting.

Owns one workspace's pending turns and their log ``<metadata_dir>/sessions/pending.jsonl``
(an :class:`AppendLog`). ``memory.add_turns`` hands messages here: they are sanitized
(:func:`~recalld.daemon.memory.turns.sanitize_messages`: tool results, media and base64
payloads, recalled-memory blocks and system prompts removed; secrets redacted) *before*
they touch the disk, then appended with a per-workspace sequence number. An auto_memory
job covers the turns of one session up to a sequence number (``upto``); it reads them with
:meth:`SessionStore.pending` (from the last committed one, so a failed job's turns are
picked up by the next) and marks them done with :meth:`SessionStore.commit`. Pending turns
survive restarts.

A damaged record in the log (a bad checksum, garbage, a field of another type:
:func:`~recalld.daemon.memory.sessionrecords.shape_error`) is never dropped silently: it is set
aside in ``<metadata_dir>/sessions/pending.quarantine.jsonl`` (raw bytes, offset, reason),
logged, and counted in the workspace status (``sessions.quarantined_records``); the log
is rewritten without it, and the records around it are kept.

Memory stays bounded however many turns wait (no chat model, a long outage): the texts
live only in the log; the store keeps each pending message's sequence number (8 bytes)
and :meth:`SessionStore.pending` reads the texts back from the log when a job needs them.
Finished sessions (every turn written, no job to come) keep their counters; past
``MAX_DONE_SESSIONS`` the oldest are forgotten when the log is compacted, so a new
conversation id for every chat does not grow the store and its log for ever.

Idempotency: the answer to each ``request_id`` is kept in a bounded LRU (persisted in the
same log), so a retried ``memory.add_turns`` returns the first answer and adds nothing.
Each open workspace runs a store (``WorkspaceServices.sessions``): open,
serve until cancelled, close. Log writes are shielded under a deadline.
"""

from __future__ import annotations

import logging
import time
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from recalld.daemon import memtrim
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.sessionrecords import (
    LoggedTurn,
    SessionsStatus,
    StateRecord,
    SubmitRecord,
    TurnsRecord,
    recorded_time,
    shape_error,
)
from recalld.daemon.memory.turns import (
    Tail,
    continued,
    count_user_turns,
    sanitize_turns,
    text_chars,
)
from recalld.daemon.store.applog import AppendLog, replay
from recalld.daemon.store.errors import CorruptState, StorageError
from recalld.daemon.store.fsio import open_state
from recalld.ipc.errors import UnknownWorkspace

log = logging.getLogger(__name__)

MAX_REQUEST_IDS = 1024
#: Sessions with every turn written that are remembered (their counters), most recent
#: first; older ones are forgotten when the log is compacted (a conversation id used
#: again starts its counters afresh).
MAX_DONE_SESSIONS = 10_000
#: Lines the log may hold past four times its snapshot's before it is compacted.
COMPACT_SLACK_LINES = 2000
WRITE_TIMEOUT_S = 10.0


def _seqs() -> array[int]:
    return array("q")


@dataclass
class _Session:
    """One session's pending turns: what is uncommitted, submitted and said last."""

    #: Seq of each uncommitted message, ascending (the texts stay in the log).
    seqs: array[int] = field(default_factory=_seqs)
    committed: int = 0  # every seq <= this one is done
    submitted: int = 0  # the last upto a job was submitted for
    last_job_id: str | None = None
    user_turns_total: int = 0
    user_seqs: array[int] = field(default_factory=_seqs)  # of the user turns among them
    #: When its last turn was added (Unix time, as recorded with it; None: not recorded,
    #: a log from before it was).
    last_at: float | None = None
    #: The end of the last text added, as given, and its speaker: a secret cut there is
    #: found with the start of that speaker's next (``turns.sanitize_messages``'s
    #: ``before``). Not logged.
    tail: Tail | None = None
    #: Its last message kept goes on in the next request (``turns.continued``): no run now.
    half_said: bool = False

    def drop_upto(self, upto: int) -> None:
        del self.seqs[:bisect_right(self.seqs, upto)]
        del self.user_seqs[:bisect_right(self.user_seqs, upto)]


@dataclass(frozen=True, slots=True)
class Added:
    """What an add changed: the session's counters after it and the last seq."""

    session_id: str
    upto: int
    pending_turns: int
    pending_messages: int
    user_turns_total: int
    since_submit: int
    submitted: int
    last_job_id: str | None


class SessionStore:
    """One workspace's pending turns. ``open`` before use, ``close`` after."""

    def __init__(self, path: Path, agent_id: str, *,
                 cpu: trio.CapacityLimiter | None = None) -> None:
        self.path = path
        self.agent_id = agent_id
        self.quarantine_path = path.with_name(path.stem + ".quarantine.jsonl")
        self._log = AppendLog(path, quarantine=self.quarantine_path, check=shape_error)
        self._quarantined = 0
        # Sanitizing a large batch of turns takes far longer than the event loop may be
        # held: it runs in a worker thread under ``cpu`` (the daemon's CPU limiter).
        self._cpu = cpu
        self._sessions: dict[str, _Session] = {}
        #: The answers of recent requests by request id (RPC answers, passed on).
        self._answers: OrderedDict[str, JsonObject] = OrderedDict()
        self._seq = 0
        self._lines = 0
        #: The log's line count at which finished sessions are looked for again.
        self._prune_check = 0
        self._open = False
        #: Held by memory.add_turns around check-add-submit, so retries cannot interleave.
        self.lock = trio.Lock()
        #: One log write at a time: a compaction must not drop a concurrent append.
        self._write_lock = trio.Lock()
        self._job_locks: dict[str, trio.Lock] = {}

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        records, report = await trio.to_thread.run_sync(self._log.open)
        self._quarantined = await trio.to_thread.run_sync(self._count_quarantined)
        if report.quarantined:
            log.warning("%s: %d damaged piece(s) of the pending-turns log set aside in %s "
                        "(offsets %s); the other records are kept", self.agent_id,
                        report.quarantined, self.quarantine_path,
                        [b.offset for b in report.bad_lines] + (
                            [report.truncated_at] if report.truncated_at is not None else []))
        self._log.opened = ([], report)  # the texts stay on disk only
        for rec in records:
            self._apply(rec)
        self._lines = len(records)
        del records
        self._open = True

    def _count_quarantined(self) -> int:
        """The quarantine file's lines, read as a state file (never waiting on a FIFO);
        something else in its place (a FIFO, a folder, a link) is logged, counting none."""
        try:
            with open_state(self.quarantine_path) as fh:
                return sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return 0
        except CorruptState as exc:
            log.warning("%s: %s; no set-aside turns counted", self.agent_id, exc.detail)
            return 0

    def close(self) -> None:
        self._open = False
        self._log.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open, serve until cancelled, close once the log write under way ended (one
        waiting for it then takes none, UnknownWorkspace)."""
        await self.open()
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._open = False
            # Closed under a worker thread's append, the log's descriptor number could be
            # another file's by the time the thread writes (and the write was refused as
            # an internal error): the write under way ends first.
            with trio.CancelScope(shield=True):
                async with self._write_lock:
                    self.close()

    def _apply(self, rec: Mapping[str, Any]) -> None:
        """Apply one log record (JSON as replayed from disk, or one just written)."""
        op, sid = rec.get("op"), rec.get("session_id")
        if op == "answer":
            self._remember(rec.get("request_id"), rec.get("answer"))
            return
        if not isinstance(sid, str) or not sid:
            return
        s = self._sessions.setdefault(sid, _Session())
        if op == "turns":
            s.last_at = recorded_time(rec.get("at"))
            for msg in rec.get("messages") or []:
                if isinstance(msg, dict) and isinstance(msg.get("seq"), int):
                    self._seq = max(self._seq, msg["seq"])
                    if msg["seq"] > s.committed:
                        s.seqs.append(msg["seq"])
                    if "at" not in rec:  # a record written before it carried the time
                        s.last_at = recorded_time(msg.get("at"))
                    s.half_said = continued(msg)
            self._seq = max(self._seq, int(rec.get("upto") or 0))
            s.user_turns_total += int(rec.get("user_turns") or 0)
            s.user_seqs.extend(int(x) for x in rec.get("user_seqs") or [] if x > s.committed)
            self._remember(rec.get("request_id"), rec.get("answer"))
        elif op == "submit":
            s.submitted = max(s.submitted, int(rec.get("upto") or 0))
            s.last_job_id = rec.get("job_id")
            self._remember(rec.get("request_id"), rec.get("answer"))
        elif op == "commit":
            s.committed = max(s.committed, int(rec.get("upto") or 0))
            s.drop_upto(s.committed)
        elif op == "state":  # written by compaction
            s.committed = int(rec.get("committed") or 0)
            s.submitted = int(rec.get("submitted") or 0)
            s.last_job_id = rec.get("last_job_id")
            s.user_turns_total = int(rec.get("user_turns_total") or 0)
            s.last_at = recorded_time(rec.get("at"))
            self._seq = max(self._seq, int(rec.get("seq") or 0))
            for rid, answer in (rec.get("answers") or {}).items():
                self._remember(rid, answer)

    def _remember(self, request_id: object, answer: object) -> None:
        if isinstance(request_id, str) and isinstance(answer, dict):
            self._answers[request_id] = dict(answer)
            self._answers.move_to_end(request_id)
            while len(self._answers) > MAX_REQUEST_IDS:
                self._answers.popitem(last=False)

    async def _append(self, records: Sequence[Mapping[str, object]]) -> None:
        self._check_open()
        written = False
        with trio.CancelScope(shield=True), trio.move_on_after(WRITE_TIMEOUT_S):
            async with self._write_lock:
                self._check_open()  # it closed while this waited
                await trio.to_thread.run_sync(self._log.append, records)
                written = True
                await self._appended(records)
        if not written:
            # Never a silent skip: the caller would take its turns for saved.
            raise StorageError(f"the pending-turns log of {self.agent_id!r} took no write "
                               f"within {WRITE_TIMEOUT_S:g} s (another write holds it); "
                               f"nothing was saved", self.path)

    def _check_open(self) -> None:
        if not self._open:
            raise UnknownWorkspace(f"the session store of {self.agent_id!r} is not open (its "
                                   "workspace closed or failed): nothing was saved")

    async def _appended(self, records: Sequence[Mapping[str, object]]) -> None:
        """Apply ``records``, just written to the log; compact the log if it is time."""
        for rec in records:  # the in-memory effect is exactly what a replay does
            self._apply(rec)
        self._lines += len(records)
        # Compact only after applying: the snapshot must include these records.
        forget = self._to_compact()
        if forget is not None:
            for sid in forget:
                del self._sessions[sid]
                self._job_locks.pop(sid, None)
            states = self._states()
            self._lines = await trio.to_thread.run_sync(self._compact, states)

    def _to_compact(self) -> list[str] | None:
        """None if the log needs no compaction yet, else the sessions to forget in it.

        The log is compacted when it holds four times the lines its snapshot would. Many
        conversations (a new id for each) leave many finished sessions: past
        ``MAX_DONE_SESSIONS`` the oldest are forgotten (looked for every 1,000 lines)."""
        limit = 4 * (self._pending_count() + len(self._sessions)) + COMPACT_SLACK_LINES
        if self._lines <= limit and (len(self._sessions) <= MAX_DONE_SESSIONS
                                     or self._lines < self._prune_check):
            return None
        done = self._done_sessions()
        forget = done[:max(len(done) - MAX_DONE_SESSIONS, 0)]
        if self._lines > limit - 4 * len(forget):
            return forget
        self._prune_check = self._lines + 1000
        return None

    def _done_sessions(self) -> list[str]:
        """Sessions with every turn written and no job to come, oldest first."""
        done = [(s.committed, sid) for sid, s in self._sessions.items()
                if not s.seqs and not s.user_seqs and s.submitted <= s.committed
                and not (sid in self._job_locks and self._job_locks[sid].locked())]
        return [sid for _, sid in sorted(done)]

    def _pending_count(self) -> int:
        return sum(len(s.seqs) for s in self._sessions.values())

    def _states(self) -> list[StateRecord]:
        """One ``state`` record per session (the in-memory part of a snapshot)."""
        out: list[StateRecord] = []
        answers = dict(self._answers)
        for sid, s in self._sessions.items():
            out.append({"op": "state", "session_id": sid, "committed": s.committed,
                        "submitted": s.submitted, "last_job_id": s.last_job_id,
                        "user_turns_total": s.user_turns_total, "seq": self._seq,
                        "answers": answers, "user_seqs": list(s.user_seqs)})
            if s.last_at is not None:
                out[-1]["at"] = s.last_at
            answers = {}
        return out

    def _messages_on_disk(self, committed: Mapping[str, int], upto: int | None = None,
                          ) -> dict[str, list[JsonObject]]:
        """Uncommitted messages per session, read back from the log (worker thread): the
        :class:`LoggedTurn` records as they are on disk."""
        records, _report = replay(self.path, repair=False)
        out: dict[str, dict[int, JsonObject]] = {}
        for rec in records:
            sid = rec.get("session_id")
            if rec.get("op") != "turns" or not isinstance(sid, str) or sid not in committed:
                continue
            for msg in rec.get("messages") or []:
                seq = msg.get("seq") if isinstance(msg, dict) else None
                if isinstance(seq, int) and seq > committed[sid] and (
                        upto is None or seq <= upto):
                    out.setdefault(sid, {})[seq] = msg
        big = len(records) > 10_000 or sum(map(len, out.values())) > 10_000
        del records
        if big:  # hand the transient heap back (see memtrim)
            memtrim.trim()
        return {sid: [msgs[k] for k in sorted(msgs)] for sid, msgs in out.items()}

    def _compact(self, states: list[StateRecord]) -> int:
        """Rewrite the log as ``states`` plus the uncommitted turns (worker thread)."""
        committed = {str(st["session_id"]): int(st["committed"]) for st in states}
        messages = self._messages_on_disk(committed)
        out: list[Mapping[str, object]] = []
        for st in states:
            user_seqs = st.pop("user_seqs")
            at = st.pop("at", None)
            out.append(st)
            pending = messages.get(str(st["session_id"]))
            if pending or user_seqs:
                out.append({"op": "turns", "session_id": st["session_id"],
                            "messages": pending or [], "user_turns": 0,
                            "user_seqs": user_seqs,
                            "upto": max([m["seq"] for m in pending or []] + user_seqs),
                            **({"at": at} if at is not None else {})})
        self._log.rewrite(out)
        return len(out)

    # -- operations --------------------------------------------------------------------

    def answer_for(self, request_id: str | None) -> JsonObject | None:
        """The answer already given to ``request_id``, if it is still remembered."""
        if request_id is None:
            return None
        answer = self._answers.get(request_id)
        return dict(answer) if answer is not None else None

    def _added(self, sid: str) -> Added:
        s = self._sessions.get(sid) or _Session()
        last = max(s.seqs[-1] if s.seqs else 0, s.user_seqs[-1] if s.user_seqs else 0)
        return Added(
            session_id=sid,
            upto=max(last, s.committed),
            pending_turns=len(s.user_seqs),
            pending_messages=len(s.seqs),
            user_turns_total=s.user_turns_total,
            since_submit=sum(1 for x in s.user_seqs if x > s.submitted),
            submitted=s.submitted,
            last_job_id=s.last_job_id,
        )

    def info(self, session_id: str) -> Added:
        return self._added(session_id)

    async def add(self, session_id: str, messages: Sequence[Mapping[str, object]],
                  request_id: str | None, answer: Mapping[str, object] | None = None) -> Added:
        """Sanitize and append ``messages``; user turns are counted before sanitizing.

        Big batches are sanitized in a worker thread (redaction is regular-expression work).
        """
        # The redaction rules are imported with the first turns a daemon is given.
        from recalld.daemon.memory.redact import INLINE_CHARS

        before = s.tail if (s := self._sessions.get(session_id)) is not None else None
        if text_chars(messages) > INLINE_CHARS:
            clean, tail = await trio.to_thread.run_sync(sanitize_turns, messages, before,
                                                        limiter=self._cpu)
        else:
            clean, tail = sanitize_turns(messages, before)
        stamped: list[LoggedTurn] = []
        user_seqs: list[int] = []
        user_left = count_user_turns(messages)
        # A user turn whose text was all removed (an image only) still counts: it gets
        # the seq of the next kept message, or a seq of its own.
        now = round(time.time(), 3)
        for msg in clean:
            self._seq += 1
            stamped.append({**msg, "seq": self._seq, "at": now})  # and its ``continued``
            if msg["role"] == "user" and user_left > 0:
                user_seqs.append(self._seq)
                user_left -= 1
        for _ in range(user_left):
            self._seq += 1
            user_seqs.append(self._seq)
        if not stamped and not user_seqs:
            return self._added(session_id)
        record: TurnsRecord = {"op": "turns", "session_id": session_id,
                               "messages": stamped, "user_turns": count_user_turns(messages),
                               "user_seqs": user_seqs, "upto": self._seq, "at": now}
        if request_id is not None:
            record["request_id"] = request_id
            if answer is None:
                # The session's counters after this add: the answer a retry gets should
                # the daemon stop before the caller records the final one.
                s = self._sessions.get(session_id) or _Session()
                answer = {"session_id": session_id, "added_messages": len(stamped),
                          "pending_turns": len(s.user_seqs) + len(user_seqs),
                          "pending_messages": len(s.seqs) + len(stamped),
                          "user_turns_total": s.user_turns_total + record["user_turns"]}
            record["answer"] = dict(answer)
        await self._append([record])
        if clean:
            self._sessions.setdefault(session_id, _Session()).tail = tail
        return self._added(session_id)

    async def mark_submitted(self, session_id: str, upto: int, job_id: str,
                             request_id: str | None, answer: Mapping[str, object]) -> None:
        rec: SubmitRecord = {"op": "submit", "session_id": session_id, "upto": upto,
                             "job_id": job_id}
        if request_id is not None:
            rec["request_id"] = request_id
            rec["answer"] = dict(answer)
        await self._append([rec])

    async def remember(self, request_id: str | None, answer: Mapping[str, object]) -> None:
        """Record the answer of a request that added nothing (a bare flush)."""
        if request_id is None:
            return
        await self._append([{"op": "answer", "session_id": "", "request_id": request_id,
                             "answer": dict(answer)}])

    async def pending(self, session_id: str, upto: int) -> list[JsonObject]:
        """Uncommitted messages of the session with seq <= ``upto``, oldest first (read
        back from the log in a worker thread)."""
        s = self._sessions.get(session_id)
        if s is None or not s.seqs or s.seqs[0] > upto:
            return []
        found = await trio.to_thread.run_sync(
            self._messages_on_disk, {session_id: s.committed}, upto)
        return found.get(session_id, [])

    def last_turn_at(self, session_id: str) -> float | None:
        """When the session's last turn was added (Unix time as recorded, which a clock
        set back may have put in the future), None if that was not recorded."""
        s = self._sessions.get(session_id)
        return s.last_at if s is not None else None

    def half_said(self, session_id: str) -> bool:
        """Whether the session's last message kept is cut, its rest still to come."""
        s = self._sessions.get(session_id)
        return s is not None and s.half_said

    def sessions_pending(self) -> list[str]:
        """The sessions with turns not yet committed by auto_memory."""
        return [sid for sid, s in self._sessions.items() if s.seqs or s.user_seqs]

    def committed(self, session_id: str) -> int:
        s = self._sessions.get(session_id)
        return s.committed if s is not None else 0

    async def commit(self, session_id: str, upto: int) -> None:
        """Everything of the session up to ``upto`` is in memory now."""
        s = self._sessions.setdefault(session_id, _Session())
        if upto <= s.committed:
            return
        await self._append([{"op": "commit", "session_id": session_id, "upto": upto}])

    def job_lock(self, session_id: str) -> trio.Lock:
        """Serializes auto_memory jobs of one session (they update the same note)."""
        return self._job_locks.setdefault(session_id, trio.Lock())

    def status(self) -> SessionsStatus:
        return {"sessions": len(self._sessions), "pending_messages": self._pending_count(),
                "quarantined_records": self._quarantined}

