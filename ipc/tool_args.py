"""Why a tool's arguments do not fit its input schema, said in the schema's words: which
argument, what it must be and the kind of value given (``a string of 40 characters``),
never the value itself. A tool's arguments are what a model or an MCP client wrote; a key
pasted into the wrong one would otherwise come back unmasked in the error, to the
client's log and the model (the daemon, which masks what it quotes, never saw it).

The MCP bridge checks each call against the tool's schema (:func:`schema_error`); the
AgentScope tools, which take more shapes than their schemas say (one string for a list,
``"5"`` for a number, as models write them), read each argument with the
``*_argument`` functions, which raise :class:`ArgumentError` in the same words. Only
:func:`schema_error` needs ``jsonschema`` (which both the ``mcp`` and the ``agentscope``
extras bring) and imports it when called: the rest serves the command line of an install
without extras.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

from recalld.ipc.protocol import MAX_RESULTS


def schema_error(check: Draft202012Validator, args: object) -> str | None:
    """Why ``args`` do not pass ``check``, or None if they do."""
    from jsonschema.exceptions import best_match

    problem = best_match(check.iter_errors(args))
    if problem is None:
        return None
    where = "/".join(str(part) for part in problem.absolute_path)
    said = _wanted(problem)
    return f"{where}: {said}" if where else said


#: JSON Schema's type names as a message says them.
_KINDS = {"object": "an object", "array": "an array", "string": "a string",
          "integer": "an integer", "number": "a number", "boolean": "true or false",
          "null": "null"}


def _kind(value: object) -> str:
    """The JSON kind of ``value``, never the value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return f"a string of {len(value)} character{'' if len(value) == 1 else 's'}"
    if isinstance(value, list | tuple):
        return f"an array of {len(value)} item{'' if len(value) == 1 else 's'}"
    return "an object" if isinstance(value, dict) else "a value"


def _wanted(problem: ValidationError) -> str:
    """What the schema asks of the value ``problem`` refused, and the kind given."""
    rule, want = problem.validator, problem.validator_value
    if rule == "required":  # the names come from the schema; the one missing is found
        given = problem.instance if isinstance(problem.instance, dict) else {}
        missing = [n for n in want if n not in given] if isinstance(want, list) else []
        return f"{', '.join(missing) or 'an argument'} is required"
    if rule == "type":
        kinds = want if isinstance(want, list) else [want]
        return (f"must be {' or '.join(_KINDS.get(str(k), str(k)) for k in kinds)}, "
                f"not {_kind(problem.instance)}")
    if rule == "enum" and isinstance(want, list):
        return f"must be one of {', '.join(map(str, want))}"
    bounds = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "above",
              "exclusiveMaximum": "below"}
    if rule in bounds:
        return f"must be {bounds[str(rule)]} {want}"
    if rule in ("minLength", "maxLength"):
        most = "at least" if rule == "minLength" else "at most"
        return (f"must be {most} {want} characters long, not "
                f"{_kind(problem.instance)}")
    told = problem.schema.get("description") if isinstance(problem.schema, dict) else None
    if rule in ("anyOf", "oneOf") and isinstance(told, str):
        return f"fits none of the shapes it may take: {told}"
    return f"does not fit the tool's input schema ({rule})"


class ArgumentError(ValueError):
    """A tool argument of the wrong shape, said without its value."""


def text_argument(name: str, value: object) -> str:
    """``value``, a string; ArgumentError otherwise."""
    if isinstance(value, str):
        return value
    raise ArgumentError(f"{name}: must be a string, not {_kind(value)}")


def texts_argument(name: str, value: object) -> list[str]:
    """``value`` as a list of strings: one string, or a list of strings (numbers written
    as strings); ArgumentError for anything else (an object's keys are not its texts)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ArgumentError(f"{name}: must be an array of strings, not {_kind(value)}")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ArgumentError(f"{name}: each item must be a string, not {_kind(item)}")
    return [str(item) for item in items]


def whole_argument(name: str, value: object) -> int | None:
    """``value`` as a whole number (None if not given): an integer, or one written as a
    string or a float (``"5"``, ``5.0``, as models write them); ArgumentError otherwise."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdecimal() and value.strip().isascii():
        return int(value.strip())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ArgumentError(f"{name}: must be a whole number, not {_kind(value)}")



def count_argument(name: str, value: object) -> int | None:
    """``value`` as a count of hits (None if not given), read as :func:`whole_argument`
    does: at least 1 (ArgumentError naming the argument below that, where the daemon
    would name its own parameter), and above the daemon's cap (``MAX_RESULTS``) taken as
    that many."""
    count = whole_argument(name, value)
    if count is not None and count < 1:
        raise ArgumentError(f"{name}: must be at least 1")
    return None if count is None else min(count, MAX_RESULTS)
