"""Wikilinks the model writes in a node's content name notes that exist."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, dream, node, open_ws, write


def test_a_link_the_model_writes_to_no_note_is_kept_as_its_text(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Only ``related`` was checked: a link in the content to no note at all (a node never
    made, a daily note of a day that has none) was written as a link to nothing."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-10-01/storm.md", "memory/2026-10-02/pier.md"
    write(root, a, "A storm hit Lisbon. Ana logged it in her storm log.\n")
    write(root, "notes/Storm Log.md", "# Storm log\n")
    # Named in the decomposed form, as macOS names files: a link in NFC names it.
    write(root, unicodedata.normalize("NFD", "notes/Café notes.md"), "# Café\n")
    open_ws(daemon, root, fake)
    harbour = "digest/wiki/harbour.md"
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Harbour",
                       "content": "- the wall held", "reason": "fact"}),
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Storm drill",
                       "content": "- close the gates", "reason": "how-to"}),
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "[[Lisbon]] storm",
                       "description": "a storm, as [[Storm log]] and [[Met office]] say",
                       "reason": "fact", "content": (
                           "- logged in [[storm log]] and [[Café Notes|the café notes]]\n"
                           "- wind from [[digest/wiki/weather]], see [[Nowhere|the old page]]\n"
                           "- like [[memory/2020-01-01/ghost.md]] and ![[Ghost#Top]]\n"
                           "- told in [[memory/2026-10-01/storm]], the [[harbour]] held\n"
                           "- `[[Nowhere]]` is how the wiki writes it\n"
                           "- [[Nowhere]] or ![[Nowhere]]\n"
                           "- drill: [[Storm Drill]], [[storm drill#Gates|gates]]")})]]
    first = dream(daemon)
    assert first["actions"] == {"CREATE": 3}, (first, model.tool_results)
    fields, text = node(root, "digest/wiki/lisbon-storm.md")
    assert fields["name"] == "Lisbon storm" and "\n# Lisbon storm\n" in text, text
    assert fields["description"] == "a storm, as [[Storm log]] and Met office say", fields
    assert "- logged in [[storm log]] and [[Café Notes|the café notes]]\n" in text, text
    assert "- wind from digest/wiki/weather, see the old page\n" in text, text
    assert "- like memory/2020-01-01/ghost.md and Ghost > Top\n" in text, text
    # The daily note read and a node made earlier in the run are linked.
    assert "- told in [[memory/2026-10-01/storm]], the [[harbour]] held\n" in text, text
    assert "- `[[Nowhere]]` is how the wiki writes it\n- Nowhere or Nowhere\n" in text, text
    # A node named by its name, not its file's: linked by its path, as Related links it.
    drill = "digest/procedure/storm-drill"
    assert f"- drill: [[{drill}|Storm Drill]], [[{drill}#Gates|gates]]\n" in text, text
    told = model.tool_results[2]
    assert "kept as text, no such note:" in told, told
    for target in ("digest/wiki/weather", "Nowhere", "memory/2020-01-01/ghost.md", "Ghost"):
        assert target in told.rsplit("no such note:", 1)[1], told

    # A person's own link to a page not written yet stays a link through a rewrite; one
    # the model brings in to no page does not.
    mine = (root / harbour).read_text(encoding="utf-8").replace(
        "- the wall held\n", "- the wall held\n- tides: [[Tide Tables]]\n")
    (root / harbour).write_text(mine, encoding="utf-8")
    write(root, b, "The pier by the harbour was rebuilt.\n")
    model.plan[b] = [[("node_read", {"path": harbour})], [
        ("integrate", {"action": "REFINE", "bucket": "wiki", "node": harbour,
                       "reason": "as [[Pier report]] says", "content": (
                           "- the wall was repaired\n- tides: [[tide tables]]\n"
                           "- the pier was rebuilt, see [[Ghost pier]]")})]]
    second = dream(daemon)
    assert second["actions"] == {"REFINE": 1}, (second, model.tool_results)
    _, text = node(root, harbour)
    assert "- tides: [[tide tables]]\n- the pier was rebuilt, see Ghost pier\n" in text, text
    assert "reason: as Pier report says" in text.split("## History", 1)[1], text
