"""A subscriber learns when its events had a gap: the subscribed connection was lost
(the daemon restarted) and a call reconnected and subscribed again before the subscriber
read its events. Both clients raise ConnectionLost once, after the events read before
the loss and before those of the new connection; a full event buffer still tells.
Real daemons, one after the other on one socket, real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from conftest import DaemonFactory, DaemonHandle
from waits import wait_for

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client
from recalld.ipc.errors import ConnectionLost


def restarted(daemon_factory: DaemonFactory, first: DaemonHandle) -> DaemonHandle:
    """A new daemon on ``first``'s socket and data, once ``first`` has stopped."""
    first.stop()
    return daemon_factory(RECALLD_SOCKET=str(first.socket_path),
                          XDG_DATA_HOME=first.env["XDG_DATA_HOME"])


def job_done(daemon: DaemonHandle, job_id: str) -> bool:
    """Whether ``job_id`` of the default workspace succeeded, as ``daemon`` says."""
    job = daemon.call("jobs.get", {"agent_id": "default", "job_id": job_id})
    return bool(job["state"] == "succeeded")


def test_a_blocking_subscriber_is_told_its_connection_was_lost_between_calls(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    first = daemon_factory(RECALLD_SOCKET=str(short_dir / "r.sock"))
    with Client(first.socket_path) as client:
        client.subscribe(["job.state"])
        client.jobs_submit("default", "reindex")
        assert succeeded(client) == 3  # queued, running, succeeded
        second = restarted(daemon_factory, first)
        assert client.ping()["pong"]  # the call reconnects (and subscribes again) unseen
        client.jobs_submit("default", "reindex")
        wait_for(lambda: second.call("jobs.list", {"agent_id": "default"})["jobs"])
        with pytest.raises(ConnectionLost):
            next(client.events(timeout_s=30))
        assert succeeded(client) == 3  # told once: then the new connection's events


def succeeded(client: Client) -> int:
    """How many job.state events ``client`` reads up to the first job's success."""
    seen = 0
    for event in client.events(timeout_s=60):
        seen += 1
        if event.data["state"] == "succeeded":
            return seen
    raise AssertionError(f"no job succeeded in {seen} events")


def test_an_async_subscriber_with_a_full_buffer_is_still_told_of_the_loss(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    first = daemon_factory(RECALLD_SOCKET=str(short_dir / "r.sock"))

    async def run() -> None:
        async with AsyncClient(first.socket_path, max_events=1) as client:
            await client.subscribe(["job.state"])
            job_id = (await client.jobs_submit("default", "reindex"))["job_id"]
            await trio.to_thread.run_sync(lambda: wait_for(lambda: job_done(first, job_id)))
            with trio.fail_after(120):
                while client.events_dropped < 2:  # the buffer is full: calls read the rest
                    await client.ping()
            await trio.to_thread.run_sync(restarted, daemon_factory, first)
            assert (await client.ping())["pong"]
            kept = await client.next_event(timeout_s=0)
            assert kept is not None and kept.data["state"] == "queued"
            with pytest.raises(ConnectionLost):
                await client.next_event(timeout_s=0)

    trio.run(run)
