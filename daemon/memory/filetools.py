"""The workspace file operations offered to a chat model: OpenAI tool schemas
(:func:`schemas`) and a dispatcher (:func:`call`) that runs one tool call on a
:class:`~recalld.daemon.memory.fileops.FileOps` and describes the outcome as text.

Every error becomes text for the model; :func:`call` never raises (except cancellation).
Starts nothing and holds no state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, TypedDict

import orjson

from recalld.daemon.jsontypes import JsonObject, integer_range
from recalld.daemon.memory.llm import MAX_TOOL_RESULT_CHARS
from recalld.daemon.providers.chat import ToolSchema, function_tool
from recalld.daemon.safepath import LineSlice
from recalld.daemon.store.errors import StorageError
from recalld.daemon.textcost import chars_within, text_cost
from recalld.ipc.errors import InvalidParams, NotAllowed, RecalldError
from recalld.ipc.textcut import cut_text

if TYPE_CHECKING:
    from recalld.daemon.memory.fileops import FileOps

ALL_TOOLS = ("read", "write", "edit", "frontmatter_update", "daily_write")
#: What the lines a ``read`` answers with may cost at most: a tool result's bound, less
#: room for the line saying which lines they are (a result past the bound would be cut
#: by the tool loop below the lines it names).
READ_SHOWN_COST = MAX_TOOL_RESULT_CHARS - 1000
#: ``daily_append`` (a schema here) is carried out by an auto_memory run's own tools
#: (:mod:`session_tools`), not by :func:`call`.


class _Tool(TypedDict):
    description: str
    parameters: JsonObject  # a JSON Schema


def schemas(names: Iterable[str] = ALL_TOOLS) -> list[ToolSchema]:
    """OpenAI ``tools`` entries for the named operations."""
    wanted = list(names)
    unknown = set(wanted) - set(_SCHEMAS)
    if unknown:
        raise ValueError(f"unknown tools: {sorted(unknown)}")
    return [function_tool(n, _SCHEMAS[n]["description"], _SCHEMAS[n]["parameters"])
            for n in wanted]


async def call(ops: FileOps, name: str, arguments: Mapping[str, object], *,
               storage_errors: list[str] | None = None) -> str:
    """Run one tool call and describe the outcome as text; errors become text too.
    A storage failure (disk full, read-only folder, I/O error) is also appended to
    ``storage_errors`` when given: the model was not at fault, and may not say so."""
    try:
        return await _call(ops, name, dict(arguments))
    except StorageError as exc:
        if storage_errors is not None:
            storage_errors.append(exc.message)
        return f"error: {exc.message}"
    except RecalldError as exc:
        return f"error: {exc.message}"
    except (TypeError, ValueError, KeyError) as exc:
        return f"error: bad arguments for {name}: {exc}"


async def _call(ops: FileOps, name: str, a: dict[str, object]) -> str:
    def text(key: str) -> str:
        value = a.get(key)
        if not isinstance(value, str):
            raise InvalidParams(f"argument {key!r} must be a string")
        return value

    def optional_text(key: str) -> str | None:
        return None if a.get(key) is None else text(key)

    def line(key: str) -> int | None:
        value = a.get(key)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidParams(f"argument {key!r} must be an integer{integer_range(value)}")
        return value

    if name == "read":
        got = shown_lines(await ops.read(text("path"), line("start_line"), line("end_line")),
                          READ_SHOWN_COST)
        more = " (truncated)" if got.truncated else ""
        return (f"{text('path')} lines {got.start_line}-{got.end_line} of "
                f"{got.total_lines}{more}:\n{got.text}")
    if name == "write":
        res = await ops.write(text("path"), text("content"))
    elif name == "edit":
        res = await ops.edit(text("path"), text("old"), text("new"))
    elif name == "frontmatter_update":
        changes = a.get("changes")
        if not isinstance(changes, dict):
            raise InvalidParams("argument 'changes' must be an object")
        res = await ops.frontmatter_update(text("path"), changes)
    elif name == "daily_write":
        if ops.session_id is None:
            raise NotAllowed("daily_write needs a session")
        res = await ops.daily_write(ops.session_id, text("name"), text("content"),
                                     optional_text("date"), optional_text("description"))
    else:
        return f"error: unknown tool {name!r}"
    return orjson.dumps({"ok": True, **res.as_dict()}).decode()


def shown_lines(got: LineSlice, limit: int) -> LineSlice:
    """``got`` as whole lines that cost at most ``limit`` (the head of its first line,
    if that alone costs more), its ``end_line`` the last of them: a model that reads on
    from the next line skips none it was not shown."""
    if text_cost(got.text) <= limit:
        return got
    end, cost, shown = 0, 0, 0
    while (nl := got.text.find("\n", end)) >= 0:
        cost += text_cost(got.text[end:nl + 1])
        if cost > limit:
            break
        end, shown = nl + 1, shown + 1
    if not shown:
        first = got.text.split("\n", 1)[0]
        return dataclasses.replace(got, text=cut_text(first, chars_within(first, limit)),
                                   end_line=got.start_line, truncated=True)
    return dataclasses.replace(got, text=got.text[:end], end_line=got.start_line + shown - 1,
                               truncated=True)


_PATH = {"type": "string", "description": "path relative to the workspace root"}
_SCHEMAS: dict[str, _Tool] = {
    "read": {
        "description": "Read lines of a workspace file (1-based, inclusive range).",
        "parameters": {"type": "object", "properties": {
            "path": _PATH, "start_line": {"type": "integer"}, "end_line": {"type": "integer"},
        }, "required": ["path"]},
    },
    "write": {
        "description": "Create or replace a Markdown file under the memory folders.",
        "parameters": {"type": "object", "properties": {
            "path": _PATH, "content": {"type": "string"},
        }, "required": ["path", "content"]},
    },
    "edit": {
        "description": "Replace one exact, unique occurrence of `old` with `new` in a file.",
        "parameters": {"type": "object", "properties": {
            "path": _PATH, "old": {"type": "string"}, "new": {"type": "string"},
        }, "required": ["path", "old", "new"]},
    },
    "frontmatter_update": {
        "description": "Set frontmatter fields of a note (null removes a field).",
        "parameters": {"type": "object", "properties": {
            "path": _PATH, "changes": {"type": "object"},
        }, "required": ["path", "changes"]},
    },
    "daily_write": {
        "description": ("Write this conversation's daily note (Markdown body; the daemon "
                        "adds the frontmatter). Writing again updates the same note."),
        "parameters": {"type": "object", "properties": {
            "name": {"type": "string", "description": "short file name, e.g. commute"},
            "description": {"type": "string", "description": "one line: what the note holds"},
            "content": {"type": "string", "description": "the note body in Markdown"},
            "date": {"type": "string", "description": "YYYY-MM-DD, default today"},
        }, "required": ["name", "content"]},
    },
    "daily_append": {
        "description": ("Add new facts to the end of this conversation's daily note "
                        "(made of them if there is none yet), without writing the note "
                        "again; lines it holds already are left out."),
        "parameters": {"type": "object", "properties": {
            "content": {"type": "string",
                        "description": "only the new facts, as Markdown bullet points"},
            "name": {"type": "string",
                     "description": "short file name, when the note does not exist yet"},
            "description": {"type": "string",
                            "description": "one line, when the note does not exist yet"},
        }, "required": ["content"]},
    },
}
