"""The records of a workspace's pending-turns log (:mod:`recalld.daemon.memory.sessions`)
and the store's status, as typed records. No state, no task."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.turns import Turn


class LoggedTurn(Turn):
    seq: int  # its place in the workspace's sequence of messages
    at: NotRequired[float]  # when it was added (Unix time; not in logs before it was kept)


class TurnsRecord(TypedDict):
    """Messages added to a session (a log record)."""

    op: Literal["turns"]
    session_id: str
    messages: list[LoggedTurn]
    user_turns: int
    user_seqs: list[int]
    upto: int
    request_id: NotRequired[str]
    answer: NotRequired[JsonObject]  # the answer given to ``request_id``


class SubmitRecord(TypedDict):
    """An auto_memory job was submitted for a session's turns up to ``upto``."""

    op: Literal["submit"]
    session_id: str
    upto: int
    job_id: str
    request_id: NotRequired[str]
    answer: NotRequired[JsonObject]


class StateRecord(TypedDict):
    """A session's counters, written by compaction."""

    op: Literal["state"]
    session_id: str
    committed: int
    submitted: int
    last_job_id: str | None
    user_turns_total: int
    seq: int
    answers: dict[str, JsonObject]
    user_seqs: NotRequired[list[int]]  # moved into a turns record when written


class SessionsStatus(TypedDict):
    sessions: int
    pending_messages: int
    quarantined_records: int
