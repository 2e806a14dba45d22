"""A subscriber's call whose new connection is closed before the daemon answers its
subscription (a daemon being killed took the connection) was not sent: the clients
connect once more, and say where the daemon has gone, never that the call was cut off.
Real daemons (SIGSTOP, then SIGKILL), real sockets."""

from __future__ import annotations

import signal
import threading

import trio
from conftest import DaemonFactory
from waits import until, wait_for

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client
from recalld.ipc.errors import DaemonNotRunning, RecalldError

TURNS = [{"role": "user", "content": "Ο φάρος ανάβει στις 19:05."},
         {"role": "assistant", "content": "Σημειώθηκε."}]


def test_a_blocking_subscribers_call_meeting_a_dying_daemon_was_not_sent(
        daemon_factory: DaemonFactory) -> None:
    d = daemon_factory()
    c = Client(d.socket_path, timeout_s=120)
    c.subscribe(["job.*"])
    c.close()  # the next call connects anew and subscribes again
    d.signal(signal.SIGSTOP)  # the kernel still takes connections for it
    raised: list[BaseException] = []

    def call() -> None:
        try:
            c.add_turns("default", "lighthouse", TURNS)
        except RecalldError as exc:
            raised.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: c.connected, "the new connection")
    d.kill()
    caller.join(timeout=120)
    assert not caller.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], DaemonNotRunning), raised


def test_an_async_subscribers_call_meeting_a_dying_daemon_was_not_sent(
        daemon_factory: DaemonFactory) -> None:
    d = daemon_factory()

    async def run() -> None:
        c = AsyncClient(d.socket_path, timeout_s=120)
        await c.subscribe(["job.*"])
        await c.aclose()
        d.signal(signal.SIGSTOP)
        raised: list[BaseException] = []

        async def call() -> None:
            try:
                await c.add_turns("default", "lighthouse", TURNS)
            except RecalldError as exc:
                raised.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await until(lambda: c.connected, "the new connection")
            await trio.to_thread.run_sync(d.kill)
        assert len(raised) == 1 and isinstance(raised[0], DaemonNotRunning), raised

    trio.run(run)
