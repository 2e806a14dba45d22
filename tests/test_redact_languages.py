"""Secrets stated the way people write outside plain ASCII English: after a full-width
colon or equals sign (as Chinese and Japanese input methods type them), with a
full-width credential name, after a Chinese copula, and named in other languages. And
the talk about credentials in those languages, which stays."""

from __future__ import annotations

import pytest

from recalld.daemon.memory.redact import redact

VALUE = "Zx9kLm2Qp"


@pytest.mark.parametrize("text", [
    f"password：{VALUE}!",
    f"服务器的 Password： {VALUE}",
    f"用户名：admin，password：{VALUE}",
    f"ｐａｓｓｗｏｒｄ＝{VALUE}",
    f"Ｐａｓｓｗｏｒｄ： {VALUE}",
    f"DB_PASSWORD＝{VALUE}",
    f"pwd：{VALUE}",
    f"secret：{VALUE}Ab",
    f"wifi password 是 {VALUE}",
    f"root password 为 {VALUE}",
    f"パスワードは {VALUE} です",
    f"パスワード：{VALUE}",
    f"パスワードは「{VALUE}」",
    f"비밀번호: {VALUE}!",
    f"비밀번호는 {VALUE} 입니다",
    f"пароль: {VALUE}!",
    f"Пароль = {VALUE}",
    f"mot de passe : {VALUE}",
    f"le mot de passe est {VALUE}",
    f"contraseña: {VALUE}!",
    f"la contraseña es {VALUE}",
    f"senha: {VALUE}",
    f"Kennwort: {VALUE}",
])
def test_stated_secrets_are_masked(text: str) -> None:
    out = redact(text)
    assert VALUE not in out and "[REDACTED]" in out, out
    # Positions are kept: what surrounds the value is the original text.
    assert out.startswith(text[:text.index(VALUE)])


@pytest.mark.parametrize("text", [
    "パスワードはありません",
    "パスワードを忘れました",
    "비밀번호를 잊었어요",
    "비밀번호는 안전합니다",
    "пароль: забыл",
    "пароль — это секрет",
    "mot de passe : oublié",
    "le mot de passe est trop court",
    "la contraseña es muy débil",
    "senha: mudou ontem",
    "Kennwort: vergessen",
    "password：忘记了",
    "wifi password 是什么？",
    "password 是 8 位以上",
    "（注：password 字段可选）",
    "参数：token（可选），key：用于签名",
    "端口：８０８０，密码：见运维手册",
    "全角文字：ＡＢＣ１２３，半角文字：ABC123。",
])
def test_talk_about_credentials_is_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("PIN码：4821", "4821"),
    ("银行卡 pin码是 739105", "739105"),
    ("Pin 码为 2046，别告诉别人", "2046"),
    ("暗証番号は 5823 です", "5823"),
    ("Das Passwort ist Sonnenblume7", "Sonnenblume7"),
    ("Das neue Passwort lautet Kuckuck#12", "Kuckuck#12"),
    ("Passwort: Tannenbaum-44", "Tannenbaum-44"),
    ("la password è Girasole_9", "Girasole_9"),
    ("Пароль: подсолнух77", "подсолнух77"),
    ("пароль от почты — Ромашка2024", "Ромашка2024"),
    ("パスワード：bluebird", "bluebird"),
    ("パスワードはmarigoldです", "marigold"),
    ("パスコード：tangerine", "tangerine"),
    ("비밀번호는 sunflower 입니다", "sunflower"),
    ("패스워드: lighthouse", "lighthouse"),
    ("пароль: lighthouse", "lighthouse"),
    ("مرحبا، كلمة السر هي Hx8kQ2mZ9pLw 🎉", "Hx8kQ2mZ9pLw"),
    ("كلمة المرور: bluebird", "bluebird"),
    ("رمز عبور: Hx8kQ2mZ9pLw", "Hx8kQ2mZ9pLw"),
    ("הסיסמה היא Hx8kQ2mZ9pLw", "Hx8kQ2mZ9pLw"),
    ("पासवर्ड: lighthouse", "lighthouse"),
    ("Κωδικός πρόσβασης: Hx8kQ2mZ9pLw", "Hx8kQ2mZ9pLw"),
    ("รหัสผ่านคือ Hx8kQ2mZ9pLw", "Hx8kQ2mZ9pLw"),
    ("Şifrem: Hx8kQ2mZ9pLw", "Hx8kQ2mZ9pLw"),
    ("Mật khẩu là Hx8kQ2mZ9pLw", "Hx8kQ2mZ9pLw"),
    ("kata sandi: Hx8kQ2mZ9pLw", "Hx8kQ2mZ9pLw"),
])
def test_passwords_stated_in_more_languages_are_masked(text: str, secret: str) -> None:
    """PIN codes in Chinese, the German and Italian words, values in Cyrillic, a plain
    Latin word stated after a password's name in another script, and the password named
    in Arabic, Persian, Hebrew, Hindi, Greek (a name longer than 12 characters), Thai,
    Turkish, Vietnamese and Indonesian, which let a conversation's password through."""
    out = redact(text)
    assert secret not in out and "[REDACTED]" in out, out


@pytest.mark.parametrize("text", [
    "PIN码是必须的", "pin码：见背面", "Das Passwort ist zu kurz",
    "Das Passwort lautet anders", "пароль: забыл", "Пароль: Москва", "パスワード：忘れた",
    "パスワードはありません", "비밀번호는 안전합니다", "la password è troppo corta",
    "mot de passe : oublié", "كلمة السر قوية", "كلمة المرور: نسيتها", "סיסמה: שכחתי",
    "पासवर्ड: भूल गया", "Şifre: unuttum", "mật khẩu là quá ngắn", "kata sandi: lupa",
    "κωδικός πρόσβασης: ξέχασα", "รหัสผ่านคือ อะไร",
])
def test_talk_about_passwords_in_more_languages_is_left_alone(text: str) -> None:
    assert redact(text) == text


#: Simplified characters and their traditional forms (Taiwan, Hong Kong) in the
#: credential words and the statements around them.
_TRADITIONAL = str.maketrans({"码": "碼", "钥": "鑰", "号": "號", "验": "驗", "证": "證",
                              "为": "為", "账": "帳", "记": "記", "学": "學", "门": "門",
                              "务": "務", "见": "見", "运": "運", "维": "維",
                              "册": "冊"})


@pytest.mark.parametrize(("text", "secret"), [
    ("数据库的密码是 Hunter2Zz9", "Hunter2Zz9"),
    ("我的密码：qwerty12345", "qwerty12345"),
    ("WiFi密码是bluebird", "bluebird"),
    ("账号admin 密码Zx9#kLm2", "Zx9#kLm2"),
    ("密码为 Tr0ub4dor&3", "Tr0ub4dor&3"),
    ("API 密钥：wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzzzKEYx", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzzzKEYx"),
    ("秘钥 9b2f1c7d8e4a6b3c5d7e9f0a1b2c3d4e", "9b2f1c7d8e4a6b3c5d7e9f0a1b2c3d4e"),
    ("PIN码：4821", "4821"),
    ("验证码：839201", "839201"),
    ("暗号是 Sesame-7Qx", "Sesame-7Qx"),
])
def test_chinese_statements_are_masked_in_traditional_characters_too(text: str,
                                                                      secret: str) -> None:
    """Chinese written in traditional characters ("密碼是 …", "密鑰：…") states a
    credential as simplified Chinese does: both spellings are masked alike."""
    traditional = text.translate(_TRADITIONAL)
    assert traditional != text
    for spelled in (text, traditional):
        out = redact(spelled)
        assert secret not in out and "[REDACTED]" in out, out


@pytest.mark.parametrize("text", [
    "密码学是一门学科", "忘记密码了", "密码 README.md", "密钥 SHA256 指纹",
    "端口：８０８０，密码：见运维手册",
])
def test_talk_about_credentials_in_traditional_characters_is_left_alone(text: str) -> None:
    for spelled in (text, text.translate(_TRADITIONAL)):
        assert redact(spelled) == spelled


_HEX = "9b2f1c7d8e4a6b3c5d7e9f0a1b2c3d4e"
_RANDOM = "Xk29vLq7Rt4mPz8W"


@pytest.mark.parametrize(("text", "secret"), [
    (f"Der API-Schlüssel lautet {_HEX}", _HEX),
    (f"Zugangstoken: {_RANDOM}", _RANDOM),
    (f"la clé API est {_HEX}", _HEX),
    (f"jeton d'accès : {_RANDOM}", _RANDOM),
    (f"la clave API es {_HEX}", _HEX),
    (f"chave de API: {_HEX}", _HEX),
    (f"API-ключ: {_HEX}", _HEX),
    (f"токен: {_RANDOM}", _RANDOM),
    (f"APIキーは {_HEX} です", _HEX),
    (f"トークン: {_RANDOM}", _RANDOM),
    (f"API 키: {_HEX}", _HEX),
    (f"토큰: {_RANDOM}", _RANDOM),
])
def test_keys_and_tokens_named_in_other_languages_are_masked(text: str, secret: str) -> None:
    """Only passwords were known by their names in other languages (and keys in
    Chinese): an API key or a token stated in German, French, Spanish, Portuguese,
    Russian, Japanese or Korean went through."""
    out = redact(text)
    assert secret not in out and "[REDACTED]" in out, out


@pytest.mark.parametrize("text", [
    "Schlüssel: im Briefkasten", "Der Schlüssel ist verloren", "la clé est sous le paillasson",
    "키: 180cm", "ключ: от двери", "トークン: 4096 個", "clé: v1.2.3-beta",
])
def test_keys_named_in_other_languages_with_no_key_after_them_are_left_alone(
        text: str) -> None:
    assert redact(text) == text
