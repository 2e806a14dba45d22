"""Cron for per-workspace jobs (auto_dream on ``dream_cron``), once per occurrence.

Owns the schedule entries (one per workspace and job kind), one sleeping task per entry
and a small JSON state file with the last occurrence fired per entry. ``CronScheduler.run``
starts the entries' tasks and stops by cancellation (an occurrence whose jitter delay was
cut short is not recorded, so the next start fires it).

Rules, like cron(8) and anacron:

- Occurrences are computed in local wall time of the entry's zone and mapped to instants.
  A local time skipped by a spring-forward change fires once, at the instant the clock
  jumps (cron(8) runs skipped jobs right after the change). A local time that repeats in a
  fall-back change fires once, on its first pass. So every occurrence is one instant and
  the instants strictly increase.
- An occurrence fires at most once: the last one fired is persisted (temp + fsync +
  rename) after its 0–``jitter_max_s`` random delay and before the job is submitted, and on
  start every occurrence at or before it is skipped. A crash between that write and the
  submit loses one run rather than doubling it.
- Missed occurrences (daemon down, suspend, the wall clock stepped forward) run once, late,
  like anacron: only the latest missed one, however many were missed. The wall clock
  stepping back never re-fires an occurrence already fired, unless the last one fired lies
  more than ``CLOCK_CORRECTION`` ahead of the clock: then one of the two clocks is wrong (a
  machine that ran years ahead and was set right, or one booted in 1970 before the network
  time is set), and waiting for that time to come again would silence the entry, so the
  occurrences from the moment this was first seen fire (a warning says so). The record is
  kept until one fires: a clock behind for a while only repeats nothing once set right.
  A new or re-enabled entry, or
  one whose expression changed, starts from "now" (no catch-up for times before it existed).
  One whose zone changed (another name of the same zone, ``TZ=UTC`` after ``Etc/UTC``, or
  another zone) keeps its last occurrence, an instant: the occurrences of its new zone
  after it fire, a missed one once.

Sleeping: trio's clock is monotonic and stops during suspend, while cron speaks wall time.
Each task sleeps toward its next occurrence in bounded steps (half the remaining time,
between ``min_step_s`` and ``max_step_s``) and re-reads the wall clock after each, so an
idle daemon wakes about once an hour, a little more often near a target, and a suspend or
clock step is noticed within one step.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import re
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import TypedDict

import orjson
import trio

from recalld.daemon.localzone import local_zone
from recalld.daemon.statefiles import WriteFailure
from recalld.daemon.store.applog import set_aside
from recalld.daemon.store.errors import CorruptState, StorageError
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir, read_verified
from recalld.daemon.wallclock import SystemWallClock, WallClock
from recalld.ipc.errors import AlreadyRunning, RecalldError

log = logging.getLogger(__name__)

#: Submits a job: ``(agent_id, kind, params) -> job_id``.
Submit = Callable[[str, str, dict[str, object]], Awaitable[str]]

# Time zone offsets change by at most a few hours; scanning this far around a time finds
# every local occurrence that can map near it.
_DST_MARGIN = timedelta(hours=3)
#: How far the last fired occurrence may lie ahead of the wall clock and still be kept: the
#: widest gap between two zones' offsets (UTC-12 to UTC+14), a clock read in the wrong zone.
#: Further ahead, it was fired by a wrong clock (see the module rules).
CLOCK_CORRECTION = timedelta(hours=26)
#: 2: the entries carry their crc32 (a flipped bit in a time fired could run an occurrence
#: again); 1, written before, is read without one.
_STATE_VERSION = 2


def _wrong_clock(last_fired: datetime, now: datetime) -> bool:
    """Whether an occurrence fired at ``last_fired`` lies too far ahead of ``now`` for a
    clock only stepped back (see the module rules)."""
    return last_fired > now + CLOCK_CORRECTION


async def load_cron() -> None:
    """Import croniter in a worker thread: its import runs a child process (``file``, for
    ``platform.architecture``), which the event loop need not wait for."""
    await trio.to_thread.run_sync(importlib.import_module, "croniter")


# croniter's ``R`` (``R``, ``R(0-29)``, ``R/5``): a value drawn at random each time the
# expression is read, so each reading is another series of times.
_RANDOM_PART = re.compile(r"^R(\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)


def cron_problem(expr: object) -> str | None:
    """What makes ``expr`` no schedule, as the end of a sentence (None: it is one): not a
    cron expression, a random field, or a time that never comes."""
    from croniter import croniter  # loaded with the first schedule, not at start-up

    if not isinstance(expr, str) or not croniter.is_valid(expr):
        return "is invalid"
    if any(_RANDOM_PART.match(part) for field in expr.split() for part in field.split(",")):
        # Every reading would fire at other times: an occurrence could fire twice or never.
        return ("must not have a random field (R): runs already start at a random delay "
                "after their time (schedule_jitter_s)")
    try:
        croniter(expr, datetime(2000, 1, 1)).get_next(datetime)
    except Exception as exc:  # croniter raises its own family for impossible dates
        return f"never fires: {exc}"
    return None


class CronSchedule:
    """A cron expression in a time zone, as a strictly increasing series of instants."""

    def __init__(self, expr: str, tz: tzinfo | str | None = None) -> None:
        problem = cron_problem(expr)
        if problem == "is invalid":
            raise ValueError(f"invalid cron expression {expr!r}")
        if problem is not None:
            raise ValueError(f"cron expression {expr!r} {problem}")
        self.expr = expr
        from zoneinfo import ZoneInfo

        self.tz: tzinfo = (ZoneInfo(tz) if isinstance(tz, str)
                           else tz if tz is not None else local_zone())
        self._last_next: tuple[datetime, datetime] | None = None  # (at, next_after(at))

    def _local(self, at: datetime) -> datetime:
        return at.astimezone(self.tz).replace(tzinfo=None)

    def resolve(self, local: datetime) -> datetime:
        """The instant (UTC) a naive local occurrence fires at (see the module rules)."""
        first = local.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        second = local.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
        if first == second or self._local(min(first, second)) == local:
            return min(first, second)  # normal, or the first pass of a repeated time
        # Skipped by a spring-forward change: the first instant whose local time is later,
        # found by bisection between the two readings (whole seconds; zones change on them).
        lo, hi = min(first, second), max(first, second)
        while hi - lo > timedelta(seconds=1):
            mid = lo + (hi - lo) / 2
            if self._local(mid) >= local:
                hi = mid
            else:
                lo = mid
        return hi.replace(microsecond=0)

    def next_after(self, at: datetime) -> datetime:
        """The first occurrence strictly after ``at`` (aware)."""
        # The last answer holds for every ``at`` from the one it was found for up to it
        # (no occurrence lies between): status asks for the next run on every call.
        # Compared in UTC: two times of one zone compare by their wall clock, fold aside.
        utc = at.astimezone(UTC)
        last = self._last_next
        if last is not None and last[0] <= utc < last[1]:
            return last[1]
        from croniter import croniter

        it = croniter(self.expr, self._local(at) - _DST_MARGIN)
        while True:
            instant = self.resolve(it.get_next(datetime))
            if instant > at:
                self._last_next = (utc, instant)
                return instant

    def latest_at_or_before(self, at: datetime) -> datetime:
        """The last occurrence at or before ``at`` (aware)."""
        from croniter import croniter

        it = croniter(self.expr, self._local(at) + _DST_MARGIN)
        while True:
            instant = self.resolve(it.get_prev(datetime))
            if instant <= at:
                return instant

    def occurrences(self, start: datetime) -> Iterator[datetime]:
        at = start
        while True:
            at = self.next_after(at)
            yield at


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's jitter, steps and state-write timeout."""

    jitter_max_s: float = 60.0
    min_step_s: float = 60.0
    max_step_s: float = 3600.0
    state_write_timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class _Entry:
    """One scheduled kind of job of a workspace."""

    agent_id: str
    kind: str
    schedule: CronSchedule
    params: Mapping[str, object]  # the job's params

    @property
    def key(self) -> str:
        return _key(self.agent_id, self.kind)


def _crc32(entries: object) -> str:
    return f"{zlib.crc32(orjson.dumps(entries, option=orjson.OPT_SORT_KEYS)):08x}"


def _set_aside(path: Path) -> str:
    """Move what is at ``path`` if it is no regular file (a folder, a FIFO, a link to a
    device: no later save could replace it) aside (:func:`applog.set_aside`); says where."""
    if not os.path.lexists(path) or (path.is_file() and not path.is_symlink()):
        return ""
    try:
        aside = set_aside(REAL, path)
    except StorageError as exc:
        return f" (could not set it aside: {exc.message})"
    return f"; set aside as {aside.name}"


def _key(agent_id: str, kind: str) -> str:
    return f"{agent_id}/{kind}"


class ScheduleEntry(TypedDict):
    """A scheduled job kind of a workspace, as its status shows it."""

    agent_id: str
    kind: str
    cron: str
    tz: str
    last_fired: str | None
    next: str


class CronScheduler:
    """Fires registered (workspace, job kind, cron) entries through ``submit``."""

    def __init__(
        self,
        submit: Submit,
        *,
        state_path: Path | None = None,
        wall: WallClock | None = None,
        rng: random.Random | None = None,
        config: SchedulerConfig | None = None,
        run_sync: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
    ) -> None:
        self._submit = submit
        # State file I/O runs in a worker thread; tests under a fake clock run it inline.
        self._run_sync = run_sync or trio.to_thread.run_sync
        self._state_path = state_path
        self.write_failure = WriteFailure(state_path)
        self._wall: WallClock = wall or SystemWallClock()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        self._config = config or SchedulerConfig()
        self._entries: dict[str, _Entry] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        self._state: dict[str, dict[str, str]] = {}
        self._state_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self.wakeups = 0
        self.fired: dict[str, int] = {}

    # -- registration --------------------------------------------------------------------------

    def schedule(self, agent_id: str, kind: str, expr: str, *, enabled: bool = True,
                 tz: tzinfo | str | None = None,
                 params: Mapping[str, object] | None = None) -> None:
        """Add or replace the entry for ``(agent_id, kind)``; ``enabled=False`` removes it
        and forgets its history. Raises ValueError for a bad expression or zone."""
        from zoneinfo import ZoneInfoNotFoundError

        key = _key(agent_id, kind)
        if not enabled:
            self.unschedule(agent_id, kind)
            if self._state.pop(key, None) is not None and self._nursery is not None:
                self._nursery.start_soon(self._persist)
            return
        try:
            entry = _Entry(agent_id, kind, CronSchedule(expr, tz), dict(params or {}))
        except ZoneInfoNotFoundError as exc:
            raise ValueError(f"unknown time zone {tz!r}") from exc
        # Restarting the task is safe: the history lives in the state, and a delay cut
        # short was not recorded, so the occurrence still fires once.
        self.unschedule(agent_id, kind)
        self._entries[key] = entry
        if self._nursery is not None:
            self._nursery.start_soon(self._entry_task, entry)

    def unschedule(self, agent_id: str, kind: str) -> None:
        key = _key(agent_id, kind)
        self._entries.pop(key, None)
        scope = self._scopes.pop(key, None)
        if scope is not None:
            scope.cancel()

    async def forget(self, agent_id: str) -> None:
        """Drop ``agent_id``'s entries and their history (its workspace was closed with
        forget): one opened later under that id starts from then, as a new entry."""
        prefix = _key(agent_id, "")
        for entry in [e for k, e in self._entries.items() if k.startswith(prefix)]:
            self.unschedule(entry.agent_id, entry.kind)
        dropped = [k for k in self._state if k.startswith(prefix)]
        for key in dropped:
            del self._state[key]
        if dropped:
            await self._persist()

    def status(self) -> list[ScheduleEntry]:
        now = self._wall.now()
        return [self._status(key, entry, now) for key, entry in sorted(self._entries.items())]

    def entry_status(self, agent_id: str, kind: str) -> ScheduleEntry | None:
        """:meth:`status` of one entry (None if it is not scheduled)."""
        key = _key(agent_id, kind)
        entry = self._entries.get(key)
        return None if entry is None else self._status(key, entry, self._wall.now())

    def _status(self, key: str, entry: _Entry, now: datetime) -> ScheduleEntry:
        # After the clock stepped back, the occurrences up to the last fired one are skipped.
        last = self._last_fired(entry)
        sched = entry.schedule
        if last is None or _wrong_clock(last, now):
            due = sched.next_after(now)
        else:
            due = sched.next_after(last)
            if due <= now:  # reached, not fired yet: in its random delay, or missed
                due = sched.latest_at_or_before(now)  # the one the entry fires (once)
        return {
            "agent_id": entry.agent_id, "kind": entry.kind, "cron": sched.expr,
            "tz": str(sched.tz), "last_fired": self._state.get(key, {}).get("last_fired"),
            "next": due.isoformat(),
        }

    # -- state file ----------------------------------------------------------------------------

    def _load_state(self) -> None:
        if self._state_path is None:
            return
        try:
            data = orjson.loads(read_verified(self._state_path, None))
            version = data.get("version")
            entries = data["entries"] if version in (1, _STATE_VERSION) else {}
            if version == _STATE_VERSION and data.get("crc32") != _crc32(entries):
                raise ValueError("checksum mismatch")
            self._state = {str(k): {str(f): str(v) for f, v in rec.items()}
                           for k, rec in entries.items()}
        except CorruptState as exc:  # missing, or a directory or device in its place
            if exc.reason != "missing":
                log.warning("scheduler state %s unreadable (%s); starting afresh%s",
                            self._state_path, exc.reason, _set_aside(self._state_path))
            self._state = {}
        except (StorageError, ValueError, TypeError, KeyError, AttributeError) as exc:
            # Starting from "now" can only skip a catch-up run, never double one.
            log.warning("scheduler state %s unreadable (%s); starting afresh%s",
                        self._state_path, exc, self._set_aside_copy())
            self._state = {}

    def _set_aside_copy(self) -> str:
        """Keep the state file that did not verify beside it, named in status."""
        assert self._state_path is not None
        try:
            aside = set_aside(REAL, self._state_path)
        except StorageError as exc:
            return f" (could not set it aside: {exc.message})"
        self.write_failure.set_aside = str(aside)
        return f"; set aside as {aside.name}"

    def _write_state(self) -> None:
        assert self._state_path is not None
        ensure_dir(REAL, self._state_path.parent)
        atomic_write(REAL, self._state_path,
                     orjson.dumps({"version": _STATE_VERSION, "crc32": _crc32(self._state),
                                   "entries": self._state}, option=orjson.OPT_SORT_KEYS))

    async def _record(self, entry: _Entry, last_fired: datetime) -> None:
        self._state[entry.key] = {"last_fired": last_fired.isoformat(),
                                  "cron": entry.schedule.expr, "tz": str(entry.schedule.tz)}
        await self._persist()

    async def _persist(self) -> None:
        if self._state_path is None:
            return
        with trio.CancelScope(shield=True), \
                trio.move_on_after(self._config.state_write_timeout_s):
            async with self._state_lock:
                try:
                    await self._run_sync(self._write_state)
                except RecalldError as exc:
                    log.exception("scheduler state write failed")
                    self.write_failure.record(exc.message)
                else:
                    self.write_failure.clear()

    def _last_fired(self, entry: _Entry) -> datetime | None:
        rec = self._state.get(entry.key)
        # The zone is not compared: the last occurrence is an instant, true under any
        # zone's name ("UTC" or "Etc/UTC" from one run to the next) and in another zone.
        if not rec or rec.get("cron") != entry.schedule.expr:
            return None
        try:
            fired = datetime.fromisoformat(rec["last_fired"])
        except (KeyError, ValueError):
            return None
        # Written with its offset: one without (a hand edit) compared with the aware
        # times of the schedule stopped the daemon at its start.
        return fired if fired.tzinfo is not None else None

    def set_jitter(self, jitter_max_s: float) -> None:
        """Occurrences from now on wait 0-``jitter_max_s`` seconds (a reload's new value)."""
        self._config = replace(self._config, jitter_max_s=jitter_max_s)

    # -- the entry tasks -----------------------------------------------------------------------

    async def _sleep_toward(self, target: datetime) -> None:
        """Sleep one bounded step toward a wall-clock target (see the module docstring)."""
        remaining = (target - self._wall.now()).total_seconds()
        if remaining <= 0:
            return
        cfg = self._config
        step = remaining if remaining <= cfg.min_step_s else min(
            max(remaining / 2, cfg.min_step_s), cfg.max_step_s)
        await trio.sleep(step)
        self.wakeups += 1

    async def _entry_task(self, entry: _Entry) -> None:
        with trio.CancelScope() as scope:
            self._scopes[entry.key] = scope
            try:
                await self._entry_loop(entry)
            finally:
                if self._scopes.get(entry.key) is scope:
                    del self._scopes[entry.key]

    async def _entry_loop(self, entry: _Entry) -> None:
        sched = entry.schedule
        last = self._last_fired(entry)
        if last is None:
            last = self._wall.now()  # a new entry: occurrences from now on
            await self._record(entry, last)
        since: datetime | None = None  # while the last fired is far ahead: from when on
        while True:
            now = self._wall.now()
            if not _wrong_clock(last, now):
                since = None
            elif since is None or since > now:  # nothing fired after it: none is skipped
                if since is None:
                    log.warning("cron %s: the last occurrence fired, %s, lies %s ahead of "
                                "the clock (%s): one clock is wrong; occurrences from now on "
                                "fire", entry.key, last.isoformat(), last - now, now.isoformat())
                since = now
            due = sched.next_after(last if since is None else since)
            if due > now:
                await self._sleep_toward(due)
                continue
            # Due or missed: fire the latest occurrence reached, once.
            occurrence = sched.latest_at_or_before(now)
            await trio.sleep(self._rng.uniform(0.0, self._config.jitter_max_s))
            await self._record(entry, occurrence)
            last = occurrence
            await self._fire(entry, occurrence)

    async def _fire(self, entry: _Entry, occurrence: datetime) -> None:
        params = {**entry.params, "trigger": "cron", "occurrence": occurrence.isoformat()}
        try:
            job_id = await self._submit(entry.agent_id, entry.kind, params)
        except AlreadyRunning as exc:
            log.info("cron %s at %s skipped: %s", entry.key, occurrence, exc.message)
            return
        except RecalldError as exc:
            log.warning("cron %s at %s not submitted: %s", entry.key, occurrence, exc)
            return
        self.fired[entry.key] = self.fired.get(entry.key, 0) + 1
        log.info("cron %s fired for %s as job %s", entry.key, occurrence, job_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every entry (and those scheduled later) until cancelled."""
        if self._state_path is not None:
            await self._run_sync(self._load_state)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for entry in list(self._entries.values()):
                    nursery.start_soon(self._entry_task, entry)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
