"""The ``recalld`` command run as the tests' helpers run it: a process of its own, its
output captured as text.

A command's start is mostly its imports (~0.1 s of CPU each time, several hundred
commands in a run). Where the worker's fork server for the command's environment is
already running (tests/forkserver.py, started for the daemons), the command is a fork of
it that runs ``recalld.ipc.cli.main`` as the console script does, on pipes as
``subprocess.run`` gives; otherwise (no server, a locale other than the server's, an
argument that is not text) it is the installed script in a fresh interpreter. What only
a fresh interpreter shows (what the command imports, its exit on a full disk or a closed
pipe, a terminal) is tested on real ``exec`` by the tests that look at it.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from forkserver import ForkServer, ForkServers

SCRIPT = Path(sys.executable).parent / "recalld"
#: Read when an interpreter starts its text streams: a command forked from a server
#: started with other values would write in the server's encoding.
_LOCALE_VARS = ("LANG", "LC_ALL", "LC_CTYPE")

_servers: ForkServers | None = None


def use_fork_servers(servers: ForkServers | None) -> None:
    """Called by the session fixture that owns the worker's fork servers."""
    global _servers
    _servers = servers


def run_recalld(args: Sequence[str], *, env: Mapping[str, str], input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``recalld ARGS`` with ``env``; stdin is ``input`` (empty when None)."""
    server = _server_for(args, env)
    if server is None:
        cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
        return subprocess.run([*cmd, *args], env=dict(env), capture_output=True, text=True,
                              timeout=timeout, input=input or "", check=False)
    return _run_forked(server, list(args), env, input or "", timeout)


def _server_for(args: Sequence[str], env: Mapping[str, str]) -> ForkServer | None:
    if _servers is None:
        return None
    try:
        "".join(args).encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, carried as surrogates
        return None
    server = _servers.running(env)
    if server is None or any(env.get(k) != server.env.get(k) for k in _LOCALE_VARS):
        return None
    return server


def _run_forked(server: ForkServer, args: list[str], env: Mapping[str, str], stdin: str,
                timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryFile() as stdin_file:
        stdin_file.write(stdin.encode("utf-8"))
        stdin_file.seek(0)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = server.spawn_cli(args, env, [stdin_file.fileno(), out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        output = _read_until_closed({out_r: bytearray(), err_r: bytearray()},
                                    time.monotonic() + timeout)
        if output is None:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(["recalld", *args], timeout)
        code = proc.wait(timeout=timeout)
    return subprocess.CompletedProcess(
        ["recalld", *args], code, _text(output[out_r]), _text(output[err_r]))


def _read_until_closed(buffers: dict[int, bytearray],
                       deadline: float) -> dict[int, bytearray] | None:
    """Read every pipe of ``buffers`` to its end (closing it); None at the deadline."""
    with selectors.DefaultSelector() as sel:
        for fd in buffers:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        buffers[key.fd] += chunk
                    else:
                        sel.unregister(key.fd)
        finally:
            for fd in buffers:
                os.close(fd)
    return buffers


def _text(data: bytearray) -> str:
    # As ``subprocess.run(text=True)`` decodes: the locale's encoding, universal newlines.
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
