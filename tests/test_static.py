"""Ruff and mypy (strict) over the whole tree, as part of the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ruff_clean() -> None:
    proc = subprocess.run(
        [str(BIN / "ruff"), "check", "--no-cache", "."],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# A cold cache (a fresh checkout) checks every module and the third-party code it follows
# (pyproject.toml leaves out what recalld never imports): ~20 s on an idle 2-core machine,
# a few times that on a busy one, more than the suite's default per-test cap.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mypy_strict_clean() -> None:
    # The import packages live in folders named daemon/ and ipc/; a link tree gives mypy
    # the recalld.* names that the installed distribution has. Tree and cache stay in the
    # (ignored) .mypy_cache between runs: mypy re-checks every module whose source or
    # dependencies changed, and a warm run skips the third-party stubs.
    cache = ROOT / ".mypy_cache"
    pkg = cache / "suite-tree" / "recalld"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in ("daemon", "ipc"):
        link = pkg / name
        if not (link.is_symlink() and link.resolve() == (ROOT / name).resolve()):
            link.unlink(missing_ok=True)
            link.symlink_to(ROOT / name)
    env = {**os.environ, "MYPYPATH": str(pkg.parent)}
    proc = subprocess.run(
        [str(BIN / "mypy"), "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(cache / "suite"),
         "-p", "recalld.daemon", "-p", "recalld.ipc"],
        cwd=pkg.parent, env=env, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: The most lines a module may have (STYLE.md: split before 500): the daemon's, the
#: clients' and the tests'. The benchmark scripts (tests/bench/) are not held to it.
MAX_MODULE_LINES = 500


def test_every_module_is_at_most_500_lines() -> None:
    long = {}
    for folder, pattern in (("daemon", "**/*.py"), ("ipc", "**/*.py"), ("tests", "*.py"),
                            ("tests", "fakes/*.py")):
        for path in sorted((ROOT / folder).glob(pattern)):
            with path.open(encoding="utf-8") as f:
                lines = sum(1 for _ in f)
            if lines > MAX_MODULE_LINES:
                long[str(path.relative_to(ROOT))] = lines
    assert long == {}, f"split these before they grow further: {long}"
