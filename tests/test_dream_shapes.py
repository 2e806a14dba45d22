"""auto_dream on nodes and notes of other shapes than the model or the dream made: a
real daemon, a real socket and a scripted OpenAI-compatible model (see test_dream.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, dream, fake, node, open_ws, write

__all__ = ["fake"]  # the fixture, imported for the tests here


def digest_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "digest").rglob("*.md"))


def test_a_node_renamed_by_hand_is_found_by_its_name(daemon: DaemonHandle,
                                                     fake: FakeProvider,
                                                     tmp_path: Path) -> None:
    """A person renames a node's file (and moves one to another bucket), keeping its
    frontmatter name: the model's CREATE of that name, a link to it by its old file name,
    land on the renamed files; no second node of one name is made."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(root, a, "Green tea in the morning. Deploys on Fridays.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "Morning Tea",
                       "content": "- green tea in the morning", "reason": "habit"}),
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Deploy day",
                       "content": "- deploys on Fridays", "reason": "rule"})]]
    assert dream(daemon)["actions"] == {"CREATE": 2}
    (root / "digest/personal/morning-tea.md").rename(root / "digest/personal/drinks.md")
    (root / "digest/wiki").mkdir(exist_ok=True)
    (root / "digest/procedure/deploy-day.md").rename(root / "digest/wiki/releases.md")
    write(root, b, "Green tea again; deploys stay on Fridays.\n")
    model.plan[b] = [[
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "morning  tea",
                       "content": "- green tea in the morning", "sources": [b],
                       "reason": "seen again", "related": ["digest/procedure/deploy-day.md"]}),
        ("integrate", {"action": "CORROBORATE", "bucket": "procedure",
                       "node": "digest/procedure/deploy-day.md", "sources": [b],
                       "reason": "seen again"})]]
    second = dream(daemon)
    assert second["actions"] == {"CORROBORATE": 2}, (second, model.tool_results)
    assert digest_files(root) == ["digest/personal/drinks.md", "digest/wiki/releases.md"]
    fields, _ = node(root, "digest/personal/drinks.md")
    assert fields["name"] == "Morning Tea" and fields["sources"] == [a, b]
    assert fields["related"] == ["digest/wiki/releases.md"], fields
    assert node(root, "digest/wiki/releases.md")[0]["sources"] == [a, b]
