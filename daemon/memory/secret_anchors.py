"""Where the context rules of :mod:`secret_rules` look: the credential words (in English
and the other languages :mod:`secret_languages` reads) and the start of the name each is
part of (:func:`anchors`), found in one pass over a text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

#: The password named in scripts other than Latin (Japanese, Korean, Russian, Arabic,
#: Persian, Hebrew, Hindi, Greek, Thai), as it starts a statement of one.
NON_LATIN_WORDS: Final = (
    "パスワード", "パスコード", "暗証番号", "비밀번호", "패스워드", "암호", "пароль",
    "كلمة السر", "كلمة المرور", "رمز المرور", "رمز عبور", "گذرواژه", "סיסמה", "סיסמא",
    "पासवर्ड", "κωδικός πρόσβασης", "รหัสผ่าน")
#: The password named in other languages: those of :data:`NON_LATIN_WORDS`, then those
#: written in Latin letters.
OTHER_WORDS: Final = (
    *NON_LATIN_WORDS,
    "contraseña", "contrasena", "senha", "kennwort", "passwort", "mot de passe", "wachtwoord",
    "hasło", "haslo", "heslo", "salasana", "lösenord", "losenord", "adgangskode", "clave",
    "mdp", "şifre", "şifrem", "mật khẩu", "kata sandi", "kata laluan")
#: The credential named in Chinese, in simplified and in traditional characters (Taiwan,
#: Hong Kong: "密碼是 ...", "API 密鑰：...").
ZH_WORDS: Final = ("密码", "口令", "密钥", "秘钥", "密匙", "令牌", "暗号", "验证码",
                   "密碼", "密鑰", "秘鑰", "祕鑰", "暗號", "驗證碼")
#: A key or a token named in other languages ("API-Schlüssel", "clé API", "API-ключ",
#: "APIキー", "토큰"): what follows is one only where it looks random (see ``keyish``).
KEY_WORDS: Final = (
    "schlüssel", "schluessel", "zugangstoken", "geheimnis", "clé", "jeton", "clave",
    "chave", "chiave", "segreto", "secreto", "sleutel", "klucz", "anahtar", "nyckel",
    "ключ", "токен", "キー", "トークン", "키", "토큰")

#: Lowercase words where a credential name or statement can start (the anchors).
_ANCHOR_WORDS: Final = (
    "pass", "pw", "pin", "secret", "token", "key", "cred", "auth", "sig", "cookie", "session",
    "otp", "pat", "login", "api", "access", "private", "signing", "encryption", "master",
    "license", "ssh", "app", "bearer", "refresh", "bot", "client", "sessid", *KEY_WORDS,
    *ZH_WORDS, *OTHER_WORDS)
#: "key" after these names a public key, which is published, not kept secret ("public
#: key: MFkw...", "-----BEGIN PUBLIC KEY-----", "WireGuard PublicKey = ...").
_PUBLIC_KEY: Final = re.compile(r"(?:public|pub)[ \t_\-]?$")
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
#: ... the words written in ASCII only, for a text with none of the other words'
#: characters beyond ASCII (most texts): none of those words can be in it, and a position
#: is tried against half the branches (twice as fast).
_ASCII_ANCHOR_RE: Final = re.compile(_alternation(w for w in _ANCHOR_WORDS if w.isascii()))
_NON_ASCII_CHARS: Final = re.compile("[" + "".join(sorted(
    {re.escape(c) for w in _ANCHOR_WORDS for c in w if not c.isascii()})) + "]")


#: Hints that are anchor words: one of them is in a text exactly when it starts at one
#: of the text's ``anchor_words``.
ANCHOR_WORDS: Final = frozenset(_ANCHOR_WORDS)


#: Texts at least this long are looked over by :func:`_word_candidates` first: below it,
#: setting that up costs more than the search it saves.
LONG_TEXT: Final = 512

_MULTIPLIER: Final = 0x9E3779B1
_HASH_BITS: Final = 20


def _low_bytes(word: str) -> list[int]:
    return [ord(c) & 0xFF for c in word]


def _hash4(quad: int) -> int:
    return ((quad * _MULTIPLIER) & 0xFFFFFFFF) >> (32 - _HASH_BITS)


def _tables() -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Where an anchor word may start, by the low bytes of the characters there: the
    first two of a word of one or two characters (the second any byte after a word of
    one), the hash of the first four of a longer word (the fourth any byte after a word
    of three)."""
    pairs = np.zeros(1 << 16, np.bool_)
    quads = np.zeros(1 << _HASH_BITS, np.bool_)
    for word in _ANCHOR_WORDS:
        low = _low_bytes(word[:4])
        if len(word) == 1:
            pairs[[low[0] | second << 8 for second in range(256)]] = True
        elif len(word) == 2:
            pairs[low[0] | low[1] << 8] = True
        else:
            head = low[0] | low[1] << 8 | low[2] << 16
            fourths = range(256) if len(word) == 3 else (low[3],)
            quads[[_hash4(head | fourth << 24) for fourth in fourths]] = True
    return pairs, quads


_PAIRS, _QUADS = _tables()


def _word_candidates(lower: str) -> list[int]:
    """Positions of ``lower`` where an anchor word may start: every position where one
    does, and a few more (the low bytes of other characters, or a hash, alike).

    Each position's character and the three after it are read as the low bytes of their
    code points (zeros past the end), four bytes in one integer; a word starts only
    where its own first bytes are, so only where :func:`_tables` marks them."""
    n = len(lower)
    if lower.isascii():
        low = np.frombuffer(lower.encode("ascii") + b"\0\0\0", np.uint8)
    else:
        low = np.zeros(n + 3, np.uint8)
        low[:n] = np.frombuffer(lower.encode("utf-32-le", "surrogatepass"), np.uint8)[::4]
    quad = np.ndarray((n,), "<u4", low, 0, (1,))
    marked = _PAIRS.take(quad & 0xFFFF)
    marked |= _QUADS.take((quad * np.uint32(_MULTIPLIER)) >> np.uint32(32 - _HASH_BITS))
    found: list[int] = np.flatnonzero(marked).tolist()
    return found


def anchor_words(lower: str) -> list[int]:
    """Every position of ``lower`` where an anchor word starts."""
    if len(lower) >= LONG_TEXT:
        # A pattern tried at every position enters its branches at most of them (the
        # words start with the commonest letters); the candidates are few, and hold
        # every position where a word starts.
        match = _ANCHOR_RE.match
        return [i for i in _word_candidates(lower) if match(lower, i)]
    found: list[int] = []
    search = (_ASCII_ANCHOR_RE if lower.isascii() or _NON_ASCII_CHARS.search(lower) is None
              else _ANCHOR_RE).search
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
        if lower.startswith("key", i) and _PUBLIC_KEY.search(lower, max(0, i - 7), i):
            continue
        found.add(i)
        start = i
        while start > 0 and i - start < _NAME_REACH and text[start - 1] in _NAME_CHARS:
            start -= 1
        found.add(start)
    return sorted(found)


CRED_HINTS = ("pass", "pw", "pin", "secret", "token", "key", "cred", "auth", "sig", "cookie",
              "session", "sessid", "otp", "pat", "login",
              *ZH_WORDS, *OTHER_WORDS, *KEY_WORDS)
