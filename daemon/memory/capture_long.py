"""A session's note grown long: new facts are added to it, never written again whole.

A day-long conversation's note grows with every run of auto_memory. Once writing it
again whole takes more than the chat model's ``max_tokens``, the model's ``daily_write``
is cut off at its length limit, the run fails, and so does every later one: the
conversation would stop being captured. So:

- a note whose rewrite may not fit (:func:`is_long`: over half of ``max_tokens``, its
  tokens counted as conservatively as an embedding model's input is) is shown to the
  model with ``daily_append`` (new lines added at its end; a line it holds already is
  left out) and ``edit`` (to correct a fact) in place of ``daily_write``, and asked for
  the new facts a few at a time (one call an answer, as many answers as it takes: a loop
  out of steps while it still adds them is asked for the rest, :data:`MAX_ROUNDS` times
  at most, within the job's tool budget);
- a part of the turns whose answer was cut at its length limit anyway (a tool call cut
  mid-way, or text only; also the first write of a note, of more facts than one answer
  holds) is asked again, once, that way, with the note as it is then.

The prompt shows a long note as a bounded view (:func:`note_view`: its headings and
its last lines, at most :data:`NOTE_VIEW_CHARS`, counted as estimated tokens as every
budget of a prompt is: :mod:`~recalld.daemon.textcost`), so a prompt does not outgrow the
model's context as the note grows all day: ``daily_append`` leaves out the lines the
note holds, shown or not, and ``read`` shows the rest. A note that reaches the write
limit (``MAX_WRITE_BYTES``) is continued in the next note of the session's day
(``<name>-2.md``, ``-3``...): the last of them is added to with ``daily_append``, its
lines checked against all of the session's notes of the day.

Nothing the note held is dropped (nothing rewrites it), nothing is written twice. An
answer of new facts that is cut too fails the run as before (raise ``max_tokens``): the
facts of its earlier answers are written, so the next run has fewer to add.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from recalld.daemon.index.frontmatter import body_of
from recalld.daemon.memory.fileops import FileOps
from recalld.daemon.memory.llm import LENGTH_CUTS, LoopResult, ToolBudget, run_tools
from recalld.daemon.memory.session_tools import SessionTools
from recalld.daemon.providers.errors import CutToolCall
from recalld.daemon.textcost import tail_within, text_cost

if TYPE_CHECKING:
    from recalld.daemon.providers.chat import ChatClient, ChatMessage

#: The tools of a run whose note is short enough to write again whole.
REWRITE_TOOLS = ("daily_write", "read", "edit", "frontmatter_update")
#: The tools of a run whose note is long: the note is added to, not written again.
APPEND_TOOLS = ("daily_append", "read", "edit", "frontmatter_update")

WRITE_RULES = (
    "Write the note with daily_write. If the note already exists (it is shown below), "
    "write the whole merged note again: keep what it says, add what is new, correct what "
    "changed. Do not create a second note.")
APPEND_RULES = (
    "The note is too long to write again whole (or, when none is shown, what is new is "
    "too much for one answer): do not write it whole. Call daily_append with only the "
    "facts the note does not hold yet, as bullet points, at most ten in one call and one "
    "call in an answer, until all are added; correct a fact that changed with edit "
    "(replace its line with the corrected line). Never repeat what the note says.")

#: How much of a note a prompt shows at most (:func:`note_view`), a cost in thirds of an
#: estimated token (:mod:`~recalld.daemon.textcost`: that many characters of English, a
#: ninth as many of Chinese); a note longer than that is added to, never written again
#: whole.
NOTE_VIEW_CHARS = 16_000
_HEADING = re.compile(r"#{1,6}\s")

#: ``(rules, note path, note text)`` to the conversation for the model.
#: How many more times a part is asked for its new facts (after a cut answer, or a loop
#: out of steps while it still added them); the job's tool budget bounds them too.
MAX_ROUNDS = 4

Prompt = Callable[[str, str | None, str | None], "list[ChatMessage]"]


def note_view(text: str, earlier: Sequence[str] = ()) -> str:
    """What a prompt shows of the note ``text`` the new facts are added to (``earlier``:
    the session's full notes of the day it continues): all of it when it fits in
    :data:`NOTE_VIEW_CHARS`, else its headings (the last of them, if they are many) and
    as many of its last lines as fit, with a line saying what is left out."""
    told = (f"(This note continues {', '.join(earlier)}, which took no more: "
            "daily_append leaves out the lines they hold too, and read shows them.)\n\n"
            if earlier else "")
    if text_cost(text) <= NOTE_VIEW_CHARS:
        return told + text
    lines = text.split("\n")
    headings: list[str] = []
    fenced = False
    for ln in lines:
        if ln.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and _HEADING.match(ln):
            headings.append(ln[:200])
    while headings and sum(text_cost(h) + 1 for h in headings) > NOTE_VIEW_CHARS // 4:
        headings.pop(0)
    tail = tail_within(text, NOTE_VIEW_CHARS - sum(text_cost(h) + 1 for h in headings))
    if "\n" in tail:  # whole lines only
        tail = tail[tail.index("\n") + 1:]
    left = len(lines) - len(tail.split("\n"))
    shown = "\n".join(headings)
    return (f"{told}(The note is long: only its headings and its last lines are shown. "
            f"{left} earlier lines are left out here; daily_append leaves out any line "
            "the note holds already, so a fact it holds is not written twice, and read "
            "shows the whole note.)\n\n"
            + (f"Headings of the note:\n{shown}\n\n" if shown else "")
            + f"The last lines of the note:\n{tail}")


def is_long(note_text: str | None, max_tokens: int) -> bool:
    """True if writing ``note_text`` again whole may not fit in half of ``max_tokens``
    (the other half for what is new, and the JSON the call is written in)."""
    if note_text is None:
        return False
    body = body_of(note_text)[0]  # the frontmatter is the daemon's to write
    half = max_tokens // 2
    return half > 0 and text_cost(body) > 3 * half  # thirds of a token


def _more(result: LoopResult, changes_before: int, ops: FileOps, budget: ToolBudget) -> bool:
    """True if the loop ran out of steps while it still added to the note (and may run
    more tool calls): what it had left to add is asked for."""
    return (not result.finished and result.cut is None and len(ops.changes) > changes_before
            and not budget.spent())


def _cut(result: LoopResult, changes_before: int, ops: FileOps) -> bool:
    """True if the loop ended at the length limit with no write of the note made."""
    return result.cut in LENGTH_CUTS and len(ops.changes) == changes_before


async def current_note(ops: FileOps, tools: SessionTools
                       ) -> tuple[str | None, str | None, list[str]]:
    """The session's note of the day that new facts go to (its last), its text, and the
    session's notes of the day before it (full ones it continues)."""
    notes = await tools.continued_notes()
    if not notes:
        return None, None, []
    return notes[-1], await ops.read_text(notes[-1]), notes[:-1]


async def run_part(chat: ChatClient, prompt: Prompt, ops: FileOps, tools: SessionTools, *,
                   max_steps: int, deadline_s: float, on_step: Callable[[int, str], None],
                   budget: ToolBudget) -> LoopResult:
    """Run the tool loop (:func:`run_tools`, with these arguments) on one part of the
    turns (with the session's note as the part starts), the note added to when it is
    long, asked again for the new facts only when the answer was cut at its length
    limit, and for the rest when the loop ran out of steps while it still added them."""

    async def loop(rules: str, path: str | None, text: str | None,
                   names: tuple[str, ...]) -> LoopResult:
        return await run_tools(chat, prompt(rules, path, text), ops.tools(names), tools,
                               max_steps=max_steps, deadline_s=deadline_s, on_step=on_step,
                               budget=budget)

    note_path, note_text, earlier = await current_note(ops, tools)
    long = bool(earlier) or is_long(note_text, chat.config.max_tokens) or (
        note_text is not None and text_cost(note_text) > NOTE_VIEW_CHARS)
    if long and note_text is not None:
        note_text = note_view(note_text, earlier)
    changes_before = len(ops.changes)
    first: LoopResult | None = None
    try:
        first = await loop(APPEND_RULES if long else WRITE_RULES, note_path, note_text,
                           APPEND_TOOLS if long else REWRITE_TOOLS)
    except CutToolCall:
        if long:
            raise
    if first is not None and not long and not _cut(first, changes_before, ops):
        return first
    # A long note's loop goes on only if it ran out of steps; a cut rewrite is asked again.
    total, last = first, first if long else None
    for _ in range(MAX_ROUNDS):
        if last is not None and not _more(last, changes_before, ops, budget):
            break
        # Cut (asked again for the new facts only), or out of steps while still adding
        # them (asked for the rest): with the note as it is now.
        changes_before = len(ops.changes)
        note_path, note_text, earlier = await current_note(ops, tools)
        if note_text is not None:
            note_text = note_view(note_text, earlier)
        last = await loop(APPEND_RULES, note_path, note_text, APPEND_TOOLS)
        total = last if total is None else dataclasses.replace(
            last, steps=total.steps + last.steps,
            tool_calls_made=total.tool_calls_made + last.tool_calls_made)
    assert total is not None  # a first loop that raised was followed by another
    return total
