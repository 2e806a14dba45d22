"""Notes of odd but legal shapes, as a daemon indexes and searches them."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle


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
