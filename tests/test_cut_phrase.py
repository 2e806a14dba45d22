"""A long hit cut for a model shows where the query matches best: for Chinese, Japanese,
Korean and Thai (searched by pairs of characters) the place of the whole phrase, or of
most of its pairs, not the first common pair of it in a long line about something else;
for words, as ever, the first of them."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from test_index_daemon import open_ws, write

from recalld.ipc.types import SearchResponse, cut_part

# (name, query, filler holding a common pair of the query, the line the query is about)
CASES = (
    ("zh", "数据库迁移的负责人", "今天大家的数据都很好，天气也不错。",
     "数据库迁移的负责人是王芳。"),
    ("th", "ระบบไม่ทำงาน", "ฉันไม่รู้ว่าเขาไม่มา ", "เมื่อวานระบบไม่ทำงานเลย "),
    ("ja", "会議の議事録", "私の友達の家の近くで会議がありました。",
     "会議の議事録は田中さんが書いた。"),
    ("ko", "데이터베이스 이전", "데이터가 많아요 ",
     "데이터베이스 이전 담당자는 김민수입니다 "),
    # Two words of a pair each: where both are, not the first of either.
    ("zh2", "迁移 负责", "他负责的工作都很好，大家都满意。", "数据库迁移由王芳负责。"),
)


def test_a_cut_of_one_long_line_shows_the_whole_phrase(daemon: DaemonHandle,
                                                       tmp_path: Path) -> None:
    # One line without breaks (a pasted paragraph): the query's common pair near its
    # start, the whole phrase far on; the recall block and the AgentScope hit show the
    # phrase, labelled with the line it is on.
    from recalld.ipc.agentscope_messages import MAX_HIT_CHARS, format_hits

    root = tmp_path / "ws"
    for name, _query, filler, line in CASES:
        text = filler * (1200 // len(filler)) + line + filler * 4
        write(root, f"memory/2026-08-07/{name}.md", f"# {name}\n\n{text}\n")
    open_ws(daemon, root)
    for name, query, filler, line in CASES:
        answer = daemon.call("memory.recall", {"agent_id": "w", "query": query,
                                               "budget_chars": 300, "max_results": 1})
        item = answer["items"][0]
        assert answer["truncated"] and item["path"].endswith(f"/{name}.md"), answer
        assert line.strip() in item["text"], (name, item["text"])
        # Around it: the common pairs before it add nothing, what follows it is shown.
        after = item["text"].split(line.strip())[1]
        assert len(after) >= min(40, len(filler * 4) - 1), (name, item["text"])
        assert (item["start_line"], item["end_line"]) == (3, 3), item
        wire = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                             "max_results": 1})
        assert len(wire["results"][0]["text"]) > MAX_HIT_CHARS
        shown = format_hits(SearchResponse.from_wire(wire), query)[0]
        assert line.strip() in shown and shown.split("\n")[0].endswith(":3-3]"), shown


def test_a_cut_of_many_lines_goes_to_the_line_with_the_whole_phrase(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # An early line holds every pair of the query, apart; a later one the phrase whole.
    root = tmp_path / "ws"
    rows = [f"第{i}行：今天天气很好，我们去公园散步。" for i in range(40)]
    rows[2] = "他是负责的，不要责人太多。"
    rows[30] = "负责人是王芳。"
    write(root, "memory/2026-08-08/zh.md", "# 记录\n\n" + "\n".join(rows) + "\n")
    open_ws(daemon, root)
    answer = daemon.call("memory.recall", {"agent_id": "w", "query": "负责人",
                                           "budget_chars": 200, "max_results": 1})
    item = answer["items"][0]
    assert answer["truncated"] and "负责人是王芳" in item["text"], item
    assert item["start_line"] <= 33 <= item["end_line"], item


def test_words_are_cut_around_the_first_of_them_as_before(daemon: DaemonHandle,
                                                           tmp_path: Path) -> None:
    # A query of words only: the part shown starts before the first word of it in the
    # line, even where more of its words come together later.
    root = tmp_path / "ws"
    line = ("plain filler text " * 30 + "the gantry moved " + "plain filler text " * 20
            + "gantry ZX_PLOVER_5512 stalled " + "plain filler text " * 5)
    write(root, "memory/2026-08-09/en.md", f"# En\n\n{line}\n")
    open_ws(daemon, root)
    answer = daemon.call("memory.recall", {"agent_id": "w", "query": "gantry ZX_PLOVER_5512",
                                           "budget_chars": 200, "max_results": 1})
    shown = answer["items"][0]["text"]
    assert "the gantry moved" in shown and "ZX_PLOVER" not in shown, shown


def test_a_cut_of_a_200_kb_line_shows_the_phrase_at_its_end() -> None:
    # A one-line note of 200 KB, a common pair of the query all over it, the phrase at
    # its end (speed is measured outside the tests: one pass over the places matched).
    line = "的人" * 100_000 + "负责的人是王芳"
    part = cut_part([line], 1, 1200, "负责的人是王芳")
    assert part.text.endswith("负责的人是王芳") and part.before and not part.after
