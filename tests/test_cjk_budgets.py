"""The memory jobs' prompts in Chinese, Japanese or Korean stay within the token budget
English ones keep: their bounds count estimated tokens (:mod:`recalld.daemon.textcost`),
not characters, and a CJK character is about a token or more where English takes four
characters to one.

A real daemon, a real socket, and a chat model on 127.0.0.1 that records what each
request would cost; English and Chinese runs side by side under the same bounds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, config, done, turn, write_note
from test_dream import AGENT, ScriptedModel, dream, open_ws, write
from test_resource import open_ws as open_resources
from test_resource import wait_state
from waits import wait_committed, wait_job

from recalld.daemon.memory.capture_parts import MAX_PROMPT_CHARS
from recalld.daemon.memory.dreamnotes import note_parts
from recalld.daemon.memory.filetools import shown_lines
from recalld.daemon.memory.llm import MAX_RESULTS_CHARS, MAX_TOOL_RESULT_CHARS
from recalld.daemon.safepath import LineSlice
from recalld.daemon.textcost import chars_within, pieces_within, tail_within, text_cost

#: Room for what a prompt holds besides its bounded parts (its rules, the tools).
TEMPLATE_COST = 12_000
_HANZI = "今天我们讨论了项目的进度和下一步的计划所有人都同意在周五之前完成测试"


def _chinese(n: int, tag: str) -> str:
    """``n`` Chinese characters, beginning with ``tag``."""
    return tag + (_HANZI * (n // len(_HANZI) + 1))[:n]


def _costs(fake: FakeProvider, marker: str) -> list[int]:
    """The estimated cost of each chat request whose messages hold ``marker``."""
    out = []
    for r in fake.requests:
        if not r.path.endswith("/chat/completions"):
            continue
        texts = [str(m.get("content") or "") for m in r.json["messages"]]
        if any(marker in t for t in texts):
            out.append(sum(map(text_cost, texts)))
    return out


def test_a_day_long_chinese_session_stays_within_the_english_token_budget(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.chat_default = lambda body: done().json
    turns = 14
    for n in range(turns):  # the same cost a turn in each language
        add(d, "en", turn(f"en-turn-{n} " + "the valves in bay four need a check " * 270))
        add(d, "zh", turn(_chinese(1_100, f"第{n}轮 ")))
    for session in ("en", "zh"):
        job = wait_job(d, add(d, session, [], flush=True)["job_id"])
        assert job["state"] == "succeeded", job
        assert add(d, session, [])["pending_turns"] == 0
    english, chinese = _costs(fake, "en-turn-"), _costs(fake, "轮 ")
    assert len(english) >= 2 and max(english) <= MAX_PROMPT_CHARS + TEMPLATE_COST
    assert len(chinese) >= 2 and max(chinese) <= max(english) * 21 // 20
    sent = "".join(str(m.get("content")) for r in fake.requests
                   if r.path.endswith("/chat/completions") for m in r.json["messages"])
    assert all(f"第{n}轮 " in sent and f"en-turn-{n} " in sent for n in range(turns))


def test_a_dream_over_long_chinese_nodes_stays_within_the_english_token_budget(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    notes = {"en": "memory/2026-12-01/farm.md", "zh": "memory/2026-12-01/农场.md"}
    write(root, notes["en"], "The platform team now owns the build farm.\n")
    write(root, notes["zh"], "平台团队现在负责构建农场。\n")
    nodes: dict[str, list[str]] = {"en": [], "zh": []}
    for n in range(6):
        rel = f"digest/wiki/team-{n}.md"
        write(root, rel, f"---\nname: Team {n}\nsources: []\n---\n# Team {n}\n\n"
              + "".join(f"- team {n} fact {k}: the build farm runs nightly\n"
                        for k in range(600)))
        nodes["en"].append(rel)
        rel = f"digest/wiki/团队-{n}.md"
        write(root, rel, f"---\nname: 团队 {n}\nsources: []\n---\n# 团队 {n}\n\n"
              + "".join(f"- {_chinese(40, f'团队{n}事实{k}')}\n" for k in range(600)))
        nodes["zh"].append(rel)
    open_ws(daemon, root, fake)
    for lang, note in notes.items():
        model.plan[note] = [[("node_read", {"path": rel})] for rel in nodes[lang]]
    assert dream(daemon)["notes"] == 2
    english = _costs(fake, f"Daily note {notes['en']}:")
    chinese = _costs(fake, f"Daily note {notes['zh']}:")
    assert len(english) == len(chinese) == len(nodes["en"]) + 1
    bound = MAX_RESULTS_CHARS + MAX_TOOL_RESULT_CHARS + 2 * TEMPLATE_COST
    assert max(english) <= bound and max(chinese) <= max(english) * 21 // 20
    # The model was shown the start of each Chinese node, cut where its budget ends.
    shown = [t for t in model.tool_results if "团队" in t]
    assert len(shown) == len(nodes["zh"])
    assert all("[cut: the node has" in t and text_cost(t) <= MAX_TOOL_RESULT_CHARS + 1_000
               for t in shown)


def test_a_dream_among_nodes_with_long_chinese_names_and_descriptions_lists_them_briefly(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-12-03/花园.md"
    write(root, note, "西红柿需要更多的水。\n")
    for n in range(80):
        write(root, f"digest/wiki/beet-{n}.md", f"---\nname: 第{n}块{_chinese(100, '菜地')}\n"
              f"description: |\n  {_chinese(600, f'菜地{n}')}\n  第二行\n---\n# 菜地 {n}\n")
    open_ws(daemon, root, fake)
    model.plan[note] = []
    assert dream(daemon)["notes"] == 1
    sent = next(r.json for r in fake.requests if r.path.endswith("/chat/completions"))
    listing = sent["messages"][1]["content"].split("Existing nodes (newest first):\n")[1]
    lines = listing.splitlines()
    assert len(lines) == 80 and all(line.startswith("- digest/wiki/beet-") for line in lines)
    # As long in tokens as a line of English at most (test_tool_context: 600 characters).
    assert max(map(text_cost, lines)) < 600


def test_a_long_chinese_note_read_by_the_model_says_which_lines_it_shows(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """A read's answer names the lines it holds: its model reads on from the next one,
    and skips none it was not shown."""
    root = tmp_path / "ws"
    rel = "memory/2026-11-10/trip.md"
    write(root, rel, "---\nname: trip\ndescription: a trip\n---\n"
          + "".join(f"第{k}行 {_chinese(40, '旅行')}\n" for k in range(1, 1201)))
    d = daemon_factory(config(root, fake, interval=0))
    fake.script(Reply(json=chat_answer(None, [tool_call("read", {"path": rel}, "r0")])),
                write_note("trips", "- 计划去京都"), done())
    add(d, "s", turn("我的第九次旅行：京都。"))
    job = wait_job(d, add(d, "s", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    answer = next(m["content"] for r in fake.requests if r.path.endswith("/chat/completions")
                  for m in r.json["messages"] if m["role"] == "tool")
    assert text_cost(answer) <= MAX_TOOL_RESULT_CHARS
    head = answer.split(":", 1)[0]
    assert head.startswith(f"{rel} lines 1-") and head.endswith(" of 1204 (truncated)")
    last = int(head.removeprefix(f"{rel} lines 1-").split(" ")[0]) - 4  # the frontmatter's
    assert f"第{last}行 " in answer and f"第{last + 1}行 " not in answer


def test_a_dream_searching_among_chinese_nodes_is_shown_every_hit(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-12-04/团队.md"
    write(root, note, "平台团队负责构建农场。\n")
    for n in range(8):
        write(root, f"digest/wiki/team-{n}.md", f"---\nname: 团队{n}\nsources: []\n---\n"
              f"# 团队{n}\n\n{_chinese(400, f'平台团队{n}')}\n")
    open_ws(daemon, root, fake)
    wait_committed(daemon, AGENT)  # every node found by the search
    model.plan[note] = [[("node_search", {"query": "平台团队"})]]
    assert dream(daemon)["notes"] == 1
    hits = model.tool_results[0].splitlines()
    assert len(hits) == 8 and all(h.startswith("digest/wiki/team-") for h in hits), hits
    assert max(map(text_cost, hits)) <= 300 + 30


def test_a_chinese_file_is_summarized_from_as_many_tokens_as_an_english_one(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/en.txt", "the deploy runbook says restart the workers\n" * 2_000)
    write(root, "resource/zh.txt", _chinese(40_000, "部署手册") + "\n")
    open_resources(daemon, "res", root, fake)
    for rel in ("resource/en.txt", "resource/zh.txt"):
        wait_state(root, rel, "processed")
    english, chinese = _costs(fake, "resource/en.txt"), _costs(fake, "resource/zh.txt")
    assert len(english) == len(chinese) == 1
    assert chinese[0] <= english[0] * 21 // 20 and english[0] <= 16_000 + TEMPLATE_COST
    zh = next(r for r in fake.requests if b"resource/zh.txt" in r.body).body.decode()
    assert "部署手册今天" in zh


def test_text_budgets_cut_english_where_they_did_and_cjk_at_the_same_cost() -> None:
    english = "the crate in bay four holds spare valves\n" * 3_000
    assert chars_within(english, 60_000) == 60_000 and text_cost(english) == len(english)
    chinese = _chinese(30_000, "")
    n = chars_within(chinese, 60_000)
    assert n == 60_000 // 9 and text_cost(chinese[:n]) <= 60_000 < text_cost(chinese[:n + 1])
    assert text_cost(tail_within("안녕 " * 5_000, 16_000)) <= 16_000
    for text in (english, chinese, "日本語の文 " * 9_000, "x" * 200_000):
        pieces = pieces_within(text, 12_000)
        assert "".join(pieces) == text and max(map(text_cost, pieces)) <= 12_000
        parts = note_parts(text, 12_000)
        assert "".join(parts) == text and max(map(text_cost, parts)) <= 12_000
    assert len(note_parts(english, 12_000)) == len(english) // 12_000 + 1
    lines = LineSlice(3, 9, 9, "ab\n" + "中" * 5_000 + "\ncd\n", truncated=False)
    assert shown_lines(lines, 900) == LineSlice(3, 3, 9, "ab\n", truncated=True)
    head = shown_lines(dataclasses.replace(lines, text=lines.text[3:]), 900)
    assert head == LineSlice(3, 3, 9, "中" * 100, truncated=True)
    assert shown_lines(lines, 100_000) is lines


def test_a_long_chinese_paragraph_goes_to_the_model_in_whole_sentences(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A paragraph longer than a part, with no line break or space, was cut at whatever
    character the budget ended on: "房租涨到九百" in one part, "五十欧元" in the next, each
    read by the model on its own. Parts of it end after a sentence or a clause."""
    root = tmp_path / "ws"
    ScriptedModel(fake)
    note = "memory/2026-11-25/会议.md"
    sentences = [f"第{i}项：房租涨到九百五十欧元，从{i % 12 + 1}月起生效。" for i in range(900)]
    text = "# 会议记录\n" + "".join(sentences) + "\n"
    write(root, note, text)
    open_ws(daemon, root, fake)
    assert dream(daemon)["notes"] == 1
    asked = [r.json["messages"][1]["content"] for r in fake.requests
             if r.path.endswith("/chat/completions") and r.json
             and r.json["messages"][1]["content"].startswith(f"Daily note {note}:")]
    bodies = [a.split(":\n\n", 1)[1].rsplit("\n\nExisting nodes", 1)[0] for a in asked]
    bodies = [b.split("]\n", 1)[1] for b in bodies]  # the "[part i of n ...]" line
    assert len(bodies) >= 3 and "".join(bodies) == text
    assert all(b.endswith(("。", "，", "：", "\n")) for b in bodies), [b[-12:] for b in bodies]
