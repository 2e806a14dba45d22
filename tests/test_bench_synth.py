"""The benchmark workspace generator is deterministic and writes valid workspaces."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "bench"))

import synth

NOTE_RE = re.compile(r"^memory/\d{4}-\d{2}-\d{2}/[a-z]+-[a-z]+-\d{6}\.md$")
DIGEST_RE = re.compile(r"^digest/(personal|procedure|wiki)/[a-z]+-[a-z]+-\d{5}\.md$")


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    a = synth.generate(tmp_path / "a", notes=130, seed=7)
    b = synth.generate(tmp_path / "b", notes=130, seed=7)
    c = synth.generate(tmp_path / "c", notes=130, seed=8)
    ta, tb, tc = _tree(tmp_path / "a"), _tree(tmp_path / "b"), _tree(tmp_path / "c")
    assert ta == tb
    assert a.needles == b.needles
    assert ta != tc
    assert a.needles != c.needles
    assert len(ta) == a.files == 130 + a.digests


def test_larger_workspace_is_a_superset(tmp_path: Path) -> None:
    synth.generate(tmp_path / "s", notes=20, digest_fraction=0.0, seed=3)
    synth.generate(tmp_path / "l", notes=40, digest_fraction=0.0, seed=3)
    small, large = _tree(tmp_path / "s"), _tree(tmp_path / "l")
    # Bodies link to notes by index, so only paths and frontmatter names must match.
    assert set(small) <= set(large)


def test_layout_frontmatter_links_and_languages(tmp_path: Path) -> None:
    st = synth.generate(tmp_path, notes=150, seed=1, zh_fraction=0.3, digest_fraction=0.1)
    tree = _tree(tmp_path)
    notes = [p for p in tree if p.startswith("memory/")]
    digests = [p for p in tree if p.startswith("digest/")]
    assert len(notes) == st.notes == 150
    assert len(digests) == st.digests > 0
    assert all(NOTE_RE.match(p) for p in notes)
    assert all(DIGEST_RE.match(p) for p in digests)
    assert {p.split("/")[1] for p in digests} == {"personal", "procedure", "wiki"}
    zh_notes = 0
    for rel, data in tree.items():
        text = data.decode("utf-8")
        fm = re.match(r"^---\nname: (.+)\ndescription: (.+)\ntags: \[(.*)\]\n", text)
        assert fm, rel
        assert fm.group(1) == rel.rsplit("/", 1)[1][:-3]
        assert "\n# " in text
        if re.search(r"[\u4e00-\u9fff]{20}", text.split("\n---\n", 1)[1]):
            zh_notes += 1
    assert 0.15 * len(tree) < zh_notes < 0.6 * len(tree)
    body = "".join(d.decode() for d in tree.values())
    assert "[[memory/" in body
    assert re.search(r"^(source|related|supports):: \[\[", body, re.M)
    # Link targets name files that exist (path without .md).
    for target in re.findall(r"\[\[([^\]]+)\]\]", body):
        assert f"{target}.md" in tree
    # Roughly 3-8 blocks per file, paragraphs of a few hundred to 1500 chars.
    assert 3 * len(tree) <= st.blocks <= 8 * len(tree)
    assert st.bytes == sum(len(d) for d in tree.values())


def test_needles_are_unique_and_where_promised(tmp_path: Path) -> None:
    st = synth.generate(tmp_path, notes=120, seed=5)
    expected = synth.needles(5, notes=120)
    assert list(st.needles) == expected
    assert len(expected) == synth.NEEDLE_COUNT
    texts = {p.relative_to(tmp_path).as_posix(): p.read_text("utf-8")
             for p in tmp_path.rglob("*.md")}
    for query, path in expected:
        holders = [rel for rel, t in texts.items() if query in t]
        assert holders == [path], (query, holders)
    assert synth.needles(5, notes=30) == expected[:6]  # notes 1, 6, ..., 26


def test_target_chunks_sizes_and_edit_stream(tmp_path: Path) -> None:
    st = synth.generate(tmp_path, target_chunks=1000, seed=2)
    assert 800 <= st.blocks <= 1200
    edits = synth.EditStream(tmp_path, seed=2)
    seen = set()
    for _ in range(30):
        e = edits.next()
        assert e.token not in seen
        seen.add(e.token)
        assert e.path.startswith("memory/")
        assert (tmp_path / e.path).read_text("utf-8").rstrip().endswith(
            f"{e.token} confirmed during the review.")
        assert re.fullmatch(r"[a-z]+", e.token)


# ----------------------------------------------------------- quality scoring and run.py
import quality_lexical as ql  # noqa: E402
import run as bench_run  # noqa: E402


def test_hit_metrics_counts_each_target_once_and_respects_line_ranges() -> None:
    targets: list[ql.Target] = [("memory/a.md", 5), ("memory/b.md", None)]
    hits: list[ql.Hit] = [
        ("memory/c.md", 1, 9, 100),   # nothing
        ("memory/a.md", 1, 4, 50),    # right file, evidence line outside the range
        ("memory/b.md", 1, 3, 20),    # document target: any chunk of b
        ("memory/b.md", 4, 9, 20),    # b again: no new gain
        ("memory/a.md", 5, 8, 10),    # evidence line inside
        ("memory/a.md", 5, 8, 999),   # rank 6: outside @5
    ]
    m = ql.hit_metrics(hits, targets)
    assert m["recall@5"] == m["recall@10"] == 1.0
    assert m["mrr"] == 1 / 3
    ideal = 1 + 1 / math.log2(3)
    assert m["ndcg@10"] == (1 / math.log2(4) + 1 / math.log2(6)) / ideal
    assert m["ctx_chars@5"] == 200
    none = ql.hit_metrics(hits[:2], targets)
    assert none == {"hit@1": 0.0, "recall@5": 0.0, "recall@10": 0.0, "mrr": 0.0,
                    "ndcg@10": 0.0, "ctx_chars@5": 150.0}
    assert m["hit@1"] == 0.0 and ql.hit_metrics(hits[2:], targets)["hit@1"] == 1.0
    late = ql.hit_metrics([hits[0]] * 5 + [hits[2]], targets)
    assert (late["recall@5"], late["recall@10"]) == (0.0, 0.5)


def test_locomo_evidence_quirks_and_category_5() -> None:
    conv = {"session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"},
                          {"speaker": "B", "dia_id": "D1:2", "text": "a\nb"}],
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_2": [{"speaker": "A", "dia_id": "D2:5", "text": "x"}],
            "session_2_date_time": "garbled"}
    notes, where = ql.locomo_notes(conv, "c1")
    assert sorted(notes) == ["memory/1970-01-01/c1-session2.md",
                             "memory/2023-05-08/c1-session1.md"]
    assert notes["memory/2023-05-08/c1-session1.md"].splitlines()[2] == "B: a b"
    assert where["D1:2"] == ("memory/2023-05-08/c1-session1.md", 3)
    qa = [{"question": "q1", "evidence": ["D1:1; D2:05"], "category": 1},
          {"question": "q2", "evidence": ["D:1:2", "D9:9"], "category": 4},
          {"question": "q3", "evidence": ["D1:1"], "category": 5},
          {"question": "q4", "evidence": [], "category": 2},
          {"question": "q5", "category": 3}]
    stats: dict[str, int] = {}
    got = ql.locomo_questions(qa, where, stats)
    assert got == [("q1", [where["D1:1"], where["D2:5"]], 1), ("q2", [where["D1:2"]], 4)]
    assert stats == {"questions": 5, "excluded_category_5": 1, "excluded_no_evidence": 2,
                     "evidence_ids_missing_turn": 1}


def test_run_py_passes_unknown_options_to_the_benchmark() -> None:
    assert bench_run.split_args(["quality", "--quick"]) == (["quality", "--quick"], [])
    assert bench_run.split_args(["quality", "--sets", "locomo", "--out", "x.json"]) == (
        ["quality", "--out", "x.json"], ["--sets", "locomo"])
    assert bench_run.split_args(["index", "quality", "--out-dir=d", "--", "--out", "y"]) == (
        ["index", "quality", "--out-dir=d"], ["--out", "y"])
    assert {"index", "quality", "ping"} <= set(bench_run.discover())
