"""How plainly a text reads as Chinese, Japanese or Korean: what tells the encodings of
East Asian Windows and Unix editors apart, when the same bytes decode in several of them.

GBK, EUC-KR and EUC-JP share their byte layout (a lead and a trail byte, both from 0xA1
to 0xFE), and each maps the rows of the others' common characters onto common characters
of its own: a Korean note in EUC-KR decodes, without a fault, as a string of GB2312's
first-level hanzi, and a Japanese one in EUC-JP as real kana between wrong hanzi. What
differs is which characters come out. Running text in each language is made mostly of a
few hundred characters of its own (particles and endings, function words): a few hundred
Hangul syllables cover most Korean text, kana and a few hundred kanji most Japanese, a
few hundred hanzi most Chinese; bytes decoded in another language's encoding give
characters drawn across the whole table, few of them among those. :func:`script_share`
gives that share; the encoding whose text has the highest is the note's.
"""

from __future__ import annotations

import functools
import re
from typing import Final

__all__ = ["CHINESE", "JAPANESE", "KOREAN", "script_share"]

CHINESE: Final = "zh"
JAPANESE: Final = "ja"
KOREAN: Final = "ko"

# The most frequent hanzi of running Chinese text, simplified and traditional (the first
# few hundred of a frequency list, with the everyday words of notes: days, meals, work).
_HANZI: Final = frozenset(
    "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去"
    "之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方"
    "又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点"
    "月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门"
    "相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总"
    "才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合"
    "放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服"
    "毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带"
    "花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转"
    "量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音买卖喝茶饭菜酒肉鱼"
    "米面早晚昨星期号钟分秒今明周末午夜睡醒病医药朋友同事老板客户项目会议预算报告邮件电"
    "话手机电脑网站微信记录计划旅行火锅熊猫猫狗孩妈爸哥姐弟妹房租超市商店银行票站飞机场"
    "火车地铁公交路上班下周三四五六日历准备完成负责交财务部门经理团队确认修改删除更新检"
    "查测试问题错误原因结果方案需要注意记得提醒重要急请帮谢谢对不起没关系可以应该已经"
    "牛奶蛋鸡猪羊果汁糖盐油洗衣服鞋包钥匙门窗灯桌椅床雨雪冷热春夏秋冬节假生日快乐礼物"
    "送取递快递寄收货付款价格便宜贵块元角毛分钱租借还签合同订单客服投诉退换维修安装"
    # traditional forms
    "這個國們為來說時會過學對裡麼後發還當開無見經頭從動兩長樣現將與進實點種聲話兒問機給"
    "幾業間東門氣關內軍產萬體別處總場師書員華報馬張難數應車體雖親記邊風戰許覺統請愛讓認"
    "論義術結連遠資隊帶條變聯權領傳紅決達辦運區轉眾輕語滿寫識極黃錢黨買賣飯魚麵鐘週晚醫"
    "藥腦網紀錄計劃遊鍋貓媽飛鐵與準備負責財務團確認刪除檢測試題錯誤謝應該經這臺灣較過"
)
# The most frequent kanji of running Japanese text (in their Japanese forms: 経, 円).
_KANJI: Final = frozenset(
    "日一国人年大十二本中長出三時行見月分後前生五間上東四今金九入学高円子外八六下来気小"
    "七山話女北午百書先名川千水半男西電校語土木聞食車何南万毎白天母火右読友左休父雨会社"
    "事者地方業自部合市内同関思新定場手実家作政議所経問理動度発化題全対意現明的主特通成"
    "体開最私彼言物立代持手目当力多連選思知様品表済民情報変京都府県区町村駅店屋室予約費"
    "精算打合送返信確認願様株式社員課長部長田島藤井佐木村野松林橋石原小川山口寺朝夕週曜"
    "昨明後今回度点線号番号以上下中外内前後左右約束用件資料案件仕事務録議"
)
# The most frequent Hangul syllables of running Korean text (particles, endings, the
# syllables of common words).
_HANGUL: Final = frozenset(
    "이다는의에고하가을지기한서도리사자어나일대시수정들인것상아은게그니적주해여부만전있"
    "라보제국원성장했스소우없방면간거마중동요화비세미내를과와무문생합습까데관경연실공선"
    "구유되모야신오학물회분발개위산말될러님며저날때던할좋운려남께치용입김민안행체명심결"
    "식통같후드크트프터계진조차처역양영현형호교목작잘점직집초출최추친타태토특파편평포표"
    "품피필함향허활효휴희힘우리요일월년시분오늘내일어제주말회의예산보고준비확인수정삭제"
    "메일전화사무실팀장님께서씨께요네죠까요요청드립니다감사합니다입니까세요어요아요해요"
    "커피밥물집학교병원약속시간계획여행서울부산도쿄중국한국미국사람친구가족엄마아빠"
    "배포우유택배찾사기보내받기다음이번지난매주오전후저녁아침점심빨리천천히정말너무"
    "많이조금다시먼저같이혼자모두아직벌써항상가끔자주좀더잘못알려주세요문제해결방법"
)
_KANA: Final = "\u3041-\u30ff\uff66-\uff9d"
_HANGUL_SYLLABLES: Final = "[\uac00-\ud7a3]"
# The letters of these scripts (not their punctuation, digits or symbols).
_LETTERS: Final = f"[{_KANA}\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3\uf900-\ufaff]"


def _class(chars: frozenset[str], ranges: str = "") -> re.Pattern[str]:
    return re.compile("[" + "".join(re.escape(c) for c in sorted(chars)) + ranges + "]")


# Every pattern here is compiled at its first use: classes of wide ranges or of a few
# hundred characters take milliseconds each to compile, and only a note that is not UTF-8
# needs them, never a daemon's start.
@functools.cache
def _letter() -> re.Pattern[str]:
    return re.compile(_LETTERS)


@functools.cache
def _hangul_syllable() -> re.Pattern[str]:
    return re.compile(_HANGUL_SYLLABLES)


@functools.cache
def _typical(language: str) -> re.Pattern[str]:
    """``language``'s frequent letters as one character class."""
    if language == CHINESE:
        return _class(_HANZI)
    if language == JAPANESE:
        return _class(_KANJI, _KANA)
    if language == KOREAN:
        return _class(_HANGUL | _HANZI)
    raise KeyError(language)


def script_share(text: str, language: str) -> float:
    """Of the Han, kana and Hangul letters of ``text``, the share that the running text of
    ``language`` (:data:`CHINESE`, :data:`JAPANESE`, :data:`KOREAN`) is made of: its
    frequent hanzi; kana and frequent kanji; frequent Hangul syllables and frequent hanja
    (0 when Hangul is not half the letters). 0 for a text with none of these letters."""
    letters = _letter().subn("", text)[1]
    hangul = _hangul_syllable().subn("", text)[1] if language == KOREAN else letters
    if not letters or hangul * 2 < letters:
        return 0.0  # Korean is written in Hangul, with hanja here and there
    return _typical(language).subn("", text)[1] / letters
