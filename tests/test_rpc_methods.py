"""The method table names the methods of each handler module it imports on first use:
the names listed match what the modules serve, listing them imports nothing, and the
first call of one of them imports its module (checked in a fresh interpreter where it
matters, since this one may have imported them already)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import trio

from recalld.daemon.rpc import dispatch
from recalld.daemon.rpc.dispatch import CallContext, Methods
from recalld.daemon.rpc.methods import _PACKAGE, DEFERRED, all_methods
from recalld.ipc.errors import MethodNotFound
from recalld.ipc.protocol import Request


@pytest.mark.parametrize(("module", "table", "names"), DEFERRED,
                         ids=[m for m, _, _ in DEFERRED])
def test_listed_names_are_the_modules_methods(module: str, table: str,
                                              names: tuple[str, ...]) -> None:
    found = getattr(importlib.import_module(f"{_PACKAGE}.{module}"), table)
    methods = found if isinstance(found, Methods) else found()
    assert methods.names() == sorted(names)


def test_the_table_lists_every_method_and_imports_a_module_on_its_first_call() -> None:
    code = (
        "import json, sys\n"
        "from recalld.daemon.rpc.methods import all_methods\n"
        "m = all_methods()\n"
        "before = sorted(n for n in sys.modules if n.startswith('recalld.daemon.rpc.'))\n"
        "names = m.names()\n"
        "m.is_immediate(__import__('recalld.ipc.protocol', fromlist=['x']).Request("
        "id=1, method='jobs.list', params={}), None)\n"
        "after = sorted(n for n in sys.modules if n.startswith('recalld.daemon.rpc.'))\n"
        "print(json.dumps([before, names, after, m.loaded('jobs.list'), "
        "m.loaded('memory.search')]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    before, names, after, jobs_loaded, search_loaded = json.loads(proc.stdout)
    handlers = {f"{_PACKAGE}.{m}" for m, _, _ in DEFERRED}
    assert not handlers & set(before), before
    assert set(names) >= {n for _, _, listed in DEFERRED for n in listed}
    assert "daemon.ping" in names and "memory.search" in names
    assert f"{_PACKAGE}.job_methods" in after
    assert not (handlers - {f"{_PACKAGE}.job_methods"}) & set(after), after
    assert jobs_loaded and not search_loaded


def _call(methods: Methods, name: str) -> object:
    state = dispatch.DaemonState.__new__(dispatch.DaemonState)
    ctx = CallContext(state, None, Request(id=1, method=name, params={}))  # type: ignore[arg-type]

    async def run() -> object:
        return await methods.dispatch(ctx)

    return trio.run(run)


def test_an_unknown_name_is_method_not_found_and_imports_nothing() -> None:
    methods = all_methods()
    with pytest.raises(MethodNotFound):
        _call(methods, "memory.no_such_method")
    assert "memory.no_such_method" not in methods
    assert "dream.runs" in methods


def test_a_module_that_does_not_serve_what_is_listed_is_refused_at_its_first_call() -> None:
    methods = Methods().defer(f"{_PACKAGE}.dream_methods", "METHODS",
                              ("dream.runs", "dream.undo", "dream.extra"))
    with pytest.raises(RuntimeError, match="does not serve exactly"):
        _call(methods, "dream.extra")
    with pytest.raises(ValueError, match="already registered"):
        methods.defer(f"{_PACKAGE}.dream_methods", "METHODS", ("dream.runs",))


def test_a_module_that_fails_to_import_is_not_immediate_and_fails_its_call() -> None:
    # The connection asks `is_immediate` for every call it reads: a broken handler module
    # must not raise there (that would end the connection with no answer); the call then
    # fails in `dispatch`, which answers it as any handler's error.
    methods = Methods().defer(f"{_PACKAGE}.no_such_handlers", "METHODS", ("x.broken",))
    request = Request(id=1, method="x.broken", params={})
    assert methods.is_immediate(request, None) is False  # type: ignore[arg-type]
    with pytest.raises(ModuleNotFoundError):
        _call(methods, "x.broken")
    assert "x.broken" in methods  # still listed; a later call tries the import again
