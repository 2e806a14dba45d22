"""Format finders of :mod:`secret_rules` for credentials that commands and code take
apart from any credential's name: a password PowerShell makes a ``SecureString`` of
(``ConvertTo-SecureString 'S3cret' -AsPlainText -Force``, piped to it too), the password
of a credential object's constructor (``NetworkCredential("bob", "S3cret")``,
``New-Object PSCredential(...)``, ``UsernamePasswordCredentials``), a password given
to Windows' ``net use`` and ``net user`` in its place on the line, and to ``psexec -p``;
and session cookies, wherever a cookie string or a set of cookies is written: a
``Cookie`` header, ``curl -b`` and ``--cookie``, ``document.cookie``, a ``cookies=``
dict, a cookie made or set by a call (``cookies.set("sessionid", "...")``,
``new Cookie("JSESSIONID", "...")``).

A cookie's value is a session when it looks machine-made (long, letters and digits
mixed, or long hex): ``theme=dark``, ``lang=en-US`` and ``Path=/`` are no credentials.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from recalld.daemon.memory.secret_context import name_kind, names_a_source, value_span
from recalld.daemon.memory.secret_values import HEX, PLACEHOLDER, classes, looks_random

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Finder, Span

#: A value on a command line: quoted (spaces and all) or bare.
_VALUE = (r"(?:\"(?P<dq>[^\"\n]{3,200})\"|'(?P<sq>[^'\n]{3,200})'"
          r"|(?P<bare>[^\s\"'$(\-][^\s\"']{2,199}))")
_QUOTED = r"(?:\"(?P<dq>[^\"\n]{3,200})\"|'(?P<sq>[^'\n]{3,200})')"

#: (hints, pattern) of passwords on Windows command lines and in PowerShell. (``net``'s
#: hints hold the blank after it: "net" is in many words, "network", "internet".)
_PASSWORDS: Final = (
    # ``ConvertTo-SecureString [-String] 'S3cret' -AsPlainText -Force``, its switches in
    # any order before the string; and ``'S3cret' | ConvertTo-SecureString ...``.
    (("securestring",), re.compile(
        r"(?i)\bConvertTo-SecureString(?:[ \t]+-(?!String\b)[A-Za-z]+(?::\$\w+)?)*"
        r"[ \t]+(?:-String[ \t]+)?" + _VALUE)),
    (("securestring",), re.compile(
        r"(?i)" + _QUOTED + r"[ \t]*\|[ \t]*ConvertTo-SecureString\b")),
    # A credential class's constructor: the user (a string or a variable), then the
    # password as a string. Only a class (a capital starts its name: not
    # ``keyring.get_credential(service, user)``).
    (("credential",), re.compile(
        r"(?:(?<![\w.])(?:[A-Za-z_]\w*\.)*[A-Z]\w*Credentials?"
        r"|(?i:\[(?:\w+\.)*\w*credentials?\]::new))[ \t]*"
        r"(?:\(|[ \t]+-ArgumentList[ \t]+\(?|[ \t]+\()[ \t]*"
        r"(?:\"[^\"\n]{0,200}\"|'[^'\n]{0,200}'|\$?[A-Za-z_][\w.]{0,100})[ \t]*,[ \t]*"
        + _QUOTED)),
    # ``net use [Z:] \\srv\share S3cret [/user:...]``: the password follows the share.
    (("net ", "net\t"), re.compile(
        r"(?i)\bnet[ \t]+use(?:[ \t]+(?:[A-Z]:|\*))?[ \t]+\\\\[^\s\"']+[ \t]+" + _VALUE)),
    # ``net user bob S3cret [/add]``.
    (("net ", "net\t"), re.compile(
        r"(?i)\bnet[ \t]+user[ \t]+(?:\"[^\"\n]{1,100}\"|[^\s/\"*]{1,100})[ \t]+" + _VALUE)),
    # More clients' password switches: a scheduled task's ``/rp``, FreeRDP's ``/p:``,
    # SQL Server's ``-P``, rdesktop's ``-p``, a key's passphrase (``ssh-keygen -N``),
    # Samba's ``-U user%password``, lftp's ``-u user,password``, and the value of a
    # GitHub secret (``gh secret set NAME --body ...``).
    (("schtasks",), re.compile(r"(?i)\bschtasks\b[^\n]{0,300}?(?<!\S)/rp[ \t]+" + _VALUE)),
    (("freerdp",), re.compile(r"(?i)\b\w*freerdp3?\b[^\n]{0,300}?(?<!\S)/p:" + _VALUE)),
    (("sqlcmd", "bcp", "osql", "isql"), re.compile(
        r"\b(?:sqlcmd|bcp|osql|isql)\b[^\n]{0,300}?(?<!\S)-P[ \t]*" + _VALUE)),
    (("rdesktop",), re.compile(r"\brdesktop\b[^\n]{0,300}?(?<!\S)-p[ \t]+" + _VALUE)),
    (("ssh-keygen",), re.compile(r"\bssh-keygen\b[^\n]{0,300}?(?<!\S)-[NP][ \t]+" + _VALUE)),
    (("smbclient",), re.compile(
        r"\bsmbclient\b[^\n]{0,300}?(?<!\S)(?:-U|--user(?:name)?)(?:[ \t]+|=)[\"']?"
        r"[^\s%\"']{1,100}%(?P<bare>[^\s\"']{3,200})")),
    (("lftp",), re.compile(
        r"\blftp\b[^\n]{0,300}?(?<!\S)-u[ \t]+[\"']?[^\s,\"']{1,100},(?P<bare>[^\s\"']{3,200})")),
    # (Looked for where "secret" is: "gh" is in most English texts.)
    (("secret",), re.compile(r"\bgh[ \t]+secret[ \t]+set\b[^\n]{0,300}?(?<!\S)(?:--body|-b)"
                         r"(?:[ \t]+|=)" + _VALUE)),
    (("psexec", "paexec"), re.compile(
        r"(?i)\b(?:psexec(?:64)?|paexec)(?:\.exe)?\b[^\n]{0,200}?(?<!\S)-p[ \t]+" + _VALUE)),
)


#: A password echoed into a command that reads it from its input: ``echo 'S3cret' |
#: sudo -S ...``, ``sudo -S <<< 'S3cret'``, ``echo S3cret | passwd --stdin bob``.
_PIPED: Final = (
    (("sudo", "passwd"), re.compile(
        r"\becho[ \t]+(?:-[ne]+[ \t]+)?" + _VALUE
        + r"[ \t]*\|[ \t]*(?:sudo[ \t]+(?:-[A-Za-z]+[ \t]+)*-[A-Za-z]*S\b"
          r"|passwd\b[^\n|]*--stdin)")),
    (("sudo",), re.compile(r"\bsudo[ \t]+(?:-[A-Za-z]+[ \t]+)*-[A-Za-z]*S\b[^\n<]*<<<[ \t]*"
                           + _VALUE)),
)
#: A variable set by a shell's own command, its name then its value apart: fish's
#: ``set -x DB_PASSWORD S3cret``, csh's ``setenv DB_PASSWORD S3cret``, elvish's
#: ``set-env``, Windows' ``setx [/M]``, launchd's ``launchctl setenv``, a Dockerfile's
#: ``ENV DB_PASSWORD S3cret``.
_SHELL_SET: Final = re.compile(
    r"(?:\b(?:set(?:[ \t]+-[A-Za-z]+|[ \t]+--[a-z]+)+|setenv|set-env|launchctl[ \t]+setenv"
    r"|setx(?:[ \t]+/[Mm])?)|(?m:^[ \t]*ENV))[ \t]+"
    r"(?P<name>[A-Za-z_][\w]{0,60})[ \t]+(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}'"
    r"|[^\s\"';|&]{1,400})")
#: A setter handed a variable's or a setting's name, then its value (a section before
#: them, as ``configparser`` takes it): ``os.Setenv("DB_PASSWORD", "...")``,
#: ``[Environment]::SetEnvironmentVariable('API_TOKEN', '...')``,
#: ``os.environ.setdefault(...)``, ``config.set("db", "password", "...")``.
_SETTER: Final = re.compile(
    r"(?i)\b(?:set\w{0,30}|put\w{0,10}|add\w{0,10})[ \t]*\([ \t]*"
    r"(?:[\"'][^\"'\n]{0,60}[\"'][ \t]*,[ \t]*)?[\"'](?P<name>[\w.\-]{1,60})[\"'][ \t]*,[ \t]*"
    r"(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}')")


#: What each of the two rules above cannot match without: a look for it costs a few
#: percent of running the rule over a text that holds neither (most texts). (Each a
#: literal first, which ``re`` looks for fast; a Dockerfile's ``ENV`` apart.)
_SHELL_SET_NEEDS: Final = re.compile(r"set(?:[ \t]+-|env|-env|x)")
_SHELL_ENV_NEEDS: Final = re.compile(r"(?m)^[ \t]*ENV")
_SETTER_NEEDS: Final = re.compile(r"\([ \t]*[\"']")


def _value_span(m: re.Match[str]) -> Span | None:
    for group in ("dq", "sq", "bare"):
        if group in m.re.groupindex and m.group(group) is not None:
            value = m.group(group)
            if value.startswith("/") and group == "bare":
                return None  # a switch of the command (``/add``, ``/user:``), not a password
            if (PLACEHOLDER.match(value) or value.startswith(("$", "%", "[REDACTED", "{"))
                    or value == "*"):
                return None
            return m.span(group)
    return None


def _passwords(rx: re.Pattern[str]) -> Finder:
    def find(text: str, pos: int, endpos: int) -> Iterable[Span]:
        for m in rx.finditer(text, pos, endpos):
            span = _value_span(m)
            if span is not None:
                yield span

    return find


def _shell_set_values(text: str, pos: int, endpos: int) -> Iterable[Span]:
    if _SHELL_SET_NEEDS.search(text, pos, endpos) is not None or (
            "ENV" in text and _SHELL_ENV_NEEDS.search(text, pos, endpos) is not None):
        yield from _set_values(_SHELL_SET, text, pos, endpos)


def _setter_values(text: str, pos: int, endpos: int) -> Iterable[Span]:
    if _SETTER_NEEDS.search(text, pos, endpos) is not None:
        yield from _set_values(_SETTER, text, pos, endpos)


#: (hints, finder) of the passwords above, each finder a rule of its own: a text is
#: looked for every rule's hints at once (``secret_plan.hints_in``), and only the
#: patterns whose hints it holds run. Each hint is what its pattern cannot match without
#: (in lowercase): ``_SHELL_SET`` needs a ``set`` or an ``ENV``, ``_SETTER`` a ``set``,
#: a ``put`` or an ``add`` (``(?i)`` matches no other letters there: ``ſ`` is read as
#: ``s`` before, ``secret_forms``).
COMMAND_FINDERS: Final[tuple[tuple[tuple[str, ...], Finder], ...]] = (
    *((hints, _passwords(rx)) for hints, rx in _PASSWORDS + _PIPED),
    (("set", "env"), _shell_set_values),
    (("set", "put", "add"), _setter_values),
)


def _set_values(rx: re.Pattern[str], text: str, pos: int, endpos: int) -> Iterable[Span]:
    for m in rx.finditer(text, pos, endpos):
        kind = name_kind(m.group("name"))
        if kind is not None and not names_a_source(text, m.start("value")):
            span = value_span(kind, m.group("value"), m.start("value"), 0)
            if span is not None:
                yield span


def session_value(value: str) -> bool:
    """Is a cookie's ``value`` a session's (machine-made), not a preference or an
    attribute (``dark``, ``en-US``, ``/``, a date)?"""
    if len(value) < 12 or PLACEHOLDER.match(value) or value.startswith(("$", "{{", "<")):
        return False
    if looks_random(value, 12) or (HEX.match(value) and len(value) >= 16):
        return True
    digit, upper, lower, _ = classes(value)
    return digit and (upper or lower) and sum(c.isdigit() for c in value) >= 4


#: ``name=value`` pairs of a cookie string.
_COOKIE_PAIR: Final = re.compile(r"(?:^|(?<=[;\s\"',]))[ \t]*[^\s=;,\"']{1,100}="
                                 r"(?P<value>[^\s;,\"']{1,4000})")
#: Where a cookie string is written: a header (``Cookie:``, to the end of its line;
#: ``"Cookie": "``, ``document.cookie = "``), ``curl -b`` and ``--cookie``.
_COOKIE_STRING: Final = re.compile(
    r"(?i)(?:\b(?:set-)?cookie[\"']?[ \t]*[:=][ \t]*(?![\"'])(?P<line>[^\n\"']{1,4000})"
    r"|(?:\b(?:set-)?cookie[\"']?[ \t]*[:=][ \t]*|(?<!\S)--cookie(?:[ \t]+|=)"
    r"|\bcurl\b[^\n]{0,400}?(?<!\S)-b(?:[ \t]+|=)?)"
    r"(?:\"(?P<dq>[^\"\n]{1,4000})\"|'(?P<sq>[^'\n]{1,4000})'|(?P<bare>[^\s\"']{1,4000})))")
#: A set of cookies: ``cookies={"session": "..."}``, ``"cookies": {...}``,
#: ``cookies=dict(session="...")``.
_COOKIE_SET: Final = re.compile(
    r"(?i)\bcookies?[\"']?[ \t]*[=:][ \t]*(?:dict[ \t]*\(|\{|@\{)(?P<body>[^{}()]{1,4000})")
_SET_PAIR: Final = re.compile(
    r"(?:[\"'][^\"'\n]{1,100}[\"']|\w{1,100})[ \t]*[:=][ \t]*"
    r"(?:\"(?P<dq>[^\"\n]{1,4000})\"|'(?P<sq>[^'\n]{1,4000})')")
#: A cookie made or set by a call: its name, then its value, or an object's ``value``
#: (``page.setCookie({name: "sid", value: "..."})``).
_COOKIE_CALL: Final = re.compile(
    r"(?i)cookies?(?:\.(?:set|add|update|append))?[ \t]*\([ \t]*"
    r"(?:[\"'][^\"'\n]{1,100}[\"'][ \t]*,[ \t]*|\[?[ \t]*\{[^{}]{0,400}?\bvalue[\"']?[ \t]*:[ \t]*)"
    r"(?:\"(?P<dq>[^\"\n]{1,4000})\"|'(?P<sq>[^'\n]{1,4000})')")


def _quoted_or_bare(m: re.Match[str]) -> tuple[int, str] | None:
    for group in ("line", "dq", "sq", "bare"):
        if group in m.re.groupindex and m.group(group) is not None:
            return m.start(group), m.group(group)
    return None


#: What a cookie string or a set of cookies cannot be found without. A search for it
#: costs a fifth of the two patterns' (each tried at every position of the text), and a
#: note that speaks of cookies seldom holds one.
_COOKIE_NEEDS: Final = re.compile(r"(?i)cookies?[\"']?[ \t]*[:=]|--cookie|curl")


def find_cookies(text: str, pos: int, endpos: int) -> Iterable[Span]:
    if _COOKIE_NEEDS.search(text, pos, endpos) is not None:
        yield from _cookie_strings(text, pos, endpos)
    for m in _COOKIE_CALL.finditer(text, pos, endpos):
        found = _quoted_or_bare(m)
        if found is not None and session_value(found[1]):
            yield found[0], found[0] + len(found[1])


def _cookie_strings(text: str, pos: int, endpos: int) -> Iterable[Span]:
    for m in _COOKIE_STRING.finditer(text, pos, endpos):
        found = _quoted_or_bare(m)
        if found is not None and "=" in found[1]:
            at, value = found
            for pair in _COOKIE_PAIR.finditer(value):
                if session_value(pair.group("value")):
                    yield at + pair.start("value"), at + pair.end("value")
    for m in _COOKIE_SET.finditer(text, pos, endpos):
        for pair in _SET_PAIR.finditer(text, m.start("body"), m.end("body")):
            found = _quoted_or_bare(pair)
            if found is not None and session_value(found[1]):
                yield found[0], found[0] + len(found[1])


__all__ = ["COMMAND_FINDERS", "find_cookies", "session_value"]
