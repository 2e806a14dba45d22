from __future__ import annotations
from pathlib import Path
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, fake, open_ws, run_job, write
__all__ = ["fake"]

def I(**kw):
    base = {"action": "CREATE", "bucket": "wiki", "reason": "r", "content": "- x"}
    base.update(kw)
    return ("integrate", base)

def test_shapes(daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-11-27/n.md"
    write(root, note, "---\ntitle: t\n---\n中文笔记 mixed ✓\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [
        [I(name="a", node="digest/wiki/a\x00b.md")],
        [I(name="long", node="digest/wiki/" + "猫" * 95 + ".md")],
        [I(name="猫" * 119)],
        [I(name="..")],
        [I(name="../../etc/passwd")],
        [I(name="con")],
        [I(name="हिन्दी नोट")],
        [I(name="x", content=["a"])],
        [I(name="y", sources="memory/2026-11-27/n.md", related={"a": 1})],
        [("integrate", {"action": "CREATE"})],
        [("node_read", {"path": "digest/../memory/2026-11-27/n.md"})],
        [("node_read", {"path": "digest/wiki/../../memory/2026-11-27/n.md"})],
        [("node_search", {"query": "x" * 5000})],
        [("note_interests", {"topics": "notalist"})],
    ]
    r = run_job(daemon, "auto_dream")
    print(r)
    for t in model.tool_results:
        print("TOOL:", t[:300])
    for p in sorted((root / "digest").rglob("*")):
        print("FILE:", p.relative_to(root))
    print(daemon.log()[-3000:])
    assert 0
