"""Running one call of a connection: the dispatch, its wire answer, counters and metrics.

:func:`run_call` turns what the dispatcher returned or raised into the answer to send
(client errors as their codes, anything else as a logged internal error) and keeps the
server's shared :class:`CallCounters` and the per-method metrics. It starts no task;
cancelling it cancels the call, which then has no answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson

from recalld.daemon import metrics
from recalld.daemon.errors import client_error
from recalld.ipc import errors
from recalld.ipc.protocol import Answer, Request, error_response, result_response

log = logging.getLogger(__name__)
P = TypeVar("P")
# An error message (and each text of its data) is sent whole up to some 2 KiB (a long
# path and its reason); longer, its middle is cut (see shown_message).
MESSAGE_END_CHARS = 1000  # what the dispatcher is given of the connection


@dataclass(slots=True)
class CallCounters:
    """Counters the connections of one server share (``daemon.status`` shows them)."""

    calls_in_flight: int = 0
    requests_total: int = 0
    errors_total: int = 0
    timeouts_total: int = 0


def shown_message(message: str) -> str:
    """``message`` as sent: one that quotes what the client sent (a method name, a param,
    a path) is kept to its first and last :data:`MESSAGE_END_CHARS` characters, so that
    the reason, often at its end, stays and the client's input does not come back whole."""
    if len(message) <= 2 * MESSAGE_END_CHARS + 100:
        return message
    cut = len(message) - 2 * MESSAGE_END_CHARS
    return (f"{message[:MESSAGE_END_CHARS]}…[{cut} characters cut]…"
            f"{message[-MESSAGE_END_CHARS:]}")


def shown_data(data: object) -> object:
    """An error's ``data`` as sent: each text in it, at any depth (keys too), cut as
    :func:`shown_message` cuts a message, since it too may quote the client's input
    (a path, a name) and must not send a long one back whole."""
    if isinstance(data, str):
        return shown_message(data)
    if isinstance(data, dict):
        return {shown_message(k) if isinstance(k, str) else k: shown_data(v)
                for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [shown_data(v) for v in data]
    return data


async def run_call(dispatch: Callable[[Request, P], Awaitable[object]], request: Request,
                   peer: P, counters: CallCounters) -> Answer | None:
    """The answer to ``request`` (None for a notification), run by ``dispatch``."""
    counters.requests_total += 1
    counters.calls_in_flight += 1
    started = time.perf_counter()
    label = request.method
    response: Answer
    try:
        result = await dispatch(request, peer)
    except Exception as exc:
        err = client_error(exc)
        counters.errors_total += 1
        if isinstance(err, errors.MethodNotFound):
            label = "unknown"  # made-up names must not grow the metric table
        metrics.count("recalld_rpc_errors_total", labels=metrics.method_labels(label))
        if err is None:
            log.exception("method %s failed", request.method)
            response = error_response(request.id, errors.INTERNAL_ERROR, "internal error")
        else:
            response = error_response(request.id, err.code, shown_message(err.message),
                                      shown_data(err.data))
    else:
        response = result_response(request.id, result)
    finally:
        counters.calls_in_flight -= 1
        metrics.observe("recalld_rpc_seconds", time.perf_counter() - started,
                        metrics.method_labels(label))
    return None if request.is_notification else response


def encodable(answer: Answer | None) -> Answer | None:
    """``answer``, or an internal error in its place if JSON cannot carry its result."""
    if answer is None:
        return None
    try:
        orjson.dumps(answer)
    except orjson.JSONEncodeError:
        log.error("result of call %r is not JSON-serializable", answer.get("id"))
        return error_response(answer.get("id"), errors.INTERNAL_ERROR, "internal error")
    return answer
