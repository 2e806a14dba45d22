"""The records of a workspace's pending-turns log (:mod:`recalld.daemon.memory.sessions`)
and the store's status, as typed records. No state, no task."""

from __future__ import annotations

import math
from typing import Literal, NotRequired, TypedDict

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.turns import Turn

_COUNTS = ("upto", "user_turns", "committed", "submitted", "user_turns_total", "seq")


def recorded_time(value: object) -> float | None:
    """A Unix time as a log record holds it, None if it holds none (or no number)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def shape_error(rec: JsonObject) -> str | None:
    """Why a record of the log, its checksum good, is not of the shape the log's writer
    gives it (a field another program or a hand edit wrote): the record is set aside as
    a damaged one is, never applied in part nor failing the workspace's open."""
    def counts(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(rec.get("session_id"), str | None):
        return "session_id is not a string"
    for key in _COUNTS:
        if rec.get(key) is not None and not counts(rec.get(key)):
            return f"{key} is not an integer"
    seqs, messages = rec.get("user_seqs") or [], rec.get("messages") or []
    if not isinstance(seqs, list) or not all(counts(x) for x in seqs):
        return "user_seqs is not a list of integers"
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "messages is not a list of objects"
    if not isinstance(rec.get("answers") or {}, dict):
        return "answers is not an object"
    return None


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
    at: NotRequired[float]  # when it was added (Unix time; not in logs before it was kept)
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
    at: NotRequired[float]  # when the session's last turn was added (moved likewise)


class SessionsStatus(TypedDict):
    sessions: int
    pending_messages: int
    quarantined_records: int
