"""What each configuration value may be: ranges, choices and parsers, one table.

``daemon/config.py`` checks every value it reads against :data:`RULES` (keyed by the
settings class and field name), so a value that would make the daemon misbehave
(``cpu_threads = -1``, ``max_request_bytes = 0``, ``dream_cron = "0 25 * * *"``) is
refused at load with one line naming the key, never accepted. Types are checked by
``config.py`` from the field defaults; this table says what a value of the right type may
be (which of a workspace's folders may lie in which: ``daemon/config_layout.py``). The
README's configuration section documents the same ranges and layouts. Also here: the
message naming unknown keys with their likely intended names (:func:`unknown`), and the
masking of credentials in settings shown (:func:`mask_url`, :func:`shown_setting`; a
DSN's in ``daemon/dsn.py``).

Nothing here imports the rest of the daemon (but the redaction rules, when a message
shows a text or a name): the config module imports this one.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Final, TypeGuard
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from recalld.daemon.dsn import mask_dsn
from recalld.daemon.providers.local_names import E5_SMALL, MINILM, known_local_model
from recalld.daemon.watchpaths import IGNORE_DIRS
from recalld.ipc.protocol import MAX_REQUEST_BYTES_RANGE

#: Agent ids name workspaces and directories; the same rule as ``workspace.open``.
AGENT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
AGENT_ID_RULE = "1-64 characters of A-Z a-z 0-9 _ . - (not '.' or '..')"
EMBEDDING_BACKENDS = ("openai", "dashscope", "dashscope_multimodal", "gemini", "ollama",
                      "local")
CHAT_BACKENDS = ("openai",)  # every chat provider is spoken to in OpenAI's wire format
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

DAY_S = 86400.0


def _below(low: float) -> object:
    return low - 1 if isinstance(low, int) else low - 0.5


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def valid_agent_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(AGENT_ID.match(value)) and value not in (".", "..")


@dataclass(frozen=True, slots=True)
class Rule:
    """What a value may be. ``check`` returns None when it is fine, else what it must be;
    ``bad`` is a value of the right type that the rule refuses (for the config tests)."""

    check: Callable[[object], str | None]
    bad: object


def between(low: float, high: float, *, bad: object = None) -> Rule:
    """A number from ``low`` to ``high``, both included."""
    def check(value: object) -> str | None:
        if isinstance(value, int | float) and not isinstance(value, bool) and (
                low <= value <= high):
            return None
        return f"must be from {_num(low)} to {_num(high)}"

    return Rule(check, bad if bad is not None else _below(low))


def one_of(choices: Sequence[str], *, fold_case: bool = False) -> Rule:
    def check(value: object) -> str | None:
        shown = value.upper() if fold_case and isinstance(value, str) else value
        if shown in choices:
            return None
        return f"must be one of {', '.join(choices)}"

    return Rule(check, "no-such-" + choices[0].lower())


def _cron(value: object) -> str | None:
    from recalld.daemon.scheduler import cron_problem  # only when a cron is checked

    problem = cron_problem(value)
    if problem is None and isinstance(value, str) and len(value.split()) == 5:
        return None
    fields = value.split() if isinstance(value, str) else []
    if problem == "is invalid" and len(fields) == 5:
        for i, (name, allowed) in enumerate(_CRON_FIELDS):
            alone = " ".join(field if j == i else "*" for j, field in enumerate(fields))
            if cron_problem(alone) == "is invalid":
                return f"must have a valid {name} field ({allowed}), not {fields[i]!r}"
    if problem is None or problem == "is invalid":
        return "must be a cron expression of 5 fields (minute hour day month weekday), " \
               "e.g. \"0 23 * * *\""
    return problem


_CRON_FIELDS = (("minute", "0-59"), ("hour", "0-23"), ("day", "1-31"), ("month", "1-12 or jan-dec"),
                ("weekday", "0-7 or sun-sat"))


def _window_chars(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and (
            value == 0 or 100 <= value <= 100_000):
        return None
    return "must be 0 (one vector per chunk) or from 100 to 100000"


def _idle_trim(value: object) -> str | None:
    # Below a second a trim would follow nearly every search, each paying its faults back.
    if isinstance(value, int | float) and not isinstance(value, bool) and (
            value == 0 or 1 <= value <= 7 * DAY_S):
        return None
    return f"must be 0 (never) or from 1 to {_num(7 * DAY_S)}"


def dir_parts(value: str) -> tuple[str, ...]:
    """The parts of a workspace-relative folder setting, ``.`` and empty parts dropped:
    ``"./memory/"`` is ``("memory",)``, the workspace itself ``()``."""
    return tuple(p for p in PurePosixPath(value).parts if p not in (".", ""))


def _subdir(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        return "must be a non-empty directory name inside the workspace"
    parts = PurePosixPath(value).parts
    if value.startswith(("/", "~")) or ".." in parts or "\\" in value:
        return "must be a directory inside the workspace (relative, no '..')"
    if any(c < " " or c == "\x7f" for c in value):
        # ``"memory\n"``: a folder no one meant, whose notes every path shown escapes.
        return "must be a directory name without control characters (a line break, a tab)"
    return None


def _watched_dir(value: object) -> str | None:
    """A folder a watcher takes files from (the notes', the resources')."""
    problem = _subdir(value)
    if problem is not None:
        return problem
    parts = dir_parts(str(value))
    if not parts:
        # Every other folder of the workspace would be in it, the daemon's state too.
        return "must be a directory inside the workspace, not the workspace itself"
    if any(p.startswith(".") for p in parts):
        # The watchers pass hidden folders by: no file there would ever be taken.
        return "must be a directory inside the workspace that is not hidden"
    return None


def _notes_dir(value: object) -> str | None:
    problem = _watched_dir(value)
    if problem is not None:
        return problem
    parts = dir_parts(str(value))
    passed = [p for p in parts if p in IGNORE_DIRS]
    if passed:
        # The same for folders of these names, whatever metadata_dir is set to.
        return f"must not be in a folder named {passed[0]} (the watchers pass those by)"
    return None


def _url(value: object) -> str | None:
    if value == "":
        return None  # the backend's default endpoint
    if any(c.isspace() or unicodedata.category(c) == "Cc" for c in str(value)):
        # A typo; urlsplit drops tabs and line breaks, and a host with a space only
        # fails when the provider is first called.
        return ("must be empty or an http:// or https:// URL (this one holds a space or "
                "a control character)")
    try:
        parts = urlsplit(str(value))
    except ValueError:  # an unclosed "[" of an IPv6 host, for one
        return "must be empty or an http:// or https:// URL (this one does not parse)"
    if parts.scheme in ("http", "https") and parts.hostname:
        try:
            _ = parts.port  # a port out of range or not a number raises
        except ValueError:
            return "has an invalid port"
        return None
    return "must be empty or an http:// or https:// URL"


def _agents(value: object) -> str | None:
    items = value if isinstance(value, list | tuple) else [value]
    bad = [v for v in items if v != "*" and not valid_agent_id(v)]
    if bad:
        return f"entries must be \"*\" or agent ids ({AGENT_ID_RULE}); not {bad[0]!r}"
    return None


def _optional_between(low: int, high: int, *, bad: object = None) -> Rule:
    inner = between(low, high, bad=bad)
    return Rule(lambda v: None if v is None else inner.check(v), inner.bad)


SUBDIR = Rule(_subdir, "../outside")
NOTES_DIR = Rule(_notes_dir, ".notes")
WATCHED_DIR = Rule(_watched_dir, ".files")
URL = Rule(_url, "ftp://example.com")

#: (settings class, field) -> rule. Every number has a range; every enum its values.
RULES: dict[tuple[str, str], Rule] = {
    # [daemon]
    ("DaemonConfig", "max_request_bytes"): between(*MAX_REQUEST_BYTES_RANGE),
    ("DaemonConfig", "max_batch"): between(1, 10_000),
    ("DaemonConfig", "max_connections"): between(1, 65_536),
    ("DaemonConfig", "idle_timeout_s"): between(1.0, 7 * DAY_S),
    ("DaemonConfig", "write_timeout_s"): between(0.1, 3600.0),
    ("DaemonConfig", "graceful_timeout_s"): between(0.0, 600.0),
    ("DaemonConfig", "max_concurrent_calls_per_connection"): between(1, 4096),
    ("DaemonConfig", "cpu_threads"): between(1, 256),
    ("DaemonConfig", "backfill_threads"): between(0, 256),
    ("DaemonConfig", "backfill_nice"): between(0, 19),
    ("DaemonConfig", "log_level"): one_of(LOG_LEVELS, fold_case=True),
    ("DaemonConfig", "reconcile_interval_s"): between(5.0, 7 * DAY_S),
    ("DaemonConfig", "persist_delay_s"): between(0.0, 3600.0),
    ("DaemonConfig", "backfill_backoff_s"): between(0.01, 300.0),
    ("DaemonConfig", "idle_trim_s"): Rule(_idle_trim, 0.5),
    ("DaemonConfig", "schedule_jitter_s"): between(0.0, 3600.0),
    # Below a few hundred characters a chunk holds a line or two: search finds fragments.
    ("DaemonConfig", "chunk_max_chars"): between(200, 1_000_000),
    # [workspace_defaults] and [workspaces.X]
    ("WorkspaceSettings", "metadata_dir"): SUBDIR,
    ("WorkspaceSettings", "session_dir"): SUBDIR,
    ("WorkspaceSettings", "mem_session_dir"): SUBDIR,
    ("WorkspaceSettings", "resource_dir"): WATCHED_DIR,
    ("WorkspaceSettings", "daily_dir"): NOTES_DIR,
    ("WorkspaceSettings", "digest_dir"): NOTES_DIR,
    # A negative interval is QwenPaw's "off" (0) before this rule sees it.
    ("WorkspaceSettings", "auto_memory_interval"): _optional_between(0, 100_000,
                                                                     bad=100_001),
    # Seconds a conversation may stay idle before its turns are written (0: never).
    ("WorkspaceSettings", "auto_memory_idle_s"): between(0, 31_536_000),
    ("WorkspaceSettings", "dream_cron"): Rule(_cron, "0 25 * * *"),
    ("WorkspaceSettings", "shared_with"): Rule(_agents, ["../x"]),
    # embedding_model_config
    ("EmbeddingModelConfig", "backend"): one_of(EMBEDDING_BACKENDS),
    ("EmbeddingModelConfig", "base_url"): URL,
    ("EmbeddingModelConfig", "dimensions"): between(1, 65_536),
    ("EmbeddingModelConfig", "max_cache_size"): between(0, 100_000_000),
    ("EmbeddingModelConfig", "max_input_length"): between(1, 10_000_000),
    ("EmbeddingModelConfig", "max_batch_size"): between(1, 10_000),
    # chat_model_config
    ("ChatModelConfig", "backend"): one_of(CHAT_BACKENDS),
    ("ChatModelConfig", "base_url"): URL,
    ("ChatModelConfig", "temperature"): between(0.0, 2.0),
    ("ChatModelConfig", "max_tokens"): between(1, 10_000_000),
    ("ChatModelConfig", "timeout_s"): between(1.0, 3600.0),
    ("ChatModelConfig", "breaker_open_s"): between(0.1, 3600.0),
    ("ChatModelConfig", "breaker_open_max_s"): between(0.1, 86400.0),
    # search
    ("SearchConfig", "vector_weight"): between(0.0, 1.0, bad=1.5),
    ("SearchConfig", "keyword_weight"): between(0.0, 1.0, bad=1.5),
    ("SearchConfig", "rrf_k"): between(1, 100_000),
    ("SearchConfig", "keyword_guard"): between(0.0, 10.0),
    ("SearchConfig", "keyword_best_within"): between(0, 1000),
    ("SearchConfig", "fusion"): one_of(("score", "rrf")),
    ("SearchConfig", "length_penalty"): between(0.0, 10.0),
    ("SearchConfig", "vector_window_chars"): Rule(_window_chars, 50),
    ("SearchConfig", "context_lines"): between(-1, 10_000),
    ("SearchConfig", "candidate_multiplier"): between(1, 100),
    ("SearchConfig", "max_candidates"): between(1, 100_000),
}


def problem(settings: str, field: str, value: object) -> str | None:
    """What is wrong with ``value`` for ``settings.field`` (None: nothing, or no rule)."""
    rule = RULES.get((settings, field))
    return None if rule is None else rule.check(value)


def record_problem(settings: str, values: dict[str, object]) -> str | None:
    """What is wrong across the fields of one table (None: nothing)."""
    if settings == "SearchConfig" and not (
            _positive(values.get("vector_weight")) or _positive(values.get("keyword_weight"))):
        return "vector_weight and keyword_weight must not both be 0"
    first, longest = values.get("breaker_open_s"), values.get("breaker_open_max_s")
    if (settings == "ChatModelConfig" and isinstance(first, int | float)
            and isinstance(longest, int | float) and longest < first):
        return (f"breaker_open_max_s = {_num(longest)} must not be below "
                f"breaker_open_s = {_num(first)}")
    model = values.get("model_name")
    if (settings == "EmbeddingModelConfig" and values.get("backend") == "local"
            and isinstance(model, str) and not known_local_model(model)):
        return (f"model_name = {shown(model)}: must name a local model with backend = "
                f"\"local\": \"{E5_SMALL}\" or \"{MINILM}\"")
    return None


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and value > 0


#: The escapes a TOML basic string has for control characters; others are ``\\uXXXX``.
_TOML_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _is_control(char: str) -> bool:
    return char < " " or "\x7f" <= char <= "\x9f"


def shown(value: object) -> str:
    """A value as TOML would write it, for error messages, with what looks like a secret
    masked as redaction masks it (a key pasted into another setting: error messages reach
    logs and the journal)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # Imported with the first message that shows a text, not with the configuration.
        from recalld.daemon.memory.redact import redact

        text = redact(value).replace("\\", "\\\\").replace('"', '\\"')
        if not text.isprintable():  # a control character, escaped as TOML escapes it
            text = "".join(_TOML_ESCAPES.get(c, f"\\u{ord(c):04X}") if _is_control(c) else c
                           for c in text)
        return f'"{text}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {shown(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    return str(value)


#: Setting names whose values are credentials (``api_key``, a ``token``, a ``password``).
SECRET_SETTING = re.compile(r"(?i)(api_?key|token|secret|password|passwd)")


def shown_setting(name: str, value: object) -> str:
    """:func:`shown` for the value of setting ``name``, masked as settings are shown: a
    credential-named setting's value as ``***``, a URL's password and credential-named
    parameters and a ``dsn``'s password as ``***`` (error messages reach logs)."""
    if SECRET_SETTING.search(name):
        return "***"
    if isinstance(value, str) and name == "dsn":
        return shown(mask_dsn(value))
    if isinstance(value, str) and "://" in value:
        return shown(mask_url(value))
    return shown(value)


def unknown(what: str, names: list[str], known: Collection[str]) -> str:
    """``unknown field(s) a, b``, with the known name each is likely a typo of."""
    import difflib  # only a configuration with an unknown field needs it

    from recalld.daemon.memory.redact import redact

    guesses = {n: difflib.get_close_matches(n, sorted(known), n=1, cutoff=0.75)
               for n in names}
    # A name is shown masked as a value is (a key pasted where a field's name goes).
    hints = [f"{redact(n)}: did you mean {g[0]}?" for n, g in guesses.items() if g]
    return (f"unknown {what}(s) {', '.join(redact(n) for n in names)}"
            + (f" ({'; '.join(hints)})" if hints else ""))


# -- masking credentials in what is shown ---------------------------------------------


# A URL's password: from the user part's first ":" to the last "@" before the path, as
# the HTTP client splits it (a password may hold a raw "@").
_URL_USERINFO_SECRET = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#]*):[^/?#]*@")
#: A query parameter named like a credential, and its value (up to ``&``, ``#`` or a
#: space: it is found in URLs and in messages that quote one).
URL_QUERY_SECRET = re.compile(
    r"(?i)([?&][^=&#\s]*(?:key|token|secret|passw|passphrase|pwd|auth|credential|sig)"
    r"[^=&#\s]*=)[^&#\s]*")


#: A URL's user name (before its password, if any): a token may stand there
#: (``https://<token>@host``, GitHub's ``https://ghp_...:x-oauth-basic@github.com``).
_URL_USER = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^:/?#@]+)(?=(?::[^/?#]*)?@)")


def _without_user_token(url: str, replacement: str) -> str:
    """``url`` with its user name replaced where it looks like a token, as redaction
    takes a URL's whole user part for one (random-looking, 16 characters or more)."""
    from recalld.daemon.memory.secret_values import looks_random

    m = _URL_USER.match(url)
    if m is None or not looks_random(m[2], 16):
        return url
    return m[1] + replacement + url[m.end():]


def url_without_secrets(url: str) -> str:
    """``url`` for a copy that must not hold its secrets (a backup without them): the
    password of its user part, a user name that looks like a token and the values of
    query parameters named like a credential (those :func:`mask_url` masks) emptied."""
    url = _without_user_token(url, "")
    return URL_QUERY_SECRET.sub(r"\1", _URL_USERINFO_SECRET.sub(r"\1:@", url))


def mask_url(url: str) -> str:
    """``url`` with a password in its user part, a user name that looks like a token and
    the values of query parameters named like a credential (``key``, ``token``,
    ``secret``, ``password``, ``pwd``, ``auth``, ``sig``, ...) as ``***``, and what
    redaction masks elsewhere in it (a key in its path, as some gateways take it) as
    ``[REDACTED]``."""
    url = _without_user_token(url, "***")
    url = URL_QUERY_SECRET.sub(r"\1***", _URL_USERINFO_SECRET.sub(r"\1:***@", url))
    if not _may_hold_a_key(url):  # an address as most are: no rules imported for it
        return url
    from recalld.daemon.memory.redact import redact

    return redact(url)


#: A run of a URL as long as the shortest key redaction masks there: a URL without one
#: (most provider addresses) has nothing for it, and does not import its rules (some
#: 28 ms: an agent's first ``workspace.open`` and ``daemon.status`` show its address).
_URL_RUN: Final = re.compile(r"[A-Za-z0-9_\-]{16}")


def _may_hold_a_key(url: str) -> bool:
    return _URL_RUN.search(url) is not None


def masked_repr(settings: DataclassInstance) -> str:
    """The ``repr`` of a settings record that may hold secrets (a provider's model config,
    a shared workspace's remote): an ``api_key`` as ``***``, the password of a
    ``base_url`` (:func:`mask_url`) or a ``dsn`` (:func:`mask_dsn`) masked, so a record
    that reaches a log line or a traceback shows none of them."""
    shown = []
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value and f.name == "api_key":
            value = "***"
        elif value and f.name == "base_url":
            value = mask_url(value)
        elif value and f.name == "dsn":
            value = mask_dsn(value)
        shown.append(f"{f.name}={value!r}")
    return f"{type(settings).__name__}({', '.join(shown)})"
