"""Search filters by date, as a daemon applies them: which notes are dated, and which
dates and ranges are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_index_daemon import open_ws, paths, search, write

from recalld.ipc.errors import InvalidParams


def test_daily_notes_named_by_their_date_are_dated(daemon: Any, tmp_path: Path) -> None:
    # ReMe's file-based memory layout keeps a day's note as
    # memory/YYYY-MM-DD.md rather than in a folder of that day.
    root = tmp_path / "ws"
    write(root, "memory/2025-02-12.md", "- deployed v2.1 with the quokka cache\n")
    write(root, "memory/2025-03-01/quokka.md", "- the quokka cache was removed\n")
    write(root, "memory/notes-2025-02-12.md.bak.md", "- a quokka copy of no date\n")
    open_ws(daemon, root)
    feb = paths(search(daemon, "quokka", filters={"date_from": "2025-02-01",
                                                   "date_to": "2025-02-28"}))
    assert feb == ["memory/2025-02-12.md"]
    march = paths(search(daemon, "quokka", filters={"date_from": "2025-03-01"}))
    assert march == ["memory/2025-03-01/quokka.md"]


def test_dates_that_are_no_calendar_dates_are_refused(daemon: Any, tmp_path: Path) -> None:
    open_ws(daemon, tmp_path / "ws")
    for bad in ({"date_from": "yesterday"}, {"date_from": "2026-13-01"},
                {"date_to": "2026-02-30"}, {"date_from": "２０２６-07-24"},
                {"date_from": "2026-07-24", "date_to": "2026-07-23"}):
        with pytest.raises(InvalidParams, match="date"):
            search(daemon, "x", filters=bad)
    assert search(daemon, "x", filters={"date_from": "2024-02-29",
                                        "date_to": "2024-02-29"})["results"] == []


def test_a_filtered_search_after_a_write_sees_the_files_it_added_moved_and_removed(
        daemon: Any, tmp_path: Path) -> None:
    # The chunks that pass a filter are kept between searches until files change: each
    # change below must show in the next search with the same filters.
    root = tmp_path / "ws"
    write(root, "memory/2025-02-12/a.md", "- the pangolin left early\n")
    write(root, "digest/wiki/pangolin.md", "---\nauthor: ada\n---\nthe pangolin node\n")
    open_ws(daemon, root)
    feb = {"date_from": "2025-02-01", "date_to": "2025-02-28"}
    shapes: list[dict[str, Any]] = [feb, {"path_prefix": "memory/2025-02-20"},
                                    {"bucket": "wiki"}, {"author": "ada"}]
    for filters in shapes:  # twice each: the second reads what the first found
        for _ in range(2):
            search(daemon, "pangolin", filters=filters)
    write(root, "memory/2025-02-20/b.md", "- a pangolin came back\n")
    write(root, "digest/wiki/pangolin.md", "---\nauthor: bob\n---\nthe pangolin node\n")
    write(root, "digest/personal/pangolin.md", "---\nauthor: ada\n---\nmy pangolin\n")
    assert sorted(paths(search(daemon, "pangolin", filters=feb, sync=True))) == [
        "memory/2025-02-12/a.md", "memory/2025-02-20/b.md"]
    assert paths(search(daemon, "pangolin", filters=shapes[1])) == ["memory/2025-02-20/b.md"]
    assert paths(search(daemon, "pangolin", filters=shapes[2])) == ["digest/wiki/pangolin.md"]
    assert paths(search(daemon, "pangolin", filters=shapes[3])) == [
        "digest/personal/pangolin.md"]
    (root / "memory/2025-02-12/a.md").unlink()
    (root / "digest/wiki/pangolin.md").rename(root / "digest/personal/node.md")
    assert paths(search(daemon, "pangolin", filters=feb, sync=True)) == [
        "memory/2025-02-20/b.md"]
    assert paths(search(daemon, "pangolin", filters=shapes[2])) == []
