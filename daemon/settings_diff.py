"""Which settings a ``workspace.open`` gave that the workspace does not use.

A workspace already open keeps the settings it was opened with: a second open with
another ``config`` (a rotated ``api_key``, another embedding model) is served by the
running workspace, which takes the new settings only when it is opened again (closed
first, or after a restart). :func:`not_applied` names the given fields whose value is
not the one in use, with the value in use (secrets masked as settings show them), so the
caller learns it rather than reading it in the docs. Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from recalld.daemon.config import ConfigError, WorkspaceSettings
from recalld.daemon.config_rules import SECRET_SETTING, mask_url
from recalld.daemon.dsn import mask_dsn

__all__ = ["not_applied", "shown_setting"]

#: Fields that say how the settings were read, not what they are.
_NOT_SETTINGS = frozenset({"ignored_fields"})


def shown_setting(key: str, value: object) -> object:
    """``value`` of setting ``key`` masked as settings show it (a nested table's values
    each so)."""
    if isinstance(value, str) and value:
        return ("***" if SECRET_SETTING.search(key)
                else mask_dsn(value) if key == "dsn"
                else mask_url(value) if "://" in value else value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: shown_setting(f.name, getattr(value, f.name))
                for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return list(value)
    return value


def not_applied(base: WorkspaceSettings, given: object,
                in_use: WorkspaceSettings) -> dict[str, object]:
    """The fields of ``given`` (``workspace.open``'s ``config``, applied over ``base``,
    the configuration's settings for the workspace) whose value is not the one
    ``in_use``: dotted field -> the value in use, shown masked. A field counts as given
    when ``given`` names it or changes it from ``base`` (a QwenPaw ``agent.json`` names
    its fields otherwise); one that differs only because a reload changed ``base`` is not
    given (``waiting_for_reopen`` says so). An empty ``given`` asks for ``base`` alone:
    every field counts."""
    if not isinstance(given, Mapping):
        return {}
    try:
        wanted = base.merged(given)
    except ConfigError:  # refused at the open already
        return {}
    named = set(_named(given))
    out: dict[str, object] = {}
    for dotted, key, asked, current, plain in _fields(wanted, in_use, base):
        if asked != current and (asked != plain or dotted in named or not given):
            out[dotted] = shown_setting(key, current)
    return out


def _named(given: Mapping[object, object]) -> Iterator[str]:
    for key, value in given.items():
        yield str(key)
        if isinstance(value, Mapping):
            yield from (f"{key}.{sub}" for sub in value)


def _fields(wanted: object, in_use: object, base: object,
            prefix: str = "") -> Iterator[tuple[str, str, object, object, object]]:
    """(dotted name, name, wanted, in use, base) of each field, one level into a table
    set on both sides."""
    assert dataclasses.is_dataclass(wanted)
    for f in dataclasses.fields(wanted):
        if f.name in _NOT_SETTINGS:
            continue
        asked, current = getattr(wanted, f.name), getattr(in_use, f.name, None)
        plain = getattr(base, f.name, None)
        if (not prefix and dataclasses.is_dataclass(asked)
                and dataclasses.is_dataclass(current) and type(asked) is type(current)):
            yield from _fields(asked, current,
                               plain if type(plain) is type(asked) else None,
                               f"{f.name}.")
        else:
            yield f"{prefix}{f.name}", f.name, asked, current, plain
