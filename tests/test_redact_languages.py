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
