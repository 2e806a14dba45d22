"""The finders of the context rules of :mod:`secret_rules`: values assigned to
credential-like names (``password=...``, ``--token ...``, ``<password>...</password>``),
and credentials stated in prose ("the password for prod is ...", "set the token to ...");
high-entropy strings near a credential word are :mod:`secret_near`'s. Each finder tries
its patterns only at the anchors it is given (where a credential word, or the name
holding one, starts: :func:`secret_anchors.anchors`); whether a value found there is a
secret is judged by :mod:`secret_values`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from recalld.daemon.memory.secret_names import MASK
from recalld.daemon.memory.secret_values import (
    FUNCTION_WORDS,
    PLACEHOLDER,
    classes,
    code_reference,
    keyish,
    looks_random,
    looks_secret,
    passphrase,
    plain_password,
    verb_form,
    version,
    version_pin,
)
from recalld.daemon.memory.secret_wrapped import (
    MULTILINE_QUOTED,
    continued,
    joined,
    pieces_below,
)

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Span

#: Words naming a credential, in names (split into parts) and in prose.
_STRONG_PARTS: Final = frozenset({
    "password", "passwd", "passphrase", "passcode", "pass", "pwd", "pw", "pin", "passwort",
    "secret", "secrets", "token", "tokens", "apikey", "credential", "credentials", "cred",
    "creds", "auth", "authorization", "sig", "signature", "cookie", "sessionid",
    "privatekey", "secretkey", "accesskey", "clientsecret", "pat", "otp", "totp", "mfa",
})
#: Strong only as one word: the cookie ``sessionid``, not a ``session_id`` field.
_ONE_WORD: Final = frozenset({"sessionid"})
#: The session cookies that web platforms name: ``PHPSESSID``, ``JSESSIONID``,
#: ``ASPSESSIONID...``, Django's ``sessionid``.
_SESSION_COOKIES: Final = ("sessid", "sessionid")
_PASSWORD_PARTS: Final = frozenset({"password", "passwd", "passphrase", "passcode", "pass",
                                    "pwd", "pw", "pin", "passwort"})
#: A name part ending in one of these is a password's name glued to its owner's:
#: ``PGPASSWORD``, ``dbpassword``, ``ROOTPASSWD``.
_PASSWORD_ENDINGS: Final = ("password", "passwd", "passphrase", "passcode", "passwort")
#: A name part ``<owner>pass`` is a password's name glued to its owner's (``SSHPASS``,
#: ``ROOTPASS``, keytool's ``-storepass``) for these owners only: other words end in
#: "pass" too (``bypass``, ``compass``, ``renderpass``, ``highpass``).
_PASS_OWNERS: Final = frozenset({
    "ssh", "sshd", "root", "admin", "user", "usr", "my", "db", "mysql", "pg", "postgres",
    "redis", "mongo", "smtp", "mail", "imap", "pop", "ftp", "sftp", "ldap", "bind", "vnc",
    "rdp", "wifi", "wlan", "sudo", "sql", "proxy", "vpn", "git", "svn", "api", "app",
    "master", "super", "login", "sys", "rabbit", "amqp", "store", "key", "keystore",
    "truststore", "server", "web", "vault", "ssl", "tls", "cert", "pfx", "jks", "ipmi",
    "bmc", "rcon", "domain", "client", "bot", "auth", "http", "basic", "default", "new",
    "old", "dev", "prod", "jenkins", "nexus", "docker", "registry", "oracle", "sa",
})
_NAME_SPLIT = re.compile(r"[_.\-\s]+|(?<=[a-z0-9])(?=[A-Z])")


#: A name ending in one of these names something about a credential, not the credential:
#: where it is (``password_file``, ``token_url``, ``api_key_env``, ``--password-stdin``),
#: what kind (``auth_type``, ``signature_algorithm``), what checks or hashes it
#: (``PASSWORD_HASHERS``, ``AUTH_PASSWORD_VALIDATORS``), how long it lasts (``token_ttl``,
#: ``token_expiry_s``) or how many there may be (``token_limit``, ``api_key_quota``).
_ABOUT_PARTS: Final = frozenset({
    "file", "files", "path", "dir", "url", "uri", "endpoint", "host", "env", "var", "stdin",
    "cmd", "command", "type", "kind", "name", "algorithm", "alg", "format", "mode", "length",
    "len", "ttl", "timeout", "expiry", "expires", "lifetime", "seconds", "secs", "ms",
    "minutes", "hours", "days", "count", "policy", "prompt", "label", "field", "header",
    "required", "enabled", "rounds", "attempts", "provider", "helper", "source", "limit",
    "limits", "budget", "quota", "usage", "max", "min", "s", "sec", "hasher", "hashers",
    "validator", "validators",
})


#: A key of these names is a data key (a row's, a cache entry's), not a credential.
_DATA_KEY_PARTS: Final = frozenset({
    "primary", "foreign", "sort", "partition", "cache", "idempotency", "row", "object",
    "lookup", "dict", "map", "composite", "unique", "natural", "surrogate", "shard", "routing",
    "dedup", "dedupe", "group", "join", "index", "hash", "range", "cluster", "clustering",
    "bucket", "s3", "sorting", "message", "record", "entity", "item",
})


def _pin_name(name: str) -> bool:
    """Is "pin" the only password word of ``name``?"""
    parts = {p.lower() for p in _NAME_SPLIT.split(name.strip("\"'`$-[]")) if p}
    return bool(parts & {"pin", "pins"}) and not parts & (_PASSWORD_PARTS - {"pin"})


def pinned_version(name: str, value: str) -> bool:
    """Is ``value``, after a name whose only password word is "pin", a version pin
    ("pin: numpy==1.26.4", "pins: actions/checkout@v4") rather than a PIN?"""
    return _pin_name(name) and version_pin(value)


def _pin_at(text: str, name: str, start: int) -> bool:
    """Is the value at ``start``, its word or its clause, a version pinned by ``name``?"""
    if not _pin_name(name):
        return False
    clause = _clip(text[start:start + 200].split("\n", 1)[0])
    return version_pin(clause) or version_pin(clause.split(" ")[0])


def name_kind(name: str) -> str | None:
    """'password' for password-like names, 'secret' for other credential names, 'key' for
    names ending in key (need a random-looking value, a UUID or a long hex string),
    'datakey' for a bare "key" or a data key's name (see ``keyish``),
    'random' for a name whose value is a credential only when it looks random (a
    session's id; a count of a model's tokens, ``max_tokens``), None otherwise (also a
    name about a credential: see ``_ABOUT_PARTS``; a public key's, published)."""
    if name.strip("\"'`$-[]") == "Pat":
        return "random"  # a person named Pat ("Pat: 555-0134"), unless it looks random
    parts = [p.lower() for p in _NAME_SPLIT.split(name.strip("\"'`$-[]")) if p]
    if not parts or (len(parts) >= 2 and (parts[-1] in _ABOUT_PARTS or (
            parts[-2] in ("public", "pub") and parts[-1] in ("key", "keys")))):
        return None
    joined = {a + b for a, b in itertools.pairwise(parts)}
    if any(p in _PASSWORD_PARTS or p.endswith(_PASSWORD_ENDINGS)
           or (p.endswith("pass") and p[:-4] in _PASS_OWNERS) for p in parts):
        return "password"
    strong = {p for p in parts if p in _STRONG_PARTS or p.endswith(_SESSION_COOKIES)} | (
        joined & _STRONG_PARTS - _ONE_WORD)
    if strong == {"tokens"} or (strong and strong <= {"token", "tokens"}
                                and parts[-1] in ("id", "ids")):
        # A model's tokens counted (``max_tokens: 4096``, ``total_tokens``,
        # ``tokens_per_minute``) or a token's number in its vocabulary (``eos_token_id``),
        # far more often than a list of credentials: a number there is no secret; a
        # random-looking value still is.
        return "random"
    if strong:
        return "secret"
    if parts[-1] in ("key", "keys"):
        return "datakey" if len(parts) == 1 or parts[-2] in _DATA_KEY_PARTS else "key"
    if len(parts) >= 2 and parts[-2] == "key":
        return "key"
    # "session_id" names a conversation (in every note the daemon writes: a UUID, a chat's
    # number, "telegram-12345") far more often than a web session's token in memory: only
    # a value that looks random is one.
    if joined & _ONE_WORD:
        return "random"
    return None


_ASSIGN = re.compile(
    r"(?P<key>[\"'`]?(?<![\w.\-])[A-Za-z_$][\w.\-]{0,60}(?:[\"'`]\]?)?)"
    r"(?P<sep>[ \t]*(?::=|=>|==|:|=)[ \t]*|[ \t]+(?=[\"']))"
    r"(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}'|`[^`\n]{1,400}`"
    r"|[^\s\"'`,;&}\]\)<>|]{1,400}(?:[ \t]+[A-Za-z][a-z]*){0,8})"
)
#: A name and a quoted value that goes on past its line (:mod:`secret_wrapped`).
_ASSIGN_WRAPPED = re.compile(_ASSIGN.pattern[:_ASSIGN.pattern.index("(?P<value>")]
                             + MULTILINE_QUOTED)
_FLAG = re.compile(r"(?<!\S)--?(?P<key>[A-Za-z][\w\-]{0,40})(?:=|[ \t]+)"
                   r"(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}'|[^\s\"']{1,400})")
_XML = re.compile(r"<(?P<key>[A-Za-z][\w.\-:]{0,40})>(?P<value>[^<\n]{1,400})</(?P=key)>")


def phrase_words(name: str) -> int:
    """How many real words make a passphrase after ``name`` (0: never several words)."""
    return 2


#: A setting of its own where a value was looked for (its name, if a credential's, is an
#: anchor of its own: "auth: token=..." is found at "token").
_SETTING = re.compile(r"[A-Za-z_][\w.\-]{0,40}=(?!=)\S")


def value_span(kind: str, value: str, start: int, min_words: int,
                statement: str = "") -> Span | None:
    """The part of ``value`` (at ``start``) to mask, given the kind of name it belongs to."""
    quoted = len(value) >= 2 and value[0] in "\"'`" and value[-1] == value[0]
    if quoted:
        inner = value[1:-1]
        if (inner.startswith(("[REDACTED", "${", "{{", "<")) or PLACEHOLDER.match(inner)
                or len(inner) < 3
                or (kind in ("key", "datakey") and not keyish(inner, data=kind == "datakey"))
                or (kind == "random" and not looks_random(inner, 12))):
            return None
        return start + 1, start + len(value) - 1
    words = value.split()
    first = words[0] if words else ""
    if first.startswith("[REDACTED") or (first[:1] in "([" and (
            first[1:].isalpha() or code_reference(first[1:].rstrip(")")))):
        # A remark in brackets ("password: (see the wiki)"), or code making the value
        # (``-AccountPassword (ConvertTo-SecureString ...)``, ``-Credential (New-Object``).
        return None
    if kind != "password" and _SETTING.match(first):
        return None  # another setting: "auth: user=alice@example.com method=oidc"
    if kind in ("key", "datakey"):
        return (start, start + len(first)) if keyish(first, data=kind == "datakey") else None
    if kind == "secret" and version(first):
        return None  # a version, as an image's tag: "auth-service:v2.14.3"
    if kind == "random":
        return (start, start + len(first)) if looks_random(first, 12) else None
    if looks_secret(first):
        return start, start + len(first)
    if kind == "password":
        if min_words and passphrase(words, min_words):
            return start, start + len(value.rstrip())
        # "password: bluebird thanks" names it; in a sentence only a lone word does ("the
        # password is bluebird thanks", not "was stolen at the ATM", "set to expire monthly").
        alone = len(words) == 1 or (statement == "is" and all(
            w.lower().strip(".,!?") in FUNCTION_WORDS for w in words[1:]))
        if plain_password(first) and (not statement or (alone and not verb_form(first))):
            return start, start + len(first)
    return None


#: The rest of a value's run, read as far as the patterns read (at every anchor of a long
#: run, reading to its end would cost time squared in its length).
_RUN = re.compile(r"\S{0,400}")
_STOPS: Final = frozenset("()[]{}<>&;,|'`\"")
#: Where another assignment follows a value in the same run: ``token=abc&user=bob``,
#: ``Password=abc;Server=db``.
_NEXT_ASSIGNMENT = re.compile(r"[&;,|][\w.\-]+[=:]")


def names_a_source(text: str, start: int) -> bool:
    """Is the value at ``start`` code naming where the credential comes from
    (``get_password()``, ``os.environ["TOKEN"]``, ``self.password``, ``!vault``)?"""
    run = _RUN.match(text, start).group(0)  # type: ignore[union-attr]  # always matches
    return code_reference(strip_end(run))


def _whole_run(text: str, start: int, value: str) -> str:
    """``value`` (an unquoted value found at ``start``) to the end of its run of non-space
    characters, when the pattern stopped inside the run at a character that ends a value
    in a URL's query or a parenthesis (``( ) & ; , | < > '``) and the whole run is made
    like a password (``Ab3(xY9)z``, a Django ``SECRET_KEY``): masked up to that character,
    the rest of it was left. It stops before another assignment (``&user=``) and leaves
    out the punctuation that ends a sentence or closes a parenthesis."""
    end = start + len(value)
    if value[:1] in "\"'`“" or end >= len(text) or text[end] not in _STOPS:
        return value
    run_end = _RUN.match(text, end).end()  # type: ignore[union-attr]  # always matches
    nxt = _NEXT_ASSIGNMENT.search(text, end, run_end)
    run = strip_end(text[start:nxt.start() if nxt else run_end])
    if len(run) <= len(value) or not made_like_a_password(run):
        return value
    return run


#: A user and password pair handed to an auth parameter or class:
#: ``auth=("admin", "S3cret")``, ``HTTPBasicAuth("admin", "S3cret")``, ``BasicAuth('a', 'b')``.
_AUTH_PAIR = re.compile(
    r"(?i)auth\w{0,20}[ \t]*(?:=[ \t]*\(?|\()[ \t]*(?P<q>[\"'])[^\"'\n]{0,200}(?P=q)[ \t]*,"
    r"[ \t]*(?P<r>[\"'])(?P<value>[^\"'\n]{3,200})(?P=r)")


def _auth_pairs(text: str, a: int) -> Iterable[Span]:
    m = _AUTH_PAIR.match(text, a) if text[a:a + 4].lower() == "auth" else None
    if m is not None:
        value = m.group("value")
        if not PLACEHOLDER.match(value) and not value.startswith(("$", "{", "<", "[REDACTED")):
            yield m.start("value"), m.end("value")


def _wrapped_quoted(text: str, at: int) -> Iterable[Span]:
    """The value of a name at ``at`` quoted over several lines, judged as one line."""
    m = _ASSIGN_WRAPPED.match(text, at)
    if m is None or (kind := name_kind(m.group("key"))) is None:
        return
    value = joined(m.group("mvalue"))
    if value and value_span(kind, f'"{value}"', 0, 0) is not None:
        yield m.start("mvalue"), m.end("mvalue")


#: A file path's run of characters up to one of its parts: from the root, the home or
#: the current folder, or a drive (``/etc/``, ``~/.config/app/``, ``./conf/``, ``C:\\``).
_PATH_BEFORE = re.compile(r"(?:[/~.]|[A-Za-z]:\\)[^\s\"'`]*[/\\]\Z")


def in_path(text: str, at: int) -> bool:
    """Is the word at ``at`` a part of a file path (``/etc/passwd``, ``~/.aws/token``)? A
    file so named is no credential's name: what follows it is not its value ("refusing
    /etc/passwd: BadZipFile ..."). "user/password: ..." names two things, no path."""
    if at == 0 or text[at - 1] not in "/\\":
        return False
    start, stop = at - 1, max(0, at - 256)
    while start > stop and not text[start - 1].isspace() and text[start - 1] not in "\"'`(":
        start -= 1
    return _PATH_BEFORE.match(text, start, at) is not None


def find_assignments(text: str, starts: Sequence[int]) -> Iterable[Span]:
    for a in starts:
        if in_path(text, a):
            continue
        yield from _auth_pairs(text, a)
        for key_start in (a, a - 1) if a and text[a - 1] in "\"'`" else (a,):
            m = _ASSIGN.match(text, key_start)
            if m is None:
                yield from _wrapped_quoted(text, key_start)
                continue
            if (kind := name_kind(m.group("key"))) is None or names_a_source(
                    text, m.start("value")) or _pin_at(text, m.group("key"), m.start("value")):
                continue
            sep = m.group("sep")
            # Several words only after ':' or '=' (YAML, .env, prose "pw: ...").
            span = value_span(kind, _whole_run(text, m.start("value"), m.group("value")),
                               m.start("value"),
                               phrase_words(m.group("key")) if sep.strip() in (":", "=") else 0)
            if span is not None:
                yield continued(text, span) if m.group("value")[:1] not in "\"'`" else span
            elif text.startswith(MASK, at := m.start("value")):
                # Masked before the pieces below it were read as its own (an older note).
                below = pieces_below(text, at, at + len(MASK))
                if below is not None:
                    yield below
        m = _FLAG.match(text, a) if text.startswith("-", a) else None
        if m is not None and (kind := name_kind(m.group("key"))) is not None:
            span = value_span(kind, m.group("value"), m.start("value"), 0)
            if span is not None:
                yield span
        m = _XML.match(text, a - 1) if a and text[a - 1] == "<" else None
        if m is not None and (kind := name_kind(m.group("key"))) is not None:
            value = m.group("value").strip()
            if kind == "random":
                if looks_random(value, 12):
                    yield m.start("value"), m.end("value")
            elif value and (looks_secret(value) or kind == "password"):
                yield m.start("value"), m.end("value")


CRED = (r"(?:pass(?:word|phrase|code|wd)s?|pass\s+(?:phrase|code)|pins?(?:\s+(?:code|number))?"
         r"|pwd?|(?:secret|api|access|private|signing|encryption|master|license|ssh|app)"
         r"[\s_\-]?(?:key|token|secret)s?|(?:access|auth|bearer|api|refresh|session|bot)[\s_\-]?"
         r"tokens?|tokens?|secrets?|credentials?|creds|logins?|(?:client|app)[\s_\-]secrets?|otp"
         r"|keys?|(?:php|j|asp)?sess(?:ion)?ids?|session[\s_\-]?cookies?"
         # A personal access token's acronym, in capitals only: "Pat" names a person.
         r"|(?-i:PATs?))")
_STATE = re.compile(
    r"(?i)\b(?P<cred>(?:[A-Za-z0-9]+[_\-])*" + CRED + r")\b"
    r"(?P<mid>(?:[ \t]+(?:for|of|on|to|at|in|from)(?:[ \t]+(?!(?:is|was|are|were)\b)"
    r"[^\s.,;:!?\"']+){1,4})?)"
    r"(?P<verb>[ \t]*(?:'s|’s)|[ \t]+(?:is|was|are|were)(?:[ \t]+(?:now|still|just|actually"
    r"|currently|set[ \t]+to|changed[ \t]+to))?|[ \t]+(?:will[ \t]+be|became|becomes)"
    r"|[ \t]*(?:=|->|=>|:|是|为|為)|[ \t]+[-—][ \t]+|—|\?[ \t]*(?:it['’]?s|it[ \t]+is))"
    r"[ \t]*(?:[:\-—][ \t]*)?"
    r"(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|“[^”\n]{1,200}”|`[^`\n]{1,200}`"
    r"|[!#-&*-~\u00a0-\u024f]{1,400}(?:[ \t]+[^\s.,;!?\"'“`()]{1,200}){0,8})"
)
_SET = re.compile(
    r"(?i)\b(?:set|change[ds]?|reset|update[ds]?|rotated?)[ \t]+(?:(?:the|my|our|your|his|her"
    r"|their|its)[ \t]+)?(?:[\w\-]+[ \t]+)?(?P<cred>(?:[A-Za-z0-9]+[_\-])*" + CRED + r")\b"
    r"(?:[ \t]+(?:for|of|on)"
    r"[ \t]+[\w.\-]+(?:[ \t]+[\w.\-]+)?)?[ \t]+(?:to|as|=)[ \t]+"
    r"(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|[!#-&*-~\u00a0-\u024f]{1,400}"
    r"(?:[ \t]+[^\s.,;!?\"'()]{1,200}){0,8})"
)
#: "is" or "as", then at most an article and one word, right before the credential word.
_IS_OR_AS = re.compile(r"(?i)[ \t](?:is|as)[ \t]+(?:[\w\-]+[ \t]+){0,2}\Z")
#: (Searched before each credential word: it starts with the set of its verbs' first
#: letters, in either case, "\u017f" the long s case-insensitive "s" matches, so a search
#: tries it only where one is, not at every position; the word boundary is checked
#: behind that letter.)
_SET_VERB = re.compile(r"[cCrRsSuU\u017f](?<=\b.)(?i:(?<=s)et|(?<=c)hange[ds]?|(?<=r)eset"
                       r"|(?<=u)pdate[ds]?|(?<=r)otated?)[ \t]")
_SET_REACH = 80  # the verb is at most this far before the credential word
#: A value named as the credential after it: "use Tr0ub4dor&3 as the password", "enter
#: 4821 as your PIN", "bluebird is the wifi password". The value starts a clause; the
#: credential word ends its noun phrase ("use bcrypt as the password hash" names none).
_NAMED_AS = re.compile(
    r"(?i)(?:\b(?:use[ds]?|using|try|tried|enter(?:ed)?|type[ds]?|typed|put|pick(?:ed)?"
    r"|choose|chose|take|took)[ \t]+(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|[^\s\"']{1,200})"
    r"[ \t]+as"
    r"|(?:(?P<clause>(?:(?<=\n)|^)[ \t]*(?:[-*•>][ \t]+)?|(?<=[.!?:;,(—–])[ \t]*"
    r"|(?<=\s-)[ \t]+)|(?<![^\s\"'])(?=[^\s\"']*[^A-Za-z\s\"']))"
    r"(?P<subject>[^\s\"']{1,200})"
    r"[ \t]+is)"
    r"[ \t]+(?:(?:the|my|our|your|his|her|their|its|a|an|new)[ \t]+)?(?:[\w\-]+[ \t]+)?"
    r"(?P<cred>" + CRED + r")\b"
    r"(?![ \t]+(?!(?:for|on|of|to|in|at|and|but|so|when|if|from|here|there|now|please|too"
    r"|again|instead|until|thanks|thank|btw|ok|okay|cheers|though|anyway|right)\b)[A-Za-z])"
    r"(?!['’]s|[\w\-])")
_CLAUSE_END = re.compile(r"[.,;:!?)](?:\s|$)|\s(?:and|but|so|then|which|because)\s|\n")


def _cred_kind(word: str) -> str:
    """How strong a value must look where ``word`` names it (see :func:`name_kind`)."""
    return name_kind(word.replace(" ", "_")) or "secret"


def _clip(value: str) -> str:
    """``value`` up to the end of its clause (a passphrase ends there)."""
    if value[:1] in "\"'“`":
        return value
    m = _CLAUSE_END.search(value)
    out = value[: m.start() + (1 if value[m.start()] in ".,;:!?)" else 0)] if m else value
    nxt = _NEXT_ASSIGNMENT.search(out)
    return strip_end(out[:nxt.start()] if nxt else out)


def _statements_at(text: str, starts: Sequence[int]) -> Iterable[re.Match[str]]:
    for a in starts:
        if in_path(text, a):
            continue
        m = _STATE.match(text, a)
        if m is not None:
            yield m
        for verb in _SET_VERB.finditer(text, max(0, a - _SET_REACH), a):
            m = _SET.match(text, verb.start())
            if m is not None:
                yield m
        before = text[max(0, a - 40):a].lower()
        if ("is " not in before and "as " not in before) or _IS_OR_AS.search(before) is None:
            continue  # no "is" or "as" before the word: nothing is named as it
        for m in _NAMED_AS.finditer(text, max(0, a - _SET_REACH), a + _SET_REACH):
            if m.start("cred") == a:
                yield m


def find_statements(text: str, starts: Sequence[int]) -> Iterable[Span]:
    for m in _statements_at(text, starts):
        group = "subject" if m.re is _NAMED_AS and m.group("value") is None else "value"
        at = m.start(group)
        if group == "subject" and m.group("clause") is None and not looks_secret(
                m.group(group)):
            continue  # inside a clause only what looks like a secret: "FYI Gy7!x is ..."
        if names_a_source(text, at):
            continue
        cred = m.group("cred")
        if _pin_at(text, cred, at):
            continue
        kind = _cred_kind(cred)
        # A subject ends where "is" starts: its last character is its own, not a full stop.
        value = m.group(group) if group == "subject" else _whole_run(text, at,
                                                                    _clip(m.group(group)))
        if not value:
            continue
        if value[:1] == "“":
            value = '"' + value[1:-1] + '"'
        if (kind != "random" and cred.lower().endswith("s")
                and not cred.lower().endswith(("pass", "ss"))):
            kind = "secret"  # "PINs are ...", "passwords are ...": about them in general
        first = value.split()[0] if value.split() else ""
        if cred.lower().startswith("login") and "/" not in first and not looks_random(
                first.strip("\"'`“”"), 12):
            continue  # "login: alice@example.com" names the user ("admin/S3cret": a pair)
        if first.endswith("ly") and not any(c.isdigit() for c in first):
            continue  # "is usually", "was initially": a description
        if m.re is _STATE and m.group("verb").strip() in ("'s", "’s") and not looks_secret(
                first):
            continue  # "the password's main strength": what it has, not what it is
        span = value_span(kind, value, at, phrase_words(cred),
                           statement="is" if m.re is _STATE else "set")
        if span is not None:
            yield _to_run_end(text, span)


#: What a bare value of a statement is made of (its patterns read at most 400 of them:
#: read to the end at every anchor of a long run, they cost time squared in its length).
_RUN_CHAR = re.compile(r"[!#-&*-~\u00a0-\u024f]*")


def _to_run_end(text: str, span: Span) -> Span:
    """``span``, reaching to the end of a value longer than the patterns read."""
    start, end = span
    if end - start < 400 or end >= len(text):
        return span
    m = _RUN_CHAR.match(text, end)
    return start, len(strip_end(m.group(0))) + end if m is not None else end


_CLOSERS: Final = {")": "(", "]": "[", "}": "{", ">": "<"}


def strip_end(value: str) -> str:
    """``value`` without the punctuation that ends a sentence after it, nor a bracket
    closing one opened before it ("(token: Ab3xY9z)", "[token limit]")."""
    value = value.rstrip(".,;:!?\"'")
    while value.endswith((")", "]", "}", ">")) and value.count(value[-1]) > value.count(
            _CLOSERS[value[-1]]):
        value = value[:-1].rstrip(".,;:!?\"'")
    return value


def made_like_a_password(value: str) -> bool:
    """Upper and lower case letters and digits together, or a random-looking string."""
    digit, upper, lower, _ = classes(value)
    return (digit and upper and lower and not PLACEHOLDER.match(value)) or looks_random(
        value, 12)
