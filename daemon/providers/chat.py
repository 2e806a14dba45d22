"""OpenAI-compatible chat completions with tool calling (vLLM, llama.cpp server, Ollama's
/v1, DashScope compatible mode, OpenAI), through the provider bridge with retries and a
circuit breaker; clients of one endpoint, key and model share the breaker and the
provider's Retry-After (:mod:`~recalld.daemon.providers.chat_lines`).

:class:`ChatClient` starts no task. ``complete`` sends one ``POST {base_url}/chat/completions``
(retried per the policy) and returns a :class:`ChatResult`; every malformed answer becomes a
:class:`ProviderBadResponse` with a clear message, never a crash; a tool call that cannot
be read beside readable ones comes back with its ``error`` instead (the readable ones are
still carried out; an answer of none readable is malformed). With no model configured,
calls raise ``ProviderConfigError("no chat model configured")``, which a client sees as
ProviderUnavailable. The API key comes from the config, else RECALLD_CHAT_API_KEY,
else OPENAI_API_KEY; it never appears in logs, reprs or status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict

import orjson

from recalld.daemon import metrics
from recalld.daemon.config import ChatModelConfig
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.redact import redact_messages_async
from recalld.daemon.memory.turns import THINKING
from recalld.daemon.providers.breaker import BreakerConfig, BreakerState, CircuitBreaker
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat_lines import ChatLine, ChatLines
from recalld.daemon.providers.embedding_keys import first_key
from recalld.daemon.providers.errors import (
    NO_CHAT_MODEL as NO_CHAT_MODEL,
)
from recalld.daemon.providers.errors import (
    CircuitOpen,
    CutToolCall,
    MalformedToolCall,
    ProviderBadResponse,
    ProviderConfigError,
    ProviderError,
    ProviderRetryableStatus,
    mask_model,
    redact,
    redact_url,
    snippet,
)
from recalld.daemon.providers.json_answers import not_json, without_bom
from recalld.daemon.providers.retry import RetryPolicy, call_with_retry, check_response

DEFAULT_CHAT_BASE_URL = "https://api.openai.com/v1"


class FunctionCall(TypedDict):
    """The function part of a tool call as the wire carries it: arguments as JSON text."""

    name: str
    arguments: str


class WireToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(TypedDict):
    """One message of a conversation sent to the model (OpenAI format)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None
    tool_calls: NotRequired[list[WireToolCall]]
    tool_call_id: NotRequired[str]


class FunctionSchema(TypedDict):
    name: str
    description: str
    parameters: JsonObject  # a JSON Schema


class ToolSchema(TypedDict):
    """A tool offered to the model."""

    type: Literal["function"]
    function: FunctionSchema


def function_tool(name: str, description: str, parameters: JsonObject) -> ToolSchema:
    """A tool entry offering function ``name`` whose arguments follow JSON Schema
    ``parameters``."""
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


class ChatRequest(TypedDict):
    """The body of ``POST /chat/completions``."""

    model: str
    messages: list[JsonObject]  # ChatMessages, redacted
    temperature: float
    max_tokens: int
    tools: NotRequired[list[ToolSchema]]
    tool_choice: NotRequired[str | JsonObject]


class ChatStatus(TypedDict):
    enabled: bool
    model: str
    endpoint: str
    breaker: BreakerState
    last_error: str | None
    last_ok: float | None
    #: Seconds before a call is sent again (the provider's Retry-After after
    #: ``last_error``, capped; an open breaker); None when calls go out now.
    wait_s: float | None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a chat model's answer."""

    id: str
    name: str
    arguments: JsonObject  # as the model wrote them: the tool checks them
    #: Why this call could not be read (its arguments not a JSON object; no function
    #: name): it is not run, and the model is answered with this. '' for a readable call.
    error: str = ""


@dataclass(frozen=True, slots=True)
class ChatResult:
    """A chat model's answer: its text, tool calls and why it ended."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: JsonObject = field(default_factory=dict)  # provider-specific counts, passed on
    #: Why the model declined to answer (OpenAI's ``refusal``): no answer at all.
    refusal: str | None = None

    def assistant_message(self) -> ChatMessage:
        """This answer as a message to append to the conversation for the next turn."""
        msg: ChatMessage = {"role": "assistant", "content": self.content}
        # An unreadable call goes back with empty arguments (servers that render the
        # conversation parse them again), one without a name not at all: it has no result.
        calls = [c for c in self.tool_calls if c.name]
        if calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name,
                              "arguments": orjson.dumps(c.arguments).decode()}}
                for c in calls
            ]
        return msg


def resolve_chat_api_key(config: ChatModelConfig, environ: Mapping[str, str]) -> str:
    """Config value, then RECALLD_CHAT_API_KEY, then OPENAI_API_KEY (:func:`first_key`)."""
    return first_key(config.api_key, environ, ("RECALLD_CHAT_API_KEY", "OPENAI_API_KEY"))


# Tool arguments some models wrap in a Markdown code fence (```json ... ```): its opening
# here, the rest read in Python (:func:`_fenced_body`). A lazy body before ``\s*```$``
# read the whitespace after each of its characters again, by the square of a run's
# length (arguments holding 16,000 spaces took 1.3 s).
_FENCE_OPEN = re.compile(r"```[\w-]*\s*")


def _fenced_body(text: str) -> str | None:
    """What a code fence that is all of ``text`` holds (without the spaces around it);
    None when ``text`` is no such fence."""
    opening = _FENCE_OPEN.match(text)
    if opening is None or not text.endswith("```") or opening.end() > len(text) - 3:
        return None
    return text[opening.end():len(text) - 3].rstrip()


def _bad(message: str) -> ProviderBadResponse:
    return ProviderBadResponse(f"chat completion: {message}")


def _bad_call(message: str) -> MalformedToolCall:
    return MalformedToolCall(f"chat completion: {message}")


def _parse_tool_call(raw: object, index: int) -> ToolCall:
    if not isinstance(raw, dict):
        raise _bad_call(f"tool call {index} is not an object")
    fn = raw.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _bad_call(f"tool call {index} has no function name")
    args_raw = fn.get("arguments")
    args: object
    if args_raw is None:  # a function without arguments, as some servers send it
        args_raw = "{}"
    if isinstance(args_raw, dict):  # some servers (Ollama) send an object, not a string
        args = args_raw
    elif isinstance(args_raw, str):
        try:
            fenced = _fenced_body(args_raw.strip())
            text = args_raw if fenced is None else fenced
            args = orjson.loads(text) if text.strip() else {}
        except orjson.JSONDecodeError:
            raise _bad_call(
                f"arguments of tool call {index} ({fn['name']}) are not valid JSON"
            ) from None
    else:
        raise _bad_call(f"arguments of tool call {index} ({fn['name']}) are not a JSON string")
    if isinstance(args, str):  # encoded twice (some servers): the object is inside
        with contextlib.suppress(orjson.JSONDecodeError):
            args = orjson.loads(args)
    if not isinstance(args, dict):
        raise _bad_call(f"arguments of tool call {index} ({fn['name']}) are not a JSON object")
    call_id = raw.get("id")
    return ToolCall(id=str(call_id) if call_id else f"call_{index}", name=fn["name"],
                    arguments=args)


def _part_text(part: object, index: int) -> str:
    """The text of one content part ('' for a part without text)."""
    if not isinstance(part, dict):
        return ""
    text = part.get("text")
    if isinstance(text, str):
        return text
    if part.get("type", "text") == "text":
        raise _bad(f"message content part {index} has no text")
    return ""


def parse_chat_response(body: bytes, secret: str = "") -> ChatResult:
    """Parse a chat.completion answer; malformed answers raise ProviderBadResponse
    (``secret``, the key sent, is masked where the answer quotes it)."""
    body = without_bom(body)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if body.lstrip().startswith((b"data:", b"event:")):
            raise _bad("answer is an event stream, not one JSON object (the server "
                       "streams its answers; recalld does not ask it to)") from None
        raise _bad(not_json(body, exc, secret)) from None
    if not isinstance(data, dict):
        raise _bad("answer is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        error = data.get("error")  # some servers answer an error with status 200
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            raise _bad("answer has no choices but an error: "
                       + snippet(error["message"], 500, secret))
        raise _bad("answer has no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _bad("first choice has no message")
    content = message.get("content")
    refusal = message.get("refusal")
    if content is not None and not isinstance(content, str):
        if isinstance(content, list):  # content parts: keep the text ones
            if not isinstance(refusal, str):  # a refusal may come as a part of its own
                refusal = " ".join(p["refusal"] for p in content if isinstance(p, dict)
                                   and isinstance(p.get("refusal"), str))
            content = "".join(_part_text(p, i) for i, p in enumerate(content))
        else:
            raise _bad("message content is not text")
    if content is not None:
        content = THINKING.sub("", content, count=1)
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _bad("tool_calls is not a list")
    legacy = message.get("function_call")
    if not raw_calls and legacy is not None:
        # The one call of the functions API that tools replaced (older Azure OpenAI API
        # versions and servers modelled on them answer so): a call all the same.
        raw_calls = [{"type": "function", "function": legacy}]
    finish = choice.get("finish_reason")
    calls = _unique_ids([_read_tool_call(raw, i, finish) for i, raw in enumerate(raw_calls)])
    unreadable = [c.error for c in calls if c.error]
    if unreadable and len(unreadable) == len(calls):  # nothing to carry out
        raise _bad_call(unreadable[0])
    usage = data.get("usage")
    return ChatResult(
        content=content,
        tool_calls=calls,
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage if isinstance(usage, dict) else {},
        refusal=(refusal.strip() or None) if isinstance(refusal, str) else None,
    )


def _read_tool_call(raw: object, index: int, finish: object) -> ToolCall:
    """Call ``index`` of an answer; one that cannot be read comes back with its
    ``error`` (and no arguments), so the others of its answer are still carried out."""
    try:
        return _parse_tool_call(raw, index)
    except MalformedToolCall as exc:
        if finish in ("length", "max_tokens"):
            # A call cut off mid-way: the limit is the cause, not the model's JSON.
            raise CutToolCall(f"chat completion: the answer stopped at its length limit "
                              f"inside a tool call (raise max_tokens in chat_model_config): "
                              f"{exc.message.removeprefix('chat completion: ')}") from None
        fn = raw.get("function") if isinstance(raw, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        call_id = raw.get("id") if isinstance(raw, dict) else None
        return ToolCall(id=str(call_id) if call_id else f"call_{index}",
                        name=name if isinstance(name, str) else "", arguments={},
                        error=exc.message.removeprefix("chat completion: "))


def _unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """``calls`` with ids unique in the answer (a server that repeats one would have each
    result taken for the first call's): a repeated id gets the call's index."""
    seen: set[str] = set()
    out: list[ToolCall] = []
    for i, call in enumerate(calls):
        if call.id in seen:
            call = dataclasses.replace(call, id=f"{call.id}_{i}")
        seen.add(call.id)
        out.append(call)
    return out


class ChatClient:
    """Chat completions against one OpenAI-compatible endpoint."""

    def __init__(
        self,
        config: ChatModelConfig | None,
        bridge: ProviderBridge | None,
        *,
        policy: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        rng: random.Random | None = None,
        environ: Mapping[str, str] | None = None,
        lines: ChatLines | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.config = config or ChatModelConfig()
        self._bridge = bridge
        self._api_key = resolve_chat_api_key(self.config, env)
        self.policy = policy or RetryPolicy(
            deadline_s=self.config.timeout_s * 2, attempt_timeout_s=self.config.timeout_s,
        )
        #: The breaker and Retry-After wait, shared through ``lines`` with every client
        #: of the same endpoint, key, backend, model and breaker settings (else this
        #: client's own).
        settings = BreakerConfig(open_base_s=self.config.breaker_open_s,
                                 open_max_s=self.config.breaker_open_max_s)
        self.line = (lines.line(self.config.backend, self.endpoint, self._api_key,
                                self.config.model_name, settings)
                     if lines is not None and breaker is None else ChatLine(
                         breaker or CircuitBreaker(settings,
                                                   name=f"chat provider {self.config.backend}")))
        self.breaker = self.line.breaker
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self.last_error: str | None = None
        self.last_ok: float | None = None

    def __repr__(self) -> str:
        endpoint = redact_url(self.endpoint, self._api_key)
        model = mask_model(self.config.model_name)
        return f"ChatClient(model={model!r}, endpoint={endpoint!r}, api_key=***)"

    @property
    def enabled(self) -> bool:
        return bool(self.config.model_name)

    @property
    def endpoint(self) -> str:
        base = (self.config.base_url or DEFAULT_CHAT_BASE_URL).rstrip("/")
        return base if base.endswith("/chat/completions") else f"{base}/chat/completions"

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSchema] | None = None,
        *,
        tool_choice: str | JsonObject | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> ChatResult:
        """One chat completion (retried per the policy).

        Raises ProviderConfigError(NO_CHAT_MODEL) without a model, ProviderTransient after
        retries are exhausted, ProviderPermanent for rejected or malformed answers. While
        the provider's last Retry-After (capped by the policy) runs, it raises
        ProviderRetryableStatus at once and sends nothing: asking again would only be
        refused again (a job's turns stay pending; a search falls back).
        Cancellation cancels the HTTP attempt in flight. Secrets in the messages are
        redacted before they leave (whatever the caller put in them).
        """
        if not self.enabled:
            raise ProviderConfigError(NO_CHAT_MODEL)
        bridge = self._bridge
        if bridge is None:
            raise ProviderConfigError("no provider bridge to send chat requests through")
        if (quiet := self.quiet_s()) > 0:
            raise ProviderRetryableStatus(
                f"chat {mask_model(self.config.model_name)}: the chat provider asked to wait "
                f"{quiet:.0f}s more (Retry-After) after: {self.line.quiet_error}",
                retry_after_s=quiet)
        body: ChatRequest = {
            "model": self.config.model_name,
            "messages": await redact_messages_async(messages),
            "temperature": self.config.temperature if temperature is None else temperature,
            "max_tokens": self.config.max_tokens if max_tokens is None else max_tokens,
        }
        if tools:
            body["tools"] = list(tools)
            body["tool_choice"] = tool_choice if tool_choice is not None else "auto"
        elif tool_choice is not None:
            body["tool_choice"] = tool_choice
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        what = f"chat {mask_model(self.config.model_name)}"
        url = self.endpoint

        async def attempt(timeout_s: float) -> ChatResult:
            result = await bridge.request("POST", url, headers=headers, json=body,
                                          timeout_s=timeout_s)
            check_response(result, self.policy, what=what, secret=self._api_key)
            return parse_chat_response(result.body, self._api_key)

        def told(delay_s: float, exc: ProviderError) -> None:
            self._asked_to_wait(exc, delay_s)  # other calls keep off while this one waits
            self.line.unavailable()

        started = time.monotonic()
        try:
            answer = await call_with_retry(self.policy, attempt, rng=self._rng,
                                           breaker=self.breaker, what=what,
                                           on_wait=told, secret=self._api_key)
        except ProviderError as exc:
            self._asked_to_wait(exc, exc.retry_after_s)
            metrics.count("recalld_chat_errors_total")
            if exc.transient:
                self.line.unavailable()
            else:  # it answered, refusing this request only
                self.line.answered(ok=False)
            raise
        finally:
            metrics.observe("recalld_chat_seconds", time.monotonic() - started)
        self.last_ok = time.time()
        self.line.answered(ok=True)  # it answers again: a Retry-After is over
        return answer

    def _asked_to_wait(self, exc: ProviderError, wait_s: float | None) -> None:
        """Keep ``exc`` as the last error; when the provider sent Retry-After with it
        (not an open circuit's wait, which the breaker keeps), hold calls ``wait_s``
        (capped by the policy)."""
        self.last_error = redact(str(exc), self._api_key)
        if wait_s is not None and exc.retry_after_s is not None and not isinstance(
                exc, CircuitOpen):
            self.line.hold(min(max(wait_s, 0.0), self.policy.retry_after_cap_s),
                           self.last_error)

    def quiet_s(self) -> float:
        """Seconds the provider's last Retry-After (capped) still asks to be left alone."""
        return self.line.quiet_s()

    def hold_s(self) -> float:
        """Seconds before a call is sent again: the Retry-After, an open breaker."""
        return max(self.breaker.retry_in_s(), self.quiet_s())

    def status(self) -> ChatStatus:
        """For daemon.status: no secrets."""
        return {
            "enabled": self.enabled,
            "model": mask_model(self.config.model_name),
            "endpoint": redact_url(self.endpoint, self._api_key),
            "breaker": self.breaker.snapshot().as_dict(),
            "last_error": self.last_error,
            "last_ok": self.last_ok,
            "wait_s": round(hold, 3) if (hold := self.hold_s()) > 0 else None,
        }
