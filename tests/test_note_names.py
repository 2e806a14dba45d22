"""Daily notes as recalld writes them. Notes named in scripts whose vowels are
combining marks (Devanagari, Thai, Tamil) or whose words hold a joiner (Persian) keep
their names as words: the marks were cut out of file names as if they were punctuation,
so that ``काल`` (time) and ``कील`` (nail) made one file, ``क-ल.md``, and two notes named
apart were written into one. And a note's lines end in ``\n`` alone, however the text
given ended them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from test_auto_memory import add, config, done, turn, write_note
from waits import wait_job


def test_names_whose_vowels_are_marks_name_notes_of_their_own(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=1))
    day = f"memory/{dt.date.today().isoformat()}"
    names = {"काल": "काल", "कील": "कील", "บันทึกการประชุม": "บันทึกการประชุม",
             "மதுரை பயணம்": "மதுரை-பயணம்", "می\u200cخواهم": "می\u200cخواهم",
             "ZWJ\u200dtest": "zwj-test"}
    for name, stem in names.items():
        added = d.call("memory.add_note", {"agent_id": "w", "content": f"- about {name}",
                                           "name": name})
        assert added["path"] == f"{day}/{stem}.md" and added["created"], added
    again = d.call("memory.add_note", {"agent_id": "w", "content": "- more", "name": "काल"})
    assert again["path"] == f"{day}/काल.md" and not again["created"], again
    # The model naming a conversation's note so.
    fake.script(write_note("मौसम की जानकारी", "- बारिश"), done())
    job = add(d, "s1", turn("आज बारिश होगी।"))
    result = wait_job(d, job["job_id"])["result"]
    assert result["note"] == f"{day}/मौसम-की-जानकारी.md", result
    assert (root / result["note"]).read_text().endswith("- बारिश\n")


def test_a_note_written_with_other_line_ends_has_lines_ended_one_way(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Text piped from Windows (CRLF) or an old Mac (CR) kept its line ends in the note:
    # its lines ended two ways, and a lone CR was a line break editors show and the
    # index (and the line numbers of its hits) did not.
    root = tmp_path / "ws"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    first = d.call("memory.add_note", {"agent_id": "w", "content": "- eins\r\n- zwei\r\n"})
    again = d.call("memory.add_note", {"agent_id": "w", "content": "- eins\r\n- zwei\r\n"})
    assert first["changed"] and not again["changed"], again  # a repeat is still one
    d.call("memory.add_note", {"agent_id": "w", "content": "- drei\r- vier"})
    text = (root / first["path"]).read_bytes().decode()
    assert "\r" not in text and text.endswith("- eins\n- zwei\n\n- drei\n- vier\n"), text
    hits = d.call("memory.search", {"agent_id": "w", "query": "vier", "sync": True})
    lines = text.split("\n")
    hit = hits["results"][0]
    assert lines[hit["end_line"] - 1] == "- vier", (hit, lines)
