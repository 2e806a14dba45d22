"""RPC methods of the daemon itself: ping, status, workspaces, ``memory.read`` and event
subscriptions."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import trio

from recalld.daemon import remembered, safepath, sharing
from recalld.daemon.config import (
    DEFAULT_AGENT,
    DaemonConfig,
    WorkspaceSettings,
    workspace_settings_from_params,
)
from recalld.daemon.config_rules import mask_url
from recalld.daemon.config_warnings import changed_folders, secret_named
from recalld.daemon.events import (
    Event,
    EventBus,
    View,
    check_topic_pattern,
    topic_matches,
)
from recalld.daemon.memory.secret_names import MASK, mask_path, shown_to_real
from recalld.daemon.providers.errors import mask_model
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.rpc.call_progress import CallProgress, check_token
from recalld.daemon.rpc.dispatch import CallContext, JsonObject, Methods, Params
from recalld.daemon.rpc.restore_journal import unresolved_shown
from recalld.daemon.settings_diff import not_applied
from recalld.daemon.spelling import spelled
from recalld.daemon.workspaces import Workspace, check_agent_id
from recalld.ipc import disks
from recalld.ipc.answers import (
    DaemonStatus,
    Pong,
    ReadResult,
    Subscribed,
    WorkspaceClosed,
    WorkspaceInfo,
    WorkspaceOpened,
)
from recalld.ipc.errors import LOOKS_LIKE_A_CREDENTIAL, InvalidParams, UnknownWorkspace

MAX_READ_BYTES = 512 * 1024
# How long ``workspace.open`` with ``import_report`` waits for the first indexing pass.
IMPORT_REPORT_WAIT_S = 600.0
#: The longest agent name ``workspace.open`` records (``name``).
MAX_NAME_CHARS = 256

METHODS = Methods()


class WorkspaceList(TypedDict):
    workspaces: list[WorkspaceInfo]


def settings_for_wire(settings: WorkspaceSettings) -> JsonObject:
    """Workspace settings as JSON, with secrets masked."""
    raw = dataclasses.asdict(settings)
    for key in ("embedding_model_config", "chat_model_config"):
        nested = raw.get(key)
        if not isinstance(nested, dict):
            continue
        if nested.get("api_key"):
            nested["api_key"] = "***"
        if isinstance(nested.get("base_url"), str):
            nested["base_url"] = mask_url(nested["base_url"])
        if isinstance(nested.get("model_name"), str):
            nested["model_name"] = mask_model(nested["model_name"])
    if settings.remote is not None:
        raw["remote"] = settings.remote.for_wire()
    return raw


def _with_left_out(registry: WorkspaceRegistry, info: WorkspaceInfo,
                   ws: Workspace | None = None) -> WorkspaceInfo:
    """``info`` with ``secrets_left_out`` when a restore could not put back secrets of
    the workspace's overrides (model keys handed over by its agent) and its settings do
    not have them from elsewhere either (the config file), with ``left_behind`` when
    the configuration moved it from a folder that still holds files, and with
    ``waiting_for_reopen``: the settings a reload changed that it takes when opened again."""
    agent_id = str(info.get("agent_id"))
    missing = registry.left_out(agent_id)
    if missing and ws is not None:
        settings = dataclasses.asdict(ws.settings)
        missing = [k for k in missing if not remembered.has_value(settings, k)]
    if missing:
        info = {**info, "secrets_left_out": missing}
    before = registry.left_behind(agent_id) if ws is not None else None
    if before:
        info = {**info, "left_behind": before}
    waiting = registry.waiting.get(agent_id) if ws is not None else None
    return {**info, "waiting_for_reopen": waiting} if waiting else info


def workspace_info(ws: Workspace) -> WorkspaceInfo:
    return {**ws.describe(), "settings": settings_for_wire(ws.settings)}

def _masked_in(text: str) -> bool:
    # The redaction rules (some fifty patterns compiled at import) are imported here, on
    # the first new agent id, not with the daemon: a warm start's first answer does not
    # wait for them.
    from recalld.daemon.memory.redact import masked_in

    return masked_in(text)


def _secret_folder_given(config: DaemonConfig, agent_id: str, record: remembered.Remembered | None,
                         path: str | None, overrides: JsonObject | None) -> str | None:
    """The param (``path``, ``config.daily_dir``, ...) of a ``workspace.open`` that gives
    the workspace a folder named by what looks like a credential, where it gives one anew
    (not as recorded); None if none does. A ``config`` the open refuses is left to it."""
    folders: dict[str, str] = {}
    if path is not None and (record is None or record["path"] != path):
        folders["path"] = path
    if overrides is not None and (record is None or record["config"] != (overrides or None)):
        base = config.workspace_settings(agent_id)
        try:
            settings = workspace_settings_from_params(base, overrides)
        except InvalidParams:
            return None
        folders |= {f"config.{name}": folder
                    for name, folder in changed_folders(base, settings).items()}
    return secret_named(folders)


def _secret_reader_given(registry: WorkspaceRegistry, record: remembered.Remembered | None,
                         overrides: JsonObject | None) -> bool:
    """Whether a ``workspace.open``'s ``config.shared_with`` names anew (not as recorded)
    an agent by what looks like a credential that is no workspace's id."""
    if overrides is None or (record is not None and record["config"] == (overrides or None)):
        return False
    readers = overrides.get("shared_with")
    return isinstance(readers, list) and any(
        isinstance(r, str) and not registry.exists(r) and _masked_in(r) for r in readers)


@METHODS.add("daemon.ping", immediate=True, early=True)
async def ping(ctx: CallContext, params: JsonObject) -> Pong:
    Params(params).done()
    return {"pong": True, "time": time.time()}


@METHODS.add("daemon.status", immediate=True)
async def status(ctx: CallContext, params: JsonObject) -> DaemonStatus:
    Params(params).done()
    state = ctx.state
    queues: dict[str, JsonObject] = {}
    for name, provider in state.stats.items():
        queues[name] = dict(provider())
    state.registry.look_at_roots()
    answer: DaemonStatus = {
        "version": state.version,
        "pid": os.getpid(),
        "started_at": state.started_at,
        "uptime_s": round(time.monotonic() - state.started_monotonic, 3),
        "socket": str(state.config.socket_path),
        "socket_path": str(state.config.socket_path),
        "data_dir": str(state.config.data_dir),
        "config_path": str(state.config.config_path),
        "workspaces": [_with_left_out(state.registry, ws.describe(), ws)
                       for ws in state.registry.list()],
        "queues": queues,
    }
    places = [("data", state.config.data_dir), *(  # its notes' folders may be mounts apart
        (f"workspace {ws.agent_id}", ws.root / folder) for ws in state.registry.list()
        for folder in ("", ws.settings.daily_dir, ws.settings.digest_dir))]
    answer["disks"] = await trio.to_thread.run_sync(disks.measure, places)
    if state.restore_recovery is not None and await trio.to_thread.run_sync(
            unresolved_shown, state):
        answer["restore_recovery"] = state.restore_recovery
    return answer


@METHODS.add("workspace.open")
async def workspace_open(ctx: CallContext,
                         params: JsonObject) -> WorkspaceInfo | WorkspaceOpened:
    p = Params(params)
    agent_id = p.agent_id()
    path = p.text("path", None)
    overrides = p.mapping("config", None)
    report = p.boolean("import_report", False)
    name = p.text("name", None)
    progress = CallProgress(ctx.connection.notify,
                            check_token(p.text("progress_token", None)), "workspace.open")
    p.done()
    if name is not None and (not name.strip() or len(name) > MAX_NAME_CHARS
                             or not name.isprintable()):
        raise InvalidParams(f"param 'name' must be the agent's name: 1-{MAX_NAME_CHARS} "
                            "printable characters, not only spaces")
    if path is not None and ("\x00" in path or not path.strip()):
        raise InvalidParams("param 'path' must be a non-empty path without NUL")
    if not ctx.state.registry.exists(agent_id) and _masked_in(agent_id):
        # A new id names a folder and shows in every log line and status of it.
        raise InvalidParams("agent_id looks like a credential; use another id",
                            {LOOKS_LIKE_A_CREDENTIAL: "agent_id"})
    record = ctx.state.registry.remembered().get(agent_id)
    named = _secret_folder_given(ctx.state.config, agent_id, record, path, overrides)
    if named is not None:
        # A folder so named shows in the settings, status, the watcher's roots and logs.
        raise InvalidParams(f"param {named!r} names a folder by what looks like a "
                            "credential; use another folder", {LOOKS_LIKE_A_CREDENTIAL: named})
    if _secret_reader_given(ctx.state.registry, record, overrides):
        # An id shared with is recorded in the settings and shows in workspace.list,
        # status and the log; no agent can open a workspace by it.
        raise InvalidParams("param 'config.shared_with' names an agent by what looks like a "
                            "credential; use another id",
                            {LOOKS_LIKE_A_CREDENTIAL: "config.shared_with"})
    recorded = record.get("name") if record is not None else None
    if name is not None and name != recorded and _masked_in(name):
        # A name claimed is recorded with the workspace and shows in workspace.list; one
        # recorded already is the owner's, kept as it was claimed.
        raise InvalidParams("param 'name' looks like a credential; use another name",
                            {LOOKS_LIKE_A_CREDENTIAL: "name"})
    async with progress.pumping():
        progress.phase("opening")
        ws = await ctx.state.registry.open(
            agent_id, Path(path) if path is not None else None, overrides, name=name)
        if report:
            index = ws.services.index

            shown: tuple[str, int, int | None] = ("listing notes", 0, None)

            def indexed() -> tuple[str, int, int | None]:
                # How many notes there are is unknown until the disk is listed; then it
                # is the indexed ones and those still to come: new notes of the passes
                # under way and changes not handed to a pass yet. While a batch is being
                # applied the two do not add up yet: what was read before is shown.
                nonlocal shown
                status = index.status()
                watcher = status["watcher"]
                if watcher["listed"] is not None or watcher["rescan_owed"] is not None:
                    shown = ("listing notes", watcher["listed"] or 0, None)
                elif not status["applying"]:
                    files = status["files"]
                    shown = ("indexing", files,
                             files + status["adding"] + status["pending_changes"])
                return shown

            progress.phase("indexing", sample=indexed)
            # What was found and reused of a QwenPaw workspace, once indexed (the
            # importer's module is loaded only for such a call).
            from recalld.daemon.qwenpaw_import import import_report

            try:
                found = await import_report(ws, overrides, timeout_s=IMPORT_REPORT_WAIT_S)
            except UnknownWorkspace:
                if ws.state != "failed":
                    raise
                # It failed while its first pass ran: the answer says so, and why.
                return _opened_info(ctx, ws, overrides)
            return {**_opened_info(ctx, ws, overrides), "import": {**found}}
    return _opened_info(ctx, ws, overrides)


def _opened_info(ctx: CallContext, ws: Workspace,
                 given: JsonObject | None) -> WorkspaceInfo:
    """``workspace.open``'s answer: with ``not_applied``, the given settings a workspace
    that was open already does not use (it takes them when opened again)."""
    info = workspace_info(ws)
    if given is not None:
        missed = not_applied(ctx.state.config.workspace_settings(ws.agent_id), given,
                             ws.settings)
        if missed:
            info["not_applied"] = missed
    return info


@METHODS.add("workspace.list", immediate=True)
async def workspace_list(ctx: CallContext, params: JsonObject) -> WorkspaceList:
    Params(params).done()
    registry = ctx.state.registry
    known = registry.remembered()
    configured = set(ctx.state.config.configured_agents())
    listed: list[WorkspaceInfo] = []
    for ws in registry.list():
        info: WorkspaceInfo = {**workspace_info(ws), "registered": ws.agent_id in known,
                               "configured": ws.agent_id in configured}
        if ws.agent_id in known:
            info["registered_at"] = known[ws.agent_id]["registered_at"]
            if "name" in known[ws.agent_id]:
                info["name"] = known[ws.agent_id]["name"]
        listed.append(_with_left_out(registry, info, ws))
    open_now = {ws.agent_id for ws in registry.list()}
    held = registry.held_now()
    # Recorded or configured, not served now (closed, or dropped after a refusal): each
    # opens again at the next start, a configured one also at a reload, where home() says.
    for agent_id in sorted((set(known) | configured) - open_now):
        closed: WorkspaceInfo = {"agent_id": agent_id, "path": str(registry.home(agent_id)),
                                 "state": "closed", "registered": agent_id in known,
                                 "configured": agent_id in configured}
        if agent_id in held:  # a restore replacing its files, a backup reading them
            closed["why"] = held[agent_id]
        rec = known.get(agent_id)
        if rec is not None:
            closed["registered_at"] = rec["registered_at"]
            if "name" in rec:
                closed["name"] = rec["name"]
        listed.append(closed)
    return {"workspaces": listed}


@METHODS.add("workspace.close")
async def workspace_close(ctx: CallContext, params: JsonObject) -> WorkspaceClosed:
    p = Params(params)
    agent_id = p.agent_id()
    forget = p.boolean("forget", False)
    p.done()
    closed = await ctx.state.registry.close(agent_id, forget=forget)
    if forget:  # a workspace opened later under its id dreams from then, as a new one
        await ctx.state.services.scheduler.forget(agent_id)
    # A workspace the configuration names opens at every start and reload, forgotten or not.
    configured = agent_id in ctx.state.config.configured_agents()
    return {"agent_id": agent_id, "closed": closed, "forgotten": forget,
            "configured": configured}


@METHODS.add("memory.read")
async def memory_read(ctx: CallContext, params: JsonObject) -> ReadResult:
    p = Params(params)
    agent_id = p.agent_id()
    path = p.text("path")
    start_line = p.integer("start_line", 1, minimum=1)
    end_line = p.integer("end_line", None, minimum=1)
    # Who asks, when it is not the workspace's owner (see recalld.daemon.sharing).
    as_agent = check_agent_id(p.text("as_agent", agent_id))
    # The owner's agent asks for what goes on to a model: masked as search serves it.
    masked = p.boolean("masked", False)
    p.done()
    if end_line is not None and end_line < start_line:
        raise InvalidParams("end_line must not be smaller than start_line")
    parts = safepath.split_file(path)  # refuse bad names before touching anything
    ws = sharing.readable(ctx.state.registry, as_agent, agent_id)
    by_shown = MASK in path  # a note named by a credential, read by the name shown for it
    if by_shown:
        try:
            path = await trio.to_thread.run_sync(shown_to_real, ws.root, "/".join(parts))
        except ValueError as exc:
            raise InvalidParams(str(exc)) from None
    # A name typed composed reads the file written decomposed, or the other way round.
    path = await spelled(ws.root, path)
    parts = safepath.split_relative(path)
    sharing.check_shared_path(as_agent, ws, parts)
    got = await trio.to_thread.run_sync(
        lambda: safepath.read_lines(
            ws.root, path, start_line=start_line, end_line=end_line, max_bytes=MAX_READ_BYTES
        )
    )
    text = got.text
    hide = masked or as_agent != agent_id
    if hide:  # a note typed by hand: masked as search has it
        from recalld.daemon.memory.redact import redact_async

        text = await redact_async(text, keep_lines=True, limiter=ctx.state.services.cpu)
    # What goes on to a model names the note as search and memory.list do, however it
    # was asked for; a note asked for by its shown name is named so again.
    path = "/".join(parts)
    return {
        "agent_id": agent_id,
        "path": mask_path(path) if hide or by_shown else path,
        "start_line": got.start_line,
        "end_line": got.end_line,
        "total_lines": got.total_lines,
        "text": text,
        "truncated": got.truncated,
    }


@METHODS.add("events.subscribe")
async def events_subscribe(ctx: CallContext, params: JsonObject) -> Subscribed:
    p = Params(params)
    topics = p.strings("topics")
    caller = check_agent_id(p.text("agent_id", DEFAULT_AGENT))
    after = p.mapping("after", None)
    p.done()
    registry = ctx.state.registry
    bus = ctx.state.events

    def view(topic: str, payload: Mapping[str, object]) -> Mapping[str, object] | None:
        return sharing.event_view(registry, caller, topic, payload)

    if not topics:
        raise InvalidParams("param 'topics' must not be empty")
    try:
        checked = [check_topic_pattern(t) for t in topics]
    except ValueError as exc:
        raise InvalidParams(str(exc)) from None
    if any(_masked_in(t) for t in checked if any(c.isdigit() or c.isupper() for c in t)):
        # A pattern is sent back as given (the answer's ``subscribed``, each
        # ``events.dropped``) and no topic is named so: a key pasted as one. The topics'
        # names (lower-case letters) do not load the redaction rules.
        raise InvalidParams("param 'topics' holds what looks like a credential; name "
                            "topics such as 'job.*'", {LOOKS_LIKE_A_CREDENTIAL: "topics"})
    answer: Subscribed = {"subscribed": [], "stream": bus.stream, "seq": bus.seq}
    if after is not None:
        # Counted and subscribed with no checkpoint between: every event is either
        # counted here or sent on the subscription.
        answer["missed"] = _missed_since(bus, after, ctx.connection.live_patterns(),
                                         checked, view)
    answer["subscribed"] = ctx.connection.subscribe(bus, checked, owner=caller, view=view)
    return answer


def _missed_since(bus: EventBus, after: JsonObject, live: set[str],
                  patterns: list[str], view: View) -> int | None:
    """How many events since ``after`` (``{stream, seq}``) a subscription to ``patterns``
    as ``view`` shows them would have had that the connection's (to ``live``) sent not."""
    p = Params(after)
    try:
        stream = p.text("stream")
        seq = p.integer("seq", minimum=0)
        p.done()
    except InvalidParams as exc:  # named within it
        raise InvalidParams(f"param 'after': {exc.message}") from None
    wanted = set(patterns) | live

    def counted(event: Event) -> bool:
        return (any(topic_matches(x, event.topic) for x in wanted)
                and not any(topic_matches(x, event.topic) for x in live)
                and view(event.topic, event.payload) is not None)

    try:
        return bus.count_since(stream, seq, counted)
    except ValueError as exc:
        raise InvalidParams(f"param 'after': {exc}") from None
