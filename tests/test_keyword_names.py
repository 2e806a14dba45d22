"""A name with a number glued on (``python3``, ``node18``) in a keyword search: the name
finds it, and the whole word ranks the notes that hold it first."""

from __future__ import annotations

from pathlib import Path

from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.state import IndexState

NOTES = {
    "a.md": "we moved the billing service to python3 last week\n",
    "b.md": "the old python2 scripts still run on the batch host\n",
    "c.md": "a python tutorial for the new hires\n",
    "d.md": "Python3 is pinned in the lockfile of the api\n",
    "e.md": "the frontend builds with node18 and Vite\n",
    "f.md": "node is the runtime of the frontend\n",
    "g.md": "the BRCA1 and BRCA2 variants of the cohort\n",
}


def _searched(tmp_path: Path) -> IndexState:
    for name, text in NOTES.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(tmp_path, sorted(NOTES), max_chars=2000, digests={})])
    return state


def _paths(state: IndexState, query: str) -> list[str]:
    return [state.chunks[k].path for k, _ in state.keyword_search(query, 20)]


def test_the_name_finds_its_numbered_forms(tmp_path: Path) -> None:
    state = _searched(tmp_path)
    assert sorted(_paths(state, "python")) == ["a.md", "b.md", "c.md", "d.md"]
    assert sorted(_paths(state, "node")) == ["e.md", "f.md"]
    assert _paths(state, "brca") == ["g.md"]


def test_the_numbered_word_ranks_its_own_notes_first(tmp_path: Path) -> None:
    state = _searched(tmp_path)
    hits = _paths(state, "python3")
    assert sorted(hits[:2]) == ["a.md", "d.md"] and "b.md" in hits
    assert _paths(state, "python2")[0] == "b.md"
    assert _paths(state, "node18")[0] == "e.md"
    assert _paths(state, "BRCA2") == ["g.md"]
