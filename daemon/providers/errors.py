"""The provider error family: one root, two flat branches a caller can act on.

* :class:`ProviderTransient` - worth retrying later (connect errors, timeouts, 408/429/5xx,
  an open circuit breaker). Backfill keeps the work pending and tries again.
* :class:`ProviderPermanent` - retrying the same request will not help (4xx other than
  408/429, malformed answers, wrong vector dimensions, missing configuration). Backfill
  records the failure and does not spin on it.

Library exceptions (aiohttp, OSError, asyncio timeouts) are translated into these once, in the
bridge; nothing above the bridge sees a foreign exception. The family knows nothing of the
wire: ``recalld.daemon.errors`` maps every provider error to ``ProviderUnavailable`` where
it reaches a client.
Messages never contain API keys: bodies quoted from a provider are redacted (the key sent
and whatever the memory's redaction rules take for a credential), then cut short.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import ClassVar

from recalld.daemon.config_rules import URL_QUERY_SECRET, mask_url
from recalld.ipc.errors import RecalldError

log = logging.getLogger(__name__)

#: The message of the ProviderConfigError a workspace without a chat model gets.
NO_CHAT_MODEL = "no chat model configured"

_SECRETISH = re.compile(
    r"(?i)(sk-[A-Za-z0-9_\-]{8,}|AIza[0-9A-Za-z_\-]{20,}|(?:bearer|api[_-]?key)[\"'=:\s]+\S+)"
)

#: A secret shorter than this is masked only where it stands as a word of its own.
_WHOLE_WORD_BELOW = 8

#: The password of a URL's user part (``https://user:password@host``).
_URL_PASSWORD = re.compile(r"(://[^:@/\s?#]*):[^@/\s?#]*@")


def mask_given(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (a key, a password) masked; a short one ("k", a
    placeholder such as "none") only where it stands as a word of its own, not inside
    every word that holds it ("as***ed")."""
    for secret in secrets:
        if len(secret) >= _WHOLE_WORD_BELOW:
            text = text.replace(secret, "***")
        elif secret:
            text = re.sub(rf"(?<![^\W_]){re.escape(secret)}(?![^\W_])", "***", text)
    return text


def redact(text: str, *secrets: str) -> str:
    """``text`` with the given secrets, URL passwords, the values of URL query parameters
    named like a credential (as the settings show them) and anything that looks like an
    API key masked: a provider's answer may quote any token back (its own error about
    one, a proxy's), so the memory's redaction rules apply too."""
    text = mask_given(text, secrets)
    # Loaded on the first error: its rule set compiles at import, which a start that
    # meets no provider error never needs.
    from recalld.daemon.memory.redact import redact as redact_secrets

    text = URL_QUERY_SECRET.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", text))
    return redact_secrets(_SECRETISH.sub("***", text))


def redact_url(url: str, *secrets: str) -> str:
    """An endpoint ``url`` as status and a client's ``repr`` show it: the given secrets
    (the key sent) and what the settings mask in its base_url (:func:`mask_url`) masked.
    Unlike :func:`redact` of a provider's text, which may quote any token, it needs no
    redaction rules: their import costs a first status or workspace.open some 28 ms."""
    return mask_url(mask_given(url, secrets))


def mask_model(name: str) -> str:
    """A model name as status, the settings and log lines show it: what redaction masks
    (an API key pasted into ``model_name``) as ``[REDACTED]``, a real model id
    (``text-embedding-3-small``, ``ft:gpt-4o-mini:org:name:9abc12``) as it is. Only the
    redaction rules, not :func:`redact`'s looser patterns, which a model id may match."""
    if not name:
        return name
    from recalld.daemon.memory.redact import redact as redact_secrets

    return redact_secrets(name)


#: How far past the cut of an excerpt it is redacted: a token that the cut would split
#: is whole there, so no piece of it is shown.
_PAST_THE_CUT = 1024


def snippet(body: bytes | str, limit: int = 200, *secrets: str) -> str:
    """A short, printable, redacted excerpt of a provider's answer for error messages.
    ``secrets`` (the key sent, which a provider may quote back) and every other token are
    masked before the cut, so none shows even in part."""
    extra = max((len(s.encode()) for s in secrets), default=0) + _PAST_THE_CUT
    raw = body.encode() if isinstance(body, str) else body
    text = redact(raw[:limit + extra].decode("utf-8", "replace"), *secrets)
    return redact(text[:limit].replace("\n", " ")) + ("..." if len(raw) > limit else "")


class ProviderError(RecalldError):
    """Root of every error from an outbound provider call (the wire sees
    ``ProviderUnavailable``)."""

    transient: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        data: dict[str, object] = {"transient": self.transient}
        if status is not None:
            data["status"] = status
        super().__init__(message, data)
        #: HTTP status when the provider answered, else None.
        self.status = status
        #: The provider's Retry-After (seconds, uncapped), when it sent one.
        self.retry_after_s = retry_after_s


class ProviderTransient(ProviderError):
    """A failure that may go away: retry later."""

    transient = True


class ProviderPermanent(ProviderError):
    """A failure that repeats for the same request: do not retry it."""


class ProviderConnectError(ProviderTransient):
    """The connection could not be made or was dropped before a full answer."""


class ProviderTimeout(ProviderTransient):
    """A single attempt or the whole retried call ran past its deadline."""


class ProviderRetryableStatus(ProviderTransient):
    """The provider answered 408, 429 or 5xx."""


class CircuitOpen(ProviderTransient):
    """The circuit breaker is open; no request was sent. ``retry_after_s`` says when to probe."""


class ProviderRejected(ProviderPermanent):
    """The provider answered with a non-retryable status (400, 401, 403, 404, ...)."""


class ProviderBadResponse(ProviderPermanent):
    """The answer could not be understood (bad JSON, missing fields, wrong shapes)."""


class MalformedToolCall(ProviderBadResponse):
    """The answer came whole, but a tool call in it cannot be read (its arguments not a
    JSON object, no function name, cut off by the answer's length limit): what the model
    wrote for this conversation, not the server's failure; the same conversation may get
    it again."""


class CutToolCall(MalformedToolCall):
    """A tool call the answer's length limit (``max_tokens``) cut off mid-way: the model
    wrote more than the limit lets it; asked for less, it may fit."""


class ProviderFault(ProviderBadResponse):
    """A provider call failed with an error nobody foresaw (a defect here or in a library
    this call went through, met on some answer or state): that call's failure, not its
    caller's (a workspace, a job), and its answer taken for unusable (a text whose every
    answer meets it is parked as one whose answers are). Made by :func:`unexpected`,
    which logs the traceback."""


def unexpected(exc: Exception, what: str, *secrets: str) -> ProviderFault:
    """The :class:`ProviderFault` of ``exc``, raised by the call ``what``; its traceback
    is logged here, once (redacted: the error may quote the answer or the key sent); the
    error's message says what it was, not where."""
    import traceback

    said = redact(" ".join(f"{type(exc).__name__}: {exc}".split()), *secrets).rstrip(": ")
    trace = redact("".join(traceback.format_exception(exc)), *secrets).rstrip()
    log.error("%s failed unexpectedly: %s\n%s", redact(what, *secrets), said, trace)
    fault = ProviderFault(f"{what}: unexpected error: {said}")
    fault.__cause__ = exc
    return fault


class DimensionMismatch(ProviderBadResponse):
    """The provider returned vectors of a different dimension than configured."""


class ProviderConfigError(ProviderPermanent):
    """The provider is not configured or configured wrongly (no model, no key, bad backend)."""


def input_refused(exc: ProviderError) -> bool:
    """Whether the provider said it refuses a call for what it was given (HTTP
    400/413/422), which another split of the inputs may avoid, and not for its
    configuration (a key, a model, the dimensions). An answer that cannot be used is no
    such word (:func:`answer_at_fault`)."""
    return isinstance(exc, ProviderRejected) and exc.status in (400, 413, 422)


def answer_at_fault(exc: ProviderError) -> bool:
    """Whether the answer could not be used (not JSON, fields missing, another count of
    vectors than of texts, NaN or all-zero vectors): the provider's answer is at fault,
    which says nothing sure of the inputs (a truncated body, a gateway's page), unless it
    keeps going wrong for one text while others are embedded. Vectors of other
    dimensions than configured are the configuration's fault (every text's answer, the
    pings' too, has them) unless that too keeps going wrong for one text alone while
    others get vectors of the configured dimensions."""
    return isinstance(exc, ProviderBadResponse)


def status_error(
    status: int,
    body: bytes,
    *,
    retryable: frozenset[int],
    retry_after_s: float | None,
    what: str,
    secrets: tuple[str, ...] = (),
) -> ProviderError:
    """The typed error for a non-2xx answer: transient if ``status`` is in ``retryable``;
    the answer it quotes has ``secrets`` masked."""
    message = f"{what}: HTTP {status}: {snippet(body, 200, *secrets)}"
    cls: type[ProviderError] = (
        ProviderRetryableStatus if status in retryable else ProviderRejected
    )
    return cls(message, status=status, retry_after_s=retry_after_s)
