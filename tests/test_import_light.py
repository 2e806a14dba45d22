"""An agent process that only queries must stay light: the client side never loads the
daemon, numpy or hnswlib (checked in a fresh interpreter, since this one has them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "hnswlib", "recalld.daemon", "pyroaring", "zstandard", "watchfiles",
         # The optional integrations load only when asked for by name.
         "agentscope", "mcp", "mcp_types", "recalld.ipc.agentscope", "recalld.ipc.mcp")
MODULES = ["recalld.ipc", "recalld.ipc.client", "recalld.ipc.aclient",
           "recalld.ipc.asyncio_client", "recalld.ipc.cli", "recalld.ipc.protocol"]


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
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY))
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
    assert not [m for m in loaded if m.startswith(HEAVY)]
