"""Secrets out of the daemon's config file before a backup carries it (``backup.py``).

A TOML text is masked where it is written, so the rest of the file (comments, layout)
stays as the person wrote it.
"""

from __future__ import annotations

import json
import re
import tomllib

from recalld.daemon.config_rules import url_without_secrets
from recalld.daemon.dsn import dsn_without_password

__all__ = ["emptied_in", "left_out_of", "mask_secrets"]

#: A TOML string: multi-line basic and literal first, then basic (with escapes), literal.
_STRING = "|".join((
    r'"""(?:[^"\\]|\\.|"(?!""))*"{3,5}',
    r"'''(?:[^']|'(?!''))*'{3,5}",
    r'"(?:[^"\\\n]|\\.)*"',
    r"'[^'\n]*'"))
_KEY_PART = r"""(?:[\w-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
#: ``key = <string>`` at the start of a line or in an inline table; the key may be
#: dotted and its parts quoted.
_ASSIGNMENT = re.compile(
    rf"(?m)((?:^|[{{,])[ \t]*)({_KEY_PART}(?:[ \t]*\.[ \t]*{_KEY_PART})*)([ \t]*=[ \t]*)"
    rf"({_STRING})")
_SECRET_NAME = re.compile(r"(?i)api_?key|token|secret|password")


def _secret_name(key: str) -> bool:
    """Whether the key ``key`` names a secret (``*_env`` names the variable holding it)."""
    return bool(_SECRET_NAME.search(key)) and not key.lower().endswith("_env")


def _mask_assignment(m: re.Match[str]) -> str:
    last = re.findall(_KEY_PART, m[2])[-1].strip("\"'")
    return m[1] + m[2] + m[3] + '""' if _secret_name(last) else m[0]


def _left_in(doc: object) -> list[str]:
    """The non-empty strings under secret-named keys of the parsed TOML ``doc``."""
    found: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if isinstance(value, str) and value and _secret_name(str(key)):
                found.append(value)
            else:
                found += _left_in(value)
    elif isinstance(doc, list):
        for item in doc:
            found += _left_in(item)
    return found


_DSN_VALUE = re.compile(
    r"""(?im)((?:^|[{,])[ \t]*dsn[ \t]*=[ \t]*)("(?:[^"\\\n]|\\.)*"|'[^'\n]*')""")


_QUOTED = re.compile(r""""(?:[^"\\\n]|\\.)*"|'[^'\n]*'""")
#: A line's comment: a ``#`` outside the strings before it on that line.
_COMMENT = re.compile(r"""(?m)^((?:[^#"'\n]|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')*)(#.*)$""")


def _comment_redacted(m: re.Match[str]) -> str:
    from recalld.daemon.memory.redact import redact

    return m[1] + redact(m[2])


def mask_secrets(config_text: str) -> str:
    """``config_text`` (TOML) with every secret-named string value emptied (in any of
    TOML's string forms, under dotted or quoted keys; a ``*_env`` key names a variable and
    stays), the password taken out of every ``dsn`` (a shared workspace's server), and
    every URL's password and credential-named parameters (``base_url = "...?key=..."``)
    emptied; and what redaction masks in comments."""
    text = _ASSIGNMENT.sub(_mask_assignment, config_text)
    # A key commented out (``# api_key = "sk-..."``, an old one kept for later) is
    # still a key: comments are redacted as notes are.
    text = _COMMENT.sub(_comment_redacted, text)
    text = _DSN_VALUE.sub(_dsn_without_password, text)
    text = _QUOTED.sub(lambda m: m[0][0] + url_without_secrets(m[0][1:-1]) + m[0][-1]
                       if "://" in m[0] else m[0], text)
    try:  # a form the patterns missed (a multi-line value): emptied where it is written
        left = _left_in(tomllib.loads(text))
    except tomllib.TOMLDecodeError:
        return text  # not TOML (the daemon refuses it): masked as far as it goes
    for value in left:
        for written in (f'"""{value}"""', f"'''{value}'''", json.dumps(value), f"'{value}'"):
            text = text.replace(written, '""')
    return text


def _dsn_without_password(m: re.Match[str]) -> str:
    try:
        dsn = tomllib.loads(f"v = {m[2]}")["v"]
    except tomllib.TOMLDecodeError:
        return m[1] + '""'
    return m[1] + json.dumps(dsn_without_password(dsn) if isinstance(dsn, str) else "")


def left_out_of(config_text: str) -> list[str]:
    """The dotted keys of the values :func:`mask_secrets` changes in ``config_text``
    (none if it is not TOML)."""
    try:
        before = tomllib.loads(config_text)
        after = tomllib.loads(mask_secrets(config_text))
    except tomllib.TOMLDecodeError:
        return []
    return _changed(before, after, "")


def _changed(before: object, after: object, prefix: str) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        return [k for key, value in before.items()
                for k in _changed(value, after.get(key), f"{prefix}{key}.")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [k for i, (b, a) in enumerate(zip(before, after, strict=True))
                for k in _changed(b, a, f"{prefix}{i}.")]
    return [] if before == after else [prefix.removesuffix(".")]


def emptied_in(masked_text: str) -> list[str]:
    """The dotted keys of ``masked_text`` (TOML, a backed-up config file that does not
    say what was left out of it) whose values look emptied: a secret-named one empty, a
    URL with an empty password or credential parameter. A ``dsn`` without a password is
    not counted: one may need none."""
    from recalld.daemon.remembered import has_value

    def walk(node: object, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [k for key, value in node.items() for k in walk(value, f"{prefix}{key}.")]
        if isinstance(node, list):
            return [k for i, value in enumerate(node) for k in walk(value, f"{prefix}{i}.")]
        key = prefix.removesuffix(".")
        last = key.rsplit(".", 1)[-1]
        if not isinstance(node, str) or last.lower() == "dsn":
            return []
        emptied = (node == "" and _secret_name(last)) or (
            "://" in node and not has_value({last: node}, last))
        return [key] if emptied else []

    try:
        return walk(tomllib.loads(masked_text), "")
    except tomllib.TOMLDecodeError:
        return []
