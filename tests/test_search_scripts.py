"""Keyword search over a real daemon across the ways other scripts write one word: digits
of every script as ASCII ones, letters a keyboard writes with or without a mark; found by
``memory.search`` and shown around the matched line by ``memory.recall``."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from test_index_daemon import open_ws, paths, search, write


def test_digits_of_other_scripts_are_found_as_ascii_digits(daemon: DaemonHandle,
                                                           tmp_path: Path) -> None:
    # A date or a number written in Persian, Arabic-Indic, Devanagari, Bengali or Thai
    # digits is the number a user types in ASCII digits, and the other way round.
    root = tmp_path / "ws"
    notes = {
        "fa": "# جلسه\n\nقرارداد تا ۱۴۰۵/۰۳/۱۲ تمدید شد، شماره ۸۸۳۱۲.\n",
        "ar": "# اجتماع\n\nرقم الفاتورة ٤٧٢٩١ بتاريخ ٢٠٢٦.\n",
        "hi": "# बैठक\n\nअनुबंध संख्या ५५१०७ है।\n",
        "bn": "# সভা\n\nচুক্তি নম্বর ৬৬২০৪।\n",
        "th": "# ประชุม\n\nสัญญาเลขที่ ๙๓๑๕๗ ครับ\n",
        "en": "# Meeting\n\nThe invoice 31337 is paid; the ticket ٥١٩٠٨ too.\n",
    }
    for name, text in notes.items():
        write(root, f"memory/2026-08-01/{name}.md", text)
    open_ws(daemon, root)
    for query, name in (("88312", "fa"), ("1405", "fa"), ("47291", "ar"), ("55107", "hi"),
                        ("66204", "bn"), ("93157", "th"), ("٣١٣٣٧", "en"),
                        ("۳۱۳۳۷", "en"), ("51908", "en"), ("١٤٠٥", "fa")):
        assert paths(search(daemon, query)) == [f"memory/2026-08-01/{name}.md"], query
    # The part shown of a long hit is cut around the line holding the number as typed.
    filler = "یک خط دیگر بدون عدد.\n" * 120
    write(root, "memory/2026-08-02/long.md",
          f"# گزارش\n\n{filler}کد پیگیری ۷۷۴۰۲ ثبت شد.\n{filler}")
    daemon.call("index.sync", {"agent_id": "w"})
    answer = daemon.call("memory.recall", {"agent_id": "w", "query": "77402",
                                           "budget_chars": 300, "max_results": 1})
    item = answer["items"][0]
    assert item["path"] == "memory/2026-08-02/long.md", answer
    assert "۷۷۴۰۲" in item["text"], item["text"]


def test_cyrillic_e_and_i_with_a_grave_accent_are_found_without_it(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Bulgarian and Macedonian mark an е or и with a grave accent (ѐ, ѝ, composed or
    # typed as a letter and a mark) to tell words apart or show the stress; a query typed
    # without it finds the note, and the other way round.
    root = tmp_path / "ws"
    bg, mk = "memory/2026-08-03/bg.md", "memory/2026-08-03/mk.md"
    write(root, bg, "# Среща\n\nСрещата е в Бѝстрица, при Пѐтровия склад.\n")
    write(root, mk, "# Состанок\n\nКлучот е кај Свиленград, каде и\u0300 дадов сè.\n")
    open_ws(daemon, root)
    for query, note in (("бистрица", bg), ("Петровия", bg), ("БЍСТРИЦА", bg),
                        ("Свѝленград", mk), ("свиленград", mk)):
        assert paths(search(daemon, query)) == [note], query


def test_persian_words_are_found_with_or_without_the_non_joiner(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Persian parts a word's pieces with a zero-width non-joiner (کتاب‌فروشی), which
    # writers as often glue (کتابفروشی) or part with a space: each form finds the others.
    root = tmp_path / "ws"
    zwnj, glued = "memory/2026-08-04/zwnj.md", "memory/2026-08-04/glued.md"
    write(root, zwnj, "# سفر\n\nفردا می\u200cخواهم به کتاب\u200cفروشی بروم.\n")
    write(root, glued, "# خرید\n\nدیروز دانشنامهها را خریدم.\n")
    open_ws(daemon, root)
    for query, note in (("کتابفروشی", zwnj), ("کتاب فروشی", zwnj), ("میخواهم", zwnj),
                        ("می\u200cخواهم", zwnj), ("دانشنامه\u200cها", glued)):
        assert paths(search(daemon, query)) == [note], query
    # A long note is shown around the line holding the word, typed in either form.
    filler = "یک خط دیگر بدون آن واژه.\n" * 120
    write(root, "memory/2026-08-05/long.md",
          f"# گزارش\n\n{filler}نامه را به فروشگاه نوشت\u200cافزار دادم.\n{filler}")
    daemon.call("index.sync", {"agent_id": "w"})
    answer = daemon.call("memory.recall", {"agent_id": "w", "query": "نوشتافزار",
                                           "budget_chars": 300, "max_results": 1})
    item = answer["items"][0]
    assert item["path"] == "memory/2026-08-05/long.md", answer
    assert "فروشگاه نوشت\u200cافزار دادم" in item["text"], item["text"]


def test_hindi_words_are_found_with_or_without_nukta_and_candrabindu(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Hindi text writes the nukta of loanwords' sounds (ज़, फ़) and the candrabindu (ँ)
    # as often as it leaves them off or writes an anusvara (ं): each form finds the other.
    root = tmp_path / "ws"
    dot, plain = "memory/2026-08-06/dot.md", "memory/2026-08-06/plain.md"
    write(root, dot, "# बैठक\n\nज़रूरी बैठक कल है, वह हँसते हुए आया।\n")
    write(root, plain, "# सूचना\n\nफोन नंबर बदल गया, किला बंद है।\n")
    open_ws(daemon, root)
    for query, note in (("जरूरी", dot), ("हंसते", dot), ("ज\u093cरूरी", dot),
                        ("फ़ोन", plain), ("क़िला", plain), ("क\u093cिला", plain)):
        assert paths(search(daemon, query)) == [note], query
    filler = "यह एक और पंक्ति है।\n" * 120
    write(root, "memory/2026-08-07/long.md", f"# संगीत\n\n{filler}उसने ग़ज़ल गाई।\n{filler}")
    daemon.call("index.sync", {"agent_id": "w"})
    answer = daemon.call("memory.recall", {"agent_id": "w", "query": "गजल",
                                           "budget_chars": 300, "max_results": 1})
    item = answer["items"][0]
    assert item["path"] == "memory/2026-08-07/long.md", answer
    assert "उसने ग़ज़ल गाई" in item["text"], item["text"]
