"""Ruff and mypy (strict) over the whole tree, as part of the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ruff_clean() -> None:
    proc = subprocess.run(
        [str(BIN / "ruff"), "check", "--no-cache", "."],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_clean(tmp_path: Path) -> None:
    # The import packages live in folders named daemon/ and ipc/; a link tree gives mypy
    # the recalld.* names that the installed distribution has.
    pkg = tmp_path / "recalld"
    pkg.mkdir()
    (pkg / "daemon").symlink_to(ROOT / "daemon")
    (pkg / "ipc").symlink_to(ROOT / "ipc")
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    proc = subprocess.run(
        [str(BIN / "mypy"), "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / ".mypy_cache"),
         "-p", "recalld.daemon", "-p", "recalld.ipc"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
