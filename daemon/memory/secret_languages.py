"""The context rule for credentials stated outside English (:mod:`secret_rules` applies
it): in Chinese, simplified or traditional ("密码是 ...", "密碼是 ...", "PIN码：1234",
"账号admin 密码Zx9#kLm2"), and after the
password's name in Japanese, Korean, Russian, Arabic, Hebrew, Hindi, Greek, Thai, German,
French, Spanish and other languages ("パスワードは ... です", "비밀번호: ...", "Пароль: ...",
"كلمة السر هي ...", "Das Passwort lautet ...", "le mot de passe est ...", "la contraseña es
..."), also with the verb last ("मेरा पासवर्ड ... है", "رمز عبور من ... است"); and a key
or a token named in those languages ("API-Schlüssel: ...", "APIキーは ..."), where what
follows looks random. Talk about a password in those languages stays
("パスワードを忘れました", "Kennwort: vergessen", "le mot de passe est trop court").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from recalld.daemon.memory.secret_anchors import (
    KEY_WORDS,
    NON_LATIN_WORDS,
    OTHER_WORDS,
    ZH_WORDS,
)
from recalld.daemon.memory.secret_context import (
    made_like_a_password,
    phrase_words,
    strip_end,
    value_span,
)
from recalld.daemon.memory.secret_values import keyish, looks_secret

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Span

_ZH = re.compile(r"(?i)(?P<word>" + "|".join(ZH_WORDS) + r"|pin[ \t]?[码碼])"
                 r"(?:(?:是|为|為|：|:|=)[ \t]*[\"'“「]?(?P<value>[^\s\"'”」，。,]{4,200})"
                 # "密码 Zx9#kLm2", "账号admin 密码Zx9#kLm2": a Latin value right after it.
                 r"|[ \t]*(?P<latin>[A-Za-z0-9][!-~]{5,199}))")
_ZH_KEY_WORDS: Final = ("密钥", "秘钥", "密匙", "令牌", "密鑰", "秘鑰", "祕鑰")
#: A password stated in another language: the word, a separator, particle or verb, and a
#: value in Latin or Cyrillic letters ("パスワードは Zx9kLm2Qp です", "비밀번호: ...",
#: "пароль: ...", "mot de passe : ...", "la contraseña es ...", "das Passwort lautet ...").
_OTHER = re.compile(
    r"(?i)(?:(?P<word>" + "|".join(OTHER_WORDS) + r")"
    # Whose it is: "пароль от почты", "Passwort für den Router", "mot de passe du wifi".
    r"(?:[ \t]+(?:от|для|к|für|fur|vom|des|de|du|pour|para|del|do|da|dla|van|voor|för|till)"
    r"(?:[ \t]+[^\s:=—\-]{1,40}){1,3}(?=[ \t]*[:=—]))?"
    # Arabic, Hebrew and Thai say "is" with a pronoun or a copula: "كلمة السر هي ...".
    r"(?P<sep>[ \t]*(?:[:=\-—]|は|が|는|은|이|هي|هو|היא|הוא|คือ)"
    r"|[ \t]+(?:est|es|é|è|ist|lautet|is|är|on|jest|je"
    r"|er|это|là))"
    # The English word in another language's sentence: "la password è ...".
    r"|(?P<en>password)(?P<en_sep>[ \t]+(?:è|ist|lautet|est|es|é|är|jest|je|это)))"
    r"[ \t]*[\"'“「『]?(?P<value>[!#-&(-+\--:<-_a-~\u00c0-\u024f\u0400-\u04ff]{4,200})")

#: A key or a token stated in another language: "API-Schlüssel: ...", "la clé API est ...",
#: "API-ключ: ...", "APIキーは ...", "토큰: ..."; the value must look random (``keyish``).
_KEY = re.compile(
    r"(?i)(?:api[ \t\-]?)?(?:" + "|".join(KEY_WORDS) + r")"
    r"(?:[ \t]+(?:(?:d['’]|de |del |da |do |von |für |для )?(?:api|accès|acceso|acesso"
    r"|zugang|доступа)))?"
    r"(?:[ \t]*(?:[:=—]|は|는|은|이|가)|[ \t]+(?:est|es|é|è|ist|lautet|is|är|это|jest|je))"
    r"[ \t]*[\"'“「『]?(?P<value>[!#-&(-+\--:<-_a-~]{8,200})")


#: A password stated with the verb last, as Hindi, Persian, Japanese and Korean put it:
#: the password's name, perhaps whose it is in that script ("رمز عبور من": my password),
#: the value, then "is" ("मेरा पासवर्ड Zx9kLm2Q है", "رمز عبور من Zx9kLm2Q است",
#: "パスワード Zx9kLm2Q です", "비밀번호 Zx9kLm2Q입니다"). The verb right after the value
#: tells it is one: "पासवर्ड reset करना है" (the password must be reset) has none there.
_VERB_LAST = re.compile(
    r"(?i)(?:" + "|".join(NON_LATIN_WORDS) + r")(?:[ \t]+[^\x00-\x7f\s]+){0,3}?[ \t]+"
    r"[\"'“「『]?(?P<value>[!#-&(-+\--:<-_a-~\u00c0-\u024f\u0400-\u04ff]{4,200}?)"
    r"[\"'”」』]?[ \t]*(?:हैं|है|था|थी|ہے|است|هست|です|だ|입니다|이다|이에요|예요)"
    r"(?=[\s।.,!?;:)\"'”」』]|\Z)")
_NON_LATIN_CHARS: Final = max(map(len, NON_LATIN_WORDS))


def _verb_last(text: str, a: int) -> Span | None:
    if not text[a:a + _NON_LATIN_CHARS].lower().startswith(NON_LATIN_WORDS):
        return None
    m = _VERB_LAST.match(text, a)
    if m is None:
        return None
    value = m.group("value")
    if looks_secret(value) and any(not c.isalpha() for c in value):
        return m.start("value"), m.end("value")
    # A plain word ("पासवर्ड lighthouse है"), judged as the English "the password is
    # lighthouse" would be: "पासवर्ड weak है" (the password is weak) is no password.
    return _stated(text, m.start("value"), "is")


#: What a text starts with where one of the patterns may match (most anchors are English
#: words: they are passed by at once).
_STARTS: Final = (*OTHER_WORDS, *ZH_WORDS, *KEY_WORDS, "password", "pin", "api")
_STARTS_CHARS: Final = max(map(len, _STARTS))


def find_in_other_languages(text: str, starts: Sequence[int]) -> Iterable[Span]:
    for a in starts:
        if not text[a:a + _STARTS_CHARS].lower().startswith(_STARTS):
            continue
        m = _OTHER.match(text, a)
        if m is not None:
            value = strip_end(m.group("value"))
            if looks_secret(value) and any(not c.isalpha() for c in value):
                yield m.start("value"), m.start("value") + len(value)
            elif (span := _latin_stated(text, m)) is not None:
                yield span
        if (span := _verb_last(text, a)) is not None:
            yield span
        m = _KEY.match(text, a)
        if m is not None and keyish(value := strip_end(m.group("value"))):
            yield m.start("value"), m.start("value") + len(value)
        m = _ZH.match(text, a)
        if m is None:
            continue
        latin = m.group("latin") is not None
        group = "latin" if latin else "value"
        value = strip_end(m.group(group))
        if latin and text.startswith(_ZH_KEY_WORDS, a):
            ok = keyish(value)  # "密钥 SHA256 指纹" names no key
        elif latin:
            # No verb or colon: only what is made like a password counts, not the file
            # names, versions and ids prose puts there ("密码 README.md", "密码 x86_64",
            # "密码 CVE-2024-3094").
            ok = made_like_a_password(value)
        else:
            ok = looks_secret(value)
        if ok:
            yield m.start(group), m.start(group) + len(value)
        elif not latin and (span := _zh_stated(text, m)):
            yield span


_ZH_PASSWORD_WORDS: Final = ("密码", "口令", "暗号", "密碼", "暗號")
#: Where a Latin value stated in Chinese, Japanese, Korean or Russian ends: punctuation, a
#: quote, a line end, a character of another script.
_CLAUSE_END = re.compile(r"[，。,；;！？!?、\n\"'`」』”]|[^\x00-\x7f]")


def _stated(text: str, start: int, verb: str) -> Span | None:
    end = _CLAUSE_END.search(text, start, start + 400)
    clause = text[start:end.start() if end else start + 400].rstrip()
    return value_span("password", clause, start, phrase_words(""),
                      statement="is" if verb else "") if clause else None


def _zh_stated(text: str, m: re.Match[str]) -> Span | None:
    """A plain word or a passphrase stated as a password in Chinese ("WiFi密码是bluebird",
    "密码：correct horse battery staple"), judged as the English statement would be."""
    if m.group("word") not in _ZH_PASSWORD_WORDS:
        return None
    start = m.start("value")
    verb = text[m.end("word"):start].strip(" \t\"'“「")
    return _stated(text, start, verb if verb in ("是", "为", "為") else "")


def _latin_stated(text: str, m: re.Match[str]) -> Span | None:
    """A plain Latin word or passphrase stated as a password after its name in a script
    other than Latin ("パスワード：bluebird", "비밀번호는 sunflower 입니다", "пароль: bluebird"):
    there it can only be the value. (After "Kennwort:" a plain word may be "vergessen".)"""
    word = m.group("word")
    if word is None or word.lower() not in NON_LATIN_WORDS or not m.group("value")[:1].isascii():
        return None
    return _stated(text, m.start("value"), m.group("sep").strip(" \t:=-—"))
