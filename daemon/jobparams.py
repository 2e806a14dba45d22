"""What a job kind takes in its ``params``: the checks ``JobManager.submit`` runs.

A kind registered with a :data:`ParamsCheck` has its params checked when it is submitted
(by a client's ``jobs.submit``, the dream cron or the capture pipeline alike): an unknown
or mistyped param is refused with InvalidParams there, at once, instead of being kept in
the job record, the journal and every ``job.state`` event, and failing the job later (or
never). Each kind's module states its fields with :func:`params_of` and the field checks
below. No I/O, no tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from recalld.daemon.jsontypes import JsonObject, integer_range
from recalld.ipc.errors import LOOKS_LIKE_A_CREDENTIAL, InvalidParams

#: Checks a submission's params: returns them as the job keeps them, or InvalidParams.
ParamsCheck = Callable[[Mapping[str, object]], JsonObject]
#: Checks one present (not null) field: ``(name, value)`` -> the value to keep.
FieldCheck = Callable[[str, object], object]
#: Longest text a generic text field takes (a cron occurrence is some 25 characters).
MAX_TEXT_CHARS = 64


def params_of(kind: str, fields: Mapping[str, FieldCheck],
              required: Collection[str] = ()) -> ParamsCheck:
    """The check of ``kind``'s params: exactly ``fields`` (a null one counts as left out
    and is not kept), those in ``required`` present."""

    def check(params: Mapping[str, object]) -> JsonObject:
        unknown = sorted(set(params) - set(fields))
        if unknown:
            known = ", ".join(sorted(fields)) or "none"
            raise InvalidParams(f"unknown {kind} job param(s): {', '.join(unknown)} "
                                f"(known: {known})")
        out: JsonObject = {}
        for name, field_check in fields.items():
            value = params.get(name)
            if value is None:
                if name in required:
                    raise InvalidParams(f"{kind} jobs need the param {name!r}")
                continue
            out[name] = field_check(name, value)
        return out

    return check


def choice(*values: str) -> FieldCheck:
    """A field that is one of ``values``."""

    def check(name: str, value: object) -> object:
        if value not in values:
            raise InvalidParams(f"job param {name!r} must be one of {', '.join(values)}")
        return value

    return check


def text(name: str, value: object) -> object:
    """A non-empty string of at most :data:`MAX_TEXT_CHARS` characters, never what
    redaction would mask: the job keeps it in its record, the journal on disk and every
    ``job.state`` event."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT_CHARS:
        raise InvalidParams(
            f"job param {name!r} must be a string of 1-{MAX_TEXT_CHARS} characters")
    # Imported on the first such param, not with the daemon (see daemon_methods).
    from recalld.daemon.memory.redact import masked_in

    if masked_in(value):
        raise InvalidParams(f"job param {name!r} looks like a credential",
                            {LOOKS_LIKE_A_CREDENTIAL: name})
    return value


def count(name: str, value: object) -> object:
    """An integer >= 0 (not a boolean)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidParams(f"job param {name!r} must be an integer >= 0{integer_range(value)}")
    return value


def flag(name: str, value: object) -> object:
    """A boolean."""
    if not isinstance(value, bool):
        raise InvalidParams(f"job param {name!r} must be true or false")
    return value
