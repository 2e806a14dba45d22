"""The rules of secrets redaction (:mod:`redact` applies them): what a credential looks
like, by its shape alone (``FORMAT_RULES``) or by a credential word next to it
(``CONTEXT_RULES``).

- *formats*: private key blocks of every armour (PEM, OpenSSH, SSH2, encrypted, PGP,
  PuTTY, age; also the end of one whose start is in the text before), cloud keys (AWS
  access key ids and secret keys, GCP OAuth secrets and tokens, Azure storage and
  connection-string keys, Alibaba), SaaS tokens (GitHub, GitLab, Slack, Telegram,
  SendGrid, Stripe, Twilio, npm, PyPI, OpenAI, Anthropic, Google, Discord, Mailgun,
  Mailchimp, Hugging Face, DigitalOcean, Shopify, Firebase, Terraform Cloud, Dynatrace,
  Databricks, Artifactory, NuGet, Atlassian, Bitbucket, Dropbox, 1Password, Asana and other
  vendors' prefixed tokens; a distinctive prefix is found joined to a name by ``-`` or
  ``_`` too, and every token right after an escape: ``%3D``, ``=3D``, ``\\n``), JSON Web
  Tokens, webhook URLs, the password of
  ``scheme://user:password@host`` URLs, a token as a URL's whole user part, the password
  of a user to log in with ("log in with admin / S3cret"), and passwords on a command
  line (``mysql -pS3cret``, ``sshpass -p S3cret``, ``curl -u me:S3cret``,
  ``redis-cli -a S3cret``, ``docker login -p S3cret``; PowerShell's and Windows'
  commands, credential classes and session cookies: :mod:`secret_commands`); and any of
  these but the last wrapped in base64 (a Kubernetes Secret's ``data``, ``echo ... |
  base64 -d``);
- *context*: values assigned to credential-like names (``password=...``, ``pw: ...``,
  ``"api_key": "..."``, ``--token ...``, ``<password>...</password>``, connection-string
  ``Pwd=...;``), credentials stated in prose ("the password for prod is ...", "my
  passphrase is correct horse battery staple", "set the token to ..."; "密码是 ...",
  "パスワードは ...", "пароль: ..."), and high-entropy strings near a credential word ("the
  AWS secret key is wJalr..."). Full-width forms (``password：``) read as ASCII.

Each rule names the lowercase hints one of which must occur in a text for its spans to
count; ``redact.find_spans`` decides in whichever order is cheaper (a token rule's pattern
over the few token runs first, or the hints first), the context rules' hints from the
positions of the anchor words. Deliberately not
secrets: bare git commit ids and other hex digests, UUIDs, ordinary words, numbers, paths
and URLs without credentials, placeholders (``<token>``, ``${VAR}``, ``****``), and talk
about credentials ("my password is too weak", "the token is refreshed hourly").

Here: what a rule is (:class:`Rule`), the token runs token rules look in, the format
rules, and the rule table. The context rules' finders are in :mod:`secret_context` (in
:mod:`secret_languages` for languages other than English, :mod:`secret_config` for
values a configuration file sets apart from their names, :mod:`secret_tables` for
Markdown tables), their anchors in
:mod:`secret_anchors`; how a value found is judged (random-looking, a placeholder, a
plain word) is in :mod:`secret_values`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from recalld.daemon.memory.secret_anchors import CRED_HINTS
from recalld.daemon.memory.secret_base64 import BLOB, WRAPPED, blob_text, wrapped_finder
from recalld.daemon.memory.secret_commands import COMMAND_FINDERS, find_cookies
from recalld.daemon.memory.secret_config import find_in_configs
from recalld.daemon.memory.secret_context import (
    find_assignments,
    find_statements,
)
from recalld.daemon.memory.secret_keys import key_block_tail, key_blocks
from recalld.daemon.memory.secret_languages import find_in_other_languages
from recalld.daemon.memory.secret_near import find_near_credential_words
from recalld.daemon.memory.secret_tables import find_in_delimited, find_in_tables
from recalld.daemon.memory.secret_values import (
    HEX,
    PLACEHOLDER,
    classes,
    entropy_bits,
    looks_random,
    looks_secret,
)
from recalld.daemon.memory.secret_wrapped import FIXED_HINTS, fixed_tokens_finder
from recalld.daemon.memory.token_starts import (
    ESCAPED,
    LONG_RUN,
    Prefilter,
    boundary_led,
    led_alternation,
    matches,
)

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
    word and look only where one is (see :func:`secret_context.anchors`)."""

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
RUN_CHARS: Final = r"A-Za-z0-9_\-.:/+=~"  # inside a character class
MIN_RUN_CHARS: Final = 16
TOKEN_RUN: Final = re.compile(rf"[{RUN_CHARS}]{{{MIN_RUN_CHARS},}}")
_RUN_CHAR = rf"[{RUN_CHARS}]"
# TOKEN_RUN's matches are found on the text's bytes with each character marked a token
# character or not (one byte each: one that is no ASCII is "?" there, no token character):
# ``bytes.find`` of MIN_RUN_CHARS marks in a row finds where a run starts, some ten times
# faster than a pattern matching one run after the other over prose.
_AS_MARKS: Final = bytes(ord("r") if re.fullmatch(_RUN_CHAR, chr(b)) else ord(" ")
                         for b in range(256))
_RUN_MARKS: Final = b"r" * MIN_RUN_CHARS


#: Characters that show nothing (format characters: zero-width space and joiners, soft
#: hyphen, word joiner, byte order mark, bidi marks; the combining grapheme joiner,
#: variation selectors) between two token characters. Put inside a key (by a page or a
#: chat that breaks long words, or on purpose) they cut it into pieces no rule knows while
#: it still reads and copies as one: the rules read a text without them too
#: (``redact.find_spans``). Between letters of other scripts (a Persian word's joiner)
#: they belong to the text.
INVISIBLE_BMP_CHARS: Final = ("\u00ad\u034f\u061c\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
                              "\u202a-\u202e\u2060-\u206f\ufe00-\ufe0f\ufeff"
                              "\ufff9-\ufffb")  # inside a character class
INVISIBLE_CHARS: Final = INVISIBLE_BMP_CHARS + "\U000e0000-\U000e0fff"  # and the tags
INVISIBLE_IN_TOKEN: Final = re.compile(
    rf"(?<={_RUN_CHAR})[{INVISIBLE_CHARS}]+(?={_RUN_CHAR})")
#: Any of them: a search for it is several times faster than INVISIBLE_IN_TOKEN's (a
#: pattern starting with a look-behind is tried at every position), and nearly every
#: text holds none.
INVISIBLE: Final = re.compile(f"[{INVISIBLE_CHARS}]")


def token_runs(text: str) -> list[Span]:
    """The spans of ``TOKEN_RUN``'s matches in ``text`` (``finditer``'s, found faster)."""
    marks = text.encode("ascii", "replace").translate(_AS_MARKS)
    runs: list[Span] = []
    # Searched from the start or from a mark that is no token character, the first
    # MIN_RUN_CHARS marks in a row start a run: one more before them would start one too.
    at = marks.find(_RUN_MARKS)
    while at >= 0:
        end = marks.find(b" ", at + MIN_RUN_CHARS)
        end = len(marks) if end < 0 else end
        runs.append((at, end))
        at = marks.find(_RUN_MARKS, end)
    return runs


# -- format rules ------------------------------------------------------------------------

# A token starts right after an escape too, though the escape ends in a letter or digit
# (``%3Dghp_...``, ``=3D``, ``\\n``: ``token_starts.ESCAPED``).
_B = r"(?:(?<![A-Za-z0-9_\-])" + ESCAPED + ")"  # token start: not glued to a word before it
_E = r"(?![A-Za-z0-9_\-])"  # token end
#: The start and end of a token whose prefix no word or identifier holds (``ghp_``,
#: ``AKIA``): it may be joined to words by ``-`` or ``_``, as in file names
#: (``deploy-ghp_....txt``, ``key_AKIA...-old.md``).
_P = r"(?:(?<![A-Za-z0-9])" + ESCAPED + ")"
_Q = r"(?![A-Za-z0-9])"


def _regex_rule(kind: str, hints: tuple[str, ...], pattern: str, flags: int = 0,
                group: int = 0, check: Callable[[str], bool] | None = None,
                token: bool = True, needs: str | None = None) -> Rule:
    """``needs``: a pattern every match of ``pattern`` holds a match of, searched for
    first (fast where it starts with a literal, as a pattern starting with ``^`` or a
    class is not): where it is not, ``pattern`` is not tried."""
    rx = re.compile(pattern, flags)
    led = boundary_led(pattern)  # long runs: tried at their token starts only
    needed = re.compile(needs) if needs is not None else None

    def find(text: str, pos: int, endpos: int) -> Iterable[Span]:
        if needed is not None and needed.search(text, pos, endpos) is None:
            return
        found = (matches(rx, text, pos, endpos) if led and endpos - pos >= LONG_RUN
                 else rx.finditer(text, pos, endpos))
        for m in found:
            if m.group(group) and (check is None or check(m.group(group))):
                yield m.span(group)

    return Rule(kind, hints, find, token=token, pattern=rx)


def token_prefilter(rules: Sequence[Rule]) -> Prefilter | None:
    """Whether the pattern of any of ``rules``' token rules matches in a stretch of text
    (a token run where none does needs none of them); None if one has no plain pattern."""
    token = [r.pattern for r in rules if r.find is not None and r.token]
    if any(p is None or p.flags & ~re.UNICODE for p in token):
        return None
    sources = [p.pattern for p in token if p is not None]
    led = [s for s in sources if boundary_led(s)]
    others = [s for s in sources if not boundary_led(s)]
    return Prefilter(led_alternation(led) if led else None,
                     re.compile("|".join(f"(?:{s})" for s in others)) if others else None)


def _tail_random(value: str) -> bool:
    """A prefixed token's characters are mixed (not a word, a phrase or a path)."""
    digit, upper, lower, _ = classes(value)
    return (digit and (upper or lower)) or (upper and lower and entropy_bits(value) >= 3.5)


_PUTTY = (
    r"PuTTY-User-Key-File-\d:.*?(?:Private-MAC:\s*[0-9a-fA-F]+|Private-Hash:\s*[0-9a-fA-F]+|\Z)"
)

_CLI_VALUE = r"[\"']?([^\s\"'\-][^\s\"']{2,199})"
_CLI_PASSWORDS: Final = (
    (("mongo", "az "), r"\b(?:mongosh|mongo|mongodump|mongorestore|mongoimport|mongoexport"
                       r"|az[ \t]+login)\b[^\n]{0,200}?(?<!\S)(?:-p|--password)(?:[ \t]+|=)"
                       + _CLI_VALUE),
    (("ldap",), r"\bldap(?:search|add|modify|delete|passwd|whoami|compare)\b[^\n]{0,200}?"
                r"(?<!\S)-w[ \t]+" + _CLI_VALUE),
    (("zip",), r"\bzip[ \t][^\n]{0,200}?(?<!\S)(?:-P|--password)[ \t]+" + _CLI_VALUE),
    (("7z",), r"\b7z[ar]?[ \t]+[a-z][^\n]{0,200}?(?<!\S)-p" + _CLI_VALUE),
    (("openssl",), r"\bopenssl[ \t][^\n]{0,200}?(?<!\S)(?:-k[ \t]+|-pass(?:in|out)?[ \t]+pass:)"
                   + _CLI_VALUE),
    (("htpasswd",), r"\bhtpasswd[ \t]+(?:-[a-zA-Z]+[ \t]+)*-[a-zA-Z]*b[a-zA-Z]*[ \t]+"
                    r"(?:-[a-zA-Z]+[ \t]+)*\S+[ \t]+\S+[ \t]+" + _CLI_VALUE),
    (("sqlplus",), r"\bsqlplus[ \t]+(?:-\w+[ \t]+)*[\w$#]+/([^\s@/\\\"']{3,200})"),
    (("/user:",), r"\bnet[ \t]+use\b[^\n]{0,200}?/user:\S+[ \t]+" + _CLI_VALUE),
    (("--password-stdin",),
     r"\becho[ \t]+(?:-n[ \t]+)?[\"']?([^\s\"'|$][^\s\"'|]{2,199})[\"']?[ \t]*"
     r"\|[ \t]*\w+[ \t]+(?:registry[ \t]+)?login\b[^\n]*--password-stdin"),
)


def _cli_value(value: str) -> bool:
    """Not a placeholder, a variable, nor a number as short as a port ("-p 27017")."""
    return (not PLACEHOLDER.match(value) and not value.startswith(("$", "%"))
            and not (value.isdigit() and len(value) <= 5))


def _basic_credentials(value: str) -> bool:
    """Is ``value`` base64 of ``user:password`` (HTTP Basic credentials)?"""
    import binascii

    try:
        decoded = binascii.a2b_base64(value + "=" * (-len(value) % 4)).decode()
    except (binascii.Error, ValueError):
        return False
    return ":" in decoded and decoded.isprintable()


_SHAPE_RULES: Final[tuple[Rule, ...]] = (
    Rule("private_key", ("private key",), key_blocks),
    Rule("private_key_tail", ("private key",), key_block_tail),
    _regex_rule("putty_key", ("putty-user-key-file",), _PUTTY, re.S, token=False),
    _regex_rule("age_key", ("age-secret-key-",), r"AGE-SECRET-KEY-1[0-9A-Z]{50,}"),
    _regex_rule("aws_access_key_id", ("akia", "asia", "abia", "acca", "a3t"),
                _P + r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}" + _Q),
    _regex_rule("aws_secret_key", (),
                r"(?:(?<![A-Za-z0-9/+=])" + ESCAPED + r")[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
                check=lambda v: ("//" not in v and v.count("/") + v.count("+") <= 6
                                 and all(classes(v)[:3]) and entropy_bits(v) >= 4.2)),
    _regex_rule("github", ("gh", "github_pat_"),
                _P + r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})" + _Q),
    _regex_rule("gitlab", ("gl", "gr1348941"),
                _P + r"(?:gl(?:pat|dt|rt|ptt|ft|cbt|oas|soat|imt|agent|ffct|wt)-[A-Za-z0-9_\-]{20,}"
                r"(?:\.[A-Za-z0-9_\-]+)*"
                r"|GR1348941[A-Za-z0-9_\-]{20,})" + _Q),
    # Slack's tokens, also a browser session's: its client token (``xoxc-``) and its ``d``
    # cookie (``xoxd-``, base64 its ``+``, ``/`` and ``=`` percent-encoded: read decoded).
    _regex_rule("slack_token", ("xox", "xapp-"),
                _P + r"(?:xox[abposre](?:\.xox[a-z])?-[A-Za-z0-9\-]{10,}|xoxc-[A-Za-z0-9\-]{10,}"
                r"|xoxd-[A-Za-z0-9\-+/]{10,}={0,2}|xapp-\d-[A-Za-z0-9\-]{10,})" + _Q,
                check=lambda v: _tail_random(v[5:])),
    _regex_rule("webhook_url", ("hooks.slack.com", "/api/webhooks/", "webhook.office.com",
                                "hooks.zapier.com"),
                r"https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
                r"|(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/"
                r"|[\w.\-]*webhook\.office\.com/webhookb2/"
                r"|hooks\.zapier\.com/hooks/catch/)[A-Za-z0-9_/+@\-]+", token=False),
    # Telegram's Bot API takes the token glued to ``bot`` in its URLs
    # (``https://api.telegram.org/bot<token>/sendMessage``): the token starts after it too.
    _regex_rule("telegram_bot_token", (":",),
                _P + r"(?:[Bb]ot)?(?<!:)(\d{5,12}:[A-Za-z0-9_\-]{30,50})" + _Q, group=1,
                check=_tail_random),
    _regex_rule("sendgrid", ("sg.",), _P + r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{30,}" + _Q),
    _regex_rule("stripe", ("_live_", "_test_", "_prod_", "whsec_"),
                _P + r"(?:(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{20,})"
                + _Q),
    _regex_rule("twilio", ("sk", "ac"), _P + r"(?:SK|AC)[0-9a-f]{32}" + _Q),
    _regex_rule("npm", ("npm_",), _P + r"npm_[A-Za-z0-9]{36}" + _Q),
    _regex_rule("pypi", ("pypi-",), _P + r"pypi-[A-Za-z0-9_\-]{40,}" + _Q),
    _regex_rule("openai_anthropic", ("sk-",), _P + r"sk-[A-Za-z0-9_\-]{20,}" + _Q,
                check=_tail_random),
    _regex_rule("google", ("aiza", "gocspx-", "ya29.", "1//"),
                _P + r"(?:AIza[0-9A-Za-z_\-]{35}|GOCSPX-[A-Za-z0-9_\-]{20,}"
                r"|ya29\.[0-9A-Za-z_\-]{20,}|1//0[0-9A-Za-z_\-]{30,})" + _Q),
    _regex_rule("discord_token", (".",),
                _P + r"[MNO][A-Za-z0-9_\-]{23,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,40}" + _Q,
                check=_tail_random),
    _regex_rule("mailgun", ("key-", "-"),
                _P + r"(?:key-[0-9a-zA-Z]{32}|[0-9a-f]{32}-[0-9a-f]{8}-[0-9a-f]{8})" + _Q,
                check=lambda v: not v.startswith("key-") or _tail_random(v[4:])),
    _regex_rule("huggingface", ("hf_", "api_org_"),
                _P + r"(?:hf_|api_org_)[A-Za-z0-9]{30,}" + _Q,
                check=lambda v: looks_random(v.removeprefix("hf_").removeprefix("api_org_"),
                                             30)),
    _regex_rule("digitalocean", ("_v1_",), _P + r"do[opr]_v1_[a-f0-9]{64}" + _Q),
    _regex_rule("shopify", ("shp",), _P + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _Q),
    _regex_rule("azure_key", ("accountkey", "sharedaccesskey", "sig="),
                r"(?i)(?:AccountKey|SharedAccessKey|SharedAccessSignature|[?&]sig)="
                r"([A-Za-z0-9+/%=]{16,})", group=1, token=False),
    # Mailchimp: 32 hex digits and the data centre (``-us12``).
    _regex_rule("mailchimp", ("-us",), _P + r"[0-9a-f]{32}-us\d{1,2}" + _Q),
    # Firebase Cloud Messaging server keys; Terraform Cloud and Dynatrace tokens.
    _regex_rule("fcm_server_key", (":apa91b",),
                _P + r"AAAA[A-Za-z0-9_\-]{7}:APA91b[A-Za-z0-9_\-]{100,}" + _Q),
    _regex_rule("terraform_dynatrace", (".atlasv1.", "dt0c01."),
                _P + r"(?:[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_\-=]{60,}"
                r"|dt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64})" + _Q),
    _regex_rule("azure_client_secret", ("q~",),
                _P + r"[a-zA-Z0-9_~.]{3}\dQ~[a-zA-Z0-9_~.\-]{31,34}" + _Q),
    _regex_rule("alibaba", ("ltai",), _P + r"LTAI[A-Za-z0-9]{12,24}" + _Q),
    # Vendors whose tokens carry a fixed prefix, then a random tail. A prefix no word or
    # identifier holds is found joined to a name by ``-`` or ``_`` too; a short or common
    # one (``pat_``, ``r8_``) only standing apart.
    _regex_rule("vendor_token", ("_", "-", "."),
                _P + r"(?:glsa_|lin_api_|PMAK-|hv[sb]\.|sntrys_|sq0(?:atp|csp)-|pplx-|figd_"
                r"|pscale_(?:tkn|pw|oauth)_|tskey-(?:auth|api)-|bkua_|NRAK-|NRII-|xkeysib-"
                r"|FLWSECK(?:_TEST)?-|CFPAT-|shippo_(?:live|test)_|lsv2_(?:pt|sk)_|ops_eyJ"
                r"|CLOJARS_|rubygems_|dckr_pat_|dp\.(?:pt|st|sa|ct|scim|audit)\.|HRKU-|cfut_"
                r"|CCIPAT_|fio-u-|tk-us-)[A-Za-z0-9_\-=.]{20,}" + _E,
                check=_tail_random),
    _regex_rule("vendor_token", ("_", "-", "."),
                _B + r"(?:glc_|ntn_|secret_|pul-|gsk_|r8_|xai-|fo1_|sbp_|tfp_|rnd_|aio_|sk\.eyJ"
                r"|pnu_|fm2_|y0_|pat_|rk_|key_|ak_|tok_|api_)[A-Za-z0-9_\-=.]{20,}" + _E,
                check=_tail_random),
    # Prefixed tokens of a fixed alphabet and length, which need no ``_``, ``-`` or ``.``
    # (Databricks, Artifactory, NuGet, Atlassian, Facebook, Bitbucket, EasyPost, Yandex,
    # Dropbox, 1Password's Secret Key, ClickUp, Harness).
    _regex_rule("vendor_token", ("dapi", "akcp", "oy2", "atatt3", "eaa", "atbb", "ezak",
                                 "aqvn", "sl.", "a3-", "pk_", "pat."),
                _P + r"(?:dapi[a-f0-9]{32}(?:-\d)?|AKCp[A-Za-z0-9]{60,80}|oy2[a-z0-9]{43}"
                r"|ATATT3[A-Za-z0-9_\-=]{150,}|EAA[A-Za-z0-9]{4}[A-Za-z0-9]{60,}"
                r"|ATBB[A-Za-z0-9]{28,40}|EZAK[A-Za-z0-9]{54}|AQVN[A-Za-z0-9_\-]{35,38}"
                r"|sl\.(?:u\.)?[A-Za-z0-9_\-]{120,}"
                r"|A3-[A-Z0-9]{6}-(?:[A-Z0-9]{6}-)?[A-Z0-9]{5}(?:-[A-Z0-9]{5}){3}"
                r"|pk_\d{5,10}_[A-Z0-9]{32}"
                r"|pat\.[A-Za-z0-9_\-]{22}\.[a-f0-9]{24}\.[A-Za-z0-9_\-]{20})" + _Q,
                check=lambda v: _tail_random(v[4:])),
    # Keys of a fixed shape with a short or no prefix: Airtable's personal access tokens,
    # Tencent Cloud's SecretId, Baidu Qianfan's bce-v3 keys, Zhipu AI's (32 hex digits, a
    # dot, 16 mixed characters).
    _regex_rule("vendor_token", ("pat", "akid", "bce-v3/", "."),
                _P + r"(?:pat[A-Za-z0-9]{14}\.[a-f0-9]{64}|AKID[A-Za-z0-9]{32}"
                r"|bce-v3/ALTAK-[A-Za-z0-9]{16,}/[a-f0-9]{32,}|[a-f0-9]{32}\.[A-Za-z0-9]{16})"
                + _Q, check=lambda v: _tail_random(v[-16:])),
    # Asana's personal access tokens: a version, the user's number (and the app's), a colon
    # and 32 hex digits (``1/1204982374823:8f3a...``, ``2/1204.../1206...:8f3a...``).
    _regex_rule("vendor_token", (":",),
                _P + r"[0-2]/\d{10,20}(?:/\d{10,20})?:[a-f0-9]{32}" + _Q),
    _regex_rule("jwt", ("eyj",),
                _P + r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}" + _Q),
    # A token as the whole user part: ``https://ghp_...@github.com``, ``https://<token>@host``.
    _regex_rule("url_token", ("://",),
                r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://([A-Za-z0-9_\-.~]{16,})@(?=[\w.\-\[])",
                group=1, check=lambda v: looks_random(v, 16), token=False),
    _regex_rule("url_password", ("://",),
                r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@\"'<>]*:([^\s/\"'<>]+)@(?=[\w.\-\[])",
                group=1, check=lambda v: not PLACEHOLDER.match(v), token=False),
    # A text that ends inside such a URL's password, before its ``@`` (a chat client cut
    # a long paste into two messages there): what follows the user's ``:`` is no port
    # (digits), nor a word standing for one (``host:port``, ``user:password``, ``PORT``).
    _regex_rule("url_password", ("://",),
                r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@\"'<>\[\]]*:([^\s/@\"'<>\[\]]+)\Z",
                group=1, check=lambda v: not (
                    v.isdigit() or (v.isalpha() and (v.islower() or v.isupper()))
                    or PLACEHOLDER.match(v) or v.startswith(("$", "%", "{"))), token=False),
    # A line of a PostgreSQL password file: ``host:port:database:user:password``.
    _regex_rule("pgpass", (":",),
                r"(?m)^[\w.\-*]+:(?:\d{2,5}|\*):[\w.\-*]+:[\w.\-*@]+:([^\s:]{3,200})[ \t]*$",
                group=1, check=lambda v: not PLACEHOLDER.match(v), token=False,
                needs=r":(?:\d{2,5}|\*):"),
    # Password hashes, as a shadow or htpasswd line holds them (``root:$6$salt$...``,
    # ``bob:$apr1$...``, ``{SSHA}...``) and libraries store them: an offline guess away
    # from the password. Crypt's schemes, bcrypt, yescrypt, argon2, LDAP's and PBKDF2's.
    _regex_rule("password_hash", ("$1$", "$2", "$5$", "$6$", "$apr1$", "$md5", "$sha1$",
                                  "$y$", "$gy$", "$7$", "$argon2", "{s", "{md5}", "pbkdf2"),
                r"(?<![\w$])(?:\$(?:1|5|6|apr1|md5|sha1|g?y|7)\$(?:rounds=\d+\$)?"
                r"(?:[./A-Za-z0-9]{1,64}\$)+[./A-Za-z0-9]{22,}"
                r"|\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}"
                r"|\$argon2(?:id|i|d)\$v=\d+\$m=\d+,t=\d+,p=\d+\$[A-Za-z0-9+/]{8,}\$"
                r"[A-Za-z0-9+/]{16,}"
                r"|\{(?:S?SHA(?:256|384|512)?|S?MD5)\}[A-Za-z0-9+/]{20,}={0,2}"
                r"|pbkdf2[_\-]sha\d+\$\d+\$[./A-Za-z0-9+]{4,}\$[./A-Za-z0-9+]{20,}={0,2})"
                r"(?![./A-Za-z0-9+=$])", token=False),
    # Passwords on a command line: ``mysql -u root -pS3cret`` (glued to ``-p``, as the
    # MySQL clients take it) and ``sshpass -p S3cret``.
    _regex_rule("cli_password", ("mysql", "mariadb"),
                r"\b(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)(?![\w\-])"
                r"[^\n]{0,200}?(?<!\S)-p[\"']?([^\s\"'\-][^\s\"']{2,199})",
                group=1, check=lambda v: looks_secret(v.rstrip(".,;:!?)")), token=False),
    _regex_rule("cli_password", ("sshpass",),
                r"\bsshpass[ \t][^\n]{0,80}?(?<!\S)-p[ \t]*[\"']?([^\s\"'\-][^\s\"']{2,199})",
                group=1, check=lambda v: not PLACEHOLDER.match(v) and not v.startswith("$"),
                token=False),
    # A user and a password to sign in with, in prose: "log in with admin / S3cret",
    # "sign in as bob@example.com / S3cret", "logged in using root/S3cret". (It opens with
    # the set of the letters "l" and "s" match ignoring case, "\u017f" the long s, not
    # ignoring case, so a search tries only the positions holding one of them, not all;
    # the word boundary is checked before that letter, the letter itself again behind it.)
    _regex_rule("login_pair", ("log", "sign"),
                r"[lLsS\u017f](?<=\b.)(?i:(?:(?<=l)og(?:ged|ging)?[ \t]?(?:in|on)"
                r"|(?<=s)ign(?:ed|ing)?[ \t]?in)[ \t]+"
                r"(?:with|as|using|via)[ \t]+(?:user(?:name)?[ \t]+)?[\w.@\-]{1,64}[ \t]*/[ \t]*"
                r"([^\s,;/]{4,100}?)(?=[.!?)]*(?:[\s,;]|\Z)))",
                group=1, check=looks_secret, token=False),
    # ``curl -u user:S3cret``, ``redis-cli -a S3cret``, ``docker login -u me -p S3cret``.
    _regex_rule("cli_password", ("curl",),
                r"\bcurl[ \t][^\n]{0,200}?(?<!\S)(?:-u|--user)(?:[ \t]+|=)?[\"']?[^\s:\"']*"
                r":([^\s\"']{3,200})",
                group=1, check=lambda v: not PLACEHOLDER.match(v) and not v.startswith("$"),
                token=False),
    # (Looked for where "login" is: "docker" is in many notes.)
    _regex_rule("cli_password", ("redis-cli", "login"),
                r"\b(?:redis-cli[ \t][^\n]{0,200}?(?<!\S)(?:-a|--pass)"
                r"|docker[ \t]+login[ \t][^\n]{0,200}?(?<!\S)(?:-p|--password))"
                r"(?:[ \t]+|=)[\"']?([^\s\"'\-][^\s\"']{2,199})",
                group=1, check=lambda v: not PLACEHOLDER.match(v) and not v.startswith("$"),
                token=False),
    # More clients' password flags: MongoDB, Azure, LDAP (``-w``), zip (``-P``), 7-Zip
    # (``-pS3cret``), OpenSSL (``-k``, ``-pass pass:``), htpasswd's batch mode, Oracle's
    # ``user/password@db``, ``net use ... /user:me S3cret`` and a password piped to a
    # registry login.
    *(_regex_rule("cli_password", hints, pattern, group=1, check=_cli_value, token=False)
      for hints, pattern in _CLI_PASSWORDS),
    _regex_rule("auth_header", ("bearer", "token "),
                r"(?i)\b(?:bearer|token)\s+([A-Za-z0-9\-._~+/]{16,}=*)",
                group=1, check=lambda v: looks_random(v, 16) or bool(HEX.match(v)), token=False),
    # HTTP Basic credentials are base64 of ``user:password``: after "Basic" in prose only
    # such base64 is one ("a basic Python3-compatible-wrapper" is not); in an
    # Authorization header any random-looking value is.
    _regex_rule("auth_header", ("basic",),
                r"(?i)\bauthorization[\"']?\s*[:=]\s*[\"']?basic\s+([A-Za-z0-9\-._~+/]{16,}=*)",
                group=1, check=lambda v: looks_random(v, 16) or bool(HEX.match(v)), token=False),
    _regex_rule("auth_header", ("basic",),
                r"(?i)\bbasic\s+([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9\-._~+/=])",
                group=1, check=lambda v: _basic_credentials(v) or looks_random(v, 16),
                token=False),
)


FORMAT_RULES: Final[tuple[Rule, ...]] = (
    *_SHAPE_RULES,
    # Passwords PowerShell, credential classes and Windows commands take, and session
    # cookies (:mod:`secret_commands`).
    *(Rule("cli_password", hints, find) for hints, find in COMMAND_FINDERS),
    Rule("cookie", ("cookie", "curl"), find_cookies),
    # Any of them wrapped in base64 (:mod:`secret_base64`), at its start or in a text.
    Rule("wrapped", (), wrapped_finder(_SHAPE_RULES), token=True, pattern=WRAPPED),
    Rule("wrapped", (), blob_text, token=True, pattern=BLOB),
    # A token of a fixed length broken at a line's end (:mod:`secret_wrapped`).
    Rule("broken_token", FIXED_HINTS, fixed_tokens_finder(_SHAPE_RULES)),
)


# -- context rules -----------------------------------------------------------------------

CONTEXT_RULES: Final[tuple[Rule, ...]] = (
    Rule("assignment", CRED_HINTS, anchored=find_assignments, format=False),
    Rule("statement", CRED_HINTS, anchored=find_statements, format=False),
    Rule("near_credential_word", CRED_HINTS, anchored=find_near_credential_words,
         format=False),
    Rule("other_language", CRED_HINTS, anchored=find_in_other_languages, format=False),
    Rule("config_layout", CRED_HINTS, anchored=find_in_configs, format=False),
    Rule("table", CRED_HINTS, anchored=find_in_tables, format=False),
    Rule("delimited", CRED_HINTS, anchored=find_in_delimited, format=False),
)
RULES: Final[tuple[Rule, ...]] = FORMAT_RULES + CONTEXT_RULES


@functools.cache
def rules_token_prefilter() -> Prefilter | None:
    """``token_prefilter(RULES)``, compiled on first use (a few ms)."""
    return token_prefilter(RULES)
