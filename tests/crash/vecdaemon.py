"""Real daemons that SIGKILL themselves at one chosen filesystem call (the vector crash test).

Run as ``python vecdaemon.py <fd>``, a fork server as ``tests/forkserver.py`` runs one
(:class:`KillingForks` starts it; a daemon costs a fork, not an interpreter's start), or
as ``python vecdaemon.py serve ...``, one daemon. Every mutating
call of the storage layer's filesystem seam (``store.fsio.FS``: the generation files,
manifests, the embedding cache and parked-text logs) is seen here with the name of the
file it acts on (for calls on a descriptor, the file it was opened on):

the daemon's environment says what to do (read at its first call):

- ``CRASH_TRACE=<file>``: append ``<op> <name>`` per call to that file;
- ``CRASH_AT=<op> <glob> <n> [<op> <glob>]``: SIGKILL this process at the ``n``-th call
  of ``op`` (a glob too: ``*`` is any call) on a file whose name matches ``glob``,
  counted from the first call matching the optional second pair (which places the kill
  after that step): before the call, except for ``write``, where half of the bytes are
  written first (a torn write).
"""

from __future__ import annotations

import fnmatch
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, as under pytest

from forkserver import ForkedProcess, ForkServer

from recalld.daemon.store import fsio

_names: dict[int, str] = {}
_seen = 0
_armed = False
#: (pid, trace file, op, glob, n, arming op and glob): read from the environment once per
#: process (a fork of the server reads its own).
_rule: tuple[int, str | None, str, str, int, list[str]] | None = None


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hit(op: str, name: str) -> bool:
    global _seen, _armed, _rule
    if _rule is None or _rule[0] != os.getpid():
        at = os.environ.get("CRASH_AT", "- - 0").split()
        _rule = (os.getpid(), os.environ.get("CRASH_TRACE"), at[0], at[1], int(at[2]), at[3:])
        _seen, _armed = 0, len(at) < 5
    _, trace, want, glob, n, arm = _rule
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{op} {name}\n")
    if _armed and fnmatch.fnmatchcase(op, want) and fnmatch.fnmatchcase(name, glob):
        _seen += 1
        return _seen == n
    if not _armed and op == arm[0] and fnmatch.fnmatchcase(name, arm[1]):
        _armed = True
    return False


def _on_path(op: str, method: Callable[..., Any], *, opens: bool = False,
             arg: int = 0) -> Callable[..., Any]:
    def call(self: fsio.FS, *args: Any) -> Any:
        name = Path(args[arg]).name
        if _hit(op, name):
            _kill()
        out = method(self, *args)
        if opens:
            _names[out] = name
        return out
    return call


def _on_fd(op: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: fsio.FS, fd: int, *args: Any) -> Any:
        if _hit(op, _names.get(fd, "?")):
            if op == "write":
                data = memoryview(args[0])
                os.write(fd, data[:max(1, len(data) // 2)])
            _kill()
        if op == "close":
            _names.pop(fd, None)
        return method(self, fd, *args)
    return call


def install() -> None:
    """Route this process's filesystem seam through the checks above."""
    fs = fsio.FS
    fs.open_write = _on_path("open_write", fs.open_write, opens=True)  # type: ignore[method-assign]
    fs.open_append = _on_path("open_append", fs.open_append, opens=True)  # type: ignore[method-assign]
    fs.write = _on_fd("write", fs.write)  # type: ignore[method-assign]
    fs.fsync = _on_fd("fsync", fs.fsync)  # type: ignore[method-assign]
    fs.truncate = _on_fd("truncate", fs.truncate)  # type: ignore[method-assign]
    fs.close = _on_fd("close", fs.close)  # type: ignore[method-assign]
    fs.replace = _on_path("replace", fs.replace, arg=1)  # type: ignore[method-assign]
    fs.link = _on_path("link", fs.link, arg=1)  # type: ignore[method-assign]
    fs.fsync_dir = _on_path("fsync_dir", fs.fsync_dir)  # type: ignore[method-assign]
    fs.unlink = _on_path("unlink", fs.unlink)  # type: ignore[method-assign]


class KillingForks:
    """``ForkServers`` for a ``DaemonFactory`` whose daemons are forks of this module."""

    def __init__(self) -> None:
        self._server: ForkServer | None = None

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *,
              driver: bool = False) -> ForkedProcess:
        # ``driver``: these daemons have no shared workspace, so no server of their own.
        if self._server is None or self._server.proc.poll() is not None:
            self._server = ForkServer(env, script=__file__)
        return self._server.spawn(argv, env, log_path)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


if __name__ == "__main__":
    install()
    if sys.argv[1] == "serve":
        from recalld.daemon.main import main

        sys.exit(main(sys.argv[1:]))
    import forkserver

    forkserver._serve(int(sys.argv[1]))
