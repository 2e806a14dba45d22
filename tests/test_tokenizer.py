"""Tokenizer: English, Chinese, mixed text, identifiers, Unicode normalization."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recalld.daemon.index.marks import MARKS
from recalld.daemon.index.tokenizer import STOPWORDS, fold, tokenize, tokenize_query
from recalld.ipc.textfold import DIGIT_ZEROS


def test_english_words_stopwords_and_stemming() -> None:
    toks = tokenize("The studies were running quickly")
    assert "the" not in toks and "were" not in toks
    # Inflections of one word meet on one term, at index and at query time alike.
    assert tokenize("study") == tokenize("studies") == tokenize_query("Studies")
    assert tokenize("running") == tokenize("run")
    assert tokenize("connected") == tokenize("connect")
    assert not set(toks) & STOPWORDS


def test_numbers_are_kept() -> None:
    assert "2026" in tokenize("in 2026 we moved")
    assert "42" in tokenize("answer: 42")


@pytest.mark.parametrize(
    ("text", "whole", "parts"),
    [
        ("handleWebSocketReconnect", "handlewebsocketreconnect", ["web", "socket", "reconnect"]),
        ("snake_case_name", "snake_case_name", ["case", "name"]),
        ("config.toml", "config.toml", ["config", "toml"]),
        ("foo-bar.md", "foo-bar.md", ["foo", "bar", "md"]),
        ("v2.3.1", "v2.3.1", ["v2", "3", "1"]),
        ("Python 3.11", "3.11", ["3", "11"]),
        ("HTTPServer", "httpserver", ["http", "server"]),
    ],
)
def test_identifiers_whole_and_parts(text: str, whole: str, parts: list[str]) -> None:
    toks = tokenize(text)
    assert whole in toks
    for part in parts:
        assert tokenize_query(part)[0] in toks
    # An exact query for the identifier finds the whole token.
    assert whole in tokenize_query(text)


@pytest.mark.parametrize(("word", "name"), [("python3", "python"), ("wombat17", "wombat"),
                                            ("Windows11", "windows"), ("BRCA1", "brca"),
                                            ("node18", "node"), ("Ubuntu2204", "ubuntu")])
def test_a_name_with_a_number_glued_on_is_the_name_too(word: str, name: str) -> None:
    # `python` found no note that says only `python3`; the whole word stays a term of its
    # own, so a query for it ranks its notes above the name's other numbers.
    toks = tokenize(f"we moved to {word} last week")
    assert tokenize_query(word)[0] in toks and tokenize_query(name)[0] in toks
    assert tokenize_query(word)[0] not in tokenize(f"we moved to {name} last week")


@pytest.mark.parametrize("word", ["k8s", "v2", "mp3", "log4j", "p53", "2024", "the2"])
def test_short_names_and_numbers_inside_words_have_no_name_part(word: str) -> None:
    assert tokenize(word) == tokenize_query(word)[:1]


def test_error_names_stay_exact() -> None:
    toks = tokenize("connect failed: ECONNREFUSED")
    assert len(toks) == 3 and toks[:2] == ["connect", "fail"]
    # Typed in any case, the query term is the one the note gave.
    assert tokenize_query("econnrefused") == tokenize_query("ECONNREFUSED") == toks[2:]
    assert tokenize_query("parserequests") == tokenize_query("parseRequests")[:1]


def test_language_names_with_symbols() -> None:
    toks = tokenize("I write C++ and C# daily, not C.")
    assert "c++" in toks and "c#" in toks
    assert "c++" in tokenize_query("c++") and "c#" in tokenize_query("C#")


def test_sentence_punctuation_is_not_glued() -> None:
    toks = tokenize("We moved to Berlin. Then - after a while - Paris.")
    assert "berlin" in toks and tokenize_query("Paris")[0] in toks
    assert not any("." in t or "-" in t for t in toks)


def test_chinese_bigrams_and_unigrams() -> None:
    toks = tokenize("战国无双")
    assert {"战国", "国无", "无双"} <= set(toks)
    assert {"战", "国", "无", "双"} <= set(toks)
    # Queries use bigrams only for runs of two or more characters ...
    assert tokenize_query("战国无双") == ["战国", "国无", "无双"]
    # ... and the single character when that is all there is.
    assert tokenize_query("国") == ["国"]
    assert "国" in toks


def test_mixed_chinese_english_identifier() -> None:
    toks = tokenize("我用Python写了handleWebSocketReconnect函数")
    assert {"我用", "python", "写了", "handlewebsocketreconnect", "socket", "函数"} <= set(toks)
    # No bigram spans the boundary between scripts.
    assert not any(len(t) == 2 and t[0] == "用" and t[1].isascii() for t in toks)


def test_nfkc_full_width_and_case_folding() -> None:
    assert tokenize("ＡＢＣ１２３") == tokenize("abc123") == ["abc123", "abc"]
    assert tokenize("Straße") == tokenize("STRASSE")
    # Half-width katakana fold to the full-width forms.
    assert tokenize("ｶﾀｶﾅ") == tokenize("カタカナ")


def test_kana_and_hangul_are_kept() -> None:
    assert "ひら" in tokenize("ひらがな")
    assert "カタ" in tokenize("カタカナ")
    toks = tokenize("한국어 테스트")
    assert "한국" in toks and "테스" in toks
    assert tokenize_query("東京タワー") == ["東京", "京タ", "タワ", "ワー"]


def test_empty_and_punctuation_only() -> None:
    assert tokenize("") == []
    assert tokenize("  ... --- !!! ") == []
    assert tokenize_query("？！。") == []


@given(st.text(max_size=200))
def test_never_crashes_and_terms_are_normalized(text: str) -> None:
    for toks in (tokenize(text), tokenize_query(text)):
        for t in toks:
            assert t and t == t.casefold()
            assert not any(c.isspace() for c in t)
    # Query terms are a subset of the index terms of the same text (bigrams without unigrams).
    assert set(tokenize_query(text)) <= set(tokenize(text))
    # The same text always gives the same terms.
    assert tokenize(text) == tokenize(text)


@given(st.text(alphabet=st.characters(categories=["Lu", "Ll", "Nd"]), min_size=1, max_size=30))
def test_query_terms_of_a_word_are_indexed_terms(word: str) -> None:
    indexed = set(tokenize(f"before {word} after"))
    assert set(tokenize_query(word)) <= indexed


def test_a_path_gives_its_compound_names_whole() -> None:
    toks = tokenize("fixed daemon/index/exact.py and my-lib/src/lib.rs and/or 1/2")
    assert {"exact.py", "my-lib", "lib.rs"} <= set(toks)
    assert tokenize_query("exact.py")[0] in toks
    # Plain names are parts already; a path of plain words gives nothing more.
    assert toks.count("index") == 1 and "and" not in toks
    # A dotted name's compound keys, whole.
    assert {"max_age", "snake_case"} <= set(tokenize("zenra.cache.max_age in src/snake_case.py"))
    assert tokenize("v2.3.1 and 3.14") == tokenize_query("v2.3.1 and 3.14")


@pytest.mark.parametrize(("text", "words"), [
    # The vowel signs of these scripts are combining marks: words end at a space, not at
    # each vowel ("किम" and "कोम" differ only in theirs).
    ("किम और कोम", ["किम", "और", "कोम"]),
    ("தமிழ் குறிப்பு", ["தமிழ்", "குறிப்பு"]),
    ("తెలుగు భాష", ["తెలుగు", "భాష"]),
    # Arabic harakat and Hebrew points go on the word too, and are folded away (most text
    # is written without them).
    ("مُحَمَّد رسول", ["محمد", "رسول"]),
    ("שָׁלוֹם עולם", ["שלום", "עולם"]),
    ("নমস্কার বন্ধু", ["নমস্কার", "বন্ধু"]),
    # Marks beyond the Basic Multilingual Plane (Brahmi), after marks within it too.
    ("\U00011013\U00011038\U0001102b \U00011013\U0001103a",
     ["\U00011013\U00011038\U0001102b", "\U00011013\U0001103a"]),
    ("q\u0303\U000e0100x y", ["q\U000e0100x", "y"]),
])
def test_words_go_on_through_combining_marks(text: str, words: list[str]) -> None:
    assert tokenize(text) == tokenize_query(text) == words


def test_the_mark_class_holds_every_combining_mark_and_no_separator() -> None:
    marks = re.compile(f"[{MARKS}]")
    found = {unicodedata.category(c)[0] for c in map(chr, range(0x110000))
             if marks.match(c)}
    missed = [c for c in map(chr, range(0x110000))
              if unicodedata.category(c)[0] == "M" and not marks.match(c)]
    # Letters and digits between marks keep the class short; they are word characters.
    assert found <= {"L", "N", "M"} and not missed


def test_scripts_without_spaces_between_words_are_paired_like_chinese() -> None:
    # Thai, Lao, Khmer and Myanmar put no space between words: a word inside a phrase is
    # found by its pairs (vowel signs and tone marks included), as a Chinese one is.
    for phrase, word in (("ผมไปตลาดเมื่อวาน", "ตลาด"), ("ຂ້ອຍໄປຕະຫຼາດ", "ຕະຫຼາດ"),
                         ("ខ្ញុំទៅផ្សារ", "ផ្សារ"), ("ကျွန်တော်ဈေးသွားတယ်", "ဈေး")):
        assert set(tokenize_query(word)) <= set(tokenize(phrase)), (phrase, word)
    assert tokenize_query("ตลาด") == ["ตล", "ลา", "าด"]
    # Their digits (the number as ASCII digits) and punctuation are no part of a run.
    assert sorted(tokenize("ราคา ๑๒๓ บาท ฿")) == sorted(
        ["123", "รา", "าค", "คา", "ร", "า", "ค", "า", "บา", "าท", "บ", "า", "ท"])


def test_namespace_paths_and_dunder_file_names_are_whole() -> None:
    assert tokenize("tokio::sync::mpsc") == ["tokio::sync::mpsc", "tokio", "sync", "mpsc"]
    assert tokenize("std::vector<int>")[:1] == ["std::vector"]
    assert tokenize("__init__.py") == ["init__.py", "init", "py"]
    # A Dataview field (`key:: value`) is no compound.
    assert tokenize("related:: [[notes]]") == ["relat", "note"]
    assert tokenize_query("tokio::sync::mpsc")[0] in tokenize("in tokio::sync::mpsc, a bug")


def test_emoji_are_terms_of_their_own() -> None:
    # Skin tones, variation selectors and joiners are no terms; a flag is one.
    assert tokenize("shipped 🚀 today 👍🏽") == ["ship", "today", "🚀", "👍"]
    assert tokenize_query("👨\u200d👩\u200d👧 ❤️ 🇨🇭🇩🇪") == ["👨", "👩", "👧", "❤", "🇨🇭", "🇩🇪"]
    assert tokenize_query("上线了🚀成功") == ["🚀", "上线", "线了", "成功"]
    assert tokenize_query("Größe ✅") == ["gross", "✅"]
    # A region's flag is the black flag and its tag letters: one term, not the black flag.
    scotland = "\U0001f3f4" + "".join(chr(0xE0000 + ord(c)) for c in "gbsct") + "\U000e007f"
    assert tokenize(f"go {scotland}!") == ["go", scotland[:-1]]


@pytest.mark.parametrize(("written", "typed"), [
    ("Café Müller", "cafe muller"),
    ("İSTANBUL İzmir", "istanbul izmir"),
    ("Ελληνικά άνθρωπος", "ελληνικα ανθρωπος"),
    ("Ёлка", "елка"),
    # Bulgarian and Macedonian accented е and и, composed or typed with the mark.
    ("Ѐ ѝ Ѝ свѐт", "е и и свет"),
    ("е\u0300 и\u0300", "е и"),
    ("naïve résumé, São Paulo, Łódź", "naive resume sao paulo lodz"),
    # Strokes and bars, which Unicode does not decompose, and Turkish's dotless i.
    ("København, Đakovo, Ħamrun", "kobenhavn dakovo hamrun"),
    ("DIYARBAKIR ISPARTA", "diyarbakır ısparta"),
    # The ligature letters are their two letters, accented or not.
    ("Œuvre, encyclopædia, Cæsar, Ǽsc", "oeuvre encyclopaedia caesar aesc"),
    ("Tiếng Việt", "tieng viet"),
    # Devanagari's nukta, precomposed or not, and its candrabindu as anusvara.
    ("ज़रूर क़िला फ़ोन ऩ हँसना", "जरूर किला फोन न हंसना"),
    ("שָׁלוֹם", "שלום"),
    ("crème-brûlée.md", "creme-brulee.md"),
    # A soft hyphen, a zero-width joiner or a word joiner inside a word leaves it whole.
    ("hyphen\u00adation pro\u200dcessing in\u2060dex\ufeff", "hyphenation processing index"),
    ("中文\u00ad测试 Ca\u00adfé", "中文测试 cafe"),
    # Arabic's tatweel only stretches a word to justify its line.
    ("مرحـــبا بالعـالم", "مرحبا بالعالم"),
    # Arabic-script letters typed one for another: Persian's yeh and keheh, the dotless
    # final yeh, alef with a hamza, madda or wasla, teh marbuta; decomposed hamza too.
    ("کتاب ایرانی، على", "كتاب ايراني، علي"),
    ("أحمد إسلام آمن ٱلله ا\u0654مل", "احمد اسلام امن الله امل"),
    ("مدرسة الجامعة", "مدرسه الجامعه"),
    ("ﻛﺘﺎﺏ", "کتاب"),
])
def test_words_are_found_without_their_accents_and_joiners(written: str, typed: str) -> None:
    assert tokenize(written) == tokenize(typed)
    assert tokenize_query(written) == tokenize_query(typed)


def test_urdu_yeh_barree_is_a_letter_of_its_own() -> None:
    # کی and کے are two words of Urdu (the genitive's forms), unlike ي and ی.
    assert tokenize("کی") != tokenize("کے")


def test_folding_keeps_the_letters_of_scripts_whose_marks_are_vowels() -> None:
    # Indic vowel signs and Thai tone marks tell words apart: not folded.
    assert tokenize("किम कोम") == ["किम", "कोम"]
    assert tokenize_query("ไม้ ไม") == ["ไม", "ม้", "ไม"]
    # Cyrillic й is a letter of its own; ё is е.
    assert tokenize("йод иод ёж") == ["йод", "иод", "еж"]
    assert fold("ї ў ѓ ќ й") == "ї ў ѓ ќ й"
    assert tokenize("ї ў ѓ ќ") == ["ї", "ў", "ѓ", "ќ"]
    # The zero-width space still breaks words; a non-joiner inside one (Persian's
    # می‌خواهم) gives the word glued and its parts, as a hyphen gives a compound's.
    assert tokenize("foo\u200bbar") == ["foo", "bar"]
    assert tokenize("می\u200cخواهم") == ["ميخواهم", "مي", "خواهم"]
    assert tokenize_query("کتاب\u200cها") == tokenize_query("کتابها کتاب ها")
    assert tokenize("\u200cfoo\u200c bar") == ["foo", "bar"]
    assert fold("ä Ä ÿ ø Ø ı") == "a A y o O i" and fold("plain") == "plain"
    # Hooks and tails make letters of their own (Hausa ƙ, Ewe ƒ).
    assert fold("ƙ ƒ ɓ") == "ƙ ƒ ɓ"


def test_middle_dots_join_the_parts_of_cjk_names_and_are_no_terms() -> None:
    # A loanword or a foreign name is one run whether its parts are joined by a dot or
    # not; a dot before a list item is no term (nor pairs with the item's first letter).
    assert tokenize("コンピュータ・ウイルス") == tokenize("コンピュータウイルス")
    assert tokenize("ｼﾞｮﾝ･ｽﾐｽ") == tokenize("ジョンスミス")
    pairs = ["迈克", "克尔", "尔乔", "乔丹"]
    assert tokenize_query("迈克尔·乔丹") == tokenize_query("迈克尔•乔丹") == pairs
    assert tokenize("・項目\n・設定") == tokenize("項目\n設定")
    # Between other letters a middle dot still ends a word.
    assert tokenize("col·legi ab・cd") == ["col", "legi", "ab", "cd"]


def test_small_ke_and_ka_are_their_full_size_kana() -> None:
    assert tokenize("霞ヶ関 一ヵ月 ゖ") == tokenize("霞ケ関 一カ月 け")
    assert tokenize_query("霞ヶ関") == ["霞ケ", "ケ関"]


def test_digits_of_every_script_are_ascii_digits() -> None:
    # Unicode's decimal digits (Arabic-Indic, Persian, Devanagari, Thai, ...) are the
    # number typed in ASCII digits: every one of Unicode 14, Python 3.11's database (on a
    # later one, those of the scripts the table names).
    digits = [chr(c) for c in range(0x80, 0x110000)
              if unicodedata.decimal(chr(c), None) is not None]
    if unicodedata.unidata_version != "14.0.0":
        digits = [d for d in digits if ord(d) - unicodedata.decimal(d) in DIGIT_ZEROS]
    assert digits and all(fold(d) == str(unicodedata.decimal(d)) for d in digits), [
        d for d in digits if fold(d) != str(unicodedata.decimal(d))]
    assert tokenize("۱۴۰۵/۰۳/۱۲ ٢٠٢٦ २०२६ ๒๐๒๖") == tokenize("1405/03/12 2026 2026 2026")
    assert tokenize_query("v٢.٣") == tokenize_query("v2.3")
