"""Exact terms across scripts through a real daemon: identifier needles in Chinese notes.

A generated bilingual workspace (tests/bench/bilingual.py, seeded): identifiers of several
shapes, each planted once in a Chinese-heavy note, while short English notes carry
siblings of them that share their parts. A keyword search for a needle, alone, with
Chinese words or in a short English question, must rank its note first.
"""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))

import bilingual


def _opened(daemon: Any, tmp_path: Path, bs: bilingual.BilingualSet) -> Path:
    """``bs`` written to a workspace the daemon opens and has indexed; its root."""
    root = tmp_path / "ws"
    bilingual.write(root, bs)
    (root / "digest").mkdir()
    _open(daemon, root)
    return root


def _day(tmp_path: Path, date: str) -> tuple[Path, Path]:
    """A workspace under ``tmp_path`` with an empty digest folder and the daily notes folder
    of ``date``: (its root, that folder)."""
    root = tmp_path / "ws"
    day = root / "memory" / date
    day.mkdir(parents=True)
    (root / "digest").mkdir()
    return root, day


def _open(daemon: Any, root: Path) -> None:
    """Open ``root`` as agent ``w``'s workspace and wait until it is indexed."""
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})


def _idents(bs: bilingual.BilingualSet) -> list[tuple[str, str]]:
    """(identifier query, its note) of each identifier needle of ``bs``."""
    return [(query, target) for query, target, form
            in zip(bs.queries, bs.targets, bs.forms, strict=True) if form == "ident"]


def _miss(daemon: Any, query: str, target: str, *,
          sync: bool = False) -> tuple[str, str, str | None] | None:
    """None when ``target`` is the exact first hit of ``query``, else what came first."""
    answer = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                           "max_results": 5, "sync": sync})
    top = answer["results"][0] if answer["results"] else None
    if top is None or top["path"] != target or not top.get("exact"):
        return query, target, top and top["path"]
    return None


def test_identifier_needles_in_chinese_notes_rank_first(daemon: Any, tmp_path: Path) -> None:
    bs = bilingual.generate(notes=120, needles=12, seed=7, distractors=20)
    root = tmp_path / "ws"
    bilingual.write(root, bs)
    (root / "digest").mkdir()
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    synced = daemon.call("index.sync", {"agent_id": "w"})
    assert synced["files"] == len(bs.notes)
    assert set(bs.shapes) == set(bilingual.SHAPES)
    misses = []
    for query, target in zip(bs.queries, bs.targets, strict=True):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                               "max_results": 5})
        assert answer["mode"] == "keyword"
        top = answer["results"][0] if answer["results"] else None
        if top is None or top["path"] != target or not top.get("exact"):
            misses.append((query, target, top and top["path"]))
    assert misses == [], f"hit@1 {1 - len(misses) / len(bs.queries):.3f}: {misses[:5]}"




def test_a_needle_glued_to_chinese_words_of_the_query_ranks_first(daemon: Any,
                                                                    tmp_path: Path) -> None:
    # A Chinese question puts no space around the identifier it asks about: the CJK
    # characters end the identifier, as the tokenizer has it.
    bs = bilingual.generate(notes=120, needles=6, seed=5, distractors=20)
    _opened(daemon, tmp_path, bs)
    misses = [miss for query, target in _idents(bs)
              for glued in (f"{query}是什么错误", f"关于{query}的问题")
              if (miss := _miss(daemon, glued, target)) is not None]
    assert misses == []


def test_a_needle_asked_with_a_rare_word_of_its_note_ranks_first(daemon: Any,
                                                                  tmp_path: Path) -> None:
    # A rare query word is held as its stem (strategy -> strategi, copying -> copi), which
    # the notes' text does not spell. The Chinese note that has the needle and the word is
    # the exact hit, ahead of the English note that has the word and the needle's parts.
    bs = bilingual.generate(notes=120, needles=6, seed=13, distractors=20)
    root = _opened(daemon, tmp_path, bs)
    needles = _idents(bs)
    words = ("strategy", "copying", "memory rating")
    for (ident, target), word in zip(needles, words, strict=False):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": ident,
                                               "max_results": 5})
        rival = next(r["path"] for r in answer["results"] if r["path"] != target)
        for path in (target, rival):
            with (root / path).open("a", encoding="utf-8") as f:
                f.write(f"\n{word}\n")
    misses = [miss for (ident, target), word in zip(needles, words, strict=False)
              if (miss := _miss(daemon, f"{ident} {word}", target, sync=True)) is not None]
    assert misses == []


def test_a_needle_asked_with_a_rare_word_of_other_notes_ranks_first(daemon: Any,
                                                                    tmp_path: Path) -> None:
    # The query's rare word is in a note that shares only the needle's parts, not in the
    # needle's own note: no note holds every special term, and the one that holds the
    # identifier must still rank first, exact, ahead of the notes with only its parts.
    bs = bilingual.generate(notes=120, needles=6, seed=17, distractors=20)
    root = _opened(daemon, tmp_path, bs)
    needles = _idents(bs)
    words = ("kelvinator", "蜂鸟引擎", "frobnicated 48213")
    for (ident, target), word in zip(needles, words, strict=False):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": ident,
                                               "max_results": 5})
        rival = next(r["path"] for r in answer["results"] if r["path"] != target)
        with (root / rival).open("a", encoding="utf-8") as f:
            f.write(f"\n{word}\n")
    misses = [miss for (ident, target), word in zip(needles, words, strict=False)
              for query in (f"{ident} {word}", f"{word} {ident}")
              if (miss := _miss(daemon, query, target, sync=True)) is not None]
    assert misses == []


def _full_width(text: str) -> str:
    """ASCII spelled in full-width forms, as a Chinese input method in that mode types it."""
    return "".join(chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch for ch in text)


def test_a_needle_in_full_width_forms_is_the_needle(daemon: Any, tmp_path: Path) -> None:
    # The tokenizer reads ＱＸ＿ＴＯＲＶＥＬ＿５８３１ as QX_TORVEL_5831 (NFKC): a Chinese note
    # that spells its needle so holds it, and must rank first for the needle typed in
    # ASCII or in full-width forms, ahead of the English notes sharing its parts.
    bs = bilingual.generate(notes=120, needles=6, seed=11, distractors=20)
    needles = {target: query for query, target in _idents(bs)}
    notes = dict(bs.notes)
    for target, ident in needles.items():
        assert ident in notes[target]
        notes[target] = notes[target].replace(ident, _full_width(ident))
    _opened(daemon, tmp_path, dataclasses.replace(bs, notes=notes))
    misses = [miss for target, ident in needles.items()
              for query in (ident, f"what went wrong with {ident}?", _full_width(ident))
              if (miss := _miss(daemon, query, target)) is not None]
    assert misses == []


def test_a_file_name_in_a_path_is_found_by_its_name(daemon: Any, tmp_path: Path) -> None:
    # A note that names a file by its path (or a link to its lines) holds the file name:
    # a query for the name alone ranks it first, ahead of notes with only its parts.
    root, day = _day(tmp_path, "2026-03-15")
    (day / "fix.md").write_text(
        "# Fix\n\nThe bug was in daemon/index/exact.py, found after a long hunt through the"
        " scoring and the fusion code; also see https://example.org/docs/setup.cfg today"
        " and https://example.org/r/blob/main/src/fuse.py#L42-L50; zenra.cache.max_age is 60.\n",
        encoding="utf-8")
    (day / "py.md").write_text("# Py\n\nExact match in py: exact py, fuse py.\n",
                               encoding="utf-8")
    (day / "cfg.md").write_text("# Cfg\n\nSetup cfg: the setup of cfg, max age.\n",
                                encoding="utf-8")
    _open(daemon, root)
    # The anchor of a link to lines (#L42) is not part of the file name.
    # A dotted key's compound parts are names of their own too.
    for query in ("exact.py", "setup.cfg", "example.org", "fuse.py", "max_age"):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query})
        top = answer["results"][0]
        assert top["path"] == "memory/2026-03-15/fix.md" and top.get("exact"), (
            query, [(r["path"], r["score"]) for r in answer["results"]])


def test_a_namespace_path_or_dunder_file_name_is_found_whole(daemon: Any,
                                                              tmp_path: Path) -> None:
    # `tokio::sync::mpsc`, `std::vector` and `__init__.py` are identifiers: the long note
    # naming each ranks first, exact, ahead of many short notes full of their parts.
    root, day = _day(tmp_path, "2026-03-16")
    for i in range(40):
        (day / f"parts{i}.md").write_text(
            f"sync the mpsc queue with tokio, std vector init py setup {i}\n",
            encoding="utf-8")
    (day / "bug.md").write_text(
        "# Bug\n\nThe channel closed early in tokio::sync::mpsc when the sender was dropped"
        " before the receiver had drained it; holding the sender in the session struct for"
        " its whole life fixed it, and made the shutdown path cleaner. A std::vector of"
        " handles in the C++ side, and __init__.py exported the wrong names after the move.\n",
        encoding="utf-8")
    _open(daemon, root)
    for query in ("tokio::sync::mpsc", "std::vector", "__init__.py",
                  "why was tokio::sync::mpsc closed?"):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query})
        top = answer["results"][0]
        assert top["path"] == "memory/2026-03-16/bug.md" and top.get("exact"), (
            query, [(r["path"], r["score"]) for r in answer["results"]])


def test_a_chunk_is_exact_only_while_its_index_holds_every_rare_word(daemon: Any,
                                                                    tmp_path: Path) -> None:
    # Two rare words (no identifier): the exact hit holds both where its index has them,
    # in Chinese text (no spaces around them) or in English, also after edits moved the
    # notes into the keyword index's delta.
    root, day = _day(tmp_path, "2026-03-17")
    for i in range(60):
        (day / f"filler{i}.md").write_text(f"# Filler {i}\n\nordinary words about day {i}\n",
                                           encoding="utf-8")
    long_zh = "今天我们讨论了存储的问题和后续的计划。" * 60
    both, first = day / "both.md", day / "first.md"
    both.write_text(f"# 记录\n\n{long_zh}zorbification和quelphast{long_zh}\n", encoding="utf-8")
    first.write_text("# Only one\n\nzorbification without the other word\n", encoding="utf-8")
    _open(daemon, root)

    def exact_paths() -> list[str]:
        answer = daemon.call("memory.search", {"agent_id": "w", "sync": True,
                                               "query": "zorbification quelphast"})
        return [r["path"] for r in answer["results"] if r.get("exact")]

    assert exact_paths() == ["memory/2026-03-17/both.md"]
    both.write_text(f"# 记录\n\n{long_zh}zorbification{long_zh}\n", encoding="utf-8")
    first.write_text("# Only one\n\nzorbification, and now quelphast too\n", encoding="utf-8")
    assert exact_paths() == ["memory/2026-03-17/first.md"]


def test_an_identifier_and_its_value_find_the_note_holding_both(daemon: Any,
                                                                tmp_path: Path) -> None:
    # `user_id=771203`: short English notes hold the identifier with other values, others
    # the value alone (too many for it to be a rare term); the long Chinese note holding
    # both ranks first, exact, however the query joins them.
    root, day = _day(tmp_path, "2026-03-18")
    for i in range(6):
        (day / f"other{i}.md").write_text(f"# Login {i}\n\nuser_id=77130{i} logged in twice, "
                                          f"user_id checked\n", encoding="utf-8")
        (day / f"value{i}.md").write_text(f"# Order {i}\n\norder 771203 shipped, box {i}\n",
                                          encoding="utf-8")
    zh = "今天排查登录失败的问题，发现会话过期以后没有刷新，需要修改配置并观察一天。" * 20
    (day / "both.md").write_text(f"# 登录\n\n{zh}用户 user_id=771203 多次登录失败。{zh}\n",
                                 encoding="utf-8")
    _open(daemon, root)
    for query in ("user_id=771203", "user_id 771203", "771203 user_id",
                  "ｕｓｅｒ＿ｉｄ＝７７１２０３", "用户user_id=771203登录失败"):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                               "max_results": 5})
        top = answer["results"][0]
        assert top["path"] == "memory/2026-03-18/both.md" and top.get("exact"), (
            query, [(r["path"], r.get("exact")) for r in answer["results"]])


def test_a_lookup_ranks_first_the_note_holding_its_names_as_the_query_joins_them(
        daemon: Any, tmp_path: Path) -> None:
    # Short notes hold the query's names apart (`payments.retry` and another setting's
    # `max_ms`, `max-old-space-size` with another value, `users` and `2f42`); the longer
    # note holding them joined (`payments.retry.max_ms`, the flag and its value, the
    # encoded path) ranks first, and alone is exact.
    root, day = _day(tmp_path, "2026-03-19")
    filler = "after the review we kept the change and watched the dashboards for a day. " * 6
    notes = {
        "retry": f"Production settings: payments.retry.max_ms = 5000. {filler}",
        "retry_apart": "payments.retry is on; checkout.timeout max_ms is 300.",
        "retry_glued": "payments.retry_count and http_max_ms were raised.",
        "heap": f"The worker crashed on heap; we run node --max-old-space-size=8192. {filler}",
        "heap_apart": "max-old-space-size is 4096 on api; 8192 ports are open.",
        "path": f"GET /api/users%2F42 gave 404: the path was encoded twice. {filler}",
        "path_apart": "users 2f42: the users table hash 2f42 for users.",
    }
    for name, text in notes.items():
        (day / f"{name}.md").write_text(text + "\n", encoding="utf-8")
    _open(daemon, root)
    for query, target in (("max_ms of payments.retry", "retry"),
                          ("payments.retry.max_ms", "retry"),
                          ("--max-old-space-size=8192", "heap"),
                          ("users%2F42", "path"), ("what broke /api/users%2F42?", "path")):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query})
        exact = [r["path"].rsplit("/", 1)[1] for r in answer["results"] if r.get("exact")]
        assert exact == [f"{target}.md"], (query, [(r["path"], r.get("exact"))
                                                   for r in answer["results"]])
    # A dotted name is held by its members' names; a name glued on by `_` is another.
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "payments.retry"})
    assert {r["path"].rsplit("/", 1)[1] for r in answer["results"] if r.get("exact")} == {
        "retry.md", "retry_apart.md"}, answer["results"]
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "max_ms"})
    assert {r["path"].rsplit("/", 1)[1] for r in answer["results"] if r.get("exact")} == {
        "retry.md", "retry_apart.md"}, answer["results"]


def test_a_name_joined_by_slashes_is_one_word_of_a_longer_question(daemon: Any,
                                                                   tmp_path: Path) -> None:
    # A path, an address or a URL typed in a question: counted as its four or five
    # parts, a Chinese question or a sentence around it made the query no lookup, and the
    # long Chinese note holding it lost to short English notes holding its siblings.
    root, day = _day(tmp_path, "2026-03-20")
    names = {"path": ("/srv/vorpa/data/ledger.db", "/srv/vorpa/data/queue.db",
                      "/srv/quist/data/ledger.db", "/etc/vorpa/ledger.db"),
             "url": ("https://vorpa.example.org/api/v3/ledger", "https://vorpa.example.org/api/v2/ledger",
                     "https://quist.example.org/api/v3/ledger", "https://vorpa.example.org/api/v3/queue"),
             "mail": ("ops.ledger@vorpa.example.org", "ops.queue@vorpa.example.org",
                      "dev.ledger@vorpa.example.org", "ops.ledger@quist.example.org")}
    zh = "今天排查同步失败的问题，发现重启以后任务没有恢复，需要修改配置并观察一天。" * 20
    for kind, (name, *siblings) in names.items():
        (day / f"{kind}.md").write_text(f"# 记录\n\n{zh}问题出在{name}上。{zh}\n",
                                        encoding="utf-8")
        for i in range(8):
            sib = siblings[i % len(siblings)]
            (day / f"{kind}-en{i}.md").write_text(
                f"# Note {i}\n\nWe hit {sib} again last week, see ledger and vorpa data.\n",
                encoding="utf-8")
    _open(daemon, root)
    for kind, (name, *_) in names.items():
        for query in (f"{name} 出了什么问题", f"{name}为什么一直同步失败",
                      f"error with {name} in prod again last week after the restart"):
            answer = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                                   "max_results": 5})
            top = answer["results"][0]
            assert top["path"] == f"memory/2026-03-20/{kind}.md" and top.get("exact"), (
                query, [(r["path"], r.get("exact")) for r in answer["results"]])


def test_a_ticket_key_is_an_identifier_however_many_notes_hold_it(daemon: Any,
                                                                   tmp_path: Path) -> None:
    # `VORP-4471`, `CVE-2026-31337`: letters, a hyphen, a number. Held by a few long
    # Chinese notes (too many for a rare term), the key was no identifier: short English
    # notes holding a sibling key and the number apart ranked first.
    root, day = _day(tmp_path, "2026-03-21")
    zh = "今天排查同步失败的问题，发现重启以后任务没有恢复，需要修改配置并观察一天。" * 20
    keys = {"vorp": ("VORP-4471", "VORP-4472", "4471"),
            "cve": ("CVE-2026-31337", "CVE-2026-31338", "31337")}
    for kind, (key, sibling, number) in keys.items():
        for i in range(4):
            (day / f"{kind}-zh{i}.md").write_text(f"# 记录\n\n{zh}工单{key}还没有关闭。{zh}\n",
                                                 encoding="utf-8")
        for i in range(8):
            (day / f"{kind}-en{i}.md").write_text(
                f"# Note {i}\n\nWe closed {sibling} and build {number} shipped.\n",
                encoding="utf-8")
    _open(daemon, root)
    for kind, (key, *_) in keys.items():
        for query in (key, f"{key} 的进展", f"status of {key.lower()}?"):
            answer = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                                   "max_results": 4})
            assert {r["path"] for r in answer["results"] if r.get("exact")} == {
                f"memory/2026-03-21/{kind}-zh{i}.md" for i in range(4)}, (
                query, [(r["path"], r.get("exact")) for r in answer["results"]])


def test_a_chinese_note_edited_to_name_another_identifier_holds_only_that_one(
        daemon: Any, tmp_path: Path) -> None:
    # A note's text is read (NFKC, case folded) for the names it holds at every search,
    # also after an edit: the name it held before is no longer in it, the new one is.
    root, day = _day(tmp_path, "2026-03-17")
    for i in range(30):
        (day / f"parts{i}.md").write_text(f"kx torvel {7700 + i} drift notes\n",
                                          encoding="utf-8")
    note = day / "zh.md"
    body = ("# 故障\n\n昨天夜里部署以后，服务一直报错{}，重启也没有用，"
            "最后发现是配置文件里的缓存时间写错了，改回去以后就好了。\n")
    note.write_text(body.format(_full_width("KX_TORVEL_7712")), encoding="utf-8")
    _open(daemon, root)
    target = "memory/2026-03-17/zh.md"
    assert _miss(daemon, "KX_TORVEL_7712", target) is None
    assert _miss(daemon, "ＫＸ＿ＴＯＲＶＥＬ＿７７１２ 是什么", target) is None
    note.write_text(body.format(_full_width("KX_TORVEL_9913")), encoding="utf-8")
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "KX_TORVEL_7712",
                                           "max_results": 5, "sync": True})
    assert [r["path"] for r in answer["results"] if r.get("exact")] == []
    assert _miss(daemon, "KX_TORVEL_9913", target, sync=True) is None


def _zh_note_with(day: Path, rng: random.Random, at: int, words: str) -> None:
    """A long Chinese note (eight paragraphs) whose paragraph ``at`` ends in ``words``."""
    chinese = [bilingual.zh_text(rng, 30) for _ in range(8)]
    chinese[at] += f"{words}，{bilingual.zh_text(rng, 6)}"
    (day / "zh.md").write_text("# 记录\n\n" + "\n\n".join(chinese) + "\n", encoding="utf-8")


def test_a_url_in_a_long_note_ranks_first_over_many_notes_sharing_its_host_and_id(
        daemon: Any, tmp_path: Path) -> None:
    # A URL's host is its identifier and its id a number of the lookup: more short notes
    # hold both (another path, another mode) than one keyword pool has room for, and the
    # long Chinese note holding the URL itself must still be found and rank first.
    root, day = _day(tmp_path, "2026-03-17")
    rng = random.Random("url-needle")
    host, url = "quorvane.example.net", "https://quorvane.example.net/api/telmo/drask?id=618&m=full"
    for i in range(40):
        sibling = (f"https://{host}/api/telmo/brisk?id=618&m=full" if i % 2 else
                   f"https://{host}/api/telmo/drask?id=618&m=lite")
        (day / f"en-{i:02d}.md").write_text(
            f"# Note {i}\n\n{bilingual.en_text(rng, 14)} We hit {sibling} again.\n",
            encoding="utf-8")
    _zh_note_with(day, rng, 5, f"问题出在 {url} 上")
    _open(daemon, root)
    misses = [miss for query in (url, f"what went wrong with {url}?", url.upper(),
                                 f"{url} 是什么问题")
              if (miss := _miss(daemon, query, "memory/2026-03-17/zh.md")) is not None]
    assert misses == []


def test_a_url_named_by_its_host_alone_ranks_first_as_typed(daemon: Any,
                                                           tmp_path: Path) -> None:
    # A two-digit id is no name of the lookup: the host is its one identifier, which many
    # more short notes hold than a keyword pool has room for. The long Chinese note
    # holding the URL as typed must still be checked, and rank first.
    root, day = _day(tmp_path, "2026-03-18")
    rng = random.Random("url-host")
    url = "https://selvaro.example.org/api/drask?id=61&mode=full"
    siblings = (url.replace("drask", "brisk"), url.replace("61", "62"), url.replace("ful", "lit"))
    for i in range(160):  # 40 name the host, the others make it a rare term
        sibling = f" We hit {siblings[i % 3]} again." if i < 40 else ""
        (day / f"en-{i:03d}.md").write_text(
            f"# Note {i}\n\n{bilingual.en_text(rng, 14)}{sibling}\n", encoding="utf-8")
    _zh_note_with(day, rng, 4, f"见 `{url}`")
    _open(daemon, root)
    misses = [miss for query in (url, f"what went wrong with {url}?", f"{url}是什么问题")
              if (miss := _miss(daemon, query, "memory/2026-03-18/zh.md")) is not None]
    assert misses == []


def test_a_url_ranks_first_after_many_notes_sharing_its_path_were_deleted(
        daemon: Any, tmp_path: Path) -> None:
    # Deleted notes leave their postings behind until a compaction: of 300 notes holding
    # the URL's host, path and id (another pane), 150 are left, and they must not count as
    # 300 holders, too many to read, hiding the long note holding the URL as typed.
    root, day = _day(tmp_path, "2026-03-19")
    rng = random.Random("url-deletes")
    url = "https://varnholt.example.net/v3/ledge/umber?key=5127&pane=open"
    for i in range(300):
        (day / f"en-{i:03d}.md").write_text(
            f"# Log {i}\n\n{bilingual.en_text(rng, 10)} Saw {url[:-4]}shut fail.\n",
            encoding="utf-8")
    _zh_note_with(day, rng, 3, f"地址是 {url}")
    _open(daemon, root)
    for i in range(0, 300, 2):
        (day / f"en-{i:03d}.md").unlink()
    daemon.call("index.sync", {"agent_id": "w"})
    assert _miss(daemon, url, "memory/2026-03-19/zh.md") is None
