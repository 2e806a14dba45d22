"""The asyncio bridge: single attempts, error translation, cancellation, shutdown.

Real HTTP against the loopback fake, so these run on the real clock with short timeouts.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio
from fakes.provider_server import FakeProvider, Reply

from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.errors import (
    ProviderBadResponse,
    ProviderConfigError,
    ProviderConnectError,
    ProviderRejected,
    ProviderTimeout,
)
from recalld.daemon.providers.retry import RetryPolicy, check_response


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(dims=4) as server:
        yield server


@pytest.fixture
async def bridge(nursery: trio.Nursery) -> ProviderBridge:
    b = ProviderBridge(stop_timeout_s=5.0, cancel_timeout_s=5.0)
    await nursery.start(b.run)
    return b


def refused_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}/v1/embeddings"


async def wait_for_requests(fake: FakeProvider, n: int) -> None:
    with trio.fail_after(5):
        while len(fake.requests) < n:
            await trio.sleep(0.005)


async def test_request_round_trip(bridge: ProviderBridge, fake: FakeProvider) -> None:
    fake.script(Reply(status=201, headers={"X-Thing": "yes"}, raw=b'{"hello": 1}'))
    result = await bridge.request(
        "POST", fake.url + "/anything", headers={"Authorization": "Bearer k"},
        json={"a": [1, 2]}, timeout_s=5,
    )
    assert result.status == 201
    assert result.headers["x-thing"] == "yes"
    assert result.body == b'{"hello": 1}'
    (rec,) = fake.requests
    assert rec.path == "/anything"
    assert rec.headers["authorization"] == "Bearer k"
    assert rec.headers["content-type"] == "application/json"
    assert rec.json == {"a": [1, 2]}
    assert bridge.statistics().in_flight == 0


async def test_any_status_is_returned_not_raised(bridge: ProviderBridge,
                                                 fake: FakeProvider) -> None:
    fake.script(Reply(status=503, headers={"Retry-After": "3"}))
    result = await bridge.request("POST", fake.url + "/v1/embeddings", headers={},
                                  json={}, timeout_s=5)
    assert result.status == 503
    assert result.headers["retry-after"] == "3"


async def test_only_a_redirect_that_keeps_request_and_server_is_followed(
        bridge: ProviderBridge, fake: FakeProvider) -> None:
    # A 307/308 within the server is resent whole: method, body and key.
    fake.script(Reply(status=307, headers={"Location": "/moved/embeddings"}),
                Reply(status=308, headers={"Location": fake.url + "/again"}),
                Reply(raw=b'{"ok": 1}'))
    result = await bridge.request("POST", fake.url + "/v1/embeddings",
                                  headers={"X-Goog-Api-Key": "k"}, json={"a": 1}, timeout_s=5)
    assert (result.status, result.body) == (200, b'{"ok": 1}')
    assert [(r.method, r.path, r.headers["x-goog-api-key"], r.json) for r in fake.requests] \
        == [("POST", p, "k", {"a": 1}) for p in ("/v1/embeddings", "/moved/embeddings",
                                                  "/again")]
    # Another server (another port, or https for http) never gets the request and its
    # key; a 301/302/303, which would resend it as a bodiless GET, is not followed.
    with FakeProvider(dims=4) as other:
        for status, target in ((307, other.url + "/v1/embeddings"),
                               (308, fake.url.replace("http:", "https:") + "/x"),
                               (301, "/moved"), (302, "/moved"), (303, "/moved")):
            fake.script(Reply(status=status, headers={"Location": target}))
            result = await bridge.request("POST", fake.url + "/v1/embeddings",
                                          headers={"X-Goog-Api-Key": "k"}, json={},
                                          timeout_s=5)
            assert (result.status, result.headers["location"]) == (status, target)
        assert other.requests == []
    assert [r.method for r in fake.requests] == ["POST"] * 8


async def test_a_redirect_to_no_url_is_the_answer(bridge: ProviderBridge,
                                                  fake: FakeProvider) -> None:
    # A Location that is no URL (an IPv6 host left open) raised ValueError while the
    # redirect was weighed, and the call failed as "cannot send to <base_url>": the
    # configured URL blamed for the provider's broken redirect.
    for target in ("http://[oops/v1/embeddings", "//[::1/x"):
        fake.script(Reply(status=307, headers={"Location": target}))
        result = await bridge.request("POST", fake.url + "/v1/embeddings", headers={},
                                      json={}, timeout_s=5)
        assert (result.status, result.headers["location"]) == (307, target)
        with pytest.raises(ProviderRejected, match=r"the provider redirects to .*\[") as info:
            check_response(result, RetryPolicy(), what="embed")
        assert not info.value.transient
    assert len(fake.requests) == 2


async def test_a_redirect_loop_ends(bridge: ProviderBridge, fake: FakeProvider) -> None:
    fake.script(*[Reply(status=307, headers={"Location": "/loop"})] * 10)
    with pytest.raises(ProviderBadResponse, match="redirected more than"):
        await bridge.request("POST", fake.url + "/loop", headers={}, json={}, timeout_s=5)


async def test_connect_refused_is_typed(bridge: ProviderBridge) -> None:
    with pytest.raises(ProviderConnectError) as info:
        await bridge.request("POST", refused_url(), headers={}, json={}, timeout_s=5)
    assert info.value.transient


async def test_dropped_connection_is_typed(bridge: ProviderBridge, fake: FakeProvider) -> None:
    fake.script(Reply(drop=True))
    with pytest.raises(ProviderConnectError):
        await bridge.request("POST", fake.url + "/x", headers={}, json={}, timeout_s=5)


@pytest.mark.parametrize("wire", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n" b'{"data": [{"index": 0, "emb',
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n" b'{"data": [',
    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\n0123456789",
], ids=["short-of-its-length", "chunks-cut", "not-gzip"])
async def test_an_answer_cut_short_says_so_on_one_line(bridge: ProviderBridge, fake: FakeProvider,
                                                       wire: bytes) -> None:
    # The provider was reached and began to answer: "cannot reach" would send the
    # operator to the network; a message on several lines breaks the status line.
    fake.script(Reply(wire=wire))
    with pytest.raises(ProviderConnectError, match="was cut short") as info:
        await bridge.request("POST", fake.url + "/x", headers={}, json={}, timeout_s=5)
    assert info.value.transient and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("wire", [
    b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 4\r\n\r\nabcd",
    b"\x15\x03\x01\x00\x02\x02\x46",  # a TLS alert: http:// to a port speaking TLS
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 9000 + b"\r\nContent-Length: 2\r\n\r\n{}",
], ids=["unasked-encoding", "not-http", "head-too-long"])
async def test_an_answer_whose_head_cannot_be_read_says_so(bridge: ProviderBridge,
                                                           fake: FakeProvider,
                                                           wire: bytes) -> None:
    # The provider answered, but not in HTTP the client reads. aiohttp reports that as a
    # "400" of its own parser: quoted, it read as the provider refusing the input, and
    # "cannot reach" sent the operator to the network.
    fake.script(Reply(wire=wire))
    with pytest.raises(ProviderBadResponse, match="cannot be read: ") as info:
        await bridge.request("POST", fake.url + "/x", headers={}, json={}, timeout_s=5)
    # (The fake's port may hold "400": the quoted status is what must not show.)
    said = str(info.value).replace(fake.url, "URL")
    assert "400" not in said and "cannot reach" not in said and "\n" not in said, said
    assert info.value.status is None


@pytest.mark.parametrize("wire", [
    bytes.fromhex("160303002a020000260303") + bytes(40),  # a ServerHello
    b"\x15\x03\x01\x00\x02\x02\x46",  # an alert
], ids=["server-hello", "alert"])
async def test_a_port_speaking_tls_to_http_says_to_use_https(bridge: ProviderBridge,
                                                             fake: FakeProvider,
                                                             wire: bytes) -> None:
    # The error quoted the record's bytes ("Bad status line: ... b'\x16\x03\x03...'"),
    # which left the operator to tell TLS by its first byte.
    fake.script(Reply(wire=wire))
    with pytest.raises(ProviderBadResponse) as info:
        await bridge.request("POST", fake.url + "/x", headers={}, json={}, timeout_s=5)
    assert str(info.value).endswith("cannot be read: the server speaks TLS on this port: "
                                    "use https:// in base_url"), str(info.value)


async def test_https_to_a_port_speaking_http_says_to_use_http(bridge: ProviderBridge,
                                                              fake: FakeProvider) -> None:
    url = fake.url.replace("http:", "https:") + "/x"
    with pytest.raises(ProviderConnectError) as info:
        await bridge.request("POST", url, headers={}, json={}, timeout_s=5)
    assert "the server does not speak TLS on this port: use http:// in base_url" \
        in str(info.value), str(info.value)
    assert info.value.transient


async def test_slow_answer_times_out(bridge: ProviderBridge, fake: FakeProvider) -> None:
    fake.script(Reply(delay_s=3.0))
    with pytest.raises(ProviderTimeout):
        await bridge.request("POST", fake.url + "/x", headers={}, json={}, timeout_s=0.2)
    assert bridge.statistics().in_flight == 0


async def test_bad_url_is_a_config_error(bridge: ProviderBridge) -> None:
    with pytest.raises((ProviderConfigError, ProviderConnectError)):
        await bridge.request("POST", "http://", headers={}, json={}, timeout_s=1)


async def test_oversized_answer_is_refused(nursery: trio.Nursery, fake: FakeProvider) -> None:
    small = ProviderBridge(max_body_bytes=100)
    await nursery.start(small.run)
    fake.script(Reply(raw=b"x" * 1000))
    with pytest.raises(Exception, match="exceeds 100 bytes"):
        await small.request("POST", fake.url + "/x", headers={}, json={}, timeout_s=5)
    # A URL with a user and password (a proxy with basic auth): the error, which goes to
    # status and log, names the URL without the password.
    fake.script(Reply(raw=b"x" * 1000))
    with pytest.raises(Exception, match="exceeds 100 bytes") as info:
        await small.request("POST", fake.url.replace("://", "://me:hunter2-pw@") + "/x",
                            headers={}, json={}, timeout_s=5)
    assert "hunter2-pw" not in str(info.value) and "me:***@" in str(info.value)


async def test_cancel_mid_request_cancels_asyncio_task(bridge: ProviderBridge,
                                                       fake: FakeProvider) -> None:
    fake.script(Reply(delay_s=10.0))
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: bridge.request(
                "POST", fake.url + "/slow", headers={}, json={}, timeout_s=30))
            await wait_for_requests(fake, 1)
            assert bridge.statistics().in_flight == 1
            scope.cancel()
    assert scope.cancelled_caught
    # The asyncio task finished cancelling before Cancelled reached us.
    assert bridge.statistics().in_flight == 0
    # And the bridge still works.
    result = await bridge.request("POST", fake.url + "/v1/embeddings", headers={},
                                  json={"model": "m", "input": ["a"]}, timeout_s=5)
    assert result.status == 200


async def test_cancel_at_many_points_leaves_no_task(bridge: ProviderBridge,
                                                   fake: FakeProvider) -> None:
    for i in range(15):
        fake.script(Reply(delay_s=0.05))
        with trio.move_on_after(i * 0.007):
            await bridge.request("POST", fake.url + "/p", headers={}, json={}, timeout_s=5)
        assert bridge.statistics().in_flight == 0
    assert bridge.running


async def test_a_first_request_cancelled_while_the_thread_starts_leaves_it_usable(
        fake: FakeProvider) -> None:
    # The first request starts the asyncio thread; cancelled at points up to 4 ms (some
    # inside that start), the bridge must still serve the next one.
    for i in range(40):
        b = ProviderBridge(stop_timeout_s=5.0, cancel_timeout_s=5.0)
        async with trio.open_nursery() as service:
            await service.start(b.run)
            with trio.move_on_after(i * 0.0001):
                await b.request("POST", fake.url + "/p", headers={}, json={}, timeout_s=5)
            assert b.running, i
            r = await b.request("POST", fake.url + "/v1/embeddings", headers={},
                                json={"model": "m", "input": ["a"]}, timeout_s=30)
            assert r.status == 200, i
            service.cancel_scope.cancel()


async def test_concurrent_requests(bridge: ProviderBridge, fake: FakeProvider) -> None:
    fake.script(*[Reply(delay_s=0.05, raw=str(i).encode()) for i in range(20)])
    bodies: list[bytes] = []

    async def one() -> None:
        r = await bridge.request("POST", fake.url + "/c", headers={}, json={}, timeout_s=5)
        bodies.append(r.body)

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(one)
    assert sorted(bodies, key=int) == [str(i).encode() for i in range(20)]
    assert bridge.statistics().requests_total == 20


async def test_not_running_raises_connect_error(fake: FakeProvider) -> None:
    b = ProviderBridge()
    with pytest.raises(ProviderConnectError, match="not running"):
        await b.request("POST", fake.url, headers={}, json={}, timeout_s=1)


async def test_stop_cancels_in_flight_and_stops_loop(fake: FakeProvider) -> None:
    b = ProviderBridge(stop_timeout_s=5.0)
    errors: list[BaseException] = []
    fake.script(Reply(delay_s=10.0))

    async def caller() -> None:
        try:
            await b.request("POST", fake.url + "/slow", headers={}, json={}, timeout_s=30)
        except ProviderConnectError as exc:
            errors.append(exc)

    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as service:
            await service.start(b.run)
            outer.start_soon(caller)
            await wait_for_requests(fake, 1)
            service.cancel_scope.cancel()
    # run() returned: the loop and the session are gone, the caller got a typed error.
    assert not b.running
    assert b.statistics().in_flight == 0
    assert len(errors) == 1
    with pytest.raises(ProviderConnectError):
        await b.request("POST", fake.url, headers={}, json={}, timeout_s=1)
    # A bridge can be run again after it stopped.
    async with trio.open_nursery() as service:
        await service.start(b.run)
        r = await b.request("POST", fake.url + "/v1/embeddings", headers={},
                            json={"model": "m", "input": ["a"]}, timeout_s=5)
        assert r.status == 200
        service.cancel_scope.cancel()


async def test_thread_starts_with_the_first_request(fake: FakeProvider) -> None:
    b = ProviderBridge()
    async with trio.open_nursery() as service:
        await service.start(b.run)
        assert b.running and b._loop is None  # serving, but no thread or loop yet
        r = await b.request("POST", fake.url + "/v1/embeddings", headers={},
                            json={"model": "m", "input": ["a"]}, timeout_s=5)
        assert r.status == 200 and b._loop is not None
        service.cancel_scope.cancel()
    assert not b.running and b._loop is None


def test_daemon_without_providers_does_not_import_aiohttp() -> None:
    # A keyword-only daemon starts ~0.1 s faster without it (measured with -X importtime).
    code = ("import sys, recalld.daemon.main, recalld.daemon.app; "
            "sys.exit('aiohttp' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
