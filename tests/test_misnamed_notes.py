"""Notes whose file name is not valid UTF-8 (``caf\\xe9.md`` from a Latin-1 tool), from
outside: a real daemon, notes dropped in by hand. No index key or JSON answer can hold
such a name, so they are left out of the index; ``recalld verify`` and ``recalld
status`` say so, naming them escaped with the fix, whenever they appear or leave (they
said nothing: verify answered ok, status was clean with no word of them). Names that
are odd but UTF-8 are indexed, searched, listed and read as written."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Any

from test_cli import recalld
from waits import wait_value

DAY = "memory/2026-11-02"
#: UTF-8 names that are odd in other ways, each indexed as written.
ODD = ("new\nline.md", "car\rret.md", "back\\slash.md", "-dash.md", "trail .md",
       "zero\u200bwidth.md", "CON.md", unicodedata.normalize("NFC", "caf\u00e9x.md"),
       unicodedata.normalize("NFD", "caf\u00e9x.md"), "l" * 252 + ".md",
       "\U0001f600" * 63 + ".md")


def _latin1(root: Path, rel: str, text: str) -> bytes:
    path = os.fsencode(root / rel).replace(b"\xc3\xa9", b"\xe9")  # é in Latin-1
    with open(path, "wb") as fh:
        fh.write(text.encode())
    return path


def _workspace(d: Any) -> dict[str, Any]:
    return dict(next(w for w in d.call("daemon.status")["workspaces"]
                     if w["agent_id"] == "w"))


def _reasons(d: Any) -> list[str]:
    return list(_workspace(d)["health"]["reasons"])


def test_notes_named_not_in_utf8_are_said_not_indexed_until_renamed(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for folder in (DAY, "digest/wiki"):
        (root / folder).mkdir(parents=True)
        for i, name in enumerate(ODD):
            (root / folder / name).write_bytes(f"# odd\nThe heron{i} note.\n".encode())
    old = _latin1(root, f"{DAY}/café.md", "# cafe\nThe quokka latte.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})
    checked = d.call("index.verify", {"agent_id": "w"})
    assert not checked["ok"] and checked["misnamed"] == {
        "count": 1, "paths": [f"{DAY}/caf\\xe9.md"]}, checked
    assert checked["files_on_disk"] == checked["files_indexed"] == 2 * len(ODD), checked
    told = f"1 note(s) not indexed: their name is not valid UTF-8 (first: {DAY}/caf\\xe9.md)"
    wait_value(lambda: _reasons(d), lambda r: any(told in x for x in r), "told")
    shown = recalld("status", env=d.env).stdout
    assert "[WARN] 1 note(s) not indexed" in shown and "convmv" in shown, shown
    cli = recalld("verify", "--agent", "w", env=d.env)
    assert cli.returncode == 1 and f"{DAY}/caf\\xe9.md" in cli.stdout, cli.stdout
    # Every odd UTF-8 name is a note of its own: listed, read and found by its words.
    files = [f["path"] for f in d.call("memory.list", {"agent_id": "w"})["files"]]
    assert sorted(files) == sorted(f"{f}/{n}" for f in (DAY, "digest/wiki") for n in ODD)
    for i, name in enumerate(ODD):
        path = f"{DAY}/{name}"
        assert d.call("memory.read", {"agent_id": "w", "path": path})["text"] == (
            f"# odd\nThe heron{i} note.\n"), name
        found = d.call("memory.search", {"agent_id": "w", "query": f"heron{i}"})
        assert path in [r["path"] for r in found["results"]], (name, found["results"])
    # Renamed to UTF-8 while serving: indexed, and no longer named.
    os.rename(old, root / DAY / "café.md")
    found = d.call("memory.search", {"agent_id": "w", "query": "quokka", "sync": True})
    assert [r["path"] for r in found["results"]] == [f"{DAY}/café.md"], found
    wait_value(lambda: _reasons(d), lambda r: not any("UTF-8" in x for x in r), "gone")
    assert d.call("index.verify", {"agent_id": "w"})["ok"]
    # One dropped in while serving is told without waiting for a periodic rescan.
    _latin1(root, "digest/wiki/résumé.md", "# cv\nThe ibis.\n")
    wait_value(lambda: _reasons(d), lambda r: any(
        "(first: digest/wiki/r\\xe9sum\\xe9.md)" in x for x in r), "the new one told")
    # Written to again, it is counted already: no rescan of the notes for it.
    before = wait_value(lambda: _workspace(d)["index"]["watcher"], lambda w: (
        w["state"] == "watching" and w["rescan_owed"] is None), "its rescan over")
    before = before["last_reconcile"]
    _latin1(root, "digest/wiki/résumé.md", "# cv\nThe ibis again.\n")
    (root / DAY / "after.md").write_text("# after\nThe stork.\n")
    d.call("memory.search", {"agent_id": "w", "query": "stork", "sync": True})
    after = _workspace(d)["index"]["watcher"]["last_reconcile"]
    assert after == before or "UTF-8" not in after["reason"], (before, after)


def test_folders_moved_in_and_out_with_such_notes_are_told_at_once(
        daemon_factory: Any, tmp_path: Path) -> None:
    """A folder moved in or out whole has one event, for the folder: the notes passed by
    below it were counted at the next periodic rescan only, minutes later."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / DAY).mkdir(parents=True)
    (root / DAY / "plain.md").write_text("# plain\nThe egret.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})
    assert d.call("index.verify", {"agent_id": "w"})["ok"]
    for folder, shown in (("2026-11-03", "2026-11-03"), ("café", "caf\\xe9")):
        away = os.fsencode(outside / folder).replace(b"\xc3\xa9", b"\xe9")
        os.makedirs(away)
        _latin1(outside, f"{folder}/été.md", "# summer\nThe ibis.\n")
        inside = os.fsencode(root / "memory" / folder).replace(b"\xc3\xa9", b"\xe9")
        told = f"(first: memory/{shown}/\\xe9t\\xe9.md)"
        for _ in range(2):  # the second time, the folder is known to hold one
            os.rename(away, inside)
            wait_value(lambda: _reasons(d), lambda r, t=told: any(t in x for x in r), told)
            os.rename(inside, away)
            wait_value(lambda: _reasons(d), lambda r: not any("UTF-8" in x for x in r),
                       f"memory/{shown} moved out")
        assert d.call("index.verify", {"agent_id": "w"})["ok"]
