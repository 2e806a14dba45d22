"""How a value found in a text is judged, for the rules of :mod:`secret_rules`: whether it
is machine-made (long, mixed, high-entropy: :func:`looks_random`), whether it plausibly
is a credential where one is expected (:func:`looks_secret`), or a placeholder, a plain
word, a passphrase, or words about a credential rather than one.

Hex strings and UUIDs are not random-looking (commit ids, checksums, request ids);
grammar words and words judging a credential ("too weak", "stored") do not make one.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Final

HEX = re.compile(r"^[0-9a-fA-F]+$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
PLACEHOLDER = re.compile(
    r"(?i)^(?:\[redacted\]|\*+|x+|\.+|-+|_+|#+|<[^>]*>|\$\{?[A-Za-z_][\w]*\}?|\{\{[^}]*\}\}"
    r"|%\(?[\w]*\)?s?|none|null|nil|true|false|yes|no|required|optional|string|str|env"
    r"|undefined|empty|placeholder|redacted)$")
#: Grammar words: a value starting with one describes a credential ("is too weak", "is
#: the name of my dog"), it is not one.
FUNCTION_WORDS: Final = frozenset("""
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
below above following attached enclosed mine yours ours theirs hers
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


#: The classes of ASCII characters, as ``str.isdigit``, ``isupper``, ``islower`` and
#: ``isalnum`` tell them apart there.
_ASCII_CLASSES: Final = (re.compile("[0-9]"), re.compile("[A-Z]"), re.compile("[a-z]"),
                         re.compile("[^0-9A-Za-z]"))


def classes(value: str) -> tuple[bool, bool, bool, bool]:
    """Whether ``value`` holds a digit, an uppercase letter, a lowercase letter and
    another character (one search each for ASCII, most values: a loop per character in
    Python took a quarter of the time masking a note of keys)."""
    if value.isascii():
        digit, upper, lower, other = _ASCII_CLASSES
        return (digit.search(value) is not None, upper.search(value) is not None,
                lower.search(value) is not None, other.search(value) is not None)
    return (any(c.isdigit() for c in value), any(c.isupper() for c in value),
            any(c.islower() for c in value), any(not c.isalnum() for c in value))


#: A word with a number after it, as names write it ("Python3", "programme2021").
_NUMBERED_WORD = re.compile(r"[A-Z]?[a-z]{2,}\d{1,4}")


def _compound(value: str) -> bool:
    """Words joined by ``-``, ``_``, ``.`` or ``=`` ("NLRP12-associated", "helix-loop-helix",
    "test_disk_full", "Python3-compatible-wrapper", a setting "max_batch_size=2000"): every
    piece a lowercase word, a word with a number after it, or short; one a real word."""
    pieces = [p for p in re.split(r"[-_.=]+", value) if p]
    return len(pieces) >= 2 and any(len(p) >= 4 and p.isalpha() and p.islower() for p in pieces) \
        and all((p.isalpha() and (p.islower() or p.istitle())) or len(p) <= 6
                or _NUMBERED_WORD.fullmatch(p) for p in pieces)


def prose_compound(value: str) -> bool:
    """Lowercase words joined by ``-``, ``_`` or ``.``, at least two of them real words
    ("passing-scheme-for-rings", "ring-2-network-topology", "ring_buffer_size"): what
    prose says after a credential word that names a thing ("the token ring", "secret
    santa"), not a value handed over after it. A machine-made value has capitals or
    digits in its pieces; one glued word and a number ("hunter-2") is not prose."""
    pieces = [p for p in re.split(r"[-_.]+", value) if p]
    return (value.islower() and _compound(value)
            and sum(len(p) >= 3 and p.isalpha() for p in pieces) >= 2)


#: A file path of words and numbers (``memory/2026-07-01/api-key-rotation.md``): each
#: part between slashes words or numbers joined by ``-``, ``_`` or ``.``.
_WORDS_PATH = re.compile(r"/?(?:(?:[A-Za-z][a-z]*|\d+)(?:[-_.](?:[A-Za-z][a-z]*|\d+))*/+)+"
                         r"(?:(?:[A-Za-z][a-z]*|\d+)(?:[-_.](?:[A-Za-z][a-z]*|\d+))*)?[-_.]?")


#: A piece of an identifier built of words and numbers: a word (``profile``, camelCase
#: ``createdAt``), a number with at most one letter (``42``, ``v3``, ``03T10``, ``00Z``),
#: a short hex part (``8f3a21c9``, as a file name's or a revision's) or a short name with
#: a number (``ed25519``, ``sha256``).
_ID_PIECE = re.compile(r"[A-Za-z][a-z]*(?:[A-Z][a-z]+)*|[A-Za-z]?\d+(?:[A-Za-z]\d*)?"
                       r"|[0-9a-f]{1,8}|[a-z]{1,4}\d{1,6}")
_ID_SEPARATORS = re.compile(r"[-_.:#/=@~]+")


def _structured(value: str) -> bool:
    """A name built of words and numbers by separators, as a cache key, a sort key, an
    object's path or a date is (``user:42:profile:v3``, ``createdAt#2024-05-03``,
    ``uploads/2024/05/photo_8f3a21c9.jpg``): at least three pieces, each an
    :data:`_ID_PIECE`, one a word of three letters or more. A machine-made key has
    pieces of mixed letters and digits longer than that."""
    pieces = [p for p in _ID_SEPARATORS.split(value) if p]
    return (len(pieces) >= 3 and all(_ID_PIECE.fullmatch(p) for p in pieces)
            and any(len(p) >= 3 and p.isalpha() for p in pieces))


def looks_random(value: str, min_len: int = 16) -> bool:
    """Is ``value`` a machine-made secret (long, mixed, high-entropy), not a word or a
    digest? Hex strings, UUIDs, paths of words and names built of
    words and numbers are not (commit ids, checksums, request ids, a note's
    path, a cache key)."""
    if (len(value) < min_len or HEX.match(value.removeprefix("0x")) or _UUID.match(value)
            or _compound(value) or ("/" in value and _WORDS_PATH.fullmatch(value))
            or _structured(value)):
        return False
    digit, upper, lower, _ = classes(value)
    if sum((digit, upper, lower)) < 2:
        return False
    if not digit and _WORD.fullmatch(value.replace("_", "").replace("-", "")[:1] or "1"):
        # Letters only: camelCase identifiers are words glued together; need more entropy.
        return entropy_bits(value) >= 4.0 and sum(c.isupper() for c in value) >= len(value) / 5
    return entropy_bits(value) >= min(3.0 + len(value) / 32, 3.8)


def looks_secret(value: str) -> bool:
    """Would this value, found where a credential is expected, plausibly be one (not prose,
    not a placeholder)?"""
    if len(value) < 4 or PLACEHOLDER.match(value) or value.startswith(("[REDACTED", "<", "$")):
        return False
    if _UUID.match(value) or looks_random(value):
        return True
    if value.isalpha() and value.islower():
        return False  # a plain word: "token: each", "password: required"
    digit, upper, lower, symbol = classes(value)
    return digit or symbol or (upper and lower and any(c.isupper() for c in value[1:]))


def keyish(value: str, *, data: bool = False) -> bool:
    """A value named only "...key": random-looking, a UUID, or a long hex string.
    ``data``: named by a bare "key" or a data key's name ("primary key", "cache key"),
    which hold UUIDs and digests as often as credentials: random-looking, or hex as long
    as a key made of hex is."""
    if data:
        return looks_random(value, 12) or (len(value) >= 32 and bool(HEX.match(value)))
    return (looks_random(value, 12) or bool(_UUID.match(value))
            or (len(value) >= 16 and bool(HEX.match(value))))


#: A package or image pinned to a version: ``numpy==1.26.4``, ``requests>=2.31,<3``,
#: ``actions/checkout@v4``, ``ubuntu:22.04``, ``node 20.11.1``; or a version alone with
#: two dots or a "v" (``v1.4.2``, ``3.11.7``).
_VERSION_PIN = re.compile(
    r"(?P<name>[A-Za-z][\w.\-/\[\]]*(?:[ \t]*(?:===?|>=|<=|~=|!=|\^|~|@|:)[ \t]*|[ \t]+))?"
    r"(?P<version>[vV]\d+(?:\.[\w*]+)*|\d+(?:\.[\w*]+)+)(?:[ \t]*,[ \t]*[<>=!~^][^\s,]*)*")


def version_pin(value: str) -> bool:
    """Is ``value`` a version pin, what "pin: ..." names far more often than a PIN?"""
    m = _VERSION_PIN.fullmatch(value.strip("\"'`"))
    return m is not None and (m.group("name") is not None or m.group("version")[0] in "vV"
                              or m.group("version").count(".") >= 2)


_VERSION = re.compile(r"[vV]\d{1,4}(?:\.\d{1,3}){1,3}|\d{1,4}(?:\.\d{1,3}){2,3}")


def version(value: str) -> bool:
    """Is ``value`` a version number (``2.14.3``, ``v2.14``, ``24.0.4``)?"""
    return _VERSION.fullmatch(value) is not None


def plain_password(value: str) -> bool:
    """A single plain word where a password is stated ("the wifi password is bluebird")."""
    return (len(value) >= 4 and value.isalpha() and not PLACEHOLDER.match(value)
            and value.lower() not in FUNCTION_WORDS | _JUDGEMENT_WORDS)


def verb_form(word: str) -> bool:
    """A participle or adverb after "is"/"was": what happened to a credential ("was
    hacked", "is expiring", "was stolen", "is usually")."""
    return word.lower().endswith(("ed", "en", "ing", "ly")) and not any(
        c.isdigit() for c in word)


def passphrase(words: Sequence[str], min_words: int) -> bool:
    """Several words stated as a password or passphrase ("correct horse battery staple"),
    not a description of one ("too weak and short", "stored in the vault", "stolen at the
    ATM"): at least ``min_words`` words that are neither grammar nor judgement."""
    first = words[0].lower() if words else ""
    if (len(words) < 2 or not first.isalpha() or first in FUNCTION_WORDS
            or PLACEHOLDER.match(first) or (verb_form(first) and first not in _JUDGEMENT_WORDS)):
        return False
    content = [w for w in words if w.lower() not in FUNCTION_WORDS | _JUDGEMENT_WORDS]
    return len(content) >= min_words and all(w.isalpha() for w in content[:min_words])


_IDENT = r"[A-Za-z_$][A-Za-z_$]*\d*"
#: A literal argument or subscript that names something (``'token'``, ``"DB_PASS"``).
_NAMING_ARG = r"(?:[\"'][A-Za-z_][A-Za-z_.\-]*\d*[\"']|" + _IDENT + r"(?:\." + _IDENT + r")*)"
_ARGS = r"(?:\((?:" + _NAMING_ARG + r"(?:,[ \t]*" + _NAMING_ARG + r")*)?\)|\[" + _NAMING_ARG \
    + r"\])"
_CALL = re.compile(rf"(?:{_IDENT}\.)*{_IDENT}{_ARGS}+(?:\.{_IDENT}{_ARGS}*)*")
_ATTRIBUTES = re.compile(rf"{_IDENT}(?:\.{_IDENT})+")
#: A YAML tag (``!vault``, ``!Ref``, ``!env_var``): the value is what follows it.
_YAML_TAG = re.compile(r"!!?[A-Za-z][A-Za-z_:]*")
#: Names that start an attribute chain in code and configs (``self.password``,
#: ``settings.SECRET``, ``process.env.TOKEN``).
_RECEIVERS: Final = frozenset("""
self this cls os env environ process settings config conf cfg secrets vars ctx context
args opts options params request app data creds credentials vault keyring props
""".split())
_CRED_NAME = re.compile(r"(?i)pass|pwd|token|secret|key|cred|auth")
#: A PowerShell cmdlet, its approved verb and a noun (``ConvertTo-SecureString``,
#: ``Read-Host``, ``Get-Secret``): what makes the value follows it.
_CMDLET = re.compile(
    r"(?:Add|Get|Read|New|Import|Export|Invoke|ConvertTo|ConvertFrom|Convert|Unprotect"
    r"|Protect|Select|Receive|Request|Resolve|Find|Search|Open|Use|Join|Format|Out|Copy"
    r"|Set|Start|Test|Merge|Expand|Restore|Update|Show|Wait|Write|Enter|Connect)"
    r"-[A-Z][A-Za-z]+")


def code_reference(value: str) -> bool:
    """Does ``value`` only name where a credential comes from, as code and configs do: a
    call (``get_password()``, ``os.getenv('DB_PASS')``, ``see(docs)``), a subscript
    (``os.environ["TOKEN"]``), an attribute (``self.password``, ``settings.API_KEY``), a
    YAML tag (``!vault``), or a PowerShell cmdlet (``ConvertTo-SecureString``,
    ``Read-Host``)? A literal that looks like a password inside it (``decrypt(
    "Zq8mN2pL4x")``), an identifier with digits inside, and two plain dotted words
    (``hunter.sunrise``) are not that."""
    if _YAML_TAG.fullmatch(value) or _CALL.fullmatch(value) or _CMDLET.fullmatch(value):
        return True
    if not _ATTRIBUTES.fullmatch(value):
        return False
    parts = value.split(".")
    return (parts[0].lower() in _RECEIVERS or any(p.isupper() and len(p) > 1 for p in parts)
            or bool(_CRED_NAME.search(parts[-1])))
