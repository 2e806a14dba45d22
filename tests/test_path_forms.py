"""Paths named in another Unicode form than the disk's: a workspace made on macOS, or
synced from it, holds names decomposed (NFD, ``nai\u0308ve.md``) where people and agents
type them composed (NFC, ``naïve.md``), and the other way round. Real daemon, socket and
files."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

from test_index_daemon import open_ws, write


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


def listed(daemon: Any, prefix: str) -> list[str]:
    answer = daemon.call("memory.list", {"agent_id": "w", "prefix": prefix})
    return [f["path"] for f in answer["files"]]


def test_a_list_prefix_in_either_form_lists_the_notes(daemon: Any, tmp_path: Path) -> None:
    # memory.list with a composed prefix listed nothing of a folder written decomposed.
    root = tmp_path / "ws"
    write(root, nfd("digest/wiki/Réunions/équipe.md"), "# Team\n")
    write(root, nfc("memory/2026-03-04/Crème brûlée.md"), "# Dessert\n")
    write(root, "memory/2026-03-04/plain.md", "# Plain\n")
    open_ws(daemon, root)
    for form in (nfc, nfd):
        assert listed(daemon, form("digest/wiki/Réunions")) == [
            nfd("digest/wiki/Réunions/équipe.md")], form
        assert listed(daemon, form("memory/2026-03-04/Crème")) == [
            nfc("memory/2026-03-04/Crème brûlée.md")], form
    assert listed(daemon, "digest/wiki/Reunions") == []
