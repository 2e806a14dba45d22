"""The suite's own bytecode folder (tests/_bytecode.py): a session killed before its
exit handlers ran leaves its folder to the next session, which removes it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from _bytecode import PREFIX, remove_left_over


def test_the_folders_of_ended_sessions_are_removed_and_live_ones_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead = tmp_path / f"{PREFIX}{ended.pid}-x1"
    live = tmp_path / f"{PREFIX}{os.getpid()}-x2"
    unnamed = tmp_path / f"{PREFIX}nopid"
    other = tmp_path / "recalld-other-1-x3"
    for folder in (dead, live, unnamed, other):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "m.pyc").write_bytes(b"x")
    remove_left_over()
    assert not dead.exists()
    assert live.exists() and unnamed.exists() and other.exists()
