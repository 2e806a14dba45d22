"""Which note a link names among several, whatever the order they were indexed in."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonFactory
from test_links_daemon import links_of, write
from waits import wait_committed


def test_a_name_of_several_notes_names_one_whatever_their_order(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # As Obsidian picks among notes of one name none of the case written: the one in
    # the linking note's own folder, else the shortest path; not the last indexed.
    root = tmp_path / "ws"
    write(root, "memory/2026-08-01/plan.md", "# Plan\nplanword [[KAFKA]]\n")
    write(root, "digest/wiki/kafka.md", "# Kafka\nwikiword\n")
    config = f'[workspaces.w]\npath = "{root}"\n[daemon]\npersist_delay_s = 0.05\n'
    d = daemon_factory(config)
    assert links_of(d, "planword") == ["digest/wiki/kafka.md"]
    # One beside the linking note, written later, takes the link.
    write(root, "memory/2026-08-01/kafka.md", "# kafka\ndayword\n")
    assert links_of(d, "planword") == ["memory/2026-08-01/kafka.md"]
    write(root, "memory/2026-08-03/deep/er/kafka.md", "# kafka\ndeepword\n")
    write(root, "memory/2026-08-02/other.md", "# Other\notherword [[KAFKA|k]]\n")
    assert links_of(d, "otherword") == ["digest/wiki/kafka.md"]
    # Relative to the linking note's folder, as Obsidian reads ./ and ../.
    write(root, "memory/2026-08-02/rel.md",
          "# Rel\nrelword [[./kafka]] [[../2026-08-01/plan|the plan]]\n")
    assert links_of(d, "relword") == ["memory/2026-08-01/plan.md"]

    wait_committed(d, "w")
    assert d.stop() == 0
    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
    assert links_of(d2, "planword") == ["memory/2026-08-01/kafka.md",
                                        "memory/2026-08-02/rel.md"]
    assert links_of(d2, "otherword") == ["digest/wiki/kafka.md"]
    # Saved, the links still take a note of their name that comes, or go when it goes.
    write(root, "memory/2026-08-02/kafka.md", "# kafka\nsecondword\n")
    assert links_of(d2, "otherword") == ["memory/2026-08-02/kafka.md"]
    assert links_of(d2, "relword") == ["memory/2026-08-01/plan.md", "memory/2026-08-02/kafka.md"]
    (root / "memory/2026-08-01/kafka.md").unlink()
    assert links_of(d2, "planword") == ["digest/wiki/kafka.md", "memory/2026-08-02/rel.md"]
    # A path of the last folders only names another note ending so when its own goes.
    write(root, "memory/2026-08-04/p.md", "# P\npathword [[Wiki/Kafka]]\n")
    assert links_of(d2, "pathword") == ["digest/wiki/kafka.md"]
    (root / "digest/wiki/kafka.md").unlink()
    write(root, "memory/2026-08-05/wiki/Kafka.md", "# Kafka\nnotesword\n")
    assert links_of(d2, "pathword") == ["memory/2026-08-05/wiki/Kafka.md"]
