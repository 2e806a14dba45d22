"""The rules of secrets redaction (:mod:`redact` applies them): what a credential looks
like, by its shape alone (``FORMAT_RULES``) or by a credential word next to it
(``CONTEXT_RULES``).

- *formats*: private key blocks of every armour (PEM, OpenSSH, encrypted, PGP, PuTTY,
  age), cloud keys (AWS access key ids and secret keys, GCP OAuth secrets and tokens,
  Azure storage and connection-string keys, Alibaba), SaaS tokens (GitHub, GitLab, Slack,
  Telegram, SendGrid, Stripe, Twilio, npm, PyPI, OpenAI, Anthropic, Google, Discord,
  Mailgun, Hugging Face, DigitalOcean, Shopify and other vendors' prefixed tokens), JSON
  Web Tokens, webhook URLs and the password of ``scheme://user:password@host`` URLs;
- *context*: values assigned to credential-like names (``password=...``, ``pw: ...``,
  ``"api_key": "..."``, ``--token ...``, ``<password>...</password>``, connection-string
  ``Pwd=...;``), credentials stated in prose ("the password for prod is ...", "my
  passphrase is correct horse battery staple", "set the token to ..."), and high-entropy
  strings near a credential word ("the AWS secret key is wJalr...").

Each rule names the lowercase hints one of which must occur in a text for its spans to
count; ``redact.find_spans`` decides in whichever order is cheaper (a token rule's pattern
over the few token runs first, or the hints first), the context rules' hints from the
positions of the anchor words. Deliberately not
secrets: bare git commit ids and other hex digests, UUIDs, ordinary words, numbers, paths
and URLs without credentials, placeholders (``<token>``, ``${VAR}``, ``****``), and talk
about credentials ("my password is too weak", "the token is refreshed hourly").
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

Span = tuple[int, int]
#: A format finder: spans of ``text[pos:endpos]`` (patterns still see what lies around).
Finder = Callable[[str, int, int], Iterable[Span]]
#: A context finder: the text and the positions where a credential word (or the name
#: holding one) starts; it tries its patterns only there.
AnchoredFinder = Callable[[str, Sequence[int]], Iterable[Span]]


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of secret: ``find`` yields its spans in a text containing one of ``hints``
    (lowercase substrings; empty: always run). ``format`` rules recognise a secret by its
    shape alone; context rules (``anchored`` set instead of ``find``) need a credential
    word and look only where one is (see :func:`anchors`)."""

    kind: str
    hints: tuple[str, ...]
    find: Finder | None = None
    anchored: AnchoredFinder | None = None
    format: bool = True
    #: A token rule's secrets are single runs of token characters (see ``TOKEN_RUN``):
    #: it looks only inside such runs.
    token: bool = False
    #: The pattern ``find`` runs (None: not one pattern), for :func:`token_prefilter`.
    pattern: re.Pattern[str] | None = None


#: A run of characters tokens are made of, long enough to hold any token a token rule
#: knows; prose has few, so token rules look only inside them (see :func:`token_runs`).
TOKEN_RUN: Final = re.compile(r"[A-Za-z0-9_\-.:/+=~]{16,}")
_RUN_CHAR = r"[A-Za-z0-9_\-.:/+=~]"
# TOKEN_RUN's matches, found by one match per run: skip shorter runs with what follows
# them, then take a run. A search for TOKEN_RUN itself would rescan each short run (each
# word) from every one of its characters. Not possessive: before Python 3.11.5 a
# possessive repeat of a group that can backtrack matched wrongly (gh-106052), and here
# that skipped runs.
_SKIP_TO_RUN: Final = re.compile(
    rf"(?:{_RUN_CHAR}{{0,15}}[^A-Za-z0-9_\-.:/+=~]+)*({_RUN_CHAR}{{16,}})?")


def token_runs(text: str) -> list[Span]:
    """The spans of ``TOKEN_RUN``'s matches in ``text`` (``finditer``'s, found faster)."""
    return [m.span(1) for m in _SKIP_TO_RUN.finditer(text) if m.start(1) >= 0]


# -- value judgement ---------------------------------------------------------------------

_HEX = re.compile(r"^[0-9a-fA-F]+$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_PLACEHOLDER = re.compile(
    r"(?i)^(?:\[redacted\]|\*+|x+|\.+|-+|_+|#+|<[^>]*>|\$\{?[A-Za-z_][\w]*\}?|\{\{[^}]*\}\}"
    r"|%\(?[\w]*\)?s?|none|null|nil|true|false|yes|no|required|optional|string|str|env"
    r"|undefined|empty|placeholder|redacted)$")
#: Grammar words: a value starting with one describes a credential ("is too weak", "is
#: the name of my dog"), it is not one.
_FUNCTION_WORDS: Final = frozenset("""
a an the not too very so still just also now then being been no any some all only never
always usually same different in on at of for to from with by as into about my your his her
our their its this that these those it what which who whom how where when why here there
nothing something anything everything somewhere and or but if because since while although
though than like is are was were be will would should could can may might must do does did
has have had i you he she we they me us them one two three four five six seven eight nine
ten several many few more most less least please thanks thank sorry yeah yep nope sure
maybe really actually probably definitely literally basically again either neither both
each every other another such own online offline yesterday today tomorrow tonight recently
already soon later earlier somewhere everywhere anywhere nowhere home outside inside away
ago last next once twice day days week weeks month months year years night morning evening
""".split())
#: Words judging or describing a credential: alone they are not one ("my password is
#: correct", "the password is stored"), though a passphrase may start with one.
_JUDGEMENT_WORDS: Final = frozenset("""
saved stored kept written hidden shown sent encrypted hashed required needed optional set
reset changed updated generated managed known unknown missing empty blank expired rotated
revoked valid invalid wrong incorrect correct right weak strong long short easy hard simple
complex complicated secure insecure safe unsafe fine ok okay good bad great important
private public personal shared case sensitive new old same different fixed broken locked
protected lost forgotten compromised leaked enabled disabled needed working ready
""".split())
_WORD = re.compile(r"[A-Za-z][a-z]*")


def entropy_bits(text: str) -> float:
    """Shannon entropy of ``text`` in bits per character."""
    if not text:
        return 0.0
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _classes(value: str) -> tuple[bool, bool, bool, bool]:
    return (any(c.isdigit() for c in value), any(c.isupper() for c in value),
            any(c.islower() for c in value), any(not c.isalnum() for c in value))


def _compound(value: str) -> bool:
    """Words joined by ``-``, ``_`` or ``.`` ("NLRP12-associated", "helix-loop-helix",
    "test_disk_full"): every piece a lowercase word or short, one a real word."""
    pieces = [p for p in re.split(r"[-_.]+", value) if p]
    return len(pieces) >= 2 and any(len(p) >= 4 and p.isalpha() and p.islower() for p in pieces) \
        and all((p.isalpha() and (p.islower() or p.istitle())) or len(p) <= 6 for p in pieces)


def looks_random(value: str, min_len: int = 16) -> bool:
    """Is ``value`` a machine-made secret (long, mixed, high-entropy), not a word or a
    digest? Hex strings and UUIDs are not (commit ids, checksums, request ids)."""
    if len(value) < min_len or _HEX.match(value) or _UUID.match(value) or _compound(value):
        return False
    digit, upper, lower, _ = _classes(value)
    if sum((digit, upper, lower)) < 2:
        return False
    if not digit and _WORD.fullmatch(value.replace("_", "").replace("-", "")[:1] or "1"):
        # Letters only: camelCase identifiers are words glued together; need more entropy.
        return entropy_bits(value) >= 4.0 and sum(c.isupper() for c in value) >= len(value) / 5
    return entropy_bits(value) >= min(3.0 + len(value) / 32, 3.8)


def looks_secret(value: str) -> bool:
    """Would this value, found where a credential is expected, plausibly be one (not prose,
    not a placeholder)?"""
    if len(value) < 4 or _PLACEHOLDER.match(value) or value.startswith(("[REDACTED", "<", "$")):
        return False
    if _UUID.match(value) or looks_random(value):
        return True
    if value.isalpha() and value.islower():
        return False  # a plain word: "token: each", "password: required"
    digit, upper, lower, symbol = _classes(value)
    return digit or symbol or (upper and lower and any(c.isupper() for c in value[1:]))


def _keyish(value: str) -> bool:
    """A value named only "...key": random-looking, a UUID, or a long hex string."""
    return (looks_random(value, 12) or bool(_UUID.match(value))
            or (len(value) >= 16 and bool(_HEX.match(value))))


def _plain_password(value: str) -> bool:
    """A single plain word where a password is stated ("the wifi password is bluebird")."""
    return (len(value) >= 4 and value.isalpha() and not _PLACEHOLDER.match(value)
            and value.lower() not in _FUNCTION_WORDS | _JUDGEMENT_WORDS)


def _verb_form(word: str) -> bool:
    """A participle or adverb after "is"/"was": what happened to a credential ("was
    hacked", "is expiring", "was stolen", "is usually")."""
    return word.lower().endswith(("ed", "en", "ing", "ly")) and not any(
        c.isdigit() for c in word)


def _passphrase(words: Sequence[str], min_words: int) -> bool:
    """Several words stated as a password or passphrase ("correct horse battery staple"),
    not a description of one ("too weak and short", "stored in the vault", "stolen at the
    ATM"): at least ``min_words`` words that are neither grammar nor judgement."""
    first = words[0].lower() if words else ""
    if (len(words) < 2 or not first.isalpha() or first in _FUNCTION_WORDS
            or _PLACEHOLDER.match(first) or (_verb_form(first) and first not in _JUDGEMENT_WORDS)):
        return False
    content = [w for w in words if w.lower() not in _FUNCTION_WORDS | _JUDGEMENT_WORDS]
    return len(content) >= min_words and all(w.isalpha() for w in content[:min_words])


# -- format rules ------------------------------------------------------------------------

_B = r"(?<![A-Za-z0-9_\-])"  # token start: not glued to a word before it
_E = r"(?![A-Za-z0-9_\-])"  # token end


def _regex_rule(kind: str, hints: tuple[str, ...], pattern: str, flags: int = 0,
                group: int = 0, check: Callable[[str], bool] | None = None,
                token: bool = True) -> Rule:
    rx = re.compile(pattern, flags)

    def find(text: str, pos: int, endpos: int) -> Iterable[Span]:
        for m in rx.finditer(text, pos, endpos):
            if m.group(group) and (check is None or check(m.group(group))):
                yield m.span(group)

    return Rule(kind, hints, find, token=token, pattern=rx)


def token_prefilter(rules: Sequence[Rule]) -> re.Pattern[str] | None:
    """One pattern that matches in a stretch of text wherever the pattern of any of
    ``rules``' token rules does (their alternation), so a token run where it finds nothing
    needs none of them; None if some token rule has no plain pattern to join."""
    token = [r for r in rules if r.find is not None and r.token]
    if any(r.pattern is None or r.pattern.flags & ~re.UNICODE for r in token):
        return None
    return re.compile("|".join(f"(?:{r.pattern.pattern})" for r in token
                               if r.pattern is not None))


def _tail_random(value: str) -> bool:
    """A prefixed token's characters are mixed (not a word, a phrase or a path)."""
    digit, upper, lower, _ = _classes(value)
    return (digit and (upper or lower)) or (upper and lower and entropy_bits(value) >= 3.5)


_KEY_BLOCK = (
    r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----"
    r".*?(?:-----END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|\Z)"
)
_PUTTY = (
    r"PuTTY-User-Key-File-\d:.*?(?:Private-MAC:\s*[0-9a-fA-F]+|Private-Hash:\s*[0-9a-fA-F]+|\Z)"
)

FORMAT_RULES: Final[tuple[Rule, ...]] = (
    _regex_rule("private_key", ("private key",), _KEY_BLOCK, re.S, token=False),
    _regex_rule("putty_key", ("putty-user-key-file",), _PUTTY, re.S, token=False),
    _regex_rule("age_key", ("age-secret-key-",), r"AGE-SECRET-KEY-1[0-9A-Z]{50,}"),
    _regex_rule("aws_access_key_id", ("akia", "asia", "abia", "acca", "a3t"),
                _B + r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}" + _E),
    _regex_rule("aws_secret_key", (),
                r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
                check=lambda v: ("//" not in v and v.count("/") + v.count("+") <= 6
                                 and all(_classes(v)[:3]) and entropy_bits(v) >= 4.2)),
    _regex_rule("github", ("gh", "github_pat_"),
                _B + r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})" + _E),
    _regex_rule("gitlab", ("gl", "gr1348941"),
                _B + r"(?:gl(?:pat|dt|rt|ptt|ft|cbt|oas|soat|imt|agent|ffct|wt)-[A-Za-z0-9_\-]{20,}"
                r"(?:\.[A-Za-z0-9_\-]+)*"
                r"|GR1348941[A-Za-z0-9_\-]{20,})" + _E),
    _regex_rule("slack_token", ("xox", "xapp-"),
                _B + r"(?:xox[abposre](?:\.xox[a-z])?-[A-Za-z0-9\-]{10,}"
                r"|xapp-\d-[A-Za-z0-9\-]{10,})" + _E),
    _regex_rule("webhook_url", ("hooks.slack.com", "/api/webhooks/", "webhook.office.com",
                                "hooks.zapier.com"),
                r"https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
                r"|(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/"
                r"|[\w.\-]*webhook\.office\.com/webhookb2/"
                r"|hooks\.zapier\.com/hooks/catch/)[A-Za-z0-9_/+@\-]+", token=False),
    _regex_rule("telegram_bot_token", (":",),
                r"(?<![\w:])\d{5,12}:[A-Za-z0-9_\-]{30,50}(?![\w\-])", check=_tail_random),
    _regex_rule("sendgrid", ("sg.",), _B + r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{30,}" + _E),
    _regex_rule("stripe", ("_live_", "_test_", "_prod_", "whsec_"),
                _B + r"(?:(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{20,})"
                + _E),
    _regex_rule("twilio", ("sk", "ac"), _B + r"(?:SK|AC)[0-9a-f]{32}" + _E),
    _regex_rule("npm", ("npm_",), _B + r"npm_[A-Za-z0-9]{36}" + _E),
    _regex_rule("pypi", ("pypi-",), _B + r"pypi-[A-Za-z0-9_\-]{40,}" + _E),
    _regex_rule("openai_anthropic", ("sk-",), _B + r"sk-[A-Za-z0-9_\-]{20,}" + _E,
                check=_tail_random),
    _regex_rule("google", ("aiza", "gocspx-", "ya29.", "1//"),
                _B + r"(?:AIza[0-9A-Za-z_\-]{35}|GOCSPX-[A-Za-z0-9_\-]{20,}"
                r"|ya29\.[0-9A-Za-z_\-]{20,}|1//0[0-9A-Za-z_\-]{30,})" + _E),
    _regex_rule("discord_token", (".",),
                _B + r"[MNO][A-Za-z0-9_\-]{23,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,40}" + _E,
                check=_tail_random),
    _regex_rule("mailgun", ("key-", "-"),
                _B + r"(?:key-[0-9a-zA-Z]{32}|[0-9a-f]{32}-[0-9a-f]{8}-[0-9a-f]{8})" + _E),
    _regex_rule("huggingface", ("hf_", "api_org_"),
                _B + r"(?:hf_|api_org_)[A-Za-z0-9]{30,}" + _E),
    _regex_rule("digitalocean", ("_v1_",), _B + r"do[opr]_v1_[a-f0-9]{64}" + _E),
    _regex_rule("shopify", ("shp",), _B + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _E),
    _regex_rule("azure_key", ("accountkey", "sharedaccesskey", "sig="),
                r"(?i)(?:AccountKey|SharedAccessKey|SharedAccessSignature|[?&]sig)="
                r"([A-Za-z0-9+/%=]{16,})", group=1, token=False),
    _regex_rule("azure_client_secret", ("q~",),
                _B + r"[a-zA-Z0-9_~.]{3}\dQ~[a-zA-Z0-9_~.\-]{31,34}" + _E),
    _regex_rule("alibaba", ("ltai",), _B + r"LTAI[A-Za-z0-9]{12,24}" + _E),
    # Vendors whose tokens carry a fixed prefix, then a random tail.
    _regex_rule("vendor_token",
                ("_", "-", "."),
                _B + r"(?:glc_|glsa_|lin_api_|ntn_|secret_|PMAK-|pul-|hv[sb]\.|sntrys_"
                r"|sq0(?:atp|csp)-|gsk_|r8_|pplx-|xai-|figd_|fo1_|pscale_(?:tkn|pw|oauth)_|sbp_"
                r"|tskey-(?:auth|api)-"
                r"|bkua_|tfp_|NRAK-|aio_|lsv2_(?:pt|sk)_|ops_eyJ|CLOJARS_|rubygems_|dckr_pat_"
                r"|dapi|dp\.(?:pt|st|sa|ct|scim|audit)\.|ATATT3|AKCp|HRKU-|EAA[A-Za-z0-9]{4}"
                r"|sk\.eyJ|oy2|cfut_|pat_|rk_|key_|ak_|tok_|api_)[A-Za-z0-9_\-=.]{20,}" + _E,
                check=_tail_random),
    _regex_rule("jwt", ("eyj",),
                _B + r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}" + _E),
    _regex_rule("url_password", ("://",),
                r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@\"'<>]*:([^\s/\"'<>]+)@(?=[\w.\-\[])",
                group=1, check=lambda v: not _PLACEHOLDER.match(v), token=False),
    _regex_rule("auth_header", ("bearer", "basic", "token "),
                r"(?i)\b(?:bearer|basic|token)\s+([A-Za-z0-9\-._~+/]{16,}=*)",
                group=1, check=lambda v: looks_random(v, 16) or bool(_HEX.match(v)), token=False),
)


# -- context rules -----------------------------------------------------------------------

#: Words naming a credential, in names (split into parts) and in prose.
_STRONG_PARTS: Final = frozenset({
    "password", "passwd", "passphrase", "passcode", "pass", "pwd", "pw", "pin", "passwort",
    "secret", "secrets", "token", "tokens", "apikey", "credential", "credentials", "cred",
    "creds", "auth", "authorization", "sig", "signature", "cookie", "sessionid",
    "privatekey", "secretkey", "accesskey", "clientsecret", "pat", "otp", "totp", "mfa",
})
_PASSWORD_PARTS: Final = frozenset({"password", "passwd", "passphrase", "passcode", "pass",
                                    "pwd", "pw", "pin", "passwort"})
_NAME_SPLIT = re.compile(r"[_.\-\s]+|(?<=[a-z0-9])(?=[A-Z])")


def _name_kind(name: str) -> str | None:
    """'password' for password-like names, 'secret' for other credential names, 'key' for
    names ending in key (need a random-looking value), None otherwise."""
    parts = [p.lower() for p in _NAME_SPLIT.split(name.strip("\"'`$-")) if p]
    if not parts:
        return None
    joined = {a + b for a, b in itertools.pairwise(parts)}
    if any(p in _PASSWORD_PARTS for p in parts):
        return "password"
    if any(p in _STRONG_PARTS for p in parts) or joined & _STRONG_PARTS:
        return "secret"
    if parts[-1] in ("key", "keys") or (len(parts) >= 2 and parts[-2] in ("key",)):
        return "key"
    return None


_ASSIGN = re.compile(
    r"(?P<key>[\"'`]?(?<![\w.\-])[A-Za-z_$][\w.\-]{0,60}[\"'`]?)"
    r"(?P<sep>[ \t]*(?::=|=>|==|:|=)[ \t]*|[ \t]+(?=[\"']))"
    r"(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}'|`[^`\n]{1,400}`"
    r"|[^\s\"'`,;&}\]\)<>|]{1,400}(?:[ \t]+[A-Za-z][a-z]*){0,8})"
)
_FLAG = re.compile(r"(?<!\S)--?(?P<key>[A-Za-z][\w\-]{0,40})(?:=|[ \t]+)"
                   r"(?P<value>\"[^\"\n]{1,400}\"|'[^'\n]{1,400}'|[^\s\"']{1,400})")
_XML = re.compile(r"<(?P<key>[A-Za-z][\w.\-:]{0,40})>(?P<value>[^<\n]{1,400})</(?P=key)>")


def _phrase_words(name: str) -> int:
    """How many real words make a passphrase after ``name`` (0: never several words)."""
    return 2


def _value_span(kind: str, value: str, start: int, min_words: int,
                statement: str = "") -> Span | None:
    """The part of ``value`` (at ``start``) to mask, given the kind of name it belongs to."""
    quoted = len(value) >= 2 and value[0] in "\"'`" and value[-1] == value[0]
    if quoted:
        inner = value[1:-1]
        if (inner.startswith(("[REDACTED", "${", "{{", "<")) or _PLACEHOLDER.match(inner)
                or len(inner) < 3 or (kind == "key" and not _keyish(inner))):
            return None
        return start + 1, start + len(value) - 1
    words = value.split()
    first = words[0] if words else ""
    if first.startswith("[REDACTED"):
        return None
    if kind == "key":
        return (start, start + len(first)) if _keyish(first) else None
    if looks_secret(first):
        return start, start + len(first)
    if kind == "password":
        if min_words and _passphrase(words, min_words):
            return start, start + len(value.rstrip())
        # "password: bluebird thanks" names it; in a sentence only a lone word does ("the
        # password is bluebird thanks", not "was stolen at the ATM", "set to expire monthly").
        alone = len(words) == 1 or (statement == "is" and all(
            w.lower().strip(".,!?") in _FUNCTION_WORDS for w in words[1:]))
        if _plain_password(first) and (not statement or (alone and not _verb_form(first))):
            return start, start + len(first)
    return None


def _find_assignments(text: str, starts: Sequence[int]) -> Iterable[Span]:
    for a in starts:
        for key_start in (a, a - 1) if a and text[a - 1] in "\"'`" else (a,):
            m = _ASSIGN.match(text, key_start)
            if m is None or (kind := _name_kind(m.group("key"))) is None:
                continue
            sep = m.group("sep")
            # Several words only after ':' or '=' (YAML, .env, prose "pw: ...").
            span = _value_span(kind, m.group("value"), m.start("value"),
                               _phrase_words(m.group("key")) if sep.strip() in (":", "=") else 0)
            if span is not None:
                yield span
        m = _FLAG.match(text, a) if text.startswith("-", a) else None
        if m is not None and (kind := _name_kind(m.group("key"))) is not None:
            span = _value_span(kind, m.group("value"), m.start("value"), 0)
            if span is not None:
                yield span
        m = _XML.match(text, a - 1) if a and text[a - 1] == "<" else None
        if m is not None and (kind := _name_kind(m.group("key"))) is not None:
            value = m.group("value").strip()
            if value and (looks_secret(value) or kind == "password"):
                yield m.start("value"), m.end("value")


_CRED = (r"(?:pass(?:word|phrase|code|wd)s?|pass\s+(?:phrase|code)|pins?(?:\s+(?:code|number))?"
         r"|pwd?|(?:secret|api|access|private|signing|encryption|master|license|ssh|app)"
         r"[\s_\-]?(?:key|token|secret)s?|(?:access|auth|bearer|api|refresh|session|bot)[\s_\-]?"
         r"tokens?|tokens?|secrets?|credentials?|creds|logins?|(?:client|app)[\s_\-]secrets?|otp"
         r"|keys?)")
_STATE = re.compile(
    r"(?i)\b(?P<cred>(?:[A-Za-z0-9]+[_\-])*" + _CRED + r")\b"
    r"(?P<mid>(?:[ \t]+(?:for|of|on|to|at|in|from)(?:[ \t]+(?!(?:is|was|are|were)\b)"
    r"[^\s.,;:!?\"']+){1,4})?)"
    r"(?P<verb>[ \t]*(?:'s|’s)|[ \t]+(?:is|was|are|were)(?:[ \t]+(?:now|still|just|actually"
    r"|currently|set[ \t]+to|changed[ \t]+to))?|[ \t]+(?:will[ \t]+be|became|becomes)"
    r"|[ \t]*(?:=|->|=>|:)|[ \t]+[-—][ \t]+|—)"
    r"[ \t]*(?:[:\-—][ \t]*)?"
    r"(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|“[^”\n]{1,200}”|`[^`\n]{1,200}`"
    r"|[!#-&*-~\u00a0-\u024f]+(?:[ \t]+[^\s.,;!?\"'“`()]+){0,8})"
)
_SET = re.compile(
    r"(?i)\b(?:set|change[ds]?|reset|update[ds]?|rotated?)[ \t]+(?:(?:the|my|our|your|his|her"
    r"|their|its)[ \t]+)?(?:[\w\-]+[ \t]+)?(?P<cred>(?:[A-Za-z0-9]+[_\-])*" + _CRED + r")\b"
    r"(?:[ \t]+(?:for|of|on)"
    r"[ \t]+[\w.\-]+(?:[ \t]+[\w.\-]+)?)?[ \t]+(?:to|as|=)[ \t]+"
    r"(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|[!#-&*-~\u00a0-\u024f]+"
    r"(?:[ \t]+[^\s.,;!?\"'()]+){0,8})"
)
_SET_VERB = re.compile(r"(?i)\b(?:set|change[ds]?|reset|update[ds]?|rotated?)[ \t]")
_SET_REACH = 80  # the verb is at most this far before the credential word
_CLAUSE_END = re.compile(r"[.,;:!?)](?:\s|$)|\s(?:and|but|so|then|which|because)\s|\n")


def _cred_kind(word: str) -> str:
    """How strong a value must look where ``word`` names it (see :func:`_name_kind`)."""
    return _name_kind(word.replace(" ", "_")) or "secret"


def _clip(value: str) -> str:
    """``value`` up to the end of its clause (a passphrase ends there)."""
    if value[:1] in "\"'“`":
        return value
    m = _CLAUSE_END.search(value)
    out = value[: m.start() + (1 if value[m.start()] in ".,;:!?)" else 0)] if m else value
    return out.rstrip(".,;:!?)")


def _statements_at(text: str, starts: Sequence[int]) -> Iterable[re.Match[str]]:
    for a in starts:
        m = _STATE.match(text, a)
        if m is not None:
            yield m
        for verb in _SET_VERB.finditer(text, max(0, a - _SET_REACH), a):
            m = _SET.match(text, verb.start())
            if m is not None:
                yield m


def _find_statements(text: str, starts: Sequence[int]) -> Iterable[Span]:
    for m in _statements_at(text, starts):
        cred = m.group("cred")
        kind = _cred_kind(cred)
        value = _clip(m.group("value"))
        if not value:
            continue
        if value[:1] == "“":
            value = '"' + value[1:-1] + '"'
        if cred.lower().endswith("s") and not cred.lower().endswith(("pass", "ss")):
            kind = "secret"  # "PINs are ...", "passwords are ...": about them in general
        first = value.split()[0] if value.split() else ""
        if first.endswith("ly") and not any(c.isdigit() for c in first):
            continue  # "is usually", "was initially": a description
        span = _value_span(kind, value, m.start("value"), _phrase_words(cred),
                           statement="is" if m.re is _STATE else "set")
        if span is not None:
            yield span


_NEAR = re.compile(r"(?i)\b" + _CRED + r"\b")
_CANDIDATE = re.compile(r"(?<![\w/+=\-.])[A-Za-z0-9/+=_\-.~]{12,}(?![\w/+=\-])")
_NEAR_CHARS = 80
_BEFORE_CHARS = 40
#: A credential word followed directly by a value: "passwd GMClz2", "token: x9Y...".
_BARE_VALUE = re.compile(
    r"(?i)\b(?:pass(?:word|phrase|code|wd)?|pwd?|pins?|tokens?|secrets?|otp)[ \t]+"
    r"(?P<value>[!#-&*-+\--~]{6,200})")
#: "credentials: admin / Winter2025!": a user and a password after a credential word.
_PAIR = re.compile(r"[ \t]*(?:[:=]|is|are)?[ \t]*[\w.@\-]{1,64}[ \t]*/[ \t]*"
                   r"(?P<value>[^\s,;]{4,100})")
_ZH = re.compile(r"(?:密码|口令|密钥|令牌|暗号|验证码)(?:是|为|：|:|=)[ \t]*[\"'“「]?"
                 r"(?P<value>[^\s\"'”」，。,]{4,200})")


def _strip_end(value: str) -> str:
    return value.rstrip(".,;:!?)")


def _near_value(value: str, word: str) -> bool:
    if looks_random(value, 12):
        return True
    # Hex near "password"/"token"/"secret" (not a bare "key": "key commit 3f78...") is one.
    return bool(_HEX.match(value)) and len(value) >= 24 and word.lower() not in ("key", "keys")


def _find_near_credential_words(text: str, starts: Sequence[int]) -> Iterable[Span]:
    """High-entropy strings shortly after (or just before) a credential word, and values
    right after one ("passwd GMClz2")."""
    for a in starts:
        m = _NEAR.match(text, a)
        if m is not None:
            pair = _PAIR.match(text, m.end())
            if pair is not None and looks_secret(_strip_end(pair.group("value"))):
                yield pair.start("value"), pair.start("value") + len(
                    _strip_end(pair.group("value")))
            window_end = m.end() + _NEAR_CHARS
            nl = text.find("\n\n", m.end(), window_end)
            for c in _CANDIDATE.finditer(text, m.end(), window_end if nl < 0 else nl):
                value = _strip_end(c.group(0))
                if _near_value(value, m.group(0)):
                    yield c.start(), c.start() + len(value)
            for c in _CANDIDATE.finditer(text, max(0, m.start() - _BEFORE_CHARS), m.start()):
                value = _strip_end(c.group(0))
                if looks_random(value, 16):
                    yield c.start(), c.start() + len(value)
        for rx in (_BARE_VALUE, _ZH):
            m = rx.match(text, a)
            if m is not None:
                value = _strip_end(m.group("value"))
                if looks_secret(value) and (rx is _ZH or any(not c.isalpha() for c in value)):
                    yield m.start("value"), m.start("value") + len(value)


#: Lowercase words where a credential name or statement can start (the anchors).
_ANCHOR_WORDS: Final = (
    "pass", "pw", "pin", "secret", "token", "key", "cred", "auth", "sig", "cookie", "session",
    "otp", "pat", "login", "api", "access", "private", "signing", "encryption", "master",
    "license", "ssh", "app", "bearer", "refresh", "bot", "client",
    "密码", "口令", "密钥", "令牌", "暗号", "验证码")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.$")
_NAME_REACH = 64


def _alternation(words: Iterable[str]) -> str:
    """A regular expression matching any of ``words``, factored by first characters (a
    trie), so that a position is tried against one branch per character, not every word."""
    heads: dict[str, list[str]] = {}
    for word in words:
        heads.setdefault(word[0], []).append(word[1:])
    branches = []
    for head, tails in sorted(heads.items()):
        rest = sorted({t for t in tails if t})
        inner = _alternation(rest) if rest else ""
        optional = "?" if "" in tails else ""
        branches.append(re.escape(head) + (f"(?:{inner}){optional}" if inner else ""))
    return "|".join(branches)


#: Any anchor word: searched from each found position plus one, so overlapping words
#: ("apin": "api" and "pin") are all found, as one ``find`` loop per word finds them.
_ANCHOR_RE: Final = re.compile(_alternation(_ANCHOR_WORDS))


#: Hints that are anchor words: one of them is in a text exactly when it starts at one
#: of the text's ``anchor_words``.
ANCHOR_WORDS: Final = frozenset(_ANCHOR_WORDS)


def anchor_words(lower: str) -> list[int]:
    """Every position of ``lower`` where an anchor word starts."""
    found: list[int] = []
    search = _ANCHOR_RE.search
    m = search(lower)
    while m is not None:
        found.append(m.start())
        m = search(lower, m.start() + 1)
    return found


def anchors(text: str, lower: str, words: Sequence[int] | None = None) -> list[int]:
    """Where a context rule may match: each credential word found in ``lower`` (``text``
    lowercased, the same length), and the start of the name it is part of
    (``DB_PASSWORD``, ``--token``, ``dbPassword``). ``words``: ``anchor_words(lower)``,
    when the caller has them."""
    found: set[int] = set()
    for i in anchor_words(lower) if words is None else words:
        found.add(i)
        start = i
        while start > 0 and i - start < _NAME_REACH and text[start - 1] in _NAME_CHARS:
            start -= 1
        found.add(start)
    return sorted(found)


_CRED_HINTS = ("pass", "pw", "pin", "secret", "token", "key", "cred", "auth", "sig", "cookie",
               "session", "otp", "pat", "login", "密码", "口令", "密钥", "令牌", "暗号", "验证码")
CONTEXT_RULES: Final[tuple[Rule, ...]] = (
    Rule("assignment", _CRED_HINTS, anchored=_find_assignments, format=False),
    Rule("statement", _CRED_HINTS, anchored=_find_statements, format=False),
    Rule("near_credential_word", _CRED_HINTS, anchored=_find_near_credential_words,
         format=False),
)
RULES: Final[tuple[Rule, ...]] = FORMAT_RULES + CONTEXT_RULES


@functools.cache
def rules_token_prefilter() -> re.Pattern[str] | None:
    """``token_prefilter(RULES)``, compiled on first use (a few ms)."""
    return token_prefilter(RULES)
