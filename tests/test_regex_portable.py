"""The daemon's regular expressions use no possessive quantifier and no atomic group.

Python 3.11 added both, but before 3.11.5 a possessive repeat of a group that can
backtrack matched wrongly (gh-106052): a pattern right on this interpreter could skip
secrets or split words differently on another 3.11. Checked on the parsed patterns of
every module (module constants, and the patterns inside the records they hold).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
from collections.abc import Iterator
from re import _parser  # type: ignore[attr-defined]  # the parse tree names the opcodes

import recalld.daemon
import recalld.ipc

_FORBIDDEN = {"POSSESSIVE_REPEAT", "ATOMIC_GROUP"}


def _modules() -> Iterator[object]:
    for package in (recalld.daemon, recalld.ipc):
        yield package
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.endswith(".__main__"):  # runs a command line when imported
                continue
            try:
                yield importlib.import_module(info.name)
            except ImportError:  # an optional dependency (e.g. the ReMe bridge's)
                continue


def _patterns(value: object, depth: int = 0) -> Iterator[re.Pattern[str]]:
    if isinstance(value, re.Pattern):
        yield value
    elif depth < 3 and isinstance(value, (tuple, list, frozenset, set)):
        for item in value:
            yield from _patterns(item, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            yield from _patterns(item, depth + 1)
    elif depth < 3 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _patterns(getattr(value, field.name, None), depth + 1)


def _opcodes(tree: object) -> Iterator[str]:
    for op, arg in tree:  # type: ignore[attr-defined]
        yield str(op)
        args = arg if isinstance(arg, (tuple, list)) else (arg,)
        for a in args:
            if isinstance(a, _parser.SubPattern):
                yield from _opcodes(a)
            elif isinstance(a, (tuple, list)):
                for b in a:
                    if isinstance(b, _parser.SubPattern):
                        yield from _opcodes(b)


def test_no_pattern_uses_possessive_repeats_or_atomic_groups() -> None:
    seen: dict[str, set[str]] = {}
    checked = 0
    for module in _modules():
        for name, value in vars(module).items():
            for pattern in _patterns(value):
                checked += 1
                if isinstance(pattern.pattern, str):
                    found = _FORBIDDEN & set(_opcodes(_parser.parse(pattern.pattern,
                                                                    pattern.flags)))
                    if found:
                        seen.setdefault(f"{module.__name__}.{name}", set()).update(found)  # type: ignore[attr-defined]
    assert checked > 50  # the tokenizer's, redaction's and the chunker's at least
    assert not seen, seen


def test_the_check_finds_them() -> None:
    for source in (r"a++", r"(?:ab|a)*+c", r"(?>a|ab)c", r"x{0,15}+y"):
        assert _FORBIDDEN & set(_opcodes(_parser.parse(source, 0))), source
    assert not _FORBIDDEN & set(_opcodes(_parser.parse(r"(?:\+\+|#|\+(?!a))?[+]+", 0)))
