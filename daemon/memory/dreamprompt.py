"""What a dream tells the chat model: the system prompt, the tools it may call and the
message that hands it one daily note (or one part of a long one) with the node listing.
Pure functions."""

from __future__ import annotations

from typing import Final

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import digest
from recalld.daemon.providers.chat import ToolSchema, function_tool

SYSTEM_PROMPT: Final = """\
You consolidate an agent's daily memory notes into long-term knowledge nodes.
Read the daily note. Extract reusable units: facts about the user (bucket "personal"),
how-to knowledge and procedures ("procedure"), and general knowledge ("wiki").
Skip chit-chat and one-off details.
A note may name the people it is about or who said what (`Alice lives in Oslo`,
`user (Bob): ...`): a fact about one person is a node of that person's (named with them,
`Alice's home town`), and never corroborates, refines or corrects a node about another
person; the same fact said in another language is the same unit.
For each unit call `integrate` once with one action:
- CREATE: a new node (check first with `node_search` that none exists).
- CORROBORATE: the note repeats what an existing node says.
- REFINE: the note adds detail to a node; give the FULL new content, keeping what it says.
- CORRECT: the note contradicts a node; give the corrected content and the reason
  (a note older than the node's sources does not correct it; it may only add detail).
Name existing nodes by their path in `node`. Use `related` for nodes on related topics.
Optionally call `note_interests` with the topics the user cares about.
Answer with a short plain-text summary when done."""


def tool_schemas() -> list[ToolSchema]:
    def fn(name: str, description: str, props: JsonObject,
           required: list[str]) -> ToolSchema:
        return function_tool(name, description,
                             {"type": "object", "properties": props, "required": required})

    strings = {"type": "array", "items": {"type": "string"}}
    return [
        fn("node_search", "Search existing digest nodes by keywords.",
           {"query": {"type": "string"}}, ["query"]),
        fn("node_read", "Read one digest node.", {"path": {
            "type": "string", "description": "path of the node, or its name"}}, ["path"]),
        fn("integrate", "Integrate one unit of knowledge into the digest.", {
            "action": {"type": "string", "enum": list(digest.ACTIONS)},
            "bucket": {"type": "string", "enum": list(digest.BUCKETS)},
            "node": {"type": "string", "description": "path of the existing node, if any"},
            "name": {"type": "string", "description": "short title of the node"},
            "description": {"type": "string", "description": "one line"},
            "type": {"type": "string", "description": "fact, preference, procedure, ..."},
            "content": {"type": "string", "description": "the node's full Markdown content"},
            "sources": {**strings, "description": "daily note paths backing it"},
            "related": {**strings, "description": "paths of related nodes"},
            "reason": {"type": "string", "description": "why this action"},
        }, ["action", "bucket", "name", "reason"]),
        fn("note_interests", "Record topics the user is interested in.",
           {"topics": strings}, ["topics"]),
    ]


def user_message(note: str, body: str, nodes: list[dict[str, str]], part: int,
                  parts: int) -> str:
    listing = "\n".join(f"- {n['path']}: {n['name']} — {n['description']}" for n in nodes)
    where = "" if parts == 1 else (
        f"[part {part} of {parts} of a long note"
        + ("; the parts before were integrated already]\n" if part > 1 else "]\n"))
    return (f"Daily note {note}:\n\n{where}{body}\n\nExisting nodes (newest first):\n"
            f"{listing or '(none yet)'}")
