"""Chunker line ranges, size cap, frontmatter in the first chunk; frontmatter parse/update."""

from __future__ import annotations

import itertools
import pickle
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.chunker import Chunk, chunk_id, chunk_markdown, split_line
from recalld.daemon.index.frontmatter import parse_frontmatter, recall_block
from recalld.daemon.index.frontmatter_edit import DELETE, render_frontmatter, update_frontmatter
from recalld.daemon.index.tokenizer import tokenize, tokenize_query

NOTE = """---
name: commute notes
description: how I get to the office
tags: [travel, bike]
---
# Commute

I ride the bike to work.
It takes twenty minutes.

When it rains I take the tram.

## Costs

The monthly pass costs 49 euros.
"""


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _heading_lines(lines: list[str], chunk: Chunk) -> int:
    """How many of ``lines`` (a chunk's first) its opening heading takes: an ATX heading
    one, a setext heading its lines of text and its underline; 0 if it opens with none."""
    if not chunk.metadata.get("starts_with_heading"):
        return 0
    if lines[0].lstrip().startswith("#"):
        return 1
    under = (j for j in range(1, len(lines)) if re.fullmatch(r" {0,3}(=+|-+)[ \t]*", lines[j]))
    return next(under, 0) + 1


def _check_invariants(text: str, chunks: list[Chunk], max_chars: int) -> None:
    lines = _lines(text)
    owner: dict[int, int] = {}
    last_end = 0
    _, fm_end = recall_block(text)
    body = [i for i in range(fm_end, len(lines)) if lines[i].strip()]
    for n, c in enumerate(chunks):
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        assert c.start_line >= last_end  # increasing; equal only for pieces of one long line
        if c.start_line == last_end:
            assert c.start_line == c.end_line == chunks[n - 1].end_line
        last_end = c.end_line
        original = "\n".join(lines[c.start_line - 1 : c.end_line])
        assert ("frontmatter" in c.metadata) == (n == 0 and fm_end > 0)
        if n == 0 and fm_end > 0 and body and c.start_line > 1:
            # A block larger than half the cap that would take the first chunk over it
            # is in no chunk's text (a block of megabytes, a hit of megabytes).
            before = "\n".join(lines[: body[0]])
            assert c.start_line == body[0] + 1 and len(before) > max_chars // 2
            assert len(before) + 1 + len(original) > max_chars
            owner.update(dict.fromkeys(range(1, c.start_line), n))
        if n == 0 and fm_end > 0 and body and c.start_line == 1:
            # The block joins the first body chunk: lines from 1, never a chunk of its own.
            block = "\n".join(lines[: body[0]])
            assert c.start_line == 1 and c.end_line >= body[0] + 1
            rest = c.text[len(block) + 1:]
            assert c.text.startswith(block + "\n") and rest in original
            assert len(rest) <= max_chars
            parts = rest.split("\n")
            h = _heading_lines(parts, c)
            if h and not any(p.strip() for p in parts[h:-1]):
                # A heading and its first line (or that line's first piece): over the cap
                # by at most the block, as a first line without a heading.
                assert len(c.text) <= len(block) + 1 + max_chars
            elif "\n" in rest:
                assert len(c.text) <= max(max_chars, len(block) + 1 + max_chars - max_chars // 2)
        elif c.start_line == c.end_line and len(lines[c.start_line - 1]) > max_chars:
            assert c.text in original and len(c.text) <= max_chars
        elif len(lines[c.end_line - 1]) > max_chars:
            # A heading (and blank lines) opening the first piece of an overlong line.
            head = lines[c.start_line - 1 : c.end_line - 1]
            h = _heading_lines(head, c)
            assert h and not any(ln.strip() for ln in head[h:])
            assert c.text.startswith("\n".join(head) + "\n") and c.text in original
            assert len(c.text) <= max_chars
        else:
            assert c.text == original
            assert len(c.text) <= max_chars
        for ln in range(c.start_line, c.end_line + 1):
            owner.setdefault(ln, n)
    for i, line in enumerate(lines, start=1):
        if line.strip():
            assert i in owner, f"line {i} is in no chunk"
    # Pieces of a split line put the line back together exactly, but for those alike to
    # an earlier piece of it (the same chunk again).
    # A piece after a heading is cut shorter and is no piece alike to the later ones.
    by_line: dict[int, str] = {}
    headed: dict[int, str] = {}
    for c in chunks:
        if len(lines[c.end_line - 1]) <= max_chars:
            continue
        before = lines[c.start_line - 1 : c.end_line - 1]  # a frontmatter block, a heading
        piece = c.text[len("\n".join(before)) + 1:] if before else c.text
        if any(ln.strip() for ln in lines[max(c.start_line - 1, fm_end) : c.end_line - 1]):
            headed[c.end_line] = piece
        by_line[c.end_line] = by_line.get(c.end_line, "") + piece
    for ln, joined in by_line.items():
        line, first = lines[ln - 1], headed.get(ln, "")
        assert line.startswith(first)
        assert joined == first + "".join(dict.fromkeys(split_line(line[len(first):],
                                                                  max_chars)))
    assert len({c.id for c in chunks}) == len(chunks)


def test_note_chunks_and_line_ranges() -> None:
    chunks = chunk_markdown("memory/2026-07-23/commute.md", NOTE, max_chars=60)
    fm = [c for c in chunks if "frontmatter" in c.metadata]
    # The frontmatter block is never a chunk of its own, nor is a heading alone: under this
    # small cap the heading takes the first line of its paragraph. The block, larger than
    # the cap, is in no chunk's text (it would take the chunk over the cap): its fields are
    # the first chunk's metadata, and its words that chunk's index text.
    assert len(fm) == 1 and fm[0] is chunks[0]
    assert (fm[0].start_line, fm[0].end_line) == (6, 8)
    assert fm[0].text == "# Commute\n\nI ride the bike to work."
    assert fm[0].metadata["frontmatter"]["name"] == "commute notes"
    assert "how I get to the office" in fm[0].index_text and len(fm[0].text) <= 60
    assert fm[0].heading == "Commute" and chunks[1].start_line == 9
    _check_invariants(NOTE, chunks, 60)
    costs = [c for c in chunks if "49 euros" in c.text]
    assert len(costs) == 1 and costs[0].heading == "Commute > Costs"
    assert costs[0].metadata["headings"] == ["Commute", "Costs"]
    # A heading never shares a chunk with the previous section.
    assert not any("## Costs" in c.text and "tram" in c.text for c in chunks)


def test_small_paragraphs_merge_up_to_the_cap() -> None:
    chunks = chunk_markdown("a.md", NOTE)
    # With the default cap each section is one chunk, blank lines inside it; the first one
    # holds the frontmatter from line 1.
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 11), (13, 15)]
    assert "\n\n" in chunks[0].text and chunks[0].text.startswith("---\n")


def test_frontmatter_is_never_a_chunk_by_itself() -> None:
    session = '---\nname: standup\ndescription: ""\nsession_id: s-42\n---\n\n\nWe shipped.\n'
    chunks = chunk_markdown("memory/2026-07-23/standup.md", session)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 8)]
    assert chunks[0].text == session.rstrip("\n")
    assert chunks[0].metadata["frontmatter"]["session_id"] == "s-42"
    # Within the cap together: the block's size is held back from the first chunk.
    long_body = "---\nname: n\n---\n" + "\n".join(f"line {i} of the body" for i in range(40))
    chunks = chunk_markdown("b.md", long_body, max_chars=200)
    assert chunks[0].start_line == 1 and len(chunks[0].text) <= 200
    assert chunks[1].start_line == chunks[0].end_line + 1
    _check_invariants(long_body, chunks, 200)
    # A first line longer than what the block leaves, but within the cap, is not split.
    wide = "---\nname: n\n---\n" + "w" * 190 + "\nnext line\n"
    chunks = chunk_markdown("w.md", wide, max_chars=200)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 4), (5, 5)]
    _check_invariants(wide, chunks, 200)
    # A note that is only frontmatter still has its one chunk.
    only = chunk_markdown("c.md", "---\nname: lonely\ntags: [a]\n---\n\n")
    assert [(c.start_line, c.end_line, c.text) for c in only] == [
        (1, 4, "---\nname: lonely\ntags: [a]\n---")]
    assert only[0].metadata["frontmatter"] == {"name": "lonely", "tags": ["a"]}


def test_a_heading_is_never_a_chunk_by_itself() -> None:
    # Before a paragraph over the cap (one line of Chinese prose, a long list), a heading
    # opens that paragraph's first chunk: a hit of a heading alone, or of a frontmatter
    # block and a heading, holds nothing to read.
    prose = "会议记录：存储迁移推迟到下周，先完成回滚演练。" * 12
    wrapped = "\n".join(f"- item {i} of the checklist" for i in range(12))
    block = "---\nname: plan\ndescription: 迁移计划\n---\n"
    for text in (f"# 计划\n\n{prose}\n", f"# 计划\n{prose}\n", f"{block}# 计划\n\n{prose}\n",
                 f"# Plan\n\n{wrapped}\n", f"{block}\n# Plan\n\n{wrapped}\n",
                 f"# A\n\nshort\n\n## 计划\n\n{prose}\n"):
        chunks = chunk_markdown("p.md", text, max_chars=120)
        _check_invariants(text, chunks, 120)
        for c in chunks:
            own = c.text.removeprefix(block) if "frontmatter" in c.metadata else c.text
            assert any(ln.strip() and not ln.startswith("#") for ln in own.split("\n")), (
                text[:40], c)


def test_frontmatter_words_are_searchable() -> None:
    notes = {
        "digest/wiki/a.md": "---\nname: zeppelin\ndescription: airships of old\n---\nbody text\n",
        "digest/wiki/b.md": "# other\nnothing about that here\n",
    }
    chunks = [c for p, t in notes.items() for c in chunk_markdown(p, t)]
    index = BM25Index()
    for key, c in enumerate(chunks):
        index.add(key, tokenize(c.index_text))
    for query in ("zeppelin", "airships"):
        hits = index.search(tokenize_query(query), 5)
        assert hits and chunks[hits[0][0]].path == "digest/wiki/a.md"


def test_overlong_paragraph_split_by_lines_and_line_by_chars() -> None:
    long_word = "".join(f"{i:03d}" for i in range(84))[:250]  # no piece alike another
    text = "\n".join(f"line {i} " + "word " * 10 for i in range(10)) + "\n" + long_word + "\n"
    chunks = chunk_markdown("long.md", text, max_chars=100)
    _check_invariants(text, chunks, 100)
    long_line = [c for c in chunks if c.start_line == 11]
    assert len(long_line) == 3 and all(c.end_line == 11 for c in long_line)


def test_continuation_chunk_indexes_its_heading() -> None:
    text = "# Garden\n" + "\n".join("tomatoes and basil grow here" for _ in range(20)) + "\n"
    chunks = chunk_markdown("g.md", text, max_chars=200)
    assert len(chunks) > 1
    assert chunks[0].index_text == chunks[0].text  # it starts with the heading itself
    assert chunks[1].index_text.startswith("Garden\n")


def test_code_fence_hides_headings_and_blank_lines() -> None:
    text = "# Real\n\n```python\n# not a heading\n\nx = 1\n```\n"
    chunks = chunk_markdown("c.md", text)
    assert [c.heading for c in chunks] == ["Real"]
    assert chunks[0].end_line == 7


def test_crlf_and_missing_final_newline() -> None:
    text = "# A\r\nfirst\r\n\r\nsecond"
    chunks = chunk_markdown("w.md", text)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 4)]
    assert "\r" not in chunks[0].text


def test_chunk_ids_are_stable_and_distinct() -> None:
    a = chunk_markdown("a.md", NOTE)
    b = chunk_markdown("a.md", NOTE)
    assert [c.id for c in a] == [c.id for c in b]
    assert len({c.id for c in a}) == len(a)
    assert len(a[0].id) == 16 and int(a[0].id, 16) >= 0
    assert chunk_id("a.md", 1, 2, "x") != chunk_id("b.md", 1, 2, "x")
    # A line repeating one run of text: its pieces alike are one chunk, not several.
    # (The heading opens the line's first piece, cut shorter by the heading's size.)
    text = "# Rule\n" + "-" * 300 + "\n" + "ab " * 90 + "end\n"
    chunks = chunk_markdown("r.md", text, max_chars=100)
    _check_invariants(text, chunks, 100)
    assert [(c.start_line, c.text) for c in chunks] == [
        (1, "# Rule\n" + "-" * 93), (2, "-" * 100), (2, "-" * 7), (3, "ab " * 33),
        (3, "ab " * 24 + "end")]


def test_empty_and_blank_files() -> None:
    assert chunk_markdown("e.md", "") == []
    assert chunk_markdown("e.md", "\n\n  \n") == []


_LINE = st.one_of(
    st.just(""), st.just("   "), st.just("# Head"), st.just("## Sub head"), st.just("```"),
    st.just("---"), st.just("name: x"), st.just("Title"), st.just("===="), st.just("<!--"),
    st.just("-->"),
    st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc", "Zl", "Zp"]), max_size=90),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_LINE, max_size=40), st.integers(min_value=10, max_value=120),
       st.sampled_from(["", "---\nname: x\n---\n", "---\ndescription: a longer one\n---\n\n",
                        "---\nname: x\nname: twice\n---\n", '+++\ntitle = "x"\n+++\n\n']))
def test_chunks_cover_every_line_exactly_once(lines: list[str], max_chars: int,
                                              block: str) -> None:
    text = block + "\n".join(lines) + "\n"
    chunks = chunk_markdown("p.md", text, max_chars=max_chars)
    _check_invariants(text, chunks, max_chars)
    # Chunks never overlap except the pieces of one split line.
    multi = [(c.start_line, c.end_line) for c in chunks if c.start_line != c.end_line]
    for (_, e1), (s2, _) in itertools.pairwise(multi):
        assert e1 < s2


# ---------------------------------------------------------------- frontmatter
def test_parse_frontmatter_forms() -> None:
    text = (
        "---\n"
        "name: \"quoted: yes\"\n"
        "single: 'it''s'\n"
        "count: 3\n"
        "ratio: 0.5\n"
        "flag: true\n"
        "empty:\n"
        "tags: [a, \"b, c\", 'd']\n"
        "items:\n"
        "  - one\n"
        "  - two\n"
        "meta:\n"
        "  owner: me\n"
        "text: plain words # a comment\n"
        "# a comment line\n"
        "date: 2026-07-23\n"
        "---\n"
        "body\n"
    )
    fields, body = parse_frontmatter(text)
    assert body == 17
    assert text.split("\n")[body] == "body"
    assert fields == {
        "name": "quoted: yes", "single": "it's", "count": 3, "ratio": 0.5, "flag": True,
        "empty": None, "tags": ["a", "b, c", "d"], "items": ["one", "two"],
        "meta": {"owner": "me"}, "text": "plain words", "date": "2026-07-23",
    }


def test_malformed_frontmatter_is_ignored() -> None:
    for text in (
        "---\nname: x\n",  # never closed
        "---\n  indented: first\n---\n",
        "---\ntags: [a, b\n---\n",
        "---\nname: \"open\n---\n",
        "---\nthis is not yaml\n---\n",
        "---\nname: x\nname: y\n---\n",
        "no frontmatter\n---\n",
        "",
        "\ufeff",
    ):
        assert parse_frontmatter(text) == ({}, 0), text


@given(st.text(max_size=300))
def test_parse_never_raises(text: str) -> None:
    fields, body = parse_frontmatter("---\n" + text)
    assert isinstance(fields, dict) and body >= 0


_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc", "Zl", "Zp"]), max_size=30),
)


@given(st.dictionaries(
    st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True),
    st.one_of(_SCALAR, st.lists(_SCALAR, max_size=4)),
    max_size=6,
))
def test_render_round_trips(fields: dict[str, Any]) -> None:
    parsed, body = parse_frontmatter(render_frontmatter(fields) + "body\n")
    assert parsed == fields
    assert body == len(render_frontmatter(fields).split("\n")) - 1


def test_update_keeps_unknown_keys_order_and_comments() -> None:
    text = "---\nname: a\n# keep me\ncustom: [x, y]\ndescription: old\n---\n# Body\n"
    out = update_frontmatter(text, {"description": "new words", "status": "done", "name": DELETE})
    assert out == (
        "---\n# keep me\ncustom: [x, y]\ndescription: new words\nstatus: done\n---\n# Body\n"
    )
    assert parse_frontmatter(out)[0] == {
        "custom": ["x", "y"], "description": "new words", "status": "done"
    }


def test_update_adds_a_block_when_missing() -> None:
    out = update_frontmatter("# Title\n", {"name": "n"})
    assert out == "---\nname: n\n---\n# Title\n"
    assert update_frontmatter("# Title\n", {"name": DELETE}) == "# Title\n"


@settings(max_examples=100, deadline=None)
@given(st.lists(_LINE, max_size=30))
def test_chunks_cross_the_process_boundary_whole(lines: list[str]) -> None:
    # Worker processes send chunks pickled (Chunk.__reduce__): every field comes back.
    chunks = chunk_markdown("memory/2026-01-01/a.md", "---\nname: x\n---\n" + "\n".join(lines),
                            max_chars=80)
    back = pickle.loads(pickle.dumps(chunks, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == chunks
    assert [type(c) for c in back] == [Chunk] * len(chunks)


def test_a_quoted_flow_list_item_may_hold_a_comment_sign() -> None:
    # `" #"` inside quotes is text, not a comment: the list (and the block) parse.
    for fields in ({"a": [" #"]}, {"tags": ["x #1", "y"], "b": "c # d"}):
        assert parse_frontmatter(render_frontmatter(fields) + "body\n")[0] == fields
    parsed, _ = parse_frontmatter("---\ntags: ['q # r', s] # a comment\n---\nbody\n")
    assert parsed == {"tags": ["q # r", "s"]}
    # Outside quotes ` #` still starts a comment, which a list cannot hold.
    assert parse_frontmatter("---\ntags: [x, #y]\n---\nbody\n")[0] == {}


def test_a_quoted_scalar_may_be_followed_by_a_comment() -> None:
    # As after a plain scalar or a flow list: the block parses, the quotes' text is kept.
    text = ("---\nname: \"Quince\"  # from the wiki\nauthor: 'it''s me' # who\n"
            "q: \"a \\\" # b\" # c\nitems:\n  - 'one' # first\n---\nbody\n")
    assert parse_frontmatter(text) == (
        {"name": "Quince", "author": "it's me", "q": 'a " # b', "items": ["one"]}, 7)
    # Anything else after the closing quote is still no YAML scalar.
    for bad in ('"x"#y', '"x" y'):
        assert parse_frontmatter(f"---\nname: {bad}\n---\nbody\n") == ({}, 0), bad


def test_keys_in_any_script_are_keys() -> None:
    text = ("---\nname: 旅行\n标签: [旅行, 日本]\nनाम: यात्रा\n2026: year\nmeta:\n  子键: 值\n"
            "---\nbody\n")
    assert parse_frontmatter(text) == ({"name": "旅行", "标签": ["旅行", "日本"], "नाम": "यात्रा",
                                        "2026": "year", "meta": {"子键": "值"}}, 8)
    # Not a key: a line starting with punctuation still voids the block.
    assert parse_frontmatter("---\n:x\n---\nbody\n") == ({}, 0)


def test_a_value_wrapped_over_indented_lines_is_one_value() -> None:
    # As PyYAML's safe_dump writes values longer than 80 columns: plain, single- and
    # double-quoted, an empty line standing for a line break, `\` ending a quoted line.
    text = ("---\nname: Long note\ndescription: This is a fairly long description that an"
            " agent wrote,\n  and it goes on past eighty characters.\n"
            "quoted: 'He said: \"hi\" and it goes on\n  and on'\n"
            "breaks: 'line one\n\n\n  line two'\n"
            "escaped: \"tab\\there and a long\\\n  \\ text\"\ntags:\n- a\n---\nbody\n")
    assert parse_frontmatter(text) == ({
        "name": "Long note",
        "description": "This is a fairly long description that an agent wrote, and it goes"
                       " on past eighty characters.",
        "quoted": 'He said: "hi" and it goes on and on', "breaks": "line one\n\nline two",
        "escaped": "tab\there and a long text", "tags": ["a"]}, 15)
    # A list item at the margin after a value is still no YAML.
    assert parse_frontmatter("---\nname: x\n- y\n---\nbody\n") == ({}, 0)


def test_list_items_and_nested_values_wrapped_over_lines_are_one_value() -> None:
    # PyYAML wraps them too: a list item past 80 columns, a nested key's value.
    text = ("---\nfacts:\n- The user prefers green tea in the morning and black coffee after"
            " lunch\n  on weekdays\n\n- short\nmeta:\n  summary: a long nested summary that"
            " goes on\n    beyond the limit\n  n: 3\n---\nbody\n")
    assert parse_frontmatter(text)[0] == {
        "facts": ["The user prefers green tea in the morning and black coffee after lunch"
                  " on weekdays", "short"],
        "meta": {"summary": "a long nested summary that goes on beyond the limit", "n": 3}}
    # Deeper nesting is still more than this parser reads.
    assert parse_frontmatter("---\nm:\n  k:\n    deeper: 1\n---\nbody\n") == ({}, 0)


def test_double_quoted_values_take_yaml_escapes() -> None:
    # PyYAML's: \U for characters beyond the BMP, \e, \_, \L; JSON's surrogate pairs.
    text = ('---\na: "\\U0001F680 go"\nb: "esc\\e nbsp\\_ ls\\L"\nc: "\\ud83d\\ude80"\n'
            'd: "tab\there \\x41"\n---\nbody\n')
    assert parse_frontmatter(text)[0] == {"a": "\U0001f680 go", "b": "esc\x1b nbsp\xa0 ls\u2028",
                                          "c": "\U0001f680", "d": "tab\there A"}
    for bad in ('"a\\q"', '"\\ud800"', '"a\\"', '"\\U00110000"'):
        assert parse_frontmatter(f"---\nd: {bad}\n---\nbody\n") == ({}, 0), bad


def test_a_flow_mapping_is_a_mapping() -> None:
    # PyYAML writes an empty mapping as `{}` (and, before 5.1, short ones in flow style).
    text = "---\nname: x\nmetadata: {}\nmeta: {a: 1, b: \"x, y\", c: 'q'}  # c\n---\nbody\n"
    assert parse_frontmatter(text) == (
        {"name": "x", "metadata": {}, "meta": {"a": 1, "b": "x, y", "c": "q"}}, 5)
    for bad in ("{a: [1]}", "{a}", "{a: 1"):
        assert parse_frontmatter(f"---\nm: {bad}\n---\nbody\n") == ({}, 0), bad
    # Written back, an empty mapping stays one.
    fields = {"metadata": {}, "meta": {"a": 1}}
    assert parse_frontmatter(render_frontmatter(fields) + "body\n")[0] == fields
