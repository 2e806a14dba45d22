"""Search filters by date, as a daemon applies them: which notes are dated (in the local
index and in a shared workspace's server, tests/pgserver.py), and which dates and ranges
are refused."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from pyroaring import BitMap
from test_index_daemon import open_ws, paths, search, write
from test_remote_search import config as remote_config
from test_remote_search import search as remote_search
from test_remote_search import ws_root, ws_status
from waits import wait_for

from recalld.daemon.index import state as index_state
from recalld.daemon.index.filters import Filters, passing
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.state import IndexState
from recalld.ipc.errors import InvalidParams


def test_daily_notes_named_by_their_date_are_dated(daemon: Any, tmp_path: Path) -> None:
    # ReMe's file-based memory layout keeps a day's note as
    # memory/YYYY-MM-DD.md rather than in a folder of that day.
    root = tmp_path / "ws"
    write(root, "memory/2025-02-12.md", "- deployed v2.1 with the quokka cache\n")
    write(root, "memory/2025-03-01/quokka.md", "- the quokka cache was removed\n")
    write(root, "memory/notes-2025-02-12.md.bak.md", "- a quokka copy of no date\n")
    # Dates in other digits are no dates: compared with a filter's, they came after all.
    write(root, "memory/\uff12\uff10\uff12\uff15-\uff10\uff13-\uff10\uff15/q.md",
          "- a full-width quokka\n")
    write(root, "memory/\u0662\u0660\u0662\u0665-\u0660\u0663-\u0660\u0665.md",
          "- an Arabic-Indic quokka\n")
    open_ws(daemon, root)
    feb = paths(search(daemon, "quokka", filters={"date_from": "2025-02-01",
                                                   "date_to": "2025-02-28"}))
    assert feb == ["memory/2025-02-12.md"]
    march = paths(search(daemon, "quokka", filters={"date_from": "2025-03-01"}))
    assert march == ["memory/2025-03-01/quokka.md"]


# Folders and notes named like a day that no calendar has: a month 13, 29 February of a
# year that is not a leap year, year 0. Compared as text, each passed a filter's bound it
# is no day of (2026-13-01 after any day of 2026, 0000-01-01 before every one).
NO_DAYS = ("memory/2026-13-01/kiwi.md", "memory/2026-02-29/kiwi.md",
           "memory/0000-01-01/kiwi.md", "memory/2026-04-31.md", "memory/2026-06-00.md")
DAYS = ("memory/2024-02-29/kiwi.md", "memory/2026-13-01/2026-05-07.md",
        "memory/2000-02-29.md")


def dated_kiwis(search_paths: Any) -> None:
    """What ``search_paths(filters)`` finds of ``NO_DAYS`` and ``DAYS`` (written) for
    "kiwi" under date filters: only notes of a calendar day, each where its day is."""
    def found(filters: dict[str, str]) -> list[str]:
        return sorted(search_paths(filters))
    assert found({"date_from": "2026-05-06"}) == ["memory/2026-13-01/2026-05-07.md"]
    assert found({"date_to": "2001-01-01"}) == ["memory/2000-02-29.md"]
    assert found({"date_from": "0001-01-01", "date_to": "9999-12-31"}) == sorted(DAYS)
    assert found({"date_from": "2024-02-29", "date_to": "2024-02-29"}) == [DAYS[0]]


def test_names_like_a_day_that_no_calendar_has_are_no_dates(daemon: Any,
                                                            tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for rel in NO_DAYS + DAYS:
        write(root, rel, "- a kiwi was seen\n")
    open_ws(daemon, root)
    assert len(paths(search(daemon, "kiwi", max_results=20))) == len(NO_DAYS + DAYS)
    dated_kiwis(lambda f: paths(search(daemon, "kiwi", filters=f, max_results=20)))


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


def test_whether_any_chunk_passes_reads_what_was_found_for_the_filters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A search with vectors asks whether any chunk passes its filters before it embeds
    # the query, then finds the chunks that pass: one walk of the files for both, also
    # when none passes, until a file changes.
    root = tmp_path / "ws"
    rels = ["memory/2025-02-12/a.md", "digest/wiki/b.md"]
    for rel in rels:
        write(root, rel, "- the pangolin\n")
    state = IndexState()
    state.apply([prepare_files(root, rels, max_chars=1600, digests={})])
    walks: list[Filters] = []

    def counted(files: Any, filters: Filters, **kw: Any) -> Any:
        walks.append(filters)
        return passing(files, filters, **kw)

    monkeypatch.setattr(index_state, "passing", counted)
    none, feb = Filters(date_from="2025-03-01"), Filters(date_from="2025-02-01")
    for _ in range(2):
        assert not state.allows_any(none) and state.allowed(none) == BitMap()
        assert state.allows_any(feb) and len(state.allowed(feb) or ()) == 1
    assert walks == [none, feb]
    write(root, "memory/2025-03-02/c.md", "- a pangolin came back\n")
    state.apply([prepare_files(root, ["memory/2025-03-02/c.md"], max_chars=1600,
                               digests={})])
    assert state.allows_any(none) and len(state.allowed(none) or ()) == 1
    assert walks == [none, feb, none]


def test_the_server_search_dates_the_notes_the_local_index_dates(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    d = daemon_factory(remote_config(pg_server.dsn, "s" + uuid.uuid4().hex[:12]))
    for agent in ("loc", "srv"):
        wait_for(lambda a=agent: ws_status(d, a)["remote"]["state"] == "online",
                 what=f"{agent} online")
    for rel in NO_DAYS + DAYS:
        write(ws_root(d, "loc"), rel, "- a kiwi was seen\n")

    def replicated() -> bool:
        return all((ws_root(d, "srv") / rel).exists() for rel in NO_DAYS + DAYS) and all(
            ws_status(d, a)["remote"]["outbox"] == 0 and not ws_status(d, a)["remote"]["behind"]
            for a in ("loc", "srv"))
    wait_for(replicated, deadline_s=120, what="every note on both replicas")
    for agent in ("loc", "srv"):
        def found(filters: dict[str, str], agent: str = agent) -> list[str]:
            answer = remote_search(d, agent, "kiwi", filters, n=20)
            assert answer.get("search_mode", "local") == ("server" if agent == "srv"
                                                          else "local"), answer
            return paths(answer)
        dated_kiwis(found)
