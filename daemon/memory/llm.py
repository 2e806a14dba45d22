"""A small tool-calling loop over a chat model, for memory jobs.

Owns no task. :func:`run_tools` sends the conversation, runs the tool calls the model asks
for through a dispatcher (whose errors go back to the model as text), and repeats until the
model answers without tool calls, ``max_steps`` answers were spent, or ``deadline_s``
passed. Tool calls are bounded: at most :data:`MAX_CALLS_PER_ANSWER` of one answer are run,
and a job's :class:`ToolBudget` bounds them over all its conversations; a call past either
is not run, and the model is told so in its result (a runaway model cannot write hundreds
of files in one answer or one job); the calls of one answer past
:data:`MAX_CALLS_ANSWERED` are not answered one by one but in one note (one log line).
A spent budget ends the loop, unfinished. A request carries the tool results of its
loop whole up to :data:`MAX_RESULTS_CHARS` in all (a cost in thirds of an estimated
token, :mod:`~recalld.daemon.textcost`: that many characters of English, a ninth as many
of Chinese), the latest first: each older result past that is sent as one line saying
which tool gave it and that calling it again shows it (:func:`within_budget`), so a
model reading many long files does not push the conversation past its context window;
every message stays, and so does the pairing of each tool call with its result. A call
the client could not read (:attr:`ToolCall.error`) is not run; the model is answered
why (one without a name, which has no result of its own, in its answer's last result).
:class:`ChatClients` builds (and keeps per workspace and configuration) the
:class:`ChatClient` of a workspace from its ``chat_model_config`` and the daemon's provider
bridge; its breaker and Retry-After wait are those of every workspace sending to the same
endpoint with the same key for the same model (the daemon's :class:`ChatLines`), and the
workspace is told (``on_back``) when that provider answers again after it was unavailable.

Errors: provider failures (after the client's own retries), malformed answers and "no chat
model configured" propagate as the provider error family (ProviderUnavailable on the wire);
a loop that runs out of time, or whose conversation the provider refuses as too long
for the model's context (:func:`context_exceeded`), raises :class:`LoopFailed`
(JobFailed on the wire; :class:`ContextExceeded` for the latter). A job that
lets them escape is reported failed with that code and message.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from recalld.daemon.config import ChatModelConfig
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.capture_parts import MAX_PROMPT_CHARS
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat_lines import ChatLines
from recalld.daemon.providers.errors import NO_CHAT_MODEL, ProviderConfigError, ProviderRejected
from recalld.daemon.textcost import chars_within, text_cost
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import JobFailed
from recalld.ipc.textcut import cut_text

if TYPE_CHECKING:
    # The chat client (and the redaction it applies to what it sends) is imported when a
    # workspace first makes one: a daemon without a chat model never loads it.
    from recalld.daemon.providers.chat import ChatClient, ChatMessage, ToolSchema

log = logging.getLogger(__name__)

#: Runs one tool call: its name and the arguments as the model wrote them (unchecked).
Dispatch = Callable[[str, JsonObject], Awaitable[str]]
DEFAULT_DEADLINE_S = 600.0
#: What one tool result may cost (:func:`~recalld.daemon.textcost.text_cost`: that many
#: characters of ASCII text, a ninth as many of Chinese); a longer one is cut.
MAX_TOOL_RESULT_CHARS = 20_000
#: The cost of tool results one request carries whole, over all of its loop's
#: answers (the latest first): as much as auto_memory's largest part of a conversation,
#: so a request is at most about its prompt, its model's answers and this much more.
MAX_RESULTS_CHARS = MAX_PROMPT_CHARS
#: What a provider says when a request is longer than the model's context (OpenAI,
#: vLLM, llama.cpp, Mistral, Gemini, DashScope, Anthropic-style gateways, LiteLLM).
_CONTEXT_EXCEEDED = re.compile(
    r"context[ _-]?(?:length|size|window)|maximum context|prompt is too long"
    r"|too many (?:input )?tokens|input (?:is )?too long|range of input length"
    r"|exceeds? the (?:model'?s? )?(?:max(?:imum)?|context)", re.IGNORECASE)
#: Finish reasons of an answer stopped before it was complete.
CUT_SHORT = frozenset({"length", "max_tokens", "content_filter"})
#: Those of :data:`CUT_SHORT` that say the answer reached its token limit.
LENGTH_CUTS = frozenset({"length", "max_tokens"})
#: Tool calls of one answer that are run; those past it are refused (a real model asks
#: for a few at a time).
MAX_CALLS_PER_ANSWER = 32
#: Tool calls of one answer that are answered one by one (each its own tool result);
#: those past it are left out of the conversation and told in one note, so an answer of
#: thousands of calls costs one bounded follow-up request, not one result each.
MAX_CALLS_ANSWERED = 4 * MAX_CALLS_PER_ANSWER
#: The reasons quoted in the note on the calls of an answer that were not answered.
_REASONS_QUOTED = 3
#: ``LoopResult.cut`` of a loop that ended because its job's tool budget was spent.
BUDGET_SPENT = "tool budget spent"
#: ``LoopResult.cut`` of a loop whose model declined to answer (a ``refusal``).
REFUSED = "refusal"
#: ``LoopResult.cut`` of an answer that holds its tool calls as text, or ends for tool
#: calls it does not hold: the server did not parse them (served without its tool-call
#: parser), so none was made.
CALLS_AS_TEXT = "tool calls as text"
#: The finish reasons of an answer that ends for tool calls (``function_call``: the
#: functions API that tools replaced).
CALL_ENDS = frozenset({"tool_calls", "function_call"})
#: What a model's tool call looks like written out in its text: the markers of the chat
#: templates (Qwen, Hermes, Llama 3, Mistral), or a JSON object naming a function. Its
#: runs of spaces are taken whole (a lookahead and its backreference): given back one at
#: a time, the next ``\s*`` read the rest again (16,000 newlines took 0.25 s to check).
_CALL_TEXT = re.compile(
    r"<\|?tool_call\|?>|<function=\w|\[TOOL_CALLS\]|<\|python_tag\|>"
    r"|\A(?=(\s*))\1(?:```\w*(?=(\s*))\2)?\[?\s*\{\s*\"(?:name|function)\"\s*:")


class LoopFailed(JobFailed):
    """The tool loop could not finish (deadline passed, or its job's tool budget was
    spent before it began)."""


class ContextExceeded(LoopFailed):
    """The provider refused the conversation as too long for the model's context
    window: the model's configuration, more than what it was given, is at fault."""


@dataclass(slots=True)
class ToolBudget:
    """The tool calls one job may run over all its conversations (``limit``), those it
    ran (``used``) and those refused (``refused``: past the budget, or past
    :data:`MAX_CALLS_PER_ANSWER` in one answer)."""

    limit: int
    used: int = 0
    refused: int = 0

    def spent(self) -> bool:
        return self.used >= self.limit

    def why_spent(self) -> str:
        return (f"the chat model asked for more than {self.limit} tool calls in one run; "
                "the calls past that were not run")


@dataclass(frozen=True, slots=True)
class LoopResult:
    """How a tool loop ended.

    ``final_text`` is the model's last text answer ('' if none); ``steps`` counts chat
    completions; ``tool_calls_made`` names every tool call in order; ``finished`` is False
    when ``max_steps`` ran out while the model still asked for tools, or when its last
    answer was stopped before it was complete (``cut``: the finish reason, ``length``
    when it reached its token limit; :data:`BUDGET_SPENT` when the job's tool budget ran
    out, :data:`REFUSED` when the model declined to answer, ``detail`` then saying why;
    :data:`CALLS_AS_TEXT` when it wrote tool calls in its text, which the server left
    unparsed, or the server ended the answer for tool calls it did not send); ``messages``
    is the whole conversation including tool results.
    """

    final_text: str
    steps: int
    tool_calls_made: list[str] = field(default_factory=list)
    finished: bool = True
    messages: list[ChatMessage] = field(default_factory=list)
    cut: str | None = None
    detail: str = ""

    def unfinished(self, max_steps: int) -> str:
        """Why the loop did not finish, for a job's error."""
        if self.cut in LENGTH_CUTS:
            return ("the chat model's answer stopped at its length limit before it was "
                    "complete (raise max_tokens in chat_model_config)")
        if self.cut == BUDGET_SPENT:
            return self.detail
        if self.cut == REFUSED:
            from recalld.daemon.memory.redact import redact  # with the chat client

            return f"the chat model refused to answer: {redact(cut_text(self.detail, 300))}"
        if self.cut == CALLS_AS_TEXT:
            return ("the chat model wrote its tool calls as text, or the server ended the "
                    "answer for tool calls it did not send: serve the model with tool calling "
                    "on (vLLM --enable-auto-tool-choice --tool-call-parser ..., llama.cpp "
                    "--jinja)")
        if self.cut is not None:
            return f"the chat model's answer was stopped before it was complete: {self.cut}"
        return (f"the chat model did not finish within {max_steps} steps (it was still "
                "calling tools)")


async def run_tools(
    chat: ChatClient,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSchema],
    dispatch: Dispatch,
    *,
    max_steps: int = 8,
    deadline_s: float = DEFAULT_DEADLINE_S,
    on_step: Callable[[int, str], None] | None = None,
    budget: ToolBudget | None = None,
) -> LoopResult:
    """Run the chat/tool loop; see the module docstring.

    ``dispatch(name, arguments)`` must return text; an exception it raises (other than
    cancellation) is reported to the model as ``error: ...`` and the loop goes on.
    ``on_step(step, message)`` is called after each completion (progress). ``budget``:
    the job's, shared by its loops (default: this loop's own, of ``max_steps`` full
    answers); one already spent raises :class:`LoopFailed` before anything is sent.
    Cancellation stops the loop at once; writes done by earlier tool calls stay.
    """
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    if budget is None:
        budget = ToolBudget(max_steps * MAX_CALLS_PER_ANSWER)
    if budget.spent():
        raise LoopFailed(budget.why_spent())
    convo: list[ChatMessage] = [m.copy() for m in messages]
    made: list[str] = []
    steps = 0
    with trio.move_on_after(deadline_s) as scope:
        while steps < max_steps:
            sent = within_budget(convo)
            try:
                answer = await chat.complete(sent, tools or None)
            except ProviderRejected as exc:
                if not context_exceeded(exc):
                    raise
                size = sum(len(m["content"] or "") for m in sent)
                raise ContextExceeded(
                    f"the conversation is too long for the chat model's context window "
                    f"(step {steps + 1}, {size} characters of text): use a model with a "
                    "larger context, or serve it with one (vLLM --max-model-len, "
                    "llama.cpp -c), or lower max_tokens in chat_model_config; the "
                    f"provider said: {exc.message}") from exc
            steps += 1
            named = [c for c in answer.tool_calls if c.name]
            answered = named[:MAX_CALLS_ANSWERED]
            convo.append(dataclasses.replace(answer, tool_calls=answered).assistant_message())
            if not answer.tool_calls:
                # An answer cut short (a thinking model spending its tokens) is no "nothing
                # to save": the caller must not take it for the model's last word.
                # So is a refusal: the model declined to read what it was given.
                cut = answer.finish_reason if answer.finish_reason in CUT_SHORT else None
                cut = REFUSED if answer.refusal else cut
                if cut is None and tools and (answer.finish_reason in CALL_ENDS
                                              or _CALL_TEXT.search(answer.content or "")):
                    cut = CALLS_AS_TEXT  # written out, or announced and not sent
                if on_step is not None:
                    on_step(steps, "model finished" if cut is None else f"answer cut ({cut})")
                return LoopResult(answer.content or "", steps, made, cut is None, convo, cut,
                                  answer.refusal or "")
            ran: list[str] = []
            nameless = [c.error for c in answer.tool_calls if not c.name]
            left_out = named[MAX_CALLS_ANSWERED:]
            answering = {c.id for c in answered}  # ids are unique in an answer
            # Each of these would only say "not run": one note (and one log line) says it.
            budget.refused += sum(1 for c in left_out if not c.error)
            for n, call in enumerate(answer.tool_calls):
                if call.id not in answering:  # no name (nothing to answer), or past the limit
                    continue
                refusal = _refusal(n, len(answer.tool_calls), budget)
                if call.error:
                    out = (f"error: {call.error}; this "
                           f"call was not run: call {call.name} again with its arguments "
                           "as one JSON object")
                elif refusal is None:
                    budget.used += 1
                    made.append(call.name)
                    ran.append(call.name)
                    out = await _run_one(dispatch, call.name, call.arguments)
                else:
                    budget.refused += 1
                    out = refusal
                convo.append({"role": "tool", "tool_call_id": call.id, "content": out})
            if nameless or left_out:
                _tell_unanswered(convo, nameless, len(left_out))
                log.warning("%d tool call(s) of answer %d not answered: %d without a "
                            "name (%s), %d past the first %d", len(nameless) + len(left_out),
                            steps, len(nameless), "; ".join(nameless[:1]) or "-",
                            len(left_out), MAX_CALLS_ANSWERED)
            refused = len([c for c in answer.tool_calls if not c.error]) - len(ran)
            if on_step is not None:
                on_step(steps, f"ran {', '.join(ran) or 'no tool'}"
                        + (f" ({refused} call(s) refused)" if refused else ""))
            if budget.spent() and refused:
                return LoopResult("", steps, made, False, convo, BUDGET_SPENT,
                                  budget.why_spent())
    if scope.cancelled_caught:
        raise LoopFailed(
            f"the chat model did not finish within {deadline_s:g} s ({steps} steps, "
            f"{len(made)} tool calls)")
    last = convo[-1]["content"] if convo else None
    return LoopResult(last if isinstance(last, str) else "", steps, made, False, convo)


def within_budget(convo: list[ChatMessage]) -> list[ChatMessage]:
    """The conversation as a request sends it: the tool results whole, the latest first,
    up to :data:`MAX_RESULTS_CHARS` in all; each older one past that (longer than the
    line that replaces it) is one line naming its tool. Every message stays in its place,
    each result answering its call as before; ``convo`` is left as it is."""
    names = {call["id"]: call["function"]["name"] for m in convo
             for call in m.get("tool_calls") or ()}
    sent = list(convo)
    kept = 0
    for i in range(len(convo) - 1, -1, -1):
        msg = convo[i]
        text = msg["content"]
        if msg["role"] != "tool" or not text:
            continue
        cost = text_cost(text)
        if kept + cost <= MAX_RESULTS_CHARS:
            kept += cost
            continue
        name = names.get(msg.get("tool_call_id", ""), "the tool")
        line = (f"[left out: this result of {name} ({len(text)} characters) was read "
                f"earlier; later results took its room in the conversation. Call {name} "
                "again to see it before you rely on it]")
        if len(line) < len(text):
            sent[i] = msg.copy()
            sent[i]["content"] = line
    return sent


def context_exceeded(exc: ProviderRejected) -> bool:
    """Whether the provider refused a request as too long for the model's context (or,
    413, for its server)."""
    return exc.status == 413 or (exc.status in (400, 422)
                                 and bool(_CONTEXT_EXCEEDED.search(exc.message)))


def _tell_unanswered(convo: list[ChatMessage], errors: list[str], past: int) -> None:
    """Tell the model of the calls of its last answer that were dropped: those without a
    function name (or not an object; ``errors`` says why), which have no id of their own
    to answer, and the ``past`` ones after the first :data:`MAX_CALLS_ANSWERED`, which
    were left out of the conversation. The last tool result of that answer says it, in
    a note of bounded length (every server takes a tool result; not all a user turn
    there). Its answer had a call with a name, or it would have failed as a whole."""
    last = convo[-1]
    note = ""
    if errors:
        quoted = "; ".join(errors[:_REASONS_QUOTED])
        more = len(errors) - _REASONS_QUOTED
        note += (f"\n\nerror: {len(errors)} other call(s) of that answer were not run: "
                 f"{quoted}{f'; and {more} more' if more > 0 else ''}. Each call needs the "
                 "name of one of the tools offered and its arguments as one JSON object; "
                 "call again what is still needed")
    if past:
        note += (f"\n\nerror: refused: {past} more call(s) of that answer, past its first "
                 f"{MAX_CALLS_ANSWERED}, were not run; only the first "
                 f"{MAX_CALLS_PER_ANSWER} of one answer are run. Ask again for what is "
                 "still needed, a few calls at a time")
    last["content"] = (last["content"] or "") + note


def _refusal(n: int, calls: int, budget: ToolBudget) -> str | None:
    """Why call ``n`` (0-based) of an answer of ``calls`` is not run, or None to run it."""
    if n >= MAX_CALLS_PER_ANSWER:
        return (f"error: refused: this answer asked for {calls} tool calls; only the first "
                f"{MAX_CALLS_PER_ANSWER} of one answer are run. Ask again for what is "
                "still needed, a few calls at a time")
    if budget.spent():
        return (f"error: refused: this run has used all of its {budget.limit} tool calls; "
                "this call was not run")
    return None


async def _run_one(dispatch: Dispatch, name: str, arguments: JsonObject) -> str:
    """One tool call's result for the model: its errors as text, cut to a bounded size."""
    try:
        out = await dispatch(name, arguments)
    except Exception as exc:  # the model hears about it; the job goes on
        log.warning("tool %s failed: %s", name, exc)
        out = f"error: {type(exc).__name__}: {exc}"
    if (n := chars_within(out, MAX_TOOL_RESULT_CHARS)) < len(out):
        out = cut_text(out, n) + "\n[truncated]"
    return out


class ChatClients:
    """One workspace's chat client: made on first use from the workspace's
    ``chat_model_config`` and the daemon's provider bridge, made again when that
    configuration changes. Its status joins the workspace's as ``chat``. Clients of
    workspaces sending to one endpoint with one key for one model share their breaker
    and Retry-After wait through ``lines``; ``on_back`` is called when that provider
    answers again after it was unavailable (whichever workspace's call found it so)."""

    def __init__(self, ws: Workspace, bridge: ProviderBridge, lines: ChatLines | None = None,
                 on_back: Callable[[], None] | None = None) -> None:
        self._ws = ws
        self._bridge = bridge
        self._lines = lines
        self._on_back = on_back
        self._config: ChatModelConfig | None = None
        self._client: ChatClient | None = None

    def client(self) -> ChatClient:
        """The client; ProviderConfigError("no chat model configured") without a model."""
        config = self._ws.settings.chat_model_config
        if config is None or not config.model_name:
            raise ProviderConfigError(NO_CHAT_MODEL)
        if self._client is None or self._config != config:
            from recalld.daemon.providers.chat import ChatClient

            if self._client is not None:
                self._client.line.unwatch(self)
            self._client = ChatClient(config, self._bridge, lines=self._lines)
            self._client.line.watch(self)
            self._config = config
            self._ws.add_status("chat", self._client.status)
        return self._client

    def provider_back(self) -> None:
        """The workspace's chat provider answers again after it was unavailable."""
        if self._on_back is not None:
            self._on_back()

    def client_or_none(self) -> ChatClient | None:
        """The client, or None when the workspace has no (usable) chat model."""
        try:
            return self.client()
        except ProviderConfigError:
            return None
