"""How often a dream tries again a daily note the model could not finish. Pure functions
on the dream catalog's records; no I/O, no task.

A note whose conversation the model could not finish as the note is (cut off by its step
budget, its answer cut or refused, a tool call of its answer that cannot be read, or a
node it had to write that cannot be read) would
fail the same way at every run, each time paying for the whole conversation again. So
each unchanged text gets :data:`MAX_TRIES` tries, with one run more between each try and
the next (tried at the next run, then after one run left out, ...); then the note waits
until its text changes or a person asks for it (the ``retry_failed`` param of the
auto_dream job, ``recalld dream --retry-failed``), which gives it one more try; one held
by a node it cannot write (:data:`WAITS_ON`) is read again once that node changes. A failure
that says nothing of the note (the provider down or answering what is no chat answer,
the run's tool budget spent before the note began, a conversation too long for the model's
context window: the model's configuration) is not counted: the note is read again
next run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, TypeVar

from recalld.daemon.jsontypes import JsonObject
from recalld.ipc.errors import JobFailed

#: In the catalog record of a note failed because a node it had to write cannot be read:
#: ``{node: what it held}`` (:func:`dreamnotes.node_digest`). Once one of them holds
#: something else (a person mended it), the note is read again, its tries counted anew.
WAITS_ON: Final = "waits_on"
#: Tries of one text of a note before it waits for a change or a person.
MAX_TRIES: Final = 3
#: In a failed note's catalog record: the tries counted for its text (:data:`MAX_TRIES`),
#: and the runs still to leave it out before the next one.
TRIES: Final = "tries"
SKIP_RUNS: Final = "skip_runs"

T = TypeVar("T", bound=tuple[str, str, str])


class NodeUnreadable(JobFailed):
    """A note's integrations could not all be applied: a node it had to write cannot be
    read as written (the message says which and why)."""


def _tries(rec: Mapping[str, object] | None, sha: str) -> int:
    """The tries counted for the text ``sha`` of the note of ``rec`` (failed records only)."""
    if rec is None or rec.get("state") != "failed" or rec.get("digest") != sha:
        return 0
    tries = rec.get(TRIES)
    return tries if isinstance(tries, int) and not isinstance(tries, bool) else 0


def failed_record(rec: Mapping[str, object] | None, note: str, sha: str, reason: str,
                  run_id: str, *, counted: bool,
                  waits_on: Mapping[str, str | None] | None = None) -> JsonObject:
    """The catalog record of ``note`` (read as ``sha``) that failed for ``reason``, its
    record before being ``rec``; ``counted``: the failure counts as a try of this text;
    ``waits_on``: the unreadable nodes that held it (:data:`WAITS_ON`)."""
    tries = _tries(rec, sha) + int(counted)
    out: JsonObject = {"path": note, "digest": sha, "state": "failed", "reason": reason,
                       "run_id": run_id}
    if waits_on:
        out[WAITS_ON] = dict(waits_on)
    if tries:
        out[TRIES] = tries
        if tries < MAX_TRIES:
            out[SKIP_RUNS] = 2 ** (tries - 1) - 1
    return out


def hold_back(catalog: dict[str, JsonObject], todo: Sequence[T], *, retry: bool,
              nodes_now: Mapping[str, str | None] | None = None
              ) -> tuple[list[T], dict[str, str]]:
    """``todo`` (:func:`dreamnotes.changed_notes`) without the notes that wait, and
    ``{path: why}`` of those; a note left out to space its tries has its catalog record's
    count of runs to leave it out lowered. ``retry``: a person asked, none waits.
    ``nodes_now``: what the nodes notes wait on hold now (:data:`WAITS_ON`); a note
    one of whose nodes changed is read, its tries counted from none."""
    if retry:
        return list(todo), {}
    kept: list[T] = []
    waiting: dict[str, str] = {}
    now = nodes_now or {}
    for item in todo:
        rel, sha = item[0], item[1]
        rec = catalog.get(rel)
        tries = _tries(rec, sha)
        held = rec.get(WAITS_ON) if rec is not None and tries else None
        if rec is not None and isinstance(held, dict) \
                and any(now.get(n, held[n]) != held[n] for n in held):
            catalog[rel] = {k: v for k, v in rec.items()
                            if k not in (TRIES, SKIP_RUNS, WAITS_ON)}
            kept.append(item)
            continue
        skip = rec.get(SKIP_RUNS) if rec is not None and tries else 0
        if tries >= MAX_TRIES:
            waiting[rel] = (f"the model failed on it {tries} times as it is (last: "
                            f"{rec.get('reason') if rec else ''}); read again once it "
                            "changes, or with recalld dream --retry-failed")
        elif isinstance(skip, int) and skip > 0 and rec is not None:
            catalog[rel] = {**rec, SKIP_RUNS: skip - 1}
            waiting[rel] = (f"the model failed on it {tries} time(s) as it is (last: "
                            f"{rec.get('reason')}); left out of {skip} run(s), this one "
                            "included, to space its tries")
        else:
            kept.append(item)
    return kept, waiting

