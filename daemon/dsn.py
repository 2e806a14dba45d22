"""A shared workspace's ``dsn`` (a libpq connection string or URI), read as libpq reads
it: whether it can be used, and its copies without the password (shown masked in status,
logs and ``workspace.list``; left out of backups).

libpq's parser (psycopg's ``conninfo``) decides where the password is. A URI whose
password holds an ``@`` or a ``/`` that is not percent-encoded is one libpq parses all
the same, but not as meant: its user part ends at the first ``@`` before any ``/``, and
the rest of the password becomes part of the host, port or database name, where no
masking can know it for a password. Such a DSN (an ``@`` left after the user part,
before the parameters) is refused like one libpq cannot parse (:func:`problem`), and is
never shown.

Nothing here imports the rest of the daemon; psycopg is imported when a DSN is read
(without it, no DSN can be read, and none is shown).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

#: What is shown for a DSN libpq cannot parse: its text may hold a password anywhere.
UNPARSEABLE_DSN = "(a DSN libpq cannot parse, not shown)"
#: What is shown for a URI whose password holds an ``@`` or ``/`` not percent-encoded.
UNENCODED_DSN = "(a DSN whose password is not percent-encoded, not shown)"
# A libpq URI as libpq splits it: the user part runs to the first "@" before any "/" (the
# password, after its first ":", may hold "#", "?", "&"), the parameters follow the first
# "?" after it.
_DSN_URI = re.compile(r"(postgres(?:ql)?://)(?:([^:@/]*)(?::([^@/]*))?@)?([^?]*)(?:\?(.*))?",
                      re.S)
# A ``password`` keyword and its value, quoted or running to a space (``\`` escapes).
_DSN_KEYWORD = re.compile(r"(?:(?<=\s)|^)(password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\.)+)")


class UnusableDsn(ValueError):
    """A DSN libpq cannot parse, or a URI libpq would split inside its password. The
    message never quotes the DSN."""


def _unencoded(dsn: str) -> bool:
    """Whether ``dsn`` is a URI with an ``@`` after its user part and before its
    parameters (in no host, port or database name is an ``@`` meant)."""
    uri = _DSN_URI.fullmatch(dsn)
    return uri is not None and "@" in uri[4]


def params(dsn: str) -> dict[str, str]:
    """``dsn``'s settings as libpq reads them; :class:`UnusableDsn` when it cannot be
    used as written (see the module docstring)."""
    try:
        from psycopg import conninfo

        parsed = conninfo.conninfo_to_dict(dsn)
    except Exception:  # psycopg.ProgrammingError, or no psycopg to parse it
        # Worded so that redaction, which masks what errors quote, leaves it whole.
        raise UnusableDsn("libpq cannot parse the dsn (its message, which quotes the dsn, "
                          "is not shown): check its quoting, and in a URI write @ / % in "
                          "the password as %40 %2F %25") from None
    if _unencoded(dsn):
        raise UnusableDsn("the dsn (not shown) has an @ after its user part, which libpq "
                          "takes into the host or database name: in a URI, write @ / % "
                          "in the password as %40 %2F %25")
    return {key: str(value) for key, value in parsed.items()}


def problem(dsn: str) -> str | None:
    """Why ``dsn`` cannot be used as written (:func:`params`), or None: it can, or no
    psycopg is installed to tell (the shared workspace then says that it is missing)."""
    from importlib.util import find_spec

    if find_spec("psycopg") is None:
        return None
    try:
        params(dsn)
    except UnusableDsn as exc:
        return str(exc)
    return None


def mask_dsn(dsn: str) -> str:
    """``dsn`` with its password (a URI's user part or ``password`` parameter, a
    ``password=`` keyword) as ``***``, found where libpq's own parser (psycopg's) finds it.
    Parsed back, the result must be the DSN with ``password=***``, else it is shown in
    keyword form built from the parsed values; a DSN that cannot be used is not shown
    (:data:`UNPARSEABLE_DSN`, :data:`UNENCODED_DSN`)."""
    try:
        found = params(dsn)
    except UnusableDsn:
        return UNENCODED_DSN if _unencoded(dsn) else UNPARSEABLE_DSN
    if not found.get("password"):
        return dsn
    from psycopg import conninfo

    wanted = {**found, "password": "***"}
    uri = _DSN_URI.fullmatch(dsn)
    if uri:
        scheme, user, password, rest, query = uri.groups()
        userinfo = "" if user is None else user + (":***" if password else "") + "@"
        if query is not None:
            query = "&".join(_masked_parameter(item) for item in query.split("&"))
            rest += "?" + query
        masked = scheme + userinfo + rest
    else:
        masked = _DSN_KEYWORD.sub(r"\1***", dsn)
    try:
        if conninfo.conninfo_to_dict(masked) == wanted:
            return masked
    except Exception:  # noqa: S110 (shown rebuilt instead)
        pass
    return conninfo.make_conninfo("", **wanted)


def dsn_without_password(dsn: str) -> str:
    """``dsn`` for a copy that must not hold its password (a backup without secrets): as
    it is when it has none, else rebuilt by libpq's parser (psycopg's, keyword form)
    without it; "" when it cannot be used, since its text may hold one anywhere."""
    try:
        found = params(dsn)
    except UnusableDsn:
        return ""
    if "password" not in found:
        return dsn
    from psycopg import conninfo

    del found["password"]
    return conninfo.make_conninfo("", **found)


def _masked_parameter(item: str) -> str:
    """One ``key=value`` of a URI's parameters, its value ``***`` if the key (decoded as
    libpq decodes it) is ``password``."""
    key, eq, _ = item.partition("=")
    try:
        name = unquote(key, errors="strict")
    except UnicodeDecodeError:
        return item
    return f"{key}=***" if eq and name == "password" else item
