"""Notes a Chinese or Japanese Windows editor saved in GBK, Big5 or Shift_JIS, through a
real daemon: found by their words and shown as written, told in ``daemon.status`` and in
the import report, after a warm start too; one in an encoding not recognised is told as
indexed with U+FFFD, and none of them is ever written over. Line ranges of notes in
UTF-16 or UTF-32 (Notepad's "Unicode") are their lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli import recalld
from test_warm_start import build_and_stop, ws_status

from recalld.ipc.errors import InvalidParams

DAY = "memory/2026-03-09"
GBK = "digest/wiki/zhouhui.md"  # a digest node: its edits go through topic_edit
NOTES = {  # path: (text, encoding saved in, encoding reported)
    GBK: ("---\nname: 周会\ndescription: 每周例会\ntype: project\n---\n# 周会记录\n\n"
          "- 张伟负责预算，下周三前交给财务部。\n- 茶 tea\n", "gbk", "gb18030"),
    f"{DAY}/gb18030.md": ("# 旅行计划\n\n- 去成都吃火锅，顺便看大熊猫 🐼。\n",
                          "gb18030", "gb18030"),
    f"{DAY}/big5.md": ("# 會議記錄\n\n- 明天下午三點在臺北開會，討論預算。\n", "big5", "big5"),
    f"{DAY}/sjis.md": ("# 議事録\n\n- 来週の火曜日に東京で打ち合わせがあります。\n",
                       "cp932", "shift_jis"),
    # Windows-1251 is not guessed: its words are no text of these encodings' own.
    f"{DAY}/cyrillic.md": ("# Заметка\n\n- купить молоко и хлеб завтра утром\n", "cp1251",
                           "unknown"),
}


def write_notes(root: Path) -> dict[Path, bytes]:
    """The notes written, and their bytes."""
    for rel, (text, encoding, _) in NOTES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode(encoding))
    (root / DAY / "plain.md").write_text("- plain UTF-8 note about 预算\n", encoding="utf-8")
    return {root / rel: (root / rel).read_bytes() for rel in NOTES}


def hits(d: Any, query: str) -> list[tuple[str, str]]:
    answer = d.call("memory.search", {"agent_id": "w", "query": query, "sync": True})
    return [(r["path"], r["text"]) for r in answer["results"]]


def told(health: dict[str, Any]) -> None:
    """What status says of the notes not in UTF-8."""
    summary = health["not_utf8"]
    assert summary["count"] == 5
    assert summary["encodings"] == {"big5": 1, "gb18030": 2, "shift_jis": 1, "unknown": 1}
    assert summary["notes"] == {rel: e for rel, (_, _, e) in sorted(
        NOTES.items(), key=lambda n: (n[1][2] != "unknown", n[0]))}
    # The one read with U+FFFD first: it is the one to save again as UTF-8.
    assert next(iter(summary["notes"])) == f"{DAY}/cyrillic.md"
    reasons = health["reasons"]
    assert any("1 note(s) in an encoding recalld does not recognise" in r
               and f"{DAY}/cyrillic.md" in r for r in reasons), reasons
    assert any("4 note(s) not in UTF-8 are read as big5 (1), gb18030 (2), shift_jis (1)"
               in r for r in reasons), reasons
    assert health["state"] == "degraded"


def test_notes_in_gbk_big5_and_shift_jis_are_found_as_written(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    before = write_notes(root)
    d = daemon_factory()
    opened = d.call("workspace.open", {"agent_id": "w", "path": str(root),
                                       "import_report": True})
    report = opened["import"]["not_utf8"]
    assert report["encodings"] == {"big5": 1, "gb18030": 2, "shift_jis": 1, "unknown": 1}
    assert report["notes"][GBK] == "gb18030"
    printed = recalld("import-qwenpaw", "--agent", "w", str(root), env=d.env).stdout
    assert (f"5 not in UTF-8: big5 1, gb18030 2, shift_jis 1, unknown 1 ({DAY}/cyrillic.md "
            f"(unknown), {GBK} (gb18030)") in printed, printed
    assert '"unknown": searchable only where ASCII, save them as UTF-8' in printed, printed
    for query, rel, line in (("负责预算", GBK, "- 张伟负责预算，下周三前交给财务部。"),
                             ("大熊猫", f"{DAY}/gb18030.md", "- 去成都吃火锅，顺便看大熊猫 🐼。"),
                             ("臺北", f"{DAY}/big5.md", "- 明天下午三點在臺北開會，討論預算。"),
                             ("打ち合わせ", f"{DAY}/sjis.md", "来週の火曜日に東京で打ち合わせ")):
        found = hits(d, query)
        assert found and found[0][0] == rel, (query, found)
        assert line in found[0][1] and "\ufffd" not in found[0][1], found
    # Both the GBK note and the UTF-8 one hold 预算.
    assert {p for p, _ in hits(d, "预算")} >= {GBK, f"{DAY}/plain.md"}
    # A line read alone is read in its note's encoding, though alone it looks Western.
    read = d.call("memory.read", {"agent_id": "w", "path": GBK,
                                  "start_line": 9, "end_line": 9})
    assert read["text"] == "- 茶 tea\n", read
    told(ws_status(d)["health"])
    shown = recalld("status", env=d.env).stdout
    assert "save them as UTF-8" in shown and "reindex" not in shown, shown
    assert "fix: open the note(s) named in an editor that reads their encoding" in shown, shown
    # Windows-1251 is not taken for any of them.
    assert "\ufffd" in d.call("memory.read", {"agent_id": "w", "path": f"{DAY}/cyrillic.md"})[
        "text"]
    # An edit does not go through: written, it would no longer be in its person's
    # encoding (and nothing else wrote any of them).
    with pytest.raises(InvalidParams, match="not UTF-8"):
        d.call("memory.topic_edit", {"agent_id": "w", "path": "wiki/zhouhui.md",
                                     "old": "茶 tea", "new": "绿茶 tea"})
    assert {p: p.read_bytes() for p in before} == before
    assert d.stop() == 0


def test_notes_not_in_utf8_are_still_told_after_a_warm_start(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write_notes(root)
    config, data_dir = build_and_stop(daemon_factory, root)
    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(data_dir))
    d2.call("index.sync", {"agent_id": "w"})
    told(ws_status(d2)["health"])
    # Saved again as UTF-8, a note is no longer told.
    (root / DAY / "cyrillic.md").write_text(NOTES[f"{DAY}/cyrillic.md"][0], encoding="utf-8")
    assert [p for p, _ in hits(d2, "молоко")] == [f"{DAY}/cyrillic.md"]
    health = ws_status(d2)["health"]
    assert health["not_utf8"]["count"] == 4 and health["state"] == "clean", health
    assert d2.stop() == 0


def test_a_line_range_of_a_utf16_or_utf32_note_is_its_lines(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Their line breaks are not the byte \n: a range was cut through characters and came
    # back with NULs and U+FFFD.
    text = "# 周会\n\n- 张伟负责预算\n- Größe\u0a0a ok\n"
    encodings = ("utf-16", "utf-16-be", "utf-32", "utf-32-be")
    root = tmp_path / "ws"
    (root / DAY).mkdir(parents=True)
    for encoding in encodings:
        bom = "\ufeff" if encoding.endswith("-be") else ""  # (the others write their own)
        (root / DAY / f"{encoding}.md").write_bytes((bom + text).encode(encoding))
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for encoding in encodings:
        rel = f"{DAY}/{encoding}.md"
        got = d.call("memory.read", {"agent_id": "w", "path": rel, "start_line": 3,
                                     "end_line": 4})
        assert (got["text"], got["total_lines"]) == ("- 张伟负责预算\n- Größe\u0a0a ok\n", 4), got
        got = d.call("memory.read", {"agent_id": "w", "path": rel, "start_line": 1,
                                     "end_line": 1})
        assert got["text"] == "# 周会\n", got
        # The lines the search gives are those a read gives.
        hit = d.call("memory.search", {"agent_id": "w", "query": "负责预算", "sync": True,
                                       "filters": {"path_prefix": rel}})
        first = hit["results"][0]
        assert (first["start_line"], first["end_line"]) == (1, 4), first
    assert d.stop() == 0


def test_korean_and_euc_jp_notes_are_not_read_as_chinese(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Their bytes decode as GB18030 without a fault: they were read as strings of wrong
    # hanzi, found by no Korean or Japanese word, and told as gb18030.
    notes = {  # path: (text, encoding saved in, encoding reported)
        f"{DAY}/hangul.md": ("# 장보기\n\n- 두부와 김치를 사고 세탁소에 들르기\n", "euc_kr",
                             "euc_kr"),
        f"{DAY}/uhc.md": ("- 똠양꿍 먹으러 가자\n", "cp949", "euc_kr"),
        f"{DAY}/eucjp.md": ("# 買い物\n\n- 豆腐と納豆を買って、クリーニング屋に寄る\n", "euc_jp",
                            "euc_jp"),
        f"{DAY}/cha.md": ("- 茶\n", "gbk", "gb18030"),  # alone, it looks Western
    }
    root = tmp_path / "ws"
    (root / DAY).mkdir(parents=True)
    for rel, (text, encoding, _) in notes.items():
        (root / rel).write_bytes(text.encode(encoding))
    before = {rel: (root / rel).read_bytes() for rel in notes}
    d = daemon_factory()
    opened = d.call("workspace.open", {"agent_id": "w", "path": str(root),
                                       "import_report": True})
    reported = {rel: e for rel, (_, _, e) in notes.items()}
    assert opened["import"]["not_utf8"]["notes"] == reported, opened["import"]
    for query, rel, line in (("김치", f"{DAY}/hangul.md", "- 두부와 김치를 사고 세탁소에 들르기"),
                             ("똠양꿍", f"{DAY}/uhc.md", "- 똠양꿍 먹으러 가자"),
                             ("納豆", f"{DAY}/eucjp.md", "- 豆腐と納豆を買って"),
                             ("茶", f"{DAY}/cha.md", "- 茶")):
        found = hits(d, query)
        assert found and found[0][0] == rel, (query, found)
        assert line in found[0][1], found
    read = d.call("memory.read", {"agent_id": "w", "path": f"{DAY}/hangul.md",
                                  "start_line": 3, "end_line": 3})
    assert read["text"] == "- 두부와 김치를 사고 세탁소에 들르기\n", read
    summary = ws_status(d)["health"]["not_utf8"]
    assert summary["encodings"] == {"euc_jp": 1, "euc_kr": 2, "gb18030": 1}, summary
    assert {rel: (root / rel).read_bytes() for rel in notes} == before
    assert d.stop() == 0
