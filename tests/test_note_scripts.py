"""Which East Asian encoding a note's bytes are read in, when the same bytes decode in
several (EUC-KR, EUC-JP and GBK share their layout): text written in each language and
saved in each of its encodings is read back as written, and Western text, other scripts
and binary are never taken for one of them."""

from __future__ import annotations

import random

import pytest

from recalld.daemon.notetext import decode_as, decode_note

KOREAN = (
    "# 주간 회의록\n\n- 다음 주 월요일까지 발표 자료를 정리해 주세요.\n"
    "- 예산은 팀장님이 확인합니다.\n",
    "- 병원 예약 변경하기\n",
    "오늘 저녁에 친구들이랑 삼겹살 먹기로 했다.\n",
    "# Release notes\n\n- fixed the login bug (로그인 오류 수정)\n- bumped version\n",
    "- 憲法 제10조: 모든 國民은 인간으로서의 존엄과 가치를 가진다.\n",
    "- 곱창 맛집: 왕십리\n",  # few of its syllables frequent, fewer of its GBK reading's
)
JAPANESE = (
    "# 週報\n\n- 来月の出張の予定を確認してください。\n- 経費の申請は金曜日までです。\n",
    "- 歯医者の予約を変更する\n",
    "明日は雨が降るらしいので、傘を持って行こう。\n",
    "# Deploy log\n\n- rollback done (ロールバック完了)\n- next: retry\n",
    "# 大阪支店 営業会議\n\n- 議題 売上報告\n- 出席者 部長 課長\n",  # no kana
)
CHINESE = (
    "# 项目周报\n\n- 下周一之前请整理好演示材料。\n- 预算由经理确认。\n",
    "- 改牙医的预约\n",
    "- 茶\n- 书\n",  # single characters between ASCII only
    "# 读书\n",
    "- 回深圳了\n",  # 圳 is no common character, the rest are frequent ones
)
TRADITIONAL = (
    "# 專案週報\n\n- 下週一之前請整理好簡報資料。\n- 預算由經理確認。\n",
    "- 買書\n",
)
WESTERN = (
    "- Größe prüfen, Füße wärmen\n",
    "- informação e ações da coração\n",
    "- créé à Montréal, déjà vu\n",
    "- Smörgåsbord i Göteborg\n",
    "- naïve façade, Ærø\n",
    "- El niño añadió más\n",
)


@pytest.mark.parametrize(("texts", "encodings", "reported"), [
    (KOREAN, ("euc_kr", "cp949"), "euc_kr"),
    (JAPANESE, ("euc_jp",), "euc_jp"),
    (JAPANESE, ("cp932",), "shift_jis"),
    (CHINESE, ("gbk",), "gb18030"),
    (TRADITIONAL, ("big5",), "big5"),
    (WESTERN, ("cp1252",), "windows-1252"),
])
def test_a_note_is_read_in_the_encoding_it_was_saved_in(
        texts: tuple[str, ...], encodings: tuple[str, ...], reported: str) -> None:
    for text in texts:
        for encoding in encodings:
            data = text.encode(encoding)
            assert decode_note(data) == (text, reported), (encoding, text)
            # A line alone is read in the note's encoding.
            last = data.splitlines(keepends=True)[-1]
            assert decode_as(last, reported) == text.splitlines(keepends=True)[-1]


def test_western_words_other_scripts_and_binary_are_not_read_as_east_asian() -> None:
    rnd = random.Random(20260309)
    accented = "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝ"
    east_asian = {"gb18030", "big5", "shift_jis", "euc_kr", "euc_jp"}
    for _ in range(2000):
        # Words of Latin letters with up to two accented ones anywhere in them.
        words = []
        for _ in range(rnd.randint(1, 6)):
            word = [rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 8))]
            for _ in range(rnd.randint(1, 2)):
                word.insert(rnd.randint(0, len(word)), rnd.choice(accented))
            words.append("".join(word))
        text = "- " + " ".join(words) + "\n"
        assert decode_note(text.encode("cp1252"))[1] not in east_asian, text
    cyrillic = "абвгдежзийклмнопрстуфхцчшщыьэюя"
    greek = "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώ"
    for _ in range(300):
        for letters, encoding in ((cyrillic, "cp1251"), (greek, "cp1253")):
            text = " ".join("".join(rnd.choice(letters) for _ in range(rnd.randint(4, 9)))
                            for _ in range(rnd.randint(3, 8)))
            assert decode_note(text.encode(encoding))[1] not in {"euc_kr", "euc_jp"}, text
        binary = rnd.randbytes(rnd.randint(64, 512)) + b"\x00\x01"
        assert decode_note(binary)[1] not in east_asian
