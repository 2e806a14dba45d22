"""What one method call is, and the helpers the method table builds its calls with.

A :class:`Call` carries the wire method name, its params (``None`` values left out by
:func:`_params`) and a function that turns the raw result into its typed shape
(:func:`_answer`, :func:`_as_list`, :func:`_as_dict`). The builders of
:mod:`recalld.ipc._methods` make one per daemon method; :func:`raw_call` makes the untyped
one of ``client.call``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from recalld.ipc.answers import JsonObject

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Call(Generic[T_co]):
    """One method call, ready to send: ``parse`` turns the raw result into ``T``."""

    method: str
    params: JsonObject | list[object]
    parse: Callable[[object], T_co]


def _params(**values: object) -> JsonObject:
    # Optional arguments left at None are not sent, so the daemon's defaults apply.
    return {k: v for k, v in values.items() if v is not None}


def _listed(value: Iterable[T], name: str) -> list[T]:
    """The list of a method's sequence argument ``name`` (``ids``, ``agents``,
    ``topics``, ``messages``); TypeError for one string, which ``list()`` would split into
    its characters: ``inbox_ack(agent, "12")`` marked items 1 and 2 seen, not item 12."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{name} must be a list, not one string {value!r}")
    return list(value)


def _mapped(value: Mapping[str, object], name: str) -> dict[str, object]:
    """A method's mapping argument ``name`` (``config``, ``filters``, ``params``, each of
    ``messages``) as a dict; TypeError naming it for anything else, not ``dict()``'s
    "dictionary update sequence element #0 ..." naming nothing the caller set."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping (a dict), not {type(value).__name__}")
    return dict(value)


def _identity(value: T) -> T:
    return value


def _as_dict(value: object) -> JsonObject:
    return value if isinstance(value, dict) else {"result": value}


def _answer(shape: type[T]) -> Callable[[object], T]:
    """The parser of an answer typed ``shape`` (a TypedDict): the decoded object as it is,
    typed, not checked (see :mod:`recalld.ipc.answers`)."""
    return cast(Callable[[object], T], _as_dict)


def _as_list(key: str, shape: type[T]) -> Callable[[object], list[T]]:
    """The parser of an answer that lists ``shape`` items under ``key``; a bare array is
    accepted too (e.g. ``{"workspaces": [...]}`` or ``[...]``)."""

    def parse(value: object) -> list[T]:
        if isinstance(value, list):
            return cast(list[T], value)
        if isinstance(value, dict) and isinstance(value.get(key), list):
            return cast(list[T], value[key])
        raise TypeError(f"expected a list of {key}, got {type(value).__name__}")

    return parse


#: What ``client.call`` sends as params: named (a mapping) or, to the methods that take
#: their first params by position, positional (a list or a tuple).
Params = Mapping[str, object] | list[object] | tuple[object, ...]


def raw_call(method: str, params: Params | None = None) -> Call[Any]:
    """An untyped call, as ``client.call`` makes: the raw result comes back. TypeError
    for ``params`` neither a mapping nor a list or tuple (a string, a set, a number)."""
    if params is None:
        return Call(method, {}, _identity)
    if isinstance(params, Mapping):
        if not all(isinstance(k, str) for k in params):
            raise TypeError(f"{method}: the names of params must be strings")
        return Call(method, dict(params), _identity)
    if isinstance(params, list | tuple):
        return Call(method, list(params), _identity)
    raise TypeError(f"{method}: params must be a mapping of named params or a list (or "
                    f"tuple) of positional ones, not {type(params).__name__}")
