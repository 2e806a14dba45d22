"""Text the daemon cuts short (echoed ids, media names, summaries, topics, refusals) is cut
between whole characters: never an accent without its letter, an emoji without its skin
tone, half a flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DaemonHandle
from test_index_daemon import open_ws, write

from recalld.daemon.memory.interests import refresh
from recalld.daemon.memory.resource_prompt import cut_summary, refused
from recalld.daemon.memory.turns import last_text
from recalld.ipc.errors import NotFound
from recalld.ipc.media import MAX_MEDIA_NAME

THUMB = "\U0001f44d\U0001f3fd"  # a thumbs-up and its skin tone: one character to a reader


def test_an_unknown_job_id_is_echoed_in_whole_characters(daemon: DaemonHandle) -> None:
    with pytest.raises(NotFound) as caught:
        daemon.call("jobs.get", {"agent_id": "default", "job_id": "a" + THUMB * 40})
    assert f"'a{THUMB * 31}…'" in str(caught.value)


def test_pure_cuts_keep_whole_characters() -> None:
    name = "x" * (MAX_MEDIA_NAME - 1) + "e\u0301tude"  # é as e and its accent
    said = last_text([{"role": "user", "content": [{"type": "image", "name": name}]}])
    assert f"[image omitted: {'x' * (MAX_MEDIA_NAME - 1)}…]" in said
    summary = cut_summary("flag " + "\U0001f1e9\U0001f1ea" * 10, None, 10)
    assert summary.startswith("flag \U0001f1e9\U0001f1ea\U0001f1e9\U0001f1ea\n\n[summary cut")
    assert list(refresh({}, {"y" * 79 + THUMB: 1.0})) == ["y" * 79]
    assert refused("z" * 299 + THUMB) == f"the chat model refused to summarize it: {'z' * 299}"


def test_a_recall_block_cuts_thai_and_hindi_between_whole_characters(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A Thai vowel written after its consonant (sara am) and a Hindi conjunct joined at
    # its virama are one character to a reader: a cut item never ends inside either.
    root = tmp_path / "ws"
    write(root, "memory/2026-08-01/th.md", "# ไทย\n\n" + "กำลังทำ " * 120 + "\n")
    write(root, "memory/2026-08-02/hi.md", "# हिन्दी\n\n" + "क्षत्रिय विद्या " * 120 + "\n")
    open_ws(daemon, root)
    for query, word in (("กำลังทำ", "กำลังทำ "), ("क्षत्रिय", "क्षत्रिय विद्या ")):
        for budget in range(160, 260):
            answer = daemon.call("memory.recall", {"agent_id": "w", "query": query,
                                                   "budget_chars": budget, "max_results": 1})
            assert answer["truncated"] and len(answer["rendered"]) <= budget
            shown = answer["items"][0]["text"].removesuffix("…").split("\n")[-1]
            assert shown and (word * 120).startswith(shown), (budget, shown)
            assert not shown.endswith(("\u094d", "ก", "ท")), (budget, shown)


def test_hits_cut_for_a_model_are_labelled_with_the_lines_shown(daemon: DaemonHandle,
                                                                tmp_path: Path) -> None:
    # The AgentScope middleware and the MCP tool cut a long hit or linked note: the label
    # names the lines of the part shown, not those of the whole chunk.
    from recalld.ipc.agentscope_messages import MAX_HIT_CHARS, format_hits
    from recalld.ipc.types import SearchResponse, render_linked

    root = tmp_path / "ws"
    lines = [f"line {i}: the grebe survey counted {i} birds on the pond" for i in range(60)]
    write(root, "digest/wiki/grebe.md", "# Grebe\n\n" + "\n".join(lines) + "\n")
    write(root, "memory/2026-08-03/walk.md", "# Walk\n\nA heron walk, see [[grebe]].\n")
    open_ws(daemon, root)
    for query, part in (("grebe survey", 0), ("heron walk", 1)):
        wire = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                             "max_results": 1})
        response = SearchResponse.from_wire(wire)
        hit = (wire["results"] if part == 0 else wire["expanded"])[0]
        assert hit["path"] == "digest/wiki/grebe.md" and len(hit["text"]) > MAX_HIT_CHARS
        shown = (format_hits(response)[0] if part == 0
                 else render_linked(response, MAX_HIT_CHARS).split("\n\n", 1)[1])
        label, text = shown.split("\n", 1)
        first, last = map(int, label.split(":")[-1].split("]")[0].split("-"))
        note = (root / "digest/wiki/grebe.md").read_text().split("\n")
        assert text.endswith("…")
        # Lines first to last: whole but for the last, which may be cut.
        got = text.removesuffix("…").split("\n")
        assert len(got) == last - first + 1 and got[:-1] == note[first - 1:last - 1]
        assert got[-1] and note[last - 1].startswith(got[-1])


def _label(shown: str) -> tuple[int, int, str]:
    label, text = shown.split("\n", 1)
    first, last = map(int, label.split(":")[-1].split("]")[0].split("-"))
    return first, last, text


def test_a_long_hit_is_cut_around_what_matched(daemon: DaemonHandle, tmp_path: Path) -> None:
    # A hit or linked note longer than a model is shown, its match far past the start:
    # the part shown holds the match, labelled with its lines, for an identifier, a
    # Chinese word (no spaces) and a word typed in other case; one line long alone is cut
    # around the match within it.
    from recalld.ipc.agentscope_messages import MAX_HIT_CHARS, format_hits
    from recalld.ipc.types import SearchResponse, render_linked

    def section(title: str, last: str) -> str:
        rows = [f"{title} {i}: heron count steady along the reed bank, section {i} of the "
                "northern marsh survey" for i in range(17)]
        return f"# {title}\n\n" + "\n".join([*rows, last]) + "\n"

    root = tmp_path / "ws"
    text = (section("Reeds", "the gauge read KESTREL_QUOTA_4417 at dusk") + "\n"
            + section("Marsh", "观鸟记录在会议纪要里 for the warden") + "\n"
            + "# Tally\n\n" + "filler " * 200 + "the Ptarmigan tally closed " + "filler " * 30
            + "\n")
    write(root, "digest/wiki/reeds.md", text)
    write(root, "memory/2026-08-03/walk.md", "# Walk\n\nA plover walk, see [[reeds#Tally]].\n")
    note = text.split("\n")
    open_ws(daemon, root)
    for query, word in (("KESTREL_QUOTA_4417", "KESTREL_QUOTA_4417"),
                        ("会议纪要", "会议纪要"), ("ptarmigan TALLY", "Ptarmigan tally"),
                        ("plover walk ptarmigan", "Ptarmigan tally")):
        wire = daemon.call("memory.search", {"agent_id": "w", "query": query,
                                             "max_results": 1})
        response = SearchResponse.from_wire(wire)
        linked = query.startswith("plover")
        hit = (wire["expanded"] if linked else wire["results"])[0]
        assert hit["path"] == "digest/wiki/reeds.md", (query, wire)
        # The match lies past what a cut from the start shows.
        assert len(hit["text"]) > MAX_HIT_CHARS and word not in hit["text"][:MAX_HIT_CHARS]
        shown = (render_linked(response, MAX_HIT_CHARS, query).split("\n\n", 1)[1]
                 if linked else format_hits(response, query)[0])
        first, last, shown_text = _label(shown)
        assert word in shown_text and len(shown_text) <= MAX_HIT_CHARS + 1, (query, shown)
        assert shown_text.startswith("…")
        got = shown_text.removeprefix("…").removesuffix("…").split("\n")
        assert len(got) == last - first + 1
        if len(got) > 1:  # whole lines, as labelled
            assert got == note[first - 1:last]
        else:  # a part of the one line labelled
            assert got[0] in note[first - 1]


def test_a_recall_cut_shows_a_word_spelt_otherwise_than_the_query(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The index finds a word whatever form it is spelt in (accents, points, width,
    # composed or decomposed), and words of Thai as of Chinese by their pairs of
    # characters: the part of a cut item shown is the one holding it, as
    # the note spells it, on a line of its own or inside one long line.
    import unicodedata

    root = tmp_path / "ws"
    cases = (
        ("vi", "tuong lua", "Cuối cùng, tường lửa đã được cấu hình lại ở Huế."),
        ("he", "נמצא", "הַסֵּפֶר נִמְצָא עַל הַשֻּׁלְחָן"),
        ("ko", "방화벽", unicodedata.normalize("NFD", "마지막에 방화벽 설정이 바뀌었다")),
        ("ja", "ファイアウォール", "最後にﾌｧｲｱｳｫｰﾙの設定を変えた"),
        ("fw", "ZQ_PLINTH_2207", "型番はＺＱ＿ＰＬＩＮＴＨ＿２２０７です"),
        # Words with no space between them, in the query as in the note.
        ("th", "ไฟร์วอลล์ใหม่", "วันนี้ไฟร์วอลล์ถูกตั้งค่าใหม่"),
    )
    filler = "unrelated filler words about the weather " * 12
    layouts = (  # many lines before it; then all on one long line
        lambda name, line: f"# {name}\n\n" + (filler + "\n\n") * 3 + line + "\n",
        lambda name, line: f"# {name}\n\n{filler * 2}{line} {filler}\n")
    for number, layout in enumerate(layouts):
        for name, _query, line in cases:
            write(root, f"memory/2026-08-04/{name}.md", layout(name, line))
        if number == 0:
            open_ws(daemon, root)
        daemon.call("index.sync", {"agent_id": "w"})
        for name, query, line in cases:
            answer = daemon.call("memory.recall", {"agent_id": "w", "query": query,
                                                   "budget_chars": 300, "max_results": 1})
            assert answer["items"], (number, name, answer)
            item = answer["items"][0]
            assert answer["truncated"] and item["path"].endswith(f"/{name}.md"), answer
            assert line[:8] in item["text"], (number, name, item["text"])


def test_a_cut_around_a_match_ends_without_an_ellipsis_where_its_line_ends(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A long line cut around a match near its end shows up to the line's end: no "…"
    # says text follows, wherever the part shown begins (on a space or a word).
    root = tmp_path / "ws"
    line = "plain filler text " * 40 + "the gantry ZX_PLOVER_5512 stalled"
    write(root, "memory/2026-08-06/long.md", f"# Long\n\n{line}\n")
    open_ws(daemon, root)
    for budget in range(140, 180):
        answer = daemon.call("memory.recall", {"agent_id": "w", "query": "ZX_PLOVER_5512",
                                               "budget_chars": budget, "max_results": 1})
        shown = answer["items"][0]["text"]
        assert answer["truncated"] and "ZX_PLOVER_5512 stalled" in shown, (budget, shown)
        assert answer["rendered"].endswith("stalled"), (budget, answer["rendered"])
