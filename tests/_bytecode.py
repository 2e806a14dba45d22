"""Bytecode the suite's processes compile once and share (imported first by conftest).

A fresh clone has no bytecode, and an environment that sets ``PYTHONDONTWRITEBYTECODE``
(many CI machines do) never caches any: each worker then compiled every
module it imported and rewrote every test module's asserts (pytest's assertion rewriting)
for itself, about 14 s of CPU per worker before its first test.

``share_session_bytecode`` (run when conftest imports this module, before anything else)
gives such a session a bytecode folder of its own (``PYTHONPYCACHEPREFIX``, a temporary
folder removed at exit, or by the next session if this one is killed; nothing is written
beside the sources) before the controller imports the suite's dependencies, so the
workers it starts afterwards read what it compiled. ``import_own_share`` has each
worker import its share of the test modules before it collects them all, so each
module's asserts are rewritten by one worker and read by the others. A session whose
bytecode is cached beside the sources (the default) gets the second half only.
"""

from __future__ import annotations

import atexit
import fnmatch
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

#: Names the session's own bytecode folder, for the daemons' environments (conftest).
MARKER = "RECALLD_TESTS_BYTECODE"
#: The start of a session's folder name (then the controller's pid): a session killed
#: before its exit handlers ran leaves its folder to the next session to remove.
PREFIX = "recalld-tests-bytecode-"


def share_session_bytecode() -> None:
    """In the controller of a session forbidden to cache bytecode, cache it in a folder of
    the session's own, inherited by every process it starts."""
    if "PYTEST_XDIST_WORKER" in os.environ or MARKER in os.environ:
        return
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    remove_left_over()
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    os.environ[MARKER] = folder
    sys.pycache_prefix = folder
    sys.dont_write_bytecode = False


def remove_left_over() -> None:
    """Remove the folders of sessions that ended without their exit handlers (killed)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name.removeprefix(PREFIX).partition("-")[0]
        if not pid.isdigit() or folder.is_symlink() or folder.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass


def session_folder() -> Path | None:
    """The session's own bytecode folder, if ``share_session_bytecode`` made one."""
    folder = os.environ.get(MARKER)
    return Path(folder) if folder and os.environ.get("PYTHONPYCACHEPREFIX") == folder else None


def import_own_share(config: pytest.Config) -> None:
    """In a worker, import every n-th test module of the run (n workers, starting at this
    worker's number) before collection imports them all."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count < 2 or sys.dont_write_bytecode:
        return
    patterns = config.getini("python_files")
    modules: set[Path] = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::", 1)[0])
        candidates = path.rglob("*.py") if path.is_dir() else [path]
        modules.update(p for p in candidates
                       if any(fnmatch.fnmatch(p.name, pat) for pat in patterns))
    for path in sorted(modules)[int(worker[2:]) % count::count]:
        # Only top-level modules: pytest imports them by their own name ("prepend" mode)
        # with their folder on sys.path, as conftest's folder is.
        if (path.parent / "__init__.py").exists() or str(path.parent) not in sys.path:
            continue
        if path.stem in sys.modules:
            continue
        try:
            importlib.import_module(path.stem)
        except (Exception, pytest.skip.Exception):
            # Collection imports it again and reports what went wrong there.
            sys.modules.pop(path.stem, None)


share_session_bytecode()
