"""Bytecode for the project and its dependencies, written once before anything is timed
or run many times.

An install made with ``pip install --no-compile`` (as the README's commands do) has no
bytecode, and with ``PYTHONDONTWRITEBYTECODE`` set none is written at import: every
interpreter the suite or a benchmark starts (a daemon's, the CLI's, an index worker's)
would compile trio, numpy and the daemon's own modules again, ~0.4 s of CPU each. pip
compiles a wheel's files at install the same way; the files written are only
``__pycache__`` entries beside the sources.
"""

from __future__ import annotations

import compileall
import sysconfig
from pathlib import Path


def compile_sources() -> bool:
    """Write the bytecode of recalld's packages and of the environment's installed
    packages (those already written are checked and kept). Returns whether every file
    compiled."""
    import recalld.daemon
    import recalld.ipc

    dirs = [str(Path(pkg.__file__).parent) for pkg in (recalld.daemon, recalld.ipc)
            if pkg.__file__]
    dirs.append(sysconfig.get_paths()["purelib"])
    return all([compileall.compile_dir(d, quiet=2, workers=0) for d in dirs])
