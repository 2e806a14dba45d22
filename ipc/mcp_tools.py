"""What ``recalld mcp`` offers MCP clients: its tools with their input schemas, the
argument check every call goes through first, and the ``recall`` prompt.

``memory_add_turns`` takes messages in the shapes ``memory.add_turns`` takes (OpenAI's
chat and Responses formats, Anthropic's, Gemini's parts): the daemon's sanitizer keeps
what the user and the assistant said, whichever client sent it.
"""

from __future__ import annotations

import mcp.types as types
from jsonschema import Draft202012Validator

from recalld.ipc.answers import MESSAGE_ROLES, JsonObject
from recalld.ipc.protocol import MAX_RESULTS
from recalld.ipc.tool_args import schema_error

#: One message of ``memory_add_turns``: a role and string, block or null content (or
#: Gemini's ``parts``; extra
#: fields such as ``tool_call_id`` or ``tool_calls`` are let through), or a Responses
#: API item without role (``function_call``, ``reasoning``...), which the daemon drops.
MESSAGE_SCHEMA: JsonObject = {
    "type": "object",
    "description": 'A message has a "role", or a "type" other than "message".',
    "properties": {
        "role": {"type": "string", "enum": sorted(MESSAGE_ROLES)},
        "content": {"type": ["string", "array", "null"],
                    "items": {"type": ["object", "string"]}},
        "parts": {"type": "array", "items": {"type": ["object", "string"]}},
        "type": {"type": "string"},
        "name": {"type": ["string", "null"],
                 "description": "Who said it, when several people or agents share the "
                                "conversation (OpenAI's chat format)."},
    },
    "anyOf": [{"required": ["role"]},
              {"required": ["type"], "not": {"properties": {"type": {"const": "message"}}}}],
}

#: What a tool does to the world, for hosts that approve calls by it (a read-only tool is
#: run without asking the user each time): the readers change nothing; the writers only
#: add to this agent's memory, never remove or overwrite; none reaches past the daemon.
_READS = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
_ADDS = types.ToolAnnotations(read_only_hint=False, destructive_hint=False,
                              open_world_hint=False)

TOOLS: list[types.Tool] = [
    types.Tool(
        name="memory_search",
        annotations=_READS,
        description=("Search long-term memory (Markdown notes from past conversations and "
                     "consolidated knowledge). Returns ranked excerpts with file:line ranges."),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "default": 5},
                "agents": {"type": "array", "items": {"type": "string"},
                           "description": "Search these agents' workspaces instead of your "
                                          "own (each must be shared with you)."},
            },
            "required": ["query"],
        },
    ),
    types.Tool(
        name="memory_recall",
        annotations=_READS,
        description=("What long-term memory holds for a request, ready to read before "
                     "answering: the best hits, the notes they link to, optionally the "
                     "memory index, each labelled with file:line ranges, within a size "
                     "budget."),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The request or topic."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "default": 5},
                "budget_chars": {"type": "integer", "minimum": 1, "maximum": 200000,
                                 "default": 4000},
                "include_index": {"type": "boolean", "default": False,
                                  "description": "Add the index of long-term notes."},
                "include_interests": {"type": "boolean", "default": False,
                                      "description": "Add the top interest topics."},
            },
            "required": ["query"],
        },
    ),
    types.Tool(
        name="memory_read",
        annotations=_READS,
        description="Read a memory file, or a 1-based inclusive range of its lines.",
        input_schema={
            "type": "object",
            "properties": {
                "path": {"type": "string",
                         "description": "Path inside the workspace, as search shows it."},
                # No request carries a number past 64 bits: refused naming the argument.
                "start_line": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                "end_line": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                "agent": {"type": "string",
                          "description": "Another agent whose workspace is shared with you."},
            },
            "required": ["path"],
        },
    ),
    types.Tool(
        name="memory_add_turns",
        annotations=_ADDS,
        description=("Hand conversation turns to long-term memory; durable facts are "
                     "extracted into notes in the background. flush=true at the end of a "
                     "conversation."),
        input_schema={
            "type": "object",
            "properties": {
                "session_id": {"type": "string"},
                "messages": {"type": "array", "items": MESSAGE_SCHEMA,
                             "description": "The new messages only, as the host holds "
                                            "them: OpenAI chat or Responses, Anthropic or "
                                            "Gemini shapes; only what the user and the "
                                            "assistant said is kept."},
                "flush": {"type": "boolean", "default": False},
                "request_id": {"type": "string", "minLength": 1, "maxLength": 200,
                               "description": "An id for these turns: a retried call with "
                                              "the same id adds nothing twice."},
            },
            "required": ["session_id", "messages"],
        },
    ),
    types.Tool(
        name="memory_add_note",
        annotations=_ADDS,
        description="Remember one durable fact now (stored as a note of the day).",
        input_schema={
            "type": "object",
            "properties": {"content": {"type": "string"},
                           "session_id": {"type": "string"}},
            "required": ["content"],
        },
    ),
]


#: Each tool's argument check: the SDK's server hands arguments on as the client sent them.
_CHECKS = {tool.name: Draft202012Validator(tool.input_schema) for tool in TOOLS}
TOOL_NAMES = frozenset(_CHECKS)


#: The ``recall`` prompt's message (``memory.add_turns`` drops ``<recalled-memory>``).
RECALL_WRAP = ("<recalled-memory>\nRelevant long-term memory (use only what is pertinent):"
               "\n\n{block}\n</recalled-memory>")


#: The spellings of a yes/no prompt argument (prompt arguments are strings); none is no.
_FLAGS = {"true": True, "1": True, "yes": True, "y": True, "on": True,
          "false": False, "0": False, "no": False, "n": False, "off": False, "": False}


def prompt_flag(args: dict[str, str], name: str) -> bool:
    """A yes/no argument of the ``recall`` prompt; ValueError for any other word (a
    flag read as no whatever it said would drop what the host asked for)."""
    flag = _FLAGS.get(str(args.get(name) or "").strip().lower())
    if flag is None:
        raise ValueError(f"{name} must be true or false")
    return flag


#: The arguments of the ``memory_recall`` tool, whose bounds the prompt's share.
_RECALL_ARGS: JsonObject = next(
    t.input_schema["properties"] for t in TOOLS if t.name == "memory_recall")


def prompt_count(args: dict[str, str], name: str) -> int | None:
    """A whole-number argument of the ``recall`` prompt, None if not given; ValueError
    unless it is ASCII digits (``int()`` also takes "٣", "1_000" and "+5") within the
    bounds of the ``memory_recall`` tool's argument of that name."""
    given = str(args.get(name) or "").strip()
    if not given:
        return None
    if not (given.isascii() and given.isdigit()):
        raise ValueError(f"{name} must be a whole number")
    # Within the bounds the memory_recall tool gives it, refused here in those words: a
    # number past them of any length (past 64 bits no request carries it; int() of
    # thousands of digits fails) is not the daemon's to refuse.
    spec = _RECALL_ARGS[name]
    low, high = int(spec["minimum"]), int(spec["maximum"])
    digits = given.lstrip("0") or "0"
    if len(digits) > len(str(high)) or not low <= int(digits) <= high:
        raise ValueError(f"{name} must be between {low} and {high}")
    return int(digits)


def argument_error(name: str, args: JsonObject) -> str | None:
    """Why ``args`` do not fit the input schema of tool ``name``, or None if they do
    (in the schema's words, never quoting the value: :func:`tool_args.schema_error`)."""
    return schema_error(_CHECKS[name], args)


#: Each tool's arguments declared integers.
_INTEGERS = {tool.name: frozenset(n for n, spec in tool.input_schema["properties"].items()
                                  if spec.get("type") == "integer") for tool in TOOLS}


def whole_numbers(name: str, args: JsonObject) -> JsonObject:
    """``args`` of tool ``name`` (checked by :func:`argument_error`) with each integer
    argument written as a float (``3.0``, which JSON Schema takes for an integer, and
    which a client's JSON library may write) as the integer it is."""
    return {key: int(value) if key in _INTEGERS[name] and isinstance(value, float)
            else value for key, value in args.items()}


RECALL_PROMPT = types.Prompt(
    name="recall",
    description=("Long-term memory for a request, to put before the reply: hits, the "
                 "notes they link to and, if asked, the memory index and the top "
                 "interest topics."),
    arguments=[
        types.PromptArgument(name="query", description="The request or topic.",
                             required=True),
        types.PromptArgument(name="budget_chars",
                             description=("The recall block in at most this many characters "
                                          f"(default 4000); the tag around it adds "
                                          f"{len(RECALL_WRAP.format(block=''))}."),
                             required=False),
        types.PromptArgument(name="include_index",
                             description="'true' to add the index of long-term notes "
                                         "(true or false).",
                             required=False),
        types.PromptArgument(name="include_interests",
                             description="'true' to add the top interest topics "
                                         "(true or false).",
                             required=False),
    ],
)
