"""The job system: states, progress events, exclusivity, fairness, cancel, restart recovery."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from recalld.daemon.jobrecords import JobContext, JobsConfig
from recalld.daemon.jobs import INTERRUPTED, JobManager
from recalld.daemon.rpc import job_methods
from recalld.ipc.errors import (
    JOB_FAILED,
    AlreadyRunning,
    InvalidParams,
    JobFailed,
    NotFound,
    Overloaded,
    ProviderUnavailable,
    UnknownWorkspace,
)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, topic: str, payload: dict[str, Any]) -> None:
        self.events.append((topic, payload))

    def states(self, job_id: str) -> list[str]:
        return [p["state"] for t, p in self.events if t == "job.state" and p["job_id"] == job_id]


class Gate:
    """A handler that records its start and waits for the test to let it finish."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.release: dict[str, trio.Event] = {}

    async def __call__(self, job: JobContext) -> dict[str, Any]:
        self.started.append((job.agent_id, job.job_id))
        event = self.release.setdefault(job.job_id, trio.Event())
        await event.wait()
        return {"ok": job.job_id}

    def open(self, job_id: str) -> None:
        self.release.setdefault(job_id, trio.Event()).set()


@asynccontextmanager
async def running(manager: JobManager) -> AsyncIterator[JobManager]:
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        yield manager
        nursery.cancel_scope.cancel()


async def wait_state(manager: JobManager, agent: str, job_id: str, *states: str) -> dict[str, Any]:
    with trio.fail_after(60):
        while (job := manager.get(agent, job_id))["state"] not in states:
            await trio.sleep(0.01)
    return job


async def test_lifecycle_with_progress_and_result(autojump_clock: object) -> None:
    rec = Recorder()
    manager = JobManager(publish=rec, config=JobsConfig(progress_interval_s=1.0))

    async def reindex(job: JobContext) -> dict[str, Any]:
        for done in range(1, 11):
            job.set_progress(done, 10, f"file {done}")
            await trio.sleep(0.25)
        return {"files": 10, "params": dict(job.params)}

    manager.register("reindex", reindex, exclusive=True, cpu_heavy=True)
    async with running(manager):
        job_id = await manager.submit("alice", "reindex", {"full": True})
        assert manager.get("alice", job_id)["state"] in ("queued", "running")
        job = await wait_state(manager, "alice", job_id, "succeeded")
    assert job["result"] == {"files": 10, "params": {"full": True}}
    assert job["progress"] == {"done": 10, "total": 10, "message": "file 10"}
    assert job["error"] is None
    assert job["submitted_at"] <= job["started_at"] <= job["finished_at"]
    assert rec.states(job_id) == ["queued", "running", "succeeded"]
    progress = [p["progress"]["done"] for t, p in rec.events if t == "job.progress"]
    # Throttled to one per second of job time (2.5 s), plus the final one.
    assert progress[-1] == 10
    assert 2 <= len(progress) <= 5
    assert progress == sorted(progress)


async def test_exclusive_kind_refuses_a_second_submit(autojump_clock: object) -> None:
    gate = Gate()
    manager = JobManager()
    manager.register("reindex", gate, exclusive=True)
    async with running(manager):
        first = await manager.submit("alice", "reindex")
        with pytest.raises(AlreadyRunning, match="already") as info:
            await manager.submit("alice", "reindex")
        assert info.value.data["job_id"] == first
        # Said without an article, which read "a auto_dream job" for a kind of a vowel.
        state = info.value.data["state"]
        assert info.value.message == (f"reindex is already {state} for workspace 'alice' "
                                      f"(job {first}); wait for it or cancel it")
        # Another workspace is not affected.
        other = await manager.submit("bob", "reindex")
        await trio.testing.wait_all_tasks_blocked()
        gate.open(first)
        await wait_state(manager, "alice", first, "succeeded")
        again = await manager.submit("alice", "reindex")  # allowed once the first is done
        gate.open(again)
        gate.open(other)
        await wait_state(manager, "alice", again, "succeeded")
        await wait_state(manager, "bob", other, "succeeded")


async def test_failures_and_cancellation(autojump_clock: object) -> None:
    rec = Recorder()
    manager = JobManager(publish=rec)

    async def broken(job: JobContext) -> dict[str, Any]:
        raise ValueError("bad input")

    async def offline(job: JobContext) -> dict[str, Any]:
        raise ProviderUnavailable("no chat model configured")

    async def forever(job: JobContext) -> dict[str, Any]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    manager.register("broken", broken)
    manager.register("offline", offline)
    manager.register("forever", forever)
    async with running(manager):
        b = await manager.submit("a", "broken")
        o = await manager.submit("a", "offline")
        f = await manager.submit("a", "forever")
        failed = await wait_state(manager, "a", b, "failed")
        assert failed["error"] == "ValueError: bad input"
        assert failed["error_code"] == JOB_FAILED
        unavailable = await wait_state(manager, "a", o, "failed")
        assert unavailable["error"] == "no chat model configured"
        assert unavailable["error_code"] == ProviderUnavailable.code
        await wait_state(manager, "a", f, "running")
        cancelled = await manager.cancel("a", f)
        assert cancelled["state"] == "cancelled"
        assert rec.states(f) == ["queued", "running", "cancelled"]
        # Cancelling again, or a finished job, changes nothing.
        assert (await manager.cancel("a", f))["state"] == "cancelled"
        assert (await manager.cancel("a", b))["state"] == "failed"
        with pytest.raises(NotFound):
            manager.get("a", "nope")
        with pytest.raises(NotFound) as huge:  # the message does not echo a megabyte id
            manager.get("a", "x" * 1_000_000)
        assert len(huge.value.message) < 200


async def test_cancel_a_queued_job_and_per_workspace_fifo(autojump_clock: object) -> None:
    gate = Gate()
    manager = JobManager(config=JobsConfig(max_running_per_workspace=1))
    manager.register("work", gate)
    async with running(manager):
        ids = [await manager.submit("a", "work", {"n": i}) for i in range(4)]
        await trio.testing.wait_all_tasks_blocked()
        assert [j for _, j in gate.started] == ids[:1]
        assert (await manager.cancel("a", ids[2]))["state"] == "cancelled"
        for job_id in ids:
            gate.open(job_id)
        await wait_state(manager, "a", ids[3], "succeeded")
        assert [j for _, j in gate.started] == [ids[0], ids[1], ids[3]]
        assert [j["job_id"] for j in manager.list("a")] == ids


async def test_round_robin_across_workspaces_under_a_cpu_limit(autojump_clock: object) -> None:
    order: list[str] = []

    async def heavy(job: JobContext) -> dict[str, Any]:
        order.append(job.agent_id)
        await trio.sleep(1)
        return {}

    limiter = trio.CapacityLimiter(1)
    manager = JobManager(cpu_limiter=limiter, config=JobsConfig(max_running=8))
    manager.register("reindex", heavy, cpu_heavy=True)
    # Alice floods the queue first; bob and carol arrive after (all before dispatching).
    ids = [("alice", await manager.submit("alice", "reindex")) for _ in range(4)]
    ids += [("bob", await manager.submit("bob", "reindex")) for _ in range(2)]
    ids += [("carol", await manager.submit("carol", "reindex"))]
    async with running(manager):
        for agent, job_id in ids:
            await wait_state(manager, agent, job_id, "succeeded")
    # One CPU-heavy job at a time, workspaces taking turns.
    assert order == ["alice", "bob", "carol", "alice", "bob", "alice", "alice"]
    assert limiter.borrowed_tokens == 0


async def test_cpu_jobs_wait_for_a_shared_limiter(autojump_clock: object) -> None:
    limiter = trio.CapacityLimiter(1)
    gate = Gate()
    manager = JobManager(cpu_limiter=limiter)
    manager.register("reindex", gate, cpu_heavy=True)
    manager.register("light", gate)
    async with running(manager):
        await limiter.acquire_on_behalf_of("index commit elsewhere")
        heavy = await manager.submit("a", "reindex")
        waiting = await manager.submit("b", "reindex")
        light = await manager.submit("c", "light")
        await trio.testing.wait_all_tasks_blocked()
        assert manager.get("a", heavy)["state"] == "queued"
        assert manager.get("c", light)["state"] == "running"  # not blocked by CPU jobs
        assert (await manager.cancel("b", waiting))["state"] == "cancelled"
        limiter.release_on_behalf_of("index commit elsewhere")
        await wait_state(manager, "a", heavy, "running")
        gate.open(heavy)
        gate.open(light)
        await wait_state(manager, "a", heavy, "succeeded")
        assert [j for _, j in gate.started] == [light, heavy]
    assert limiter.borrowed_tokens == 0


async def test_max_running_bounds_concurrency(autojump_clock: object) -> None:
    active = 0
    peak = 0

    async def light(job: JobContext) -> dict[str, Any]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await trio.sleep(1)
        active -= 1
        return {}

    manager = JobManager(config=JobsConfig(max_running=3, max_running_per_workspace=2))
    manager.register("light", light)
    async with running(manager):
        ids = [(a, await manager.submit(a, "light")) for a in ("a", "b", "c") for _ in range(3)]
        for agent, job_id in ids:
            await wait_state(manager, agent, job_id, "succeeded")
    assert peak == 3


async def test_restart_reports_interrupted_or_resumes(tmp_path: Path) -> None:
    journal = tmp_path / "state" / "jobs.jsonl"
    gate = Gate()
    first = JobManager(journal_path=journal)
    first.register("auto_dream", gate)
    first.register("reindex", gate, resumable=True)
    first.register("quick", gate)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        done_id = await first.submit("a", "quick")
        gate.open(done_id)
        await wait_state(first, "a", done_id, "succeeded")
        dream = await first.submit("a", "auto_dream")
        reindex = await first.submit("a", "reindex", {"full": True})
        await wait_state(first, "a", dream, "running")
        await wait_state(first, "a", reindex, "running")
        nursery.cancel_scope.cancel()  # the daemon stops (or dies) mid-job

    resumed: list[JobContext] = []

    async def reindex_again(job: JobContext) -> dict[str, Any]:
        resumed.append(job)
        return {"resumed": job.resumed}

    second = JobManager(journal_path=journal)
    second.register("auto_dream", gate)
    second.register("reindex", reindex_again, resumable=True)
    second.register("quick", gate)
    async with running(second):
        lost = second.get("a", dream)
        assert lost["state"] == "failed"
        assert lost["error"] == INTERRUPTED
        again = await wait_state(second, "a", reindex, "succeeded")
        assert again["result"] == {"resumed": True}
        assert resumed[0].params == {"full": True}
        assert second.get("a", done_id)["state"] == "succeeded"

    third = JobManager(journal_path=journal)  # and it stays that way
    third.register("reindex", reindex_again, resumable=True)
    async with running(third):
        assert third.get("a", dream)["error"] == INTERRUPTED
        assert third.get("a", reindex)["state"] == "succeeded"
        assert len(resumed) == 1


async def test_history_is_bounded(autojump_clock: object) -> None:
    async def quick(job: JobContext) -> dict[str, Any]:
        return {}

    manager = JobManager(config=JobsConfig(history_per_workspace=5))
    manager.register("quick", quick)
    async with running(manager):
        ids = []
        for _ in range(20):
            ids.append(await manager.submit("a", "quick"))
            await wait_state(manager, "a", ids[-1], "succeeded")
        listed = [j["job_id"] for j in manager.list("a")]
        assert len(listed) <= 6
        assert listed[-1] == ids[-1]


async def test_rpc_handlers_validate(autojump_clock: object) -> None:
    async def quick(job: JobContext) -> dict[str, Any]:
        return {"n": job.params.get("n")}

    manager = JobManager(agent_exists=lambda a: a in {"default", "alice"})
    manager.register("quick", quick)
    async with running(manager):
        out = await job_methods.rpc_submit(manager, {"agent_id": "alice", "kind": "quick",
                                              "params": {"n": 3}})
        job = await wait_state(manager, "alice", out["job_id"], "succeeded")
        assert job["result"] == {"n": 3}
        got = await job_methods.rpc_get(manager, {"agent_id": "alice", "job_id": out["job_id"]})
        assert got["state"] == "succeeded"
        listed = await job_methods.rpc_list(manager, {"agent_id": "alice"})
        assert [j["job_id"] for j in listed["jobs"]] == [out["job_id"]]
        # Without an agent id: the default agent's jobs, not everyone's.
        assert (await job_methods.rpc_list(manager, {}))["jobs"] == []
        assert (await job_methods.rpc_list(manager, {"agent_id": "default"}))["jobs"] == []
        shared = await job_methods.rpc_list(manager, {}, lambda caller, owner: True)
        assert [j["job_id"] for j in shared["jobs"]] == [out["job_id"]]

        bad: list[tuple[Callable[..., Any], Any, type[Exception]]] = [
            (job_methods.rpc_submit, ["alice", "quick"], InvalidParams),
            (job_methods.rpc_submit, {"agent_id": "alice"}, InvalidParams),
            # Started, read or cancelled, a job's workspace is named: no default assumed.
            (job_methods.rpc_submit, {"kind": "quick"}, InvalidParams),
            (job_methods.rpc_get, {"job_id": out["job_id"]}, InvalidParams),
            (job_methods.rpc_submit, {"agent_id": "alice", "kind": "nope"}, InvalidParams),
            (job_methods.rpc_submit, {"agent_id": "alice", "kind": "quick", "params": [1]},
             InvalidParams),
            (job_methods.rpc_submit, {"agent_id": "mallory", "kind": "quick"}, UnknownWorkspace),
            (job_methods.rpc_get, {"agent_id": "alice", "job_id": "missing"}, NotFound),
            (job_methods.rpc_get, {"agent_id": "alice"}, InvalidParams),
            (job_methods.rpc_get, {"agent_id": "mallory", "job_id": "x"}, UnknownWorkspace),
            (job_methods.rpc_cancel, {"agent_id": "alice", "job_id": 7}, InvalidParams),
            (job_methods.rpc_list, {"agent_id": "mallory"}, UnknownWorkspace),
            (job_methods.rpc_list, {"agent_id": "../x"}, InvalidParams),
            (job_methods.rpc_list, {"agent": "alice"}, InvalidParams),
            (job_methods.rpc_get, {"agent_id": "alice", "job_id": "x", "extra": 1},
             InvalidParams),
            (job_methods.rpc_cancel, {"agent_id": "alice", "job_id": "x", "force": True},
             InvalidParams),
            (job_methods.rpc_submit, {"agent_id": "alice", "kind": "quick", "prio": 1},
             InvalidParams),
        ]
        for fn, params, error in bad:
            with pytest.raises(error):
                await fn(manager, params)


async def test_jobs_submitted_before_run_are_journaled(tmp_path: Path) -> None:
    journal = tmp_path / "jobs.jsonl"

    async def quick(job: JobContext) -> dict[str, Any]:
        return {"n": 1}

    first = JobManager(journal_path=journal)
    first.register("quick", quick)
    early = await first.submit("a", "quick")  # queued while the manager is not running
    async with running(first):
        await wait_state(first, "a", early, "succeeded")

    second = JobManager(journal_path=journal)
    second.register("quick", quick)
    async with running(second):
        assert second.get("a", early)["result"] == {"n": 1}


async def test_each_kind_refuses_params_it_does_not_take(autojump_clock: object) -> None:
    from recalld.daemon.jobparams import params_of
    from recalld.daemon.memory.capture import AUTO_MEMORY_PARAMS
    from recalld.daemon.memory.consolidation import DREAM_PARAMS, RESOURCE_PARAMS

    async def echo(job: JobContext) -> dict[str, Any]:
        return dict(job.params)

    manager = JobManager(agent_exists=lambda a: a == "alice")
    for kind, check in (("reindex", params_of("reindex", {})),
                        ("auto_memory", AUTO_MEMORY_PARAMS), ("auto_dream", DREAM_PARAMS),
                        ("auto_resource", RESOURCE_PARAMS)):
        manager.register(kind, echo, check_params=check)
    async with running(manager):
        refused = [
            ("reindex", {"full": True}),
            ("auto_memory", {}),
            ("auto_memory", {"session_id": "../s"}),
            ("auto_memory", {"session_id": "s", "upto": -1}),
            ("auto_memory", {"session_id": "s", "upto": 2.5}),
            ("auto_memory", {"session_id": "s", "upto": True}),
            ("auto_memory", {"session_id": "s", "date": "2026-02-30"}),
            ("auto_memory", {"session_id": "s", "trigger": "whenever"}),
            ("auto_memory", {"session_id": "s", "junk": "x" * 100_000}),
            ("auto_dream", {"trigger": "cron", "occurrence": [1]}),
            ("auto_dream", {"trigger": {"a": 1}}),
            ("auto_resource", {"trigger": "watch", "x": 1}),
        ]
        for kind, params in refused:
            with pytest.raises(InvalidParams):
                await job_methods.rpc_submit(manager, {"agent_id": "alice", "kind": kind,
                                                       "params": params})
        assert manager.list("alice") == [], "nothing refused was queued"
        # What the daemon itself submits, and a client's well-formed params, are kept;
        # a null param counts as left out.
        taken = [
            ("reindex", None, {}),
            ("auto_memory", {"session_id": "s", "upto": 3, "trigger": "idle", "date": None},
             {"session_id": "s", "upto": 3, "trigger": "idle"}),
            ("auto_dream", {"trigger": "cron", "occurrence": "2026-07-23T03:00:00+00:00"},
             {"trigger": "cron", "occurrence": "2026-07-23T03:00:00+00:00"}),
            ("auto_resource", {"trigger": "watch"}, {"trigger": "watch"}),
        ]
        for kind, params, kept in taken:
            job_id = await manager.submit("alice", kind, params)
            assert (await wait_state(manager, "alice", job_id, "succeeded"))["params"] == kept


async def test_a_client_cannot_queue_jobs_without_bound(autojump_clock: object) -> None:
    # Every queued job is held and journaled: a client submitting in a loop gets
    # Overloaded once the workspace has MAX_ACTIVE_JOBS queued or running, and may submit
    # again when they finish; the daemon's own submits (a stop's flushes) still go in.
    gate = Gate()
    manager = JobManager(agent_exists=lambda a: a == "alice")
    manager.register("held", gate)
    async with running(manager):
        ids = [(await job_methods.rpc_submit(manager, {"agent_id": "alice", "kind": "held"}))[
            "job_id"] for _ in range(job_methods.MAX_ACTIVE_JOBS)]
        with pytest.raises(Overloaded, match="wait for some to finish"):
            await job_methods.rpc_submit(manager, {"agent_id": "alice", "kind": "held"})
        inside = await manager.submit("alice", "held")  # 257 active now
        for job_id in ids[:2]:
            gate.open(job_id)
            await wait_state(manager, "alice", job_id, "succeeded")
        again = await job_methods.rpc_submit(manager, {"agent_id": "alice", "kind": "held"})
        assert manager.get("alice", again["job_id"])["state"] in ("queued", "running")
        for job_id in [*ids, inside, again["job_id"]]:
            gate.open(job_id)


async def test_what_json_cannot_hold_never_stops_the_journal(tmp_path: Path) -> None:
    """A handler's progress, result or error holding text JSON cannot carry (a file name
    that was not UTF-8, as Python decodes it) or a value it has no form for: the record is
    journaled and answered with those mended, and the manager goes on."""
    journal = tmp_path / "state" / "jobs.jsonl"
    name = b"caf\xe9 \xff.md".decode("utf-8", "surrogateescape")

    async def odd(job: JobContext) -> dict[str, Any]:
        job.set_progress(1, 2, f"reading {name}")
        return {"notes": [name], "size": 1 << 70, "where": tmp_path}

    async def fails(job: JobContext) -> dict[str, Any]:
        raise JobFailed(f"cannot read {name}")  # not logged: pytest-xdist cannot carry it

    first = JobManager(journal_path=journal)
    first.register("odd", odd)
    first.register("fails", fails)
    async with running(first):
        a = await first.submit("a", "odd")
        b = await first.submit("a", "fails")
        done = await wait_state(first, "a", a, "succeeded")
        failed = await wait_state(first, "a", b, "failed")
        assert done["progress"]["message"] == "reading caf\ufffd \ufffd.md"
        assert done["result"] == {"notes": ["caf\ufffd \ufffd.md"], "size": str(1 << 70),
                                  "where": str(tmp_path)}
        assert failed["error"] == "cannot read caf\ufffd \ufffd.md"
        assert first.write_failure.failed is None
        assert await first.submit("a", "odd")  # the manager goes on

    second = JobManager(journal_path=journal)  # the journal holds both, as answered
    second.register("odd", odd)
    second.register("fails", fails)
    async with running(second):
        assert second.get("a", a)["result"] == done["result"]
        assert second.get("a", b)["error"] == failed["error"]
