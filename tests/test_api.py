"""The method registry, params checks, workspace registry and the issue-2 methods."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from recalld.daemon.config import DaemonConfig
from recalld.daemon.events import DROPPED_TOPIC, EventBus, check_topic_pattern
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.rpc.daemon_methods import METHODS as CORE
from recalld.daemon.rpc.dispatch import CallContext, DaemonState, Methods, Params
from recalld.daemon.rpc.methods import build_methods
from recalld.daemon.services import build_daemon_services
from recalld.daemon.workspaces import Workspace
from recalld.ipc import errors
from recalld.ipc.protocol import Request

if TYPE_CHECKING:
    from conftest import DaemonFactory, DaemonHandle


# --------------------------------------------------------------------------- Params


def test_params_checks_types_and_unknown_fields() -> None:
    p = Params({"agent_id": "a", "n": 3, "flag": True, "topics": ["x"], "extra": 1})
    assert p.agent_id() == "a"
    assert p.integer("n", minimum=1) == 3
    assert p.boolean("flag") is True
    assert p.strings("topics") == ["x"]
    assert p.text("missing", None) is None
    with pytest.raises(errors.InvalidParams, match=r"unknown param.*extra"):
        p.done()
    with pytest.raises(errors.InvalidParams, match="'n' must be a string"):
        Params({"n": 3}).text("n")
    with pytest.raises(errors.InvalidParams, match="'b' must be an integer"):
        Params({"b": True}).integer("b")  # a bool is not an int on the wire
    with pytest.raises(errors.InvalidParams, match="at least 1"):
        Params({"n": 0}).integer("n", minimum=1)
    with pytest.raises(errors.InvalidParams, match="missing required param 'q'"):
        Params({}).text("q")
    for bad in ("", ".", "..", "a/b", "x" * 65, "sp ace"):
        with pytest.raises(errors.InvalidParams, match="agent_id"):
            Params({"agent_id": bad}).agent_id()


# -------------------------------------------------------------------------- Methods


def _state(tmp_path: Path, methods: Methods) -> DaemonState:
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "data",
                       config_path=tmp_path / "c.toml")
    return DaemonState(services=build_daemon_services(cfg), methods=methods)


class NoPeer:
    connection_id = 1
    peer_pid = None

    def subscribe(self, bus: EventBus, patterns: list[str]) -> list[str]:
        raise AssertionError("not used")


async def test_methods_registry_extends_without_editing_api(tmp_path: Path) -> None:
    extra = Methods()

    @extra.add("demo.echo", positional=["text"])
    async def echo(ctx: CallContext, params: dict[str, Any]) -> Any:
        p = Params(params)
        text = p.text("text")
        p.done()
        return {"echo": text, "method": ctx.request.method}

    methods = build_methods([extra])
    assert "demo.echo" in methods and "daemon.ping" in methods
    state = _state(tmp_path, methods)

    async def call(method: str, params: Any) -> Any:
        ctx = CallContext(state, NoPeer(), Request(method=method, params=params, id=1))
        return await methods.dispatch(ctx)

    assert await call("demo.echo", {"text": "hi"}) == {"echo": "hi", "method": "demo.echo"}
    assert (await call("demo.echo", ["by position"]))["echo"] == "by position"
    with pytest.raises(errors.InvalidParams, match="at most 1"):
        await call("demo.echo", ["a", "b"])
    with pytest.raises(errors.InvalidParams, match="named params"):
        await call("daemon.ping", [])
    with pytest.raises(errors.MethodNotFound):
        await call("demo.nope", {})
    with pytest.raises(ValueError, match="already registered"):
        methods.include(CORE)


# ------------------------------------------------------------- workspace services


async def test_workspace_services_start_report_and_stop(tmp_path: Path) -> None:
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "data",
                       config_path=tmp_path / "c.toml")
    bus = EventBus()
    events: list[str] = []

    async def indexer(ws: Workspace, *, task_status: trio.TaskStatus[None]) -> None:
        docs = {"docs": 0}
        ws.add_status("index", lambda: dict(docs))
        events.append(f"start {ws.agent_id}")
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            events.append(f"stop {ws.agent_id}")

    async def start(ws: Workspace, nursery: trio.Nursery) -> None:
        await nursery.start(indexer, ws)

    registry = WorkspaceRegistry(lambda: cfg, bus, start)
    sub = bus.subscribe(["workspace.*"])
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        ws = await registry.open("alpha")
        assert ws.state == "ready"
        assert ws.root == (tmp_path / "data" / "workspaces" / "alpha").resolve()
        assert all(d.is_dir() for d in ws.directories())
        assert ws.describe()["index"] == {"docs": 0}
        assert await registry.open("alpha") is ws  # idempotent
        assert await registry.open("alpha", None, {"daily_dir": "memory"}) is ws
        # Served unchanged, yet a setting that would be refused at a first open is refused.
        for bad in ({"daily_dri": "memory"}, {"daily_dir": 5}):
            with pytest.raises(errors.InvalidParams, match="workspace config"):
                await registry.open("alpha", None, bad)
        assert registry.get("alpha") is ws
        with pytest.raises(errors.InvalidParams, match="already open at"):
            await registry.open("alpha", tmp_path / "other")
        with pytest.raises(errors.InvalidParams, match="already open for agent 'alpha'"):
            await registry.open("beta", ws.root)
        await registry.close("alpha")
        assert ws.state == "closed"
        with pytest.raises(errors.UnknownWorkspace):
            registry.get("alpha")
        with pytest.raises(errors.UnknownWorkspace):
            await registry.close("alpha")
        await registry.open("gamma")
        nursery.cancel_scope.cancel()
    assert events == ["start alpha", "stop alpha", "start gamma", "stop gamma"]
    topics = [sub.receive.receive_nowait().topic for _ in range(3)]
    assert topics == ["workspace.opened", "workspace.closed", "workspace.opened"]


async def test_failing_services_mark_the_workspace_failed(tmp_path: Path) -> None:
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "data",
                       config_path=tmp_path / "c.toml")
    crash_now = trio.Event()

    async def fragile(ws: Workspace, *, task_status: trio.TaskStatus[None]) -> None:
        if ws.agent_id == "bad":
            raise RuntimeError("cannot load index")
        task_status.started()
        await crash_now.wait()
        raise RuntimeError("lost the disk")

    async def start(ws: Workspace, nursery: trio.Nursery) -> None:
        await nursery.start(fragile, ws)

    registry = WorkspaceRegistry(lambda: cfg, EventBus(), start)
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        with pytest.raises(errors.RecalldError, match=r"failed to open.*cannot load index"):
            await registry.open("bad")
        assert [w.state for w in registry.list()] == ["failed"]
        good = await registry.open("good")
        crash_now.set()
        await good.wait_closed()
        assert good.state == "failed" and "lost the disk" in (good.error or "")
        assert registry.list()[1].describe()["error"].startswith("RuntimeError")
        # The registry still works after both failures.
        crash_now = trio.Event()
        again = await registry.open("good")
        assert again.state == "ready" and again is not good
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- events


def test_event_bus_drops_a_slow_subscriber_without_blocking() -> None:
    bus = EventBus()
    slow = bus.subscribe(["job.*"], max_queued=2)
    fast = bus.subscribe(["*"], max_queued=100)
    other = bus.subscribe(["inbox.new"])
    for i in range(5):
        bus.publish("job.progress", {"i": i})  # never blocks, never raises
    assert slow.dropped and slow.closed
    assert [slow.receive.receive_nowait().payload["i"] for _ in range(2)] == [0, 1]
    with pytest.raises(trio.EndOfChannel):
        slow.receive.receive_nowait()
    assert fast.delivered == 5 and other.delivered == 0
    stats = bus.statistics()
    assert stats.subscriptions == 2 and stats.dropped_subscriptions_total == 1
    assert stats.published_total == 5
    for bad in ("", "a..b", "*a", "a.*.b", "a b"):
        with pytest.raises(ValueError):
            check_topic_pattern(bad)
    assert DROPPED_TOPIC == "events.dropped"


def test_a_topic_pattern_too_long_is_refused_without_being_echoed(daemon: DaemonHandle) -> None:
    # The whole pattern came back in the error, up to the frame limit, and the message
    # did not say what was wrong with a pattern that was merely long.
    with daemon.connect() as conn:
        for size in (201, 500_000):
            with pytest.raises(errors.InvalidParams) as refused:
                conn.call("events.subscribe", {"topics": ["job.progress", "a" * size]})
            assert f"is {size} characters long; at most 200" in refused.value.message
            assert len(refused.value.message) < 200
        # A pattern refused said only that it was ("invalid topic pattern: 'j*b'"): the
        # message says what a pattern is, for every shape refused.
        for bad in ("a..b", "j*b", "*job", "job. *", "jöb.*"):
            with pytest.raises(errors.InvalidParams) as refused:
                conn.call("events.subscribe", {"topics": [bad]})
            assert refused.value.message == (
                f"invalid topic pattern: {bad!r}: a topic is words of A-Z a-z 0-9 _ - joined "
                "by single dots (job.state); a pattern is a topic, or the start of one "
                "ending in * (job.*, or * for all)")
        assert conn.call("events.subscribe", {"topics": ["a" * 200]})["subscribed"] == [
            "a" * 200]


def test_error_messages_do_not_send_a_long_input_back_whole(daemon: DaemonHandle) -> None:
    # "method not found: <the whole name>", "unknown param(s): <every name>", a refused
    # path twice in one message: up to several times the request came back as the error.
    long = "x" * 300_000
    with daemon.connect() as conn:
        for method, params, begins, ends in [
            (long, {}, "method not found: xxx", "xxx"),
            ("daemon.ping", {long: 1}, "unknown param(s): xxx", "xxx"),
            ("jobs.submit", {"agent_id": "default", "kind": long}, "unknown job kind 'xxx",
             "auto_resource, reindex)"),
        ]:
            with pytest.raises(errors.RecalldError) as refused:
                conn.call(method, params)
            message = refused.value.message
            assert len(message) < 2200, len(message)
            assert message.startswith(begins) and message.endswith(ends), message[-100:]
            assert "characters cut]" in message
        with pytest.raises(errors.InvalidParams, match=r"^unknown param\(s\): y{500}$"):
            conn.call("daemon.ping", {"y" * 500: 1})  # a message of a usual size: whole


def test_error_data_does_not_send_a_long_input_back_whole(daemon: DaemonHandle,
                                                          tmp_path: Path) -> None:
    # backup.verify's data names the file refused and why: the path as the client gave it,
    # twice, came back whole however long, where the message beside it was cut.
    for name in ("n" * 300_000, "d/" * 40_000 + "x.zip"):
        with pytest.raises(errors.InvalidBackup) as refused:
            daemon.call("backup.verify", {"file": str(tmp_path / name)})
        data = refused.value.data
        assert isinstance(data, dict) and set(data) == {"file", "reason"}
        assert len(data["file"]) < 2200 and "characters cut]" in data["file"]
        assert len(data["reason"]) < 2200, len(data["reason"])  # "no such file"
        assert data["file"].startswith(str(tmp_path / name)[:1000])
        assert data["file"].endswith(name[-1000:])
    short = tmp_path / "absent.zip"
    with pytest.raises(errors.InvalidBackup) as refused:
        daemon.call("backup.verify", {"file": str(short)})
    assert refused.value.data["file"] == str(short)  # a usual size: whole


def test_events_reach_subscribers_over_the_socket(daemon: DaemonHandle, tmp_path: Path) -> None:
    with daemon.connect() as listener:
        got = listener.call("events.subscribe", {"topics": ["workspace.*", "job.done"],
                                                 "agent_id": "evt"})
        assert got["subscribed"] == ["job.done", "workspace.*"]
        # Another agent's isolated workspace: its events do not reach this subscriber.
        daemon.call("workspace.open", {"agent_id": "other", "path": str(tmp_path / "other")})
        daemon.call("workspace.open", {"agent_id": "evt", "path": str(tmp_path / "evt")})
        event = listener.recv()
        # Its place in the stream: after the subscription's start, past the event not sent.
        assert event["params"].pop("stream") == got["stream"]
        assert event["params"].pop("seq") > got["seq"] + 1
        assert event == {"jsonrpc": "2.0", "method": "event", "params": {
            "topic": "workspace.opened", "agent_id": "evt", "path": str(tmp_path / "evt")}}
        with pytest.raises(errors.InvalidParams):
            listener.call("events.subscribe", {"topics": ["bad topic"], "agent_id": "evt"})
        with pytest.raises(errors.InvalidParams, match="on another connection"):
            listener.call("events.subscribe", {"topics": ["job.*"], "agent_id": "other"})
        for bad in ({"topics": ["job.*"], "agent_id": "../x"},
                    {"topics": ["job.*"], "agent": "evt"}):
            with pytest.raises(errors.InvalidParams):
                daemon.call("events.subscribe", bad)


# -------------------------------------------------------------- methods over the wire


def test_workspace_methods(daemon: DaemonHandle, tmp_path: Path) -> None:
    target = tmp_path / "qwenpaw"
    info = daemon.call("workspace.open", {"agent_id": "qp", "path": str(target),
                                          "config": {"daily_dir": "daily"}})
    assert info["agent_id"] == "qp" and info["state"] == "ready"
    assert info["path"] == str(target.resolve())
    assert info["settings"]["daily_dir"] == "daily"
    for sub in ("daily", "digest", "mem_session", "resource", "mem_metadata"):
        assert (target / sub).is_dir()
    again = daemon.call("workspace.open", {"agent_id": "qp", "path": str(target)})
    assert again["opened_at"] == info["opened_at"]
    with pytest.raises(errors.InvalidParams, match="already open"):
        daemon.call("workspace.open", {"agent_id": "qp", "path": str(tmp_path / "x")})
    with pytest.raises(errors.InvalidParams, match="unknown field"):
        daemon.call("workspace.open", {"agent_id": "y", "config": {"no_such": 1}})
    with pytest.raises(errors.InvalidParams, match="absolute"):
        daemon.call("workspace.open", {"agent_id": "y", "path": "relative/dir"})
    with pytest.raises(errors.InvalidParams, match="agent_id"):
        daemon.call("workspace.open", {"agent_id": "../evil"})
    names = [w["agent_id"] for w in daemon.call("workspace.list")["workspaces"]]
    assert names == ["default", "qp"]
    assert daemon.call("workspace.close", {"agent_id": "qp"}) == {
        "agent_id": "qp", "closed": True, "forgotten": False, "configured": False}
    assert target.is_dir()  # closing keeps the files
    with pytest.raises(errors.UnknownWorkspace):
        daemon.call("workspace.close", {"agent_id": "qp"})
    status = daemon.call("daemon.status")
    assert [w["agent_id"] for w in status["workspaces"]] == ["default"]
    assert status["pid"] == daemon.pid and status["version"]
    assert status["uptime_s"] >= 0 and status["socket"] == str(daemon.socket_path)
    assert status["data_dir"] == str(daemon.data_dir)
    assert {"server", "events"} <= set(status["queues"])


def test_one_daemon_per_workspace_directory(daemon_factory: DaemonFactory,
                                            tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    first = daemon_factory(f'[workspaces.a]\npath = "{shared}"\n')
    assert first.call("workspace.open", {"agent_id": "a"})["state"] == "ready"
    # Another daemon (its own data dir) would write the same derived state.
    second = daemon_factory()
    with pytest.raises(errors.AlreadyRunning, match=f"pid {first.pid}"):
        second.call("workspace.open", {"agent_id": "a", "path": str(shared)})
    assert second.call("daemon.ping")  # the refusal leaves the daemon serving
    first.call("workspace.close", {"agent_id": "a"})
    assert second.call("workspace.open", {"agent_id": "a", "path": str(shared)})[
        "state"] == "ready"


def test_memory_read_is_confined(daemon: DaemonHandle, tmp_path: Path) -> None:
    root = Path(daemon.call("workspace.list")["workspaces"][0]["path"])
    (root / "memory" / "2026-07-23").mkdir(parents=True)
    (root / "memory" / "2026-07-23" / "commute.md").write_text("a\nb\nc\nd\n")
    (tmp_path / "secret.md").write_text("SECRET\n")
    (root / "memory" / "escape.md").symlink_to(tmp_path / "secret.md")
    got = daemon.call("memory.read", {"agent_id": "default",
                                      "path": "memory/2026-07-23/commute.md",
                                      "start_line": 2, "end_line": 3})
    assert got == {"agent_id": "default", "path": "memory/2026-07-23/commute.md",
                   "start_line": 2, "end_line": 3, "total_lines": 4, "text": "b\nc\n",
                   "truncated": False}
    before = sorted(os.listdir(tmp_path))
    for bad in ("../secret.md", str(tmp_path / "secret.md"), "memory/escape.md",
                "memory/\x00x", "memory/../../secret.md"):
        with pytest.raises(errors.PathOutsideWorkspace) as caught:
            daemon.call("memory.read", {"agent_id": "default", "path": bad})
        assert caught.value.code == errors.PATH_OUTSIDE_WORKSPACE
        assert "SECRET" not in caught.value.message
    assert sorted(os.listdir(tmp_path)) == before
    with pytest.raises(errors.NotFound):
        daemon.call("memory.read", {"agent_id": "default", "path": "memory/none.md"})
    with pytest.raises(errors.InvalidParams, match="not a regular file"):  # as documented
        daemon.call("memory.read", {"agent_id": "default", "path": "memory/2026-07-23"})
    with pytest.raises(errors.UnknownWorkspace):
        daemon.call("memory.read", {"agent_id": "ghost", "path": "memory/x.md"})
    with pytest.raises(errors.InvalidParams, match="end_line"):
        daemon.call("memory.read", {"agent_id": "default", "path": "a.md",
                                    "start_line": 3, "end_line": 2})


def test_a_file_path_ending_in_a_slash_and_a_prefix_of_slashes_are_refused_as_documented(
        daemon: DaemonHandle) -> None:
    # "commute.md/" was read as commute.md (the system refuses it: not a folder); a
    # memory.list prefix "/" was "names the workspace root" (-32602), not absolute (-32005).
    root = Path(daemon.call("workspace.list")["workspaces"][0]["path"])
    (root / "memory" / "2026-07-23").mkdir(parents=True)
    (root / "memory" / "2026-07-23" / "commute.md").write_text("a\n")
    for bad in ("memory/2026-07-23/commute.md/", "memory/2026-07-23/commute.md//",
                "memory/2026-07-23/commute.md/.", "memory/2026-07-23/"):
        with pytest.raises(errors.InvalidParams) as caught:
            daemon.call("memory.read", {"agent_id": "default", "path": bad})
        assert caught.value.code == errors.INVALID_PARAMS
        assert "so it names a folder, not a file: " + bad in caught.value.message
    for prefix in ("/", "//", "/memory/"):
        with pytest.raises(errors.PathOutsideWorkspace, match="must be relative"):
            daemon.call("memory.list", {"agent_id": "default", "prefix": prefix})
    every = daemon.call("memory.list", {"agent_id": "default"})["files"]
    assert [f["path"] for f in every] == ["memory/2026-07-23/commute.md"]
    for whole in (".", "./", "./.", ".//"):
        assert daemon.call("memory.list", {"agent_id": "default",
                                           "prefix": whole})["files"] == every


def test_configured_workspaces_open_at_start(daemon_factory: DaemonFactory,
                                             tmp_path: Path) -> None:
    d = daemon_factory(f'[workspaces.writer]\npath = "{tmp_path / "w"}"\ndaily_dir = "days"\n')
    listed = {w["agent_id"]: w for w in d.call("workspace.list")["workspaces"]}
    assert set(listed) == {"default", "writer"}
    assert listed["writer"]["settings"]["daily_dir"] == "days"
    assert (tmp_path / "w" / "days").is_dir()
