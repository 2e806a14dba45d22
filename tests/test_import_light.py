"""An agent process that only queries must stay light: the client side never loads the
daemon, numpy or hnswlib, nor an event loop library of its own: the async client runs on
the program's trio or asyncio, whose anyio backend loads at its first call (checked in a
fresh interpreter, since this one has them all)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "hnswlib", "recalld.daemon", "pyroaring", "zstandard", "watchfiles",
         # The optional integrations load only when asked for by name, and what only
         # their extras bring (jsonschema) with them: a plain install has none of it.
         "agentscope", "mcp", "mcp_types", "recalld.ipc.agentscope", "recalld.ipc.mcp_",
         "jsonschema", "recalld.ipc.tool_args")
#: The event loop is the program's: trio, asyncio and anyio's backends for them.
LOOPS = ("trio", "asyncio", "anyio._backends")
MODULES = ["recalld.ipc", "recalld.ipc.client", "recalld.ipc.aclient", "recalld.ipc.cli",
           "recalld.ipc.protocol"]


@pytest.mark.parametrize("module", MODULES)
def test_import_is_light(module: str) -> None:
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    loaded = set(json.loads(proc.stdout))
    assert module in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY + LOOPS
                   or m.startswith(HEAVY + LOOPS))
    assert heavy == [], f"importing {module} loaded {heavy}"


def test_cli_help_is_light() -> None:
    # Running a client command (even just --help) must not import the daemon either.
    code = (
        "import sys, json\n"
        "from recalld.ipc.cli import main\n"
        "rc = main(['status', '--socket', '/nonexistent/recalld.sock'])\n"
        "print(json.dumps([rc, sorted(sys.modules)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    rc, loaded = json.loads(proc.stdout)
    assert rc == 3
    assert not [m for m in loaded if m.startswith(HEAVY + LOOPS)]
    # What one command alone needs is imported by that command: the doctor's checks, the
    # service install (and subprocess, also for an autostart), the TOML parser (a config
    # file to read; --socket needs none). A plain call's start is ~25 % shorter for it.
    assert not set(loaded) & {"recalld.ipc.doctor", "recalld.ipc.install", "subprocess",
                              "secrets", "tomllib"}
    # Nor the async client and anyio under it (some 15 ms of a command's start): the
    # command line calls through the blocking client and runs no event loop.
    assert not [m for m in loaded if m.split(".")[0] == "anyio"
                or m in ("recalld.ipc.aclient", "recalld.ipc._aconn")]
    # Nor hashlib (OpenSSL's library, some 3 ms): only names beyond Latin letters, request
    # ids and notes sent in parts are hashed.
    assert "hashlib" not in loaded


@pytest.mark.parametrize("argv", [["--bogus"], ["--agent", ""], ["--help"]])
def test_the_mcp_command_line_is_parsed_before_the_sdk_is_imported(argv: list[str]) -> None:
    # A usage error (or --help) of `python -m recalld.ipc.mcp` waited for the MCP SDK's
    # import (over a second) before it was said.
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['recalld-mcp', *{argv!r}]\n"
        "try:\n"
        "    runpy.run_module('recalld.ipc.mcp', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as exc:\n"
        "    print(json.dumps([exc.code, sorted(sys.modules)]), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    rc, loaded = json.loads(proc.stderr.splitlines()[-1])
    assert rc == (0 if argv == ["--help"] else 2), proc.stderr
    assert ("usage: recalld mcp" in proc.stdout) == (argv == ["--help"]), proc.stdout
    assert not [m for m in loaded if m.startswith(HEAVY + LOOPS)], loaded


RUN_ON = {
    "asyncio": "import asyncio\nasyncio.run(main())\n",
    "trio": "import trio\ntrio.run(main)\n",
}


@pytest.mark.parametrize("loop", sorted(RUN_ON))
def test_async_client_loads_only_the_programs_loop(loop: str) -> None:
    # A first call (to a socket that does not exist) loads anyio's backend for the loop
    # that runs it, and nothing of the other one.
    code = (
        "import json, sys\n"
        "from recalld.ipc import errors\n"
        "from recalld.ipc.aclient import AsyncClient\n"
        "async def main():\n"
        "    try:\n"
        "        await AsyncClient('/nonexistent/recalld.sock').ping()\n"
        "    except errors.DaemonNotRunning:\n"
        "        print(json.dumps(sorted(sys.modules)))\n"
        + RUN_ON[loop]
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    loaded = set(json.loads(proc.stdout))
    other = "trio" if loop == "asyncio" else "asyncio"
    assert f"anyio._backends._{loop}" in loaded
    assert f"anyio._backends._{other}" not in loaded
    assert other not in loaded, f"a {loop} program loaded {other}"
    assert not [m for m in loaded if m.startswith(HEAVY)]


def test_the_clients_typeddicts_compile_no_annotation_strings_at_import() -> None:
    # A TypedDict turns each string annotation (what ``from __future__ import
    # annotations`` leaves) into a ForwardRef, compiling it, as its class is made: the
    # answer shapes alone have two hundred fields, some 1.2 ms of every client's start.
    code = (
        "import json, sys, typing\n"
        "from recalld.ipc.cli import main\n"
        "print(json.dumps(sorted(\n"
        "    f'{name}.{v.__name__}.{field}' for name, m in list(sys.modules.items())\n"
        "    if name.startswith('recalld.') for v in vars(m).values()\n"
        "    if typing.is_typeddict(v) and v.__module__ == name\n"
        "    for field, t in v.__annotations__.items() if isinstance(t, typing.ForwardRef))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert json.loads(proc.stdout) == []
