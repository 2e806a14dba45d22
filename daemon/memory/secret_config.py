"""The context rule for credentials that configuration files set apart from their names
(:mod:`secret_rules` applies it):

- a YAML block scalar: ``PASSWORD: >-`` or ``token: |``, the value on the lines below,
  indented deeper;
- a name and value pair: the credential's name in a ``name``/``key`` field and its value in
  the ``value`` field after it, as Kubernetes and docker-compose environments
  (``- name: DB_PASS`` then ``value: ...``), ECS task definitions and CloudFormation
  parameters (JSON), Terraform blocks and .NET ``<add key="DbPassword" value="..."/>``
  settings write them;
- a credential element's ``value`` attribute (``<password value="..."/>``), and a label
  alone on its line with the value alone on the next ("Password:", then the value).

(A Markdown table's cells are read by :mod:`secret_tables`.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from recalld.daemon.memory.secret_context import (
    made_like_a_password,
    name_kind,
    names_a_source,
    phrase_words,
    strip_end,
    value_span,
)
from recalld.daemon.memory.secret_values import keyish, looks_random, looks_secret

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Span

_BLOCK = re.compile(r"(?P<key>[\"']?[A-Za-z_][\w.\-]{0,60}[\"']?)[ \t]*:[ \t]*[|>][+\-]?\d?"
                    r"[+\-]?[ \t]*(?:#[^\n]*)?\r?\n")
#: How far below a name its block or its value field may be.
_REACH = 400
_LINE = re.compile(r"([ \t]*)([^\n]*)\n?")


def _indent(text: str, pos: int) -> int:
    """The indentation of the line holding ``pos`` (a list item's ``- `` counts)."""
    line = text.rfind("\n", 0, pos) + 1
    head = text[line:pos]
    return len(head) - len(head.lstrip(" \t-"))


def _block(text: str, a: int) -> Span | None:
    m = _BLOCK.match(text, a)
    if m is None or (kind := name_kind(m.group("key"))) is None:
        return None
    depth = _indent(text, a)
    pos = m.end()
    first = end = -1
    lines: list[str] = []
    while pos < len(text) and pos - m.end() < _REACH:
        line = _LINE.match(text, pos)
        assert line is not None  # always matches
        if line.group(2).strip() and len(line.group(1)) <= depth:
            break
        if line.group(2).strip():
            first = line.start(2) if first < 0 else first
            end = line.end(2)
            lines.append(line.group(2).strip())
        pos = line.end()
    if first < 0:
        return None
    value = " ".join(lines)
    if kind in ("key", "datakey", "random"):
        joined = "".join(lines)
        ok = looks_random(joined, 12) if kind == "random" else keyish(
            joined, data=kind == "datakey")
        return (first, end) if ok else None
    span = value_span(kind, value, first, phrase_words(m.group("key")))
    return None if span is None else (first, end)


#: The field a name sits in, just before the anchor: ``name: ``, ``"key": "``, ``key="``.
_NAME_FIELD = re.compile(r"(?i)(?:^|[\s{,\[(<\"'])(?:name|key|parameterkey|variable|var"
                         r"|env|secretname)[\"']?[ \t]*[:=][ \t]*[\"']?$")
_NAME = re.compile(r"[A-Za-z_][\w.\-]{0,60}")
#: The value field after the name: ``value: ...``, ``"Value": "..."``, ``value="..."``.
_VALUE_FIELD = re.compile(
    r"(?i)(?<![\w\-])[\"']?(?:value|parametervalue|default)[\"']?[ \t]*[:=][ \t]*"
    r"(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}'|[^\s\"',}<>]{1,400})")
#: Where the name's record ends: a blank line, the end of an object, the next name.
_RECORD_END = re.compile(r"(?i)\n[ \t]*\n|}|/>|(?<![\w\-])[\"']?(?:name|key)[\"']?[ \t]*[:=]")


def _pair(text: str, a: int) -> Span | None:
    k = a
    while k > 0 and a - k < 8 and text[k - 1] in " \t\"'":
        k -= 1
    if k == 0 or text[k - 1] not in ":=":
        return None  # no field separator right before the name
    line = text.rfind("\n", max(0, a - 40), a) + 1
    if not _NAME_FIELD.search(text, max(line, a - 40), a):
        return None
    name = _NAME.match(text, a)
    if name is None or (kind := name_kind(name.group(0))) is None:
        return None
    stop = _RECORD_END.search(text, name.end(), name.end() + _REACH)
    m = _VALUE_FIELD.search(text, name.end(), stop.start() if stop else name.end() + _REACH)
    if m is None or names_a_source(text, m.start("value")):
        return None
    value = m.group("value")
    if value[:1] not in "\"'":
        value = strip_end(value)
    return value_span(kind, value, m.start("value"), 0)


#: A block scalar's indicator or a value field (any field :data:`_VALUE_FIELD` takes)
#: somewhere in the text: without one, no anchor need be tried. (It starts with a set of
#: its first characters, not ignoring case there, so a search tries only the positions
#: holding one of them, not all.)
_LAYOUT = re.compile(r"[:VvDd](?:(?<=:)[ \t]*[|>]|(?<=[Vv])(?i:alue)[\"']?[ \t]*[:=]"
                     r"|(?<=[Dd])(?i:efault)[\"']?[ \t]*[:=])")


#: An element named as a credential, its value in an attribute: ``<password value="..."/>``.
_ELEMENT = re.compile(r"<(?P<name>[A-Za-z_][\w.\-:]{0,60})(?:\s+[\w.\-:]+\s*=\s*(?:\"[^\"\n]*\""
                      r"|'[^'\n]*'))*?\s+value\s*=\s*(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}')")
#: A label alone on its line, the value alone on the next: "Password:\nZq8...", as notes
#: and chats set them out ("**Password:**", then the value in backticks), or as a
#: Markdown definition list sets a term and its definition ("Password\n: Zq8...").
_LABEL = re.compile(r"(?P<key>[A-Za-z_][\w.\- ]{0,40}?)[*_`]*[ \t]*"
                    r"(?::[ \t]*[*_`]*[ \t]*\r?\n[ \t]*|\r?\n[ \t]{0,3}:[ \t]+)"
                    r"[`\"']?(?P<value>[^\s`\"']{4,200})[`\"']?[ \t]*(?=\r?\n|\Z)")


#: Versions, dates and times: "v2.3.1", "2026-01-05", "10:30".
_NUMBERED = re.compile(r"[vV]?\d+(?:[.\-/:]\d+)+[A-Za-z]?")


def _element(text: str, a: int) -> Span | None:
    m = _ELEMENT.match(text, a - 1) if a and text[a - 1] == "<" else None
    if m is None or (kind := name_kind(m.group("name"))) is None:
        return None
    return value_span(kind, m.group("value"), m.start("value"), 0)


def _label(text: str, a: int) -> Span | None:
    m = _LABEL.match(text, a)
    if m is None or (kind := name_kind(m.group("key"))) is None:
        return None
    return set_apart(kind, text, strip_end(m.group("value")), m.start("value"))


def set_apart(kind: str, text: str, value: str, start: int, *,
              headed: bool = False) -> Span | None:
    """The span of ``value`` (at ``start``, alone on its line or in its cell, apart from
    the name of ``kind`` it belongs to) if it is a secret. ``headed``: in a cell the name
    heads (its column's header, the cell before it), which says whose value it is as
    ``name: value`` says it: a machine-made key there (a long hex string, a UUID) is
    one, as it is after ``api_token:``."""
    # Apart from its name, a plain word, a version or a date may be anything: only what
    # looks like a secret (below a label, made like a password where the name names no
    # password).
    if (not looks_secret(value) or value.isalpha() or _NUMBERED.fullmatch(value)
            or names_a_source(text, start)
            or (kind != "password" and not made_like_a_password(value)
                and not (headed and keyish(value)))):
        return None
    return value_span(kind, value, start, 0)


def find_in_configs(text: str, starts: Sequence[int]) -> Iterable[Span]:
    for a in starts:
        for span in (_element(text, a), _label(text, a)):
            if span is not None:
                yield span
    if _LAYOUT.search(text) is None:
        return
    for a in starts:
        for span in (_block(text, a), _pair(text, a)):
            if span is not None:
                yield span
