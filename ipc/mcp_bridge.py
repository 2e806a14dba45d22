"""The MCP server behind ``recalld mcp`` (:mod:`recalld.ipc.mcp`, which parses the
command line before this module imports the MCP SDK): on stdio, forwarding to the daemon.

Install with ``pip install 'recalld[mcp]'``. An MCP client (an IDE, a desktop assistant,
an agent framework) launches ``recalld mcp --agent coder`` (or
``python -m recalld.ipc.mcp --agent coder``) and gets:

- tools ``memory_search`` (query, limit, optional other ``agents``), ``memory_recall``
  (the recall block of ``memory.recall``: hits, linked context, optionally the memory
  index, within a size budget), ``memory_read``
  (a file or a line range, optionally of another agent's workspace), ``memory_add_turns``
  (conversation turns for the daemon's auto_memory, in any shape ``memory.add_turns``
  takes) and ``memory_add_note`` (one fact);
- the prompt ``recall`` (arguments ``query``, ``budget_chars``, ``include_index``,
  ``include_interests``): the recall block as a user message to put before the reply;
- the agent's Markdown files as resources ``recalld://<agent>/<path>``.

Every line the client writes is checked first (:mod:`recalld.ipc.mcp_lines`): one that
is not a single JSON-RPC message (not JSON, a batch, a request of the wrong shape) gets an
error answer, with the request's id when it can be read, and the bridge reads on; so
does a line longer than the 16 MiB the bridge holds of one. At the end of stdin the
requests read before it are served and answered (for at most a minute) before the
bridge stops, so ``printf '...' | recalld mcp`` gets every answer. SIGTERM, SIGINT and
SIGHUP end the input as its end does (:mod:`recalld.ipc.mcp_stdin`).

The tools and the prompt are defined in :mod:`recalld.ipc.mcp_tools`. Tool arguments are
checked against the tool's input schema first: arguments of the wrong
shape get an error result naming the argument and what it must be, and nothing reaches
the daemon. No refusal of the bridge's own quotes what the client sent (a tool or prompt
name, an argument, a URI): a key pasted into the wrong place would come back unmasked.

The bridge holds no index and no state besides one daemon connection: any number of
bridges (one per MCP client) share the one daemon, and a daemon restart is bridged by
the client's reconnect. Reads of other workspaces go out as this agent (``as_agent``),
so the daemon's sharing rules apply. The server stops when stdin closes (or at a stop
signal); on the way out every session given turns without a final ``flush`` is ended
(its turns go to auto_memory now, ``end_session``), then the daemon connection is closed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast
from urllib.parse import quote, unquote, urlsplit

import anyio
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from recalld.ipc import __version__, errors
from recalld.ipc._reopen import on_workspace
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import note_session_key, owner_name, session_key
from recalld.ipc.answers import JsonObject, Recall
from recalld.ipc.known_ids import KnownIds, provisional_id
from recalld.ipc.mcp_lines import AnsweringStream, CheckedLines, bounded_lines
from recalld.ipc.mcp_stdin import StdinReader
from recalld.ipc.mcp_tools import (
    RECALL_PROMPT,
    RECALL_WRAP,
    TOOL_NAMES,
    TOOLS,
    argument_error,
    prompt_count,
    prompt_flag,
    whole_numbers,
)
from recalld.ipc.mcp_wire import StdoutWire, claimed_stdout
from recalld.ipc.recall_tags import inert_recall_tags
from recalld.ipc.request_parts import add_turns_in_parts, in_note_parts, search_query
from recalld.ipc.types import render_linked, render_skipped

SCHEME = "recalld"
DEFAULT_AGENT = "default"
MAX_RESOURCES = 5000
#: A resource is read whole, in as many ``memory.read`` ranges as it takes, up to this size.
MAX_RESOURCE_CHARS = 16 << 20
#: Sessions the bridge remembers to end at shutdown.
MAX_SESSIONS = 10_000
#: Answers to unreadable lines waiting for stdout (the reader waits beyond).
MAX_LINE_ANSWERS = 16
_DAEMON_ERRORS = (errors.RecalldError, OSError, TimeoutError)
# What the bridge says of a client's request never quotes what the client sent (a key
# pasted into a tool name or an argument would come back, and into the client's log,
# unmasked): it says what was expected instead. The daemon's own errors come masked.
_UNKNOWN_TOOL = f"unknown tool: the tools are {', '.join(sorted(TOOL_NAMES))}"

def resource_uri(agent: str, path: str) -> str:
    return f"{SCHEME}://{agent}/{quote(path)}"


def parse_uri(uri: str) -> tuple[str, str]:
    """``recalld://<agent>/<path>`` to (agent, path); ValueError otherwise."""
    parts = urlsplit(uri)
    path = unquote(parts.path).lstrip("/")
    if parts.scheme != SCHEME or not parts.netloc or not path:
        raise ValueError(f"not a recalld resource: a resource is {SCHEME}://<agent>/<path>")
    return parts.netloc, path


def _text(text: str, *, error: bool = False,
          structured: Mapping[str, object] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=error,
                                structured_content=None if structured is None
                                else dict(structured))


def _recall_block(answer: Recall) -> str:
    """The recall block, or why there is none: nothing was found, or nothing found fits
    in the budget (a model told "nothing found" would not ask again with a larger one)."""
    if answer.get("rendered"):
        return str(answer["rendered"])
    if answer.get("truncated"):
        return f"(memories found; none fits in budget_chars={answer.get('budget_chars')})"
    return "(no relevant memories found)"


class Bridge:
    """The MCP handlers of one bridge process: agent ``agent`` over ``client``."""

    def __init__(self, client: AsyncClient, agent: str, name: str | None = None) -> None:
        self.client = client
        self.agent = agent
        #: The name ``agent`` was made of, given to the daemon with each open.
        self.name = name
        self._ids = KnownIds(client)
        self._opened = False
        #: Sessions given turns since their last flush, ended when the stream ends.
        self._unflushed: dict[str, None] = {}

    async def _open(self, again: bool = False) -> None:
        if again or not self._opened:
            if self.name is not None:  # an id some names had before is kept if in use
                self.agent = await self._ids.id_of(self.name)
            await self.client.workspace_open(
                self.agent, name=owner_name(self.name) if self.name is not None else None)
            self._opened = True

    # ------------------------------------------------------------------- tools

    async def call_tool(self, name: str, args: JsonObject) -> types.CallToolResult:
        if name not in TOOL_NAMES:
            return _text(_UNKNOWN_TOOL, error=True)
        problem = argument_error(name, args)
        if problem is not None:
            return _text(f"bad arguments for {name}: {problem}", error=True)
        args = whole_numbers(name, args)
        try:
            return await on_workspace(self._open, lambda: self._tool(name, args))
        except _DAEMON_ERRORS as exc:
            code = f" (code {exc.code})" if isinstance(exc, errors.RecalldError) else ""
            return _text(f"{exc}{code}", error=True)
        except (TypeError, ValueError) as exc:  # arguments of the wrong shape
            # Python's words quote the value ("invalid literal for int(): 'ghp_...'").
            return _text(f"bad arguments for {name}: {type(exc).__name__}", error=True)

    async def _tool(self, name: str, args: JsonObject) -> types.CallToolResult:
        if name == "memory_search":
            return await self._search(args)
        if name == "memory_recall":
            return await self._recall(args)
        if name == "memory_read":
            return await self._read(args)
        if name == "memory_add_turns":
            # A host's conversation id the daemon would refuse ("chat 42/b", "会话-1")
            # is mapped as the AgentScope middleware maps it.
            session = session_key(str(args.get("session_id", "")))
            flush = bool(args.get("flush", False))
            # In as many requests as the daemon's limits take (bytes, messages).
            answer = await add_turns_in_parts(
                self.client, self.agent, session, list(args.get("messages", [])),
                str(args["request_id"]) if "request_id" in args else None, flush=flush)
            if flush:
                self._unflushed.pop(session, None)
            elif len(self._unflushed) < MAX_SESSIONS:  # beyond: the idle flush
                self._unflushed[session] = None
            return _text(json.dumps(answer), structured=answer)
        if name == "memory_add_note":
            owner = note_session_key(args.get("session_id"))
            # Content longer than one call takes goes in parts, as the middlewares send it.
            note = await in_note_parts(
                str(args.get("content", "")), self.client.request_limit,
                lambda part, part_id: self.client.add_note(
                    self.agent, part, session_id=owner, request_id=part_id))
            return _text(f"recorded in {', '.join(note['paths'])}", structured=note)
        return _text(_UNKNOWN_TOOL, error=True)

    async def _search(self, args: JsonObject) -> types.CallToolResult:
        if not str(args.get("query", "")).strip():  # as memory_recall and `recalld search`
            return _text("the query is empty (no text)", error=True)
        agents = args.get("agents")
        # A query of any size (a pasted log): its start and end, as one request takes.
        query = search_query(str(args.get("query", "")), self.client.request_limit)
        response = await self.client.search(
            self.agent, query, max_results=int(args.get("limit") or 5),
            agents=[await self._ids.id_of(str(a)) for a in agents] if agents else None)
        hits = [r.to_dict() for r in response]
        # Workspaces of agents not open were passed by: said, not taken for empty.
        skipped = response.extra.get("skipped")
        passed_by = {"skipped": skipped} if isinstance(skipped, dict) and skipped else {}
        text = response.rendered or "\n\n".join(r.rendered for r in response)
        parts = [text or "(no results)", render_linked(response, query=query),
                 render_skipped(response)]
        return _text("\n\n".join(p for p in parts if p), structured={
            "results": hits, "expanded": [r.to_dict() for r in response.expanded],
            **passed_by})

    async def recall(self, query: str, *, limit: int | None = None,
                     budget_chars: int | None = None, include_index: bool = False,
                     include_interests: bool = False) -> Recall:
        """``memory.recall`` for this agent (the tool and the prompt), for a query of
        any size (its start and end, as one request takes)."""
        query = search_query(query, self.client.request_limit)
        return await on_workspace(self._open, lambda: self.client.recall(
            self.agent, query, max_results=limit, budget_chars=budget_chars,
            include_index=include_index, include_interests=include_interests))

    async def _recall(self, args: JsonObject) -> types.CallToolResult:
        limit, budget = args.get("limit"), args.get("budget_chars")
        answer = await self.recall(
            str(args.get("query", "")), limit=int(limit) if limit is not None else None,
            budget_chars=int(budget) if budget is not None else None,
            include_index=bool(args.get("include_index", False)),
            include_interests=bool(args.get("include_interests", False)))
        return _text(_recall_block(answer), structured=answer)

    async def get_prompt(self, name: str, args: dict[str, str]) -> types.GetPromptResult:
        """The ``recall`` prompt: the recall block as one user message, wrapped in the tag
        the daemon drops, so a host handing its conversation back to ``memory_add_turns``
        does not store recalled memory as what the user said (a recall tag in a note
        is made plain text: it would end the block early)."""
        if name != RECALL_PROMPT.name:
            raise ValueError(f"unknown prompt: the prompt is {RECALL_PROMPT.name}")
        # Checked before the daemon is asked: a wrong word is refused, not taken for no.
        budget_chars = prompt_count(args, "budget_chars")
        include_index = prompt_flag(args, "include_index")
        include_interests = prompt_flag(args, "include_interests")
        answer = await self.recall(
            str(args.get("query", "")), budget_chars=budget_chars,
            include_index=include_index, include_interests=include_interests)
        block = _recall_block(answer)
        return types.GetPromptResult(
            description=f"long-term memory of {self.agent} for the request",
            messages=[types.PromptMessage(role="user", content=types.TextContent(
                text=RECALL_WRAP.format(block=inert_recall_tags(block))))])

    async def _read(self, args: JsonObject) -> types.CallToolResult:
        given = args.get("agent")
        # An empty name is refused as memory_search refuses it, not read as one's own.
        owner = await self._ids.id_of(str(given)) if given is not None else self.agent
        got = await self.client.read(
            owner, str(args.get("path", "")), start_line=args.get("start_line"),
            end_line=args.get("end_line"), as_agent=self.agent if owner != self.agent else None,
            masked=True)
        text = str(got.get("text", ""))
        if got.get("truncated"):  # said in the text too: the model may see nothing else
            text += (f"\n[truncated: lines {got.get('start_line')}-{got.get('end_line')} of "
                     f"{got.get('total_lines')}; read on with start_line]")
        elif not text and int(got.get("start_line") or 1) > int(got.get("total_lines") or 0):
            # Not an empty file: a range past its end (an empty answer would say neither).
            text = (f"[no lines: start_line {got.get('start_line')} is past the end of "
                    f"{got.get('path')}, which has {got.get('total_lines')} lines]")
        return _text(text, structured=got)

    async def end_sessions(self) -> None:
        """End every session given turns since its last flush (errors are skipped:
        the daemon's idle flush writes them later)."""
        while self._unflushed:
            session = next(iter(self._unflushed))
            del self._unflushed[session]
            try:
                await self.client.end_session(self.agent, session)
            except _DAEMON_ERRORS as exc:
                print(f"recalld mcp: ending a session failed: {exc}", file=sys.stderr)

    # --------------------------------------------------------------- resources

    async def list_resources(self) -> list[types.Resource]:
        files = await on_workspace(self._open, lambda: self.client.memory_list(
            self.agent, limit=MAX_RESOURCES + 1))
        if len(files) > MAX_RESOURCES:  # said where the MCP client keeps server logs
            print(f"recalld mcp: listing the first {MAX_RESOURCES} of more files of "
                  f"{self.agent}; memory_search and memory_read reach all of them",
                  file=sys.stderr, flush=True)
        return [
            types.Resource(uri=resource_uri(self.agent, f["path"]), name=f["path"],
                           mime_type="text/markdown", size=f.get("size"))
            for f in files[:MAX_RESOURCES]
        ]

    async def read_resource(self, uri: str) -> str:
        """The whole file: the daemon answers at most 512 KiB per read, so a larger file
        is read range after range (ValueError if it is too large for that)."""
        agent, path = parse_uri(uri)
        return await on_workspace(self._open, lambda: self._read_whole(agent, path))

    async def _read_whole(self, agent: str, path: str) -> str:
        parts: list[str] = []
        size, start = 0, 1
        while True:
            got = await self.client.read(agent, path, start_line=start, masked=True,
                                         as_agent=self.agent if agent != self.agent else None)
            text = str(got.get("text", ""))
            parts.append(text)
            size += len(text)
            if not got.get("truncated"):
                return "".join(parts)
            end = int(got["end_line"])
            if size > MAX_RESOURCE_CHARS or not text.endswith("\n") or end < start:
                # Too large, or one line longer than a whole read: it cannot come whole.
                raise ValueError("the file is too large to read as a resource "
                                 f"({got.get('total_lines')} lines): read it in line ranges "
                                 "with the memory_read tool")
            start = end + 1


def mcp_error(exc: BaseException) -> MCPError:
    """The MCP error answer for a failure: the recalld code when the daemon gave one
    (or ``-32602`` for a bad URI), else internal error; the SDK logs no traceback."""
    if isinstance(exc, errors.RecalldError):
        code = errors.INTERNAL_ERROR if isinstance(exc, errors.DaemonNotRunning) else exc.code
        return MCPError(code=code, message=f"recalld: {exc.message}")
    if isinstance(exc, ValueError):
        return MCPError(code=errors.INVALID_PARAMS, message=f"recalld: {exc}")
    return MCPError(code=errors.INTERNAL_ERROR, message=f"recalld: {exc}")


# What the server's lifespan hands its handlers: nothing they use.
_Lifespan = dict[str, object]
_Context = ServerRequestContext[_Lifespan]


def build_server(bridge: Bridge,
                 check: Callable[[], Coroutine[object, object, None]] | None = None,
                 ) -> Server[_Lifespan]:
    """The MCP server whose handlers forward to ``bridge``; ``check`` (the daemon's
    reachability) runs beside them while the server runs, and is cancelled as it stops
    (before the daemon connection closes, which it would take for the daemon's fault)."""

    async def on_list_tools(ctx: _Context, params: types.PaginatedRequestParams | None,
                            ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def on_call_tool(ctx: _Context, params: types.CallToolRequestParams,
                           ) -> types.CallToolResult:
        return await bridge.call_tool(params.name, dict(params.arguments or {}))

    async def on_list_resources(ctx: _Context, params: types.PaginatedRequestParams | None,
                                ) -> types.ListResourcesResult:
        try:
            return types.ListResourcesResult(resources=await bridge.list_resources())
        except _DAEMON_ERRORS as exc:
            raise mcp_error(exc) from None

    async def on_read_resource(ctx: _Context, params: types.ReadResourceRequestParams,
                               ) -> types.ReadResourceResult:
        try:
            text = await bridge.read_resource(str(params.uri))
        except (ValueError, *_DAEMON_ERRORS) as exc:
            raise mcp_error(exc) from None
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=str(params.uri), mime_type="text/markdown", text=text)])

    async def on_list_prompts(ctx: _Context, params: types.PaginatedRequestParams | None,
                              ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[RECALL_PROMPT])

    async def on_get_prompt(ctx: _Context, params: types.GetPromptRequestParams,
                            ) -> types.GetPromptResult:
        try:
            return await bridge.get_prompt(params.name, dict(params.arguments or {}))
        except (ValueError, *_DAEMON_ERRORS) as exc:
            raise mcp_error(exc) from None

    @asynccontextmanager
    async def lifespan(_: Server[_Lifespan]) -> AsyncIterator[_Lifespan]:
        try:
            async with anyio.create_task_group() as checks:
                if check is not None:
                    checks.start_soon(check)
                yield {}
                checks.cancel_scope.cancel()
        finally:
            try:
                await bridge.end_sessions()
            finally:
                await bridge.client.aclose()

    return Server(
        "recalld", version=__version__,
        instructions=(f"Long-term memory of agent {bridge.agent!r}: search it before "
                      "answering questions about earlier work, read files by path."),
        lifespan=lifespan,
        on_list_tools=on_list_tools, on_call_tool=on_call_tool,
        on_list_resources=on_list_resources, on_read_resource=on_read_resource,
        on_list_prompts=on_list_prompts, on_get_prompt=on_get_prompt,
    )


async def serve(agent: str = DEFAULT_AGENT, socket_path: str | Path | None = None,
                *, autostart: bool = False) -> None:
    """Serve MCP on stdin/stdout until stdin closes. Warns on stderr (the MCP client's
    log) when no daemon answers at start; requests then answer with errors until one does.
    The check runs beside the server: a daemon that takes its time to answer (busy, or
    stopped) does not hold back ``initialize``, which hosts give a few seconds.
    """
    client = AsyncClient(socket_path, autostart=autostart)
    bridge = Bridge(client, provisional_id(agent), agent)
    server = build_server(bridge, None if autostart else lambda: warn_if_unreachable(client))
    send_answers, answers = anyio.create_memory_object_stream[types.JSONRPCError](
        MAX_LINE_ANSWERS)
    stdin = StdinReader.of_process()
    lines = CheckedLines(bounded_lines(stdin.read), send_answers)
    with claimed_stdout() as stdout:
        await _serve_stdio(server, lines, answers, stdout, stdin)


async def _serve_stdio(server: Server[_Lifespan], lines: CheckedLines,
                       answers: MemoryObjectReceiveStream[types.JSONRPCError],
                       stdout: StdoutWire, stdin: StdinReader) -> None:
    # The transport only iterates its stdin (``async for``) and writes its stdout.
    async with stdio_server(stdin=cast("anyio.AsyncFile[str]", lines),
                            stdout=cast("anyio.AsyncFile[str]", stdout)) as (read_stream,
                                                                             write_stream):
        # A clone: the answers to the last lines still go out after the server has
        # closed its own stream at the end of stdin.
        out = write_stream.clone()

        async def answer_lines() -> None:
            async with answers, out:
                async for answer in answers:
                    await out.send(SessionMessage(answer))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(answer_lines)
            # A stop signal ends the lines as the end of stdin does.
            signals = anyio.CancelScope()
            tasks.start_soon(_in_scope, signals, stdin.end_on_signal)
            # Each answer is told to the lines, whose end waits for those still due.
            await server.run(read_stream, AnsweringStream(write_stream, lines.in_flight),
                             server.create_initialization_options())
            signals.cancel()


async def _in_scope(scope: anyio.CancelScope, run: Callable[[], Awaitable[None]]) -> None:
    with scope:
        await run()


async def warn_if_unreachable(client: AsyncClient) -> None:
    try:
        await client.ping()
    except _DAEMON_ERRORS as exc:
        print(f"recalld mcp: warning: {exc}; every request fails until a daemon answers "
              "(or run recalld mcp --autostart)", file=sys.stderr, flush=True)
