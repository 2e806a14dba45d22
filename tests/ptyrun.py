"""Run the ``recalld`` command with its output on a pseudo-terminal, as a person sees it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

from test_cli import SCRIPT


def on_a_terminal(args: list[str], env: dict[str, str], *, stdout_too: bool,
                  deadline_s: float = 300) -> tuple[int, str]:
    """Run the CLI with stderr (and stdout, if ``stdout_too``; else it goes to a pipe) on
    a pseudo-terminal: its exit status and what it drew (CRLF as the terminal writes it,
    read as newlines)."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    master, slave = pty.openpty()
    with subprocess.Popen([*cmd, *args], env=env, stderr=slave,
                          stdout=slave if stdout_too else subprocess.PIPE,
                          stdin=subprocess.DEVNULL) as proc:
        os.close(slave)
        drawn = b""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            chunk = read_chunk(master, 1.0)
            if chunk is None:
                break
            if chunk:
                drawn += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=60)
    os.close(master)
    return code, drawn.decode(errors="replace").replace("\r\n", "\n")


def read_chunk(master: int, wait_s: float) -> bytes | None:
    """What the terminal ``master`` got within ``wait_s`` (b"": nothing yet; None: the
    other end closed)."""
    ready, _, _ = select.select([master], [], [], wait_s)
    if not ready:
        return b""
    try:
        return os.read(master, 1 << 16) or None
    except OSError:  # the other end closed
        return None
