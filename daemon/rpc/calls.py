"""Running one call of a connection: the dispatch, its wire answer, counters and metrics.

:func:`run_call` turns what the dispatcher returned or raised into the answer to send
(client errors as their codes, their text masked and cut by :mod:`.echo`, anything
else as a logged internal error) and keeps the
server's shared :class:`CallCounters` and the per-method metrics. It starts no task;
cancelling it cancels the call, which then has no answer. :func:`run_calls` runs the calls
of one line (a batch) in order, within the limits on a batch's answers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import orjson

from recalld.daemon import metrics
from recalld.daemon.errors import client_error
from recalld.daemon.rpc.echo import shown_data, shown_message
from recalld.ipc import errors
from recalld.ipc.protocol import Answer, Incoming, Request, error_response, result_response

log = logging.getLogger(__name__)
P = TypeVar("P")

# A batch is answered in one frame, built in memory: once its answers pass this size, its
# remaining requests are answered with REQUEST_TOO_LARGE instead of being run (a batch of
# 100 reads would otherwise hold some 50 MB per connection that does not read).
MAX_BATCH_ANSWER_BYTES = 1024 * 1024
_BATCH_CUT = (f"the batch's answers passed {MAX_BATCH_ANSWER_BYTES >> 20} MiB before this call "
              "ran: send it again, alone or in a smaller batch")
NOT_RUN = "shutting down: this request was not run; send it again once the daemon is back"


@dataclass(slots=True)
class CallCounters:
    """Counters the connections of one server share (``daemon.status`` shows them)."""

    calls_in_flight: int = 0
    requests_total: int = 0
    errors_total: int = 0
    timeouts_total: int = 0


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


async def run_calls(dispatch: Callable[[Request, P], Awaitable[object]], incoming: Incoming,
                    peer: P, counters: CallCounters,
                    stopping: Callable[[], bool]) -> list[Answer | None]:
    """The answers of ``incoming``'s calls, run in order; in a batch, the requests
    after its answers passed :data:`MAX_BATCH_ANSWER_BYTES` are refused unrun
    (notifications still run: their answers are not kept), and once ``stopping()`` (the
    daemon stops), those not started are refused SHUTTING_DOWN (notifications dropped)."""
    answers: list[Answer | None] = []
    size = 0
    for call in incoming.calls:
        if stopping():
            counters.errors_total += 1
            answers.append(None if call.is_notification else
                           error_response(call.id, errors.SHUTTING_DOWN, NOT_RUN))
            continue
        if size > MAX_BATCH_ANSWER_BYTES and not call.is_notification:
            counters.errors_total += 1
            answers.append(error_response(call.id, errors.REQUEST_TOO_LARGE, _BATCH_CUT))
            continue
        answer = await run_call(dispatch, call, peer, counters)
        if incoming.is_batch and answer is not None:
            with contextlib.suppress(orjson.JSONEncodeError):  # sent as an internal error
                size += len(orjson.dumps(answer))
        answers.append(answer)
    return answers


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
