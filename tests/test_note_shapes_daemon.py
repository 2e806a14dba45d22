"""Notes of odd but legal shapes, as a daemon indexes, searches and lists them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run_recalld
from conftest import DaemonHandle

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.ipc.errors import InvalidParams


def test_a_byte_order_mark_is_no_text(daemon: DaemonHandle, tmp_path: Path) -> None:
    # Saved by a Windows editor: the note starts with U+FEFF, then its title.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-01"
    day.mkdir(parents=True)
    (day / "bom.md").write_bytes(
        "\ufeff# Title\r\nbomword\r\n\r\n## Sub\r\nsubword\r\n".encode())
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for word, lines, heading, text in (("bomword", (1, 2), "Title", "# Title\nbomword"),
                                       ("subword", (4, 5), "Title > Sub", "## Sub\nsubword")):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": word, "sync": True})
        (hit,) = answer["results"]
        assert ((hit["start_line"], hit["end_line"]), hit["heading"], hit["text"]) == (
            lines, heading, text)


def test_a_japanese_name_with_an_iteration_mark_is_one_word(daemon: DaemonHandle,
                                                            tmp_path: Path) -> None:
    # 佐々木 (Sasaki) is written with 々, which repeats the character before it: the
    # note about Sasaki ranks first, not one that holds 佐, 木 and some other 々 apart.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-01"
    day.mkdir(parents=True)
    (day / "sasaki.md").write_text(
        "佐々木さんと来週の予算について長い会議をした。資料は事前に共有する予定。\n",
        encoding="utf-8")
    (day / "other.md").write_text("木曜日に補佐と話した。人々。\n", encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for query, path in (("佐々木", "memory/2026-08-01/sasaki.md"),
                        ("人々", "memory/2026-08-01/other.md")):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query, "sync": True})
        assert [r["path"] for r in answer["results"]][:1] == [path], answer["results"]
        assert len(answer["results"]) == 1, answer["results"]


def test_words_whose_vowels_are_marks_find_their_own_note(daemon: DaemonHandle,
                                                          tmp_path: Path) -> None:
    # Hindi किम (Kim) and कोम (Kom) share their consonants; Tamil and Arabic words too
    # are written with vowel signs that are combining marks. Each finds its own note only,
    # not every note holding the same consonants.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-02"
    day.mkdir(parents=True)
    notes = {"kim.md": "किम कल दिल्ली जाएगा\n", "kom.md": "कोम ने मकान बेचा\n",
             "tamil.md": "தமிழ் குறிப்பு\n", "thamizh.md": "தம ழ ம\n",
             "arabic.md": "كِتَاب جديد\n", "arabic2.md": "كتب تاريخ\n"}
    for name, text in notes.items():
        (day / name).write_text(text, encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for query, name in (("किम", "kim.md"), ("कोम", "kom.md"), ("தமிழ்", "tamil.md"),
                        ("كِتَاب", "arabic.md")):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query, "sync": True})
        assert [r["path"] for r in answer["results"]] == [f"memory/2026-08-02/{name}"], (
            query, answer["results"])


def test_a_thai_word_inside_a_phrase_is_found(daemon: DaemonHandle, tmp_path: Path) -> None:
    # Thai writes no space between words: "ตลาด" (market) is inside the phrase "I went
    # to the market yesterday" and finds that note, not the one about the weather.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-03"
    day.mkdir(parents=True)
    (day / "market.md").write_text("ผมไปตลาดเมื่อวาน\n", encoding="utf-8")
    (day / "weather.md").write_text("วันนี้อากาศดีมาก\n", encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for query, name in (("ตลาด", "market.md"), ("อากาศ", "weather.md")):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query, "sync": True})
        assert [r["path"] for r in answer["results"]] == [f"memory/2026-08-03/{name}"], (
            query, answer["results"])


def test_a_quoted_frontmatter_value_with_a_comment_keeps_the_block(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # `name: "Quince"  # ...` is YAML: the node keeps its name, description and author.
    root = tmp_path / "ws"
    wiki = root / "digest" / "wiki"
    wiki.mkdir(parents=True)
    (wiki / "quince.md").write_text(
        "---\nname: \"Quince\"  # as the wiki spells it\ndescription: 'a hard fruit' # short\n"
        "author: \"writer\"  # who wrote it\n---\n# Quince\njelly recipe\n", encoding="utf-8")
    (wiki / "other.md").write_text("---\nauthor: coder\n---\njelly beans\n", encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "jelly", "sync": True,
                                           "filters": {"author": "writer"}})
    assert [r["path"] for r in answer["results"]] == ["digest/wiki/quince.md"], answer
    entries = daemon.call("memory.index", {"agent_id": "w"})["entries"]
    assert {(e["path"], e["name"], e["description"]) for e in entries} >= {
        ("digest/wiki/quince.md", "Quince", "a hard fruit")}, entries


def test_a_list_cut_by_its_limit_holds_the_first_notes_by_path(daemon: DaemonHandle,
                                                               tmp_path: Path) -> None:
    # The digest sorts before memory/, a day's note named by its date before its folder,
    # and a folder's own notes around its subfolder's: a limit keeps the first by path,
    # whatever order the folders are walked in.
    root = tmp_path / "ws"
    names = ["digest/personal/b.md", "digest/wiki/a.md", "memory/2026-07-01.md",
             "memory/2026-07-01/a.md", "memory/2026-07-01/sub/m.md", "memory/2026-07-01/z.md",
             "memory/2026-07-02/a.md"]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("note\n", encoding="utf-8")
    (root / "memory/2026-07-01/.hidden.md").write_text("no\n", encoding="utf-8")
    (root / "memory/2026-07-01/link.md").symlink_to(root / "digest/wiki/a.md")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for limit in range(1, len(names) + 2):
        answer = daemon.call("memory.list", {"agent_id": "w", "limit": limit})
        assert ([f["path"] for f in answer["files"]], answer["truncated"]) == (
            names[:limit], limit < len(names)), limit
    answer = daemon.call("memory.list", {"agent_id": "w", "prefix": "memory/2026-07-01",
                                         "limit": 3})
    assert [f["path"] for f in answer["files"]] == names[2:5] and answer["truncated"]
    # A prefix written as a shell would names the same notes; "." names them all.
    for same in ("./memory/2026-07-01", "memory//2026-07-01", "memory/./2026-07-01"):
        answer = daemon.call("memory.list", {"agent_id": "w", "prefix": same})
        assert [f["path"] for f in answer["files"]] == names[2:6], same
    for whole in (".", "./"):
        answer = daemon.call("memory.list", {"agent_id": "w", "prefix": whole})
        assert [f["path"] for f in answer["files"]] == names, whole


def test_frontmatter_keys_in_any_script_keep_the_block(daemon: DaemonHandle,
                                                       tmp_path: Path) -> None:
    # `标签:` (tags) and `नाम:` (name) are plain YAML keys: the block still gives the
    # node's name, description and author, not nothing.
    root = tmp_path / "ws"
    wiki = root / "digest" / "wiki"
    wiki.mkdir(parents=True)
    (wiki / "trip.md").write_text(
        "---\nname: 京都旅行\n标签: [旅行, 日本]\nनाम: यात्रा\ndescription: 秋天的计划\n"
        "author: writer\n---\n# 京都\n红叶很美\n", encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "红叶", "sync": True,
                                           "filters": {"author": "writer"}})
    assert [r["path"] for r in answer["results"]] == ["digest/wiki/trip.md"], answer
    entries = daemon.call("memory.index", {"agent_id": "w"})["entries"]
    assert [(e["name"], e["description"]) for e in entries] == [("京都旅行", "秋天的计划")]


def test_a_description_wrapped_as_pyyaml_writes_it_keeps_the_block(daemon: DaemonHandle,
                                                                   tmp_path: Path) -> None:
    # Python tools write frontmatter with yaml.safe_dump, which wraps a value past 80
    # columns onto an indented line (a list item's, a nested key's too), and an empty
    # mapping as `{}`: still the node's name, description and author.
    root = tmp_path / "ws"
    wiki = root / "digest" / "wiki"
    wiki.mkdir(parents=True)
    (wiki / "ferry.md").write_text(
        "---\nname: Ferry times\ndescription: The ferry to the island leaves at seven and at"
        " nine on weekdays,\n  and only at noon on Sundays.\nauthor: writer\nfacts:\n- it is"
        " late when the wind comes from the north and the harbour master\n  closes the gate\n"
        "meta:\n  source: a timetable found on the pier, photographed and typed in by hand\n"
        "    later\nextra: {}\n---\n"
        "# Ferry\nbring the pass\n", encoding="utf-8")
    # Its default escapes: \U for a character beyond the BMP, \u, \_ (no-break space).
    (wiki / "launch.md").write_text(
        '---\nname: "\\U0001F680 Launch"\ndescription: "\\u4EAC\\u90FD\\_trip"\n---\nsoon\n',
        encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "pass", "sync": True,
                                           "filters": {"author": "writer"}})
    assert [r["path"] for r in answer["results"]] == ["digest/wiki/ferry.md"], answer
    entries = daemon.call("memory.index", {"agent_id": "w"})["entries"]
    assert sorted((e["name"], e["description"]) for e in entries) == [(
        "Ferry times", "The ferry to the island leaves at seven and at nine on weekdays, and"
        " only at noon on Sundays."), ("\U0001f680 Launch", "京都 trip")]


def test_a_note_saved_in_windows_1252_or_utf_16_is_read_as_written(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Older editors save Windows-1252 (Latin-1), Notepad's "Unicode" is UTF-16 with a
    # byte order mark: their accented words are found, and shown, as written; a UTF-8
    # note with one stray byte stays UTF-8 (its other letters are not misread).
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-01"
    day.mkdir(parents=True)
    (day / "latin.md").write_bytes("# Réunion\r\n\r\nLe café “crème” coûte 3 €\r\n"
                                   .encode("cp1252"))
    (day / "wide.md").write_bytes("# Notiz\n\nDie Größe der Straße\n".encode("utf-16"))
    (day / "mixed.md").write_bytes("Übung für später\n".encode() + b"stray \xe9 byte\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for query, path, text in (
            ("café crème", "latin.md", "Le café “crème” coûte 3 €"),
            ("Réunion", "latin.md", "Le café “crème” coûte 3 €"),
            ("straße größe", "wide.md", "Die Größe der Straße"),
            ("übung später", "mixed.md", "Übung für später\nstray \ufffd byte")):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query, "sync": True})
        hit = answer["results"][0]
        assert hit["path"] == f"memory/2026-08-01/{path}", (query, answer["results"])
        assert hit["text"].endswith(text), hit
    read = daemon.call("memory.read", {"agent_id": "w", "path": "memory/2026-08-01/latin.md",
                                       "start_line": 3, "end_line": 3})
    assert read["text"].rstrip("\r\n") == "Le café “crème” coûte 3 €", read


def test_a_query_of_emoji_finds_the_notes_holding_them(daemon: DaemonHandle,
                                                       tmp_path: Path) -> None:
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-02"
    day.mkdir(parents=True)
    for name, text in (("launch", "Release went out 🚀 after the review\n"),
                       ("thumbs", "Reviewer said 👍 on the plan\n"),
                       ("swiss", "Trip to Bern 🇨🇭 in May\n"),
                       ("german", "Trip to Berlin 🇩🇪 in June\n"),
                       ("zh", "上线了🚀成功\n"),
                       ("plain", "Nothing but words here\n")):
        (day / f"{name}.md").write_text(text, encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})

    def found(query: str) -> set[str]:
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query, "sync": True})
        return {r["path"].rsplit("/", 1)[1][:-3] for r in answer["results"]}

    assert found("🚀") == {"launch", "zh"}
    assert found("👍🏽") == {"thumbs"}  # any skin tone of it
    assert found("🇨🇭") == {"swiss"}
    assert found("🚀 review") == {"launch", "zh"}
    assert found("🎉") == set()


@pytest.mark.parametrize("name", ["", "   ", ".md", ".MD", "!!!", "_", "- -", "\u0301"])
def test_a_note_name_without_a_letter_is_refused_not_called_note(
        daemon: DaemonHandle, name: str) -> None:
    # It was written as note.md (and later calls appended to that file), whatever the
    # caller named; the author filter took "!!!" alike.
    with pytest.raises(InvalidParams, match="param 'name' must contain letters or digits"):
        daemon.call("memory.add_note", {"agent_id": "default", "content": "kestrel",
                                        "name": name})
    with pytest.raises(InvalidParams, match="param 'author' must contain letters or digits"):
        daemon.call("memory.add_note", {"agent_id": "default", "content": "kestrel",
                                        "author": name or "?"})
    assert daemon.call("memory.list", {"agent_id": "default"})["files"] == []
    added = daemon.call("memory.add_note", {"agent_id": "default", "content": "kestrel",
                                            "name": f"日記{name}", "author": f"Zoë{name}"})
    assert added["path"].endswith("/日記.md"), added


# Text that shows nothing: a zero-width space, a byte order mark, bidi marks, a word
# joiner, a combining mark with no letter to sit on, the braille blank.
SHOWS_NOTHING = ("\u200b", "\ufeff", "\u200e\u200f", " \u2060\n\u200b ", "\u0301",
                 "\u2800", "\u0640", "\u0640\u0640 \u0640\u064e\n")


@pytest.mark.parametrize("content", SHOWS_NOTHING)
def test_a_note_that_shows_nothing_is_refused_as_an_empty_one(daemon: DaemonHandle,
                                                               content: str) -> None:
    # "   " was refused as empty, a zero-width space alone was written as a note.
    with pytest.raises(InvalidParams, match="param 'content' must not be empty"):
        daemon.call("memory.add_note", {"agent_id": "default", "content": content})
    assert daemon.call("memory.list", {"agent_id": "default"})["files"] == []
    added = daemon.call("memory.add_note", {"agent_id": "default",
                                            "content": f"a{content}b", "name": "kept"})
    assert added["path"].endswith("/kept.md"), added


def test_what_a_person_added_to_a_notes_frontmatter_stays_on_append(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Tags and a rating added by hand to an agent's note of the day were dropped by
    # its next add_note, which wrote the daemon's fields alone.
    root = tmp_path / "ws"
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    first = daemon.call("memory.add_note", {"agent_id": "w", "content": "The grebe nests.",
                                            "session_id": "birds", "name": "birds"})
    note = root / first["path"]
    note.write_text(note.read_text().replace(
        "session_id: birds", "session_id: birds\ntags: [lake, grebe]\nrating: 5"))
    daemon.call("index.sync", {"agent_id": "w"})
    daemon.call("memory.add_note", {"agent_id": "w", "content": "The grebe dives.",
                                    "session_id": "birds", "name": "birds"})
    text = note.read_text()
    assert "tags: [lake, grebe]" in text, text
    assert "rating: 5" in text, text
    assert "The grebe nests." in text and "The grebe dives." in text
    assert text.count("session_id:") == 1, text


def test_a_note_whose_secret_was_masked_is_added_though_it_reads_as_an_earlier_one(
        daemon: DaemonHandle) -> None:
    # Two notes told apart only by their secrets are alike once masked: the second was
    # answered changed: false and not added, as if the caller had sent it twice.
    first, second = ("ghp_" + "A1b2C3d4" * 4 + "Zz9y", "ghp_" + "Q7w8E9r0" * 4 + "Kk3j")
    said = []
    for content in (first, f"the deploy token: {first}", second,
                    f"the deploy token: {second}"):
        added = daemon.call("memory.add_note", {"agent_id": "default", "content": content,
                                                "session_id": "ops", "name": "keys"})
        said.append(added["changed"])
    assert said == [True, True, True, True]
    body = daemon.call("memory.read", {"agent_id": "default", "path": added["path"]})["text"]
    assert "ghp_" not in body
    assert body.count("the deploy token: [REDACTED]") == 2, body
    # Plain text sent again (its answer lost) is still not added twice.
    again = [daemon.call("memory.add_note", {"agent_id": "default", "content": "Rotate monthly.",
                                             "session_id": "ops", "name": "keys"})["changed"]
             for _ in range(2)]
    assert again == [True, False]


def test_a_frontmatter_word_finds_body_text_before_a_long_paragraph(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A session note whose first section is one long line (Chinese prose has no line
    # breaks), saved on Windows: a word of its frontmatter or heading finds a hit that
    # holds the block, the heading and body text, never the block and a heading alone;
    # a word of the section's end finds the rest of the line.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-02"
    day.mkdir(parents=True)
    prose = "今天把存储迁移推迟到下周，先做一次回滚演练，再确认监控的告警阈值。" * 70
    (day / "s.md").write_bytes(
        ("\ufeff---\r\nname: 迁移会议\r\ndescription: quillworth review\r\n---\r\n"
         f"# Zephyrine\r\n\r\n{prose}尾声记号\r\n").encode())
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for word in ("quillworth", "zephyrine"):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": word, "sync": True})
        # (The heading's word is in every chunk of its section; the block only in one.)
        results = answer["results"]
        assert results and all("回滚演练" in r["text"] for r in results), answer
        (hit,) = [r for r in results if r["start_line"] == 1]
        assert hit["end_line"] == 7 and hit["text"].startswith("---\nname: 迁移会议\n"), hit
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "尾声记号"})
    assert answer["results"][0]["text"].endswith("尾声记号")


def test_a_note_of_no_named_session_links_no_dialog_log(daemon: DaemonHandle,
                                                        tmp_path: Path) -> None:
    # `recalld note` and the MCP bridge's memory_add_note without a session write to the
    # daemon's own note session, whose dialog log nobody writes: its notes linked one.
    root = tmp_path / "ws"
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    proc = run_recalld(["note", "--agent", "w", "--json", "The kiln fires at 1240 C."],
                       env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    plain = root / json.loads(proc.stdout)["path"]
    assert "source_conversation" not in plain.read_text(), plain.read_text()
    # The same note written before with the link has it taken out on the next write.
    plain.write_text(plain.read_text().replace(
        "session_id: agent-notes",
        'session_id: agent-notes\nsource_conversation: "[[mem_session/dialog/'
        'agent-notes.jsonl]]"'))
    daemon.call("index.sync", {"agent_id": "w"})
    daemon.call("memory.add_note", {"agent_id": "w", "content": "The glaze is cobalt."})
    named = daemon.call("memory.add_note", {"agent_id": "w", "content": "Kiln two is cold.",
                                            "session_id": "chat-7"})
    fields = parse_frontmatter(plain.read_text())[0]
    assert fields["session_id"] == "agent-notes", fields
    assert "source_conversation" not in fields, fields
    assert "The glaze is cobalt." in plain.read_text()
    # A session named by its caller is a conversation its turns may be given in.
    assert parse_frontmatter((root / named["path"]).read_text())[0][
        "source_conversation"] == "[[mem_session/dialog/chat-7.jsonl]]"
