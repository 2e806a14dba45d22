"""The layering of the source, checked from the source itself (ast, no import).

- The feature packages (``daemon/index``, ``daemon/memory``, ``daemon/store``,
  ``daemon/providers``), and every other daemon module below the RPC layer, never import
  the RPC layer (``daemon/rpc``), the supervisor or the application wiring
  (``daemon/app.py``): the arrows point down only.
- ``recalld.ipc`` never imports ``recalld.daemon`` (not even through ``importlib``).
- No module reads or writes another class's underscore names: ``x._name`` is allowed on
  ``self``/``cls``, on a module (``os._exit``), and for names a class of the same module
  defines; anything else is reported with its place.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"daemon": "recalld.daemon", "ipc": "recalld.ipc"}
FEATURES = ("daemon/index", "daemon/memory", "daemon/store", "daemon/providers")
UPWARD = ("recalld.daemon.rpc", "recalld.daemon.supervisor", "recalld.daemon.app")
# Underscore names that are public API (namedtuple's methods).
PUBLIC_UNDERSCORE = frozenset({"_replace", "_asdict", "_fields", "_make"})


def sources(*folders: str) -> Iterator[tuple[str, Path]]:
    """``(module name, path)`` of every Python file under ``folders`` (repo-relative)."""
    for folder in folders:
        top = folder.split("/")[0]
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / top).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([PACKAGES[top], *parts]), path


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The parsed source of ``path``, parsed once for all the checks of this module."""
    return ast.parse(path.read_text())


def imported_modules(module: str, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module ``tree`` imports (any scope, TYPE_CHECKING included), with its line;
    ``from a import b`` yields both ``a`` and ``a.b``; ``import_module("x")`` yields x."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "import_module"))):
            yield node.lineno, node.args[0].value


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_feature_packages_do_not_import_upward() -> None:
    arrows = [f"{path.relative_to(ROOT)}:{line}: imports {target}"
              for module, path in sources(*FEATURES)
              for line, target in imported_modules(module, _tree(path))
              if _under(target, UPWARD)]
    assert arrows == []


def test_nothing_below_the_rpc_layer_imports_it() -> None:
    # Wider than the feature packages: jobs, workspaces, the composition (services.py)
    # and every other daemon module sit below the RPC layer too.
    top = {"recalld.daemon.app", "recalld.daemon.main", "recalld.daemon.supervisor"}
    arrows = [f"{path.relative_to(ROOT)}:{line}: imports {target}"
              for module, path in sources("daemon")
              if module not in top and not _under(module, ("recalld.daemon.rpc",))
              for line, target in imported_modules(module, _tree(path))
              if _under(target, UPWARD)]
    assert arrows == []


def test_ipc_does_not_import_the_daemon() -> None:
    arrows = [f"{path.relative_to(ROOT)}:{line}: imports {target}"
              for module, path in sources("ipc")
              for line, target in imported_modules(module, _tree(path))
              if _under(target, ("recalld.daemon",))]
    assert arrows == []


def test_the_checks_see_an_upward_import() -> None:
    # The walkers above must notice each form of import they claim to check.
    tree = ast.parse(
        "from recalld.daemon import supervisor\n"
        "def f():\n    from ..rpc.dispatch import Methods\n"
        "import recalld.daemon.app\n"
        "importlib.import_module('recalld.daemon.rpc.server')\n")
    found = {t for _, t in imported_modules("recalld.daemon.index.x", tree) if _under(t, UPWARD)}
    assert found == {"recalld.daemon.supervisor", "recalld.daemon.rpc.dispatch",
                     "recalld.daemon.rpc.dispatch.Methods", "recalld.daemon.app",
                     "recalld.daemon.rpc.server"}


# ------------------------------------------------------------------ private access


def _own_names(tree: ast.Module) -> set[str]:
    """Underscore names this module defines: module-level names, and its classes'
    methods, class attributes and fields, ``__slots__`` and ``self.x = ...`` targets."""
    names: set[str] = set()

    def bind(target: ast.expr) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)

    def body(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target)
                if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
                    names.update(c.value for c in ast.walk(node.value)
                                 if isinstance(c, ast.Constant) and isinstance(c.value, str))
            elif isinstance(node, ast.AnnAssign):
                bind(node.target)
            if isinstance(node, ast.ClassDef):
                body(node.body)

    body(tree.body)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return {n for n in names if n.startswith("_")}


def _module_names(module: str, tree: ast.AST) -> set[str]:
    """Local names bound to modules (``import os``, ``from recalld.daemon import x``)."""
    out: set[str] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if _is_module(f"{base}.{alias.name}"):
                    out.add(alias.asname or alias.name)
    return out


@functools.cache
def _is_module(name: str) -> bool:
    """Whether ``name`` is a module, found without importing it or its packages
    (``importlib.util.find_spec`` imports the parents: agentscope alone takes seconds)."""
    if name in sys.modules:
        return True
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    for i, _ in enumerate(rest, 1):
        if spec is None or spec.submodule_search_locations is None:
            return False
        spec = _find_spec(".".join([top, *rest[:i]]), list(spec.submodule_search_locations))
    return spec is not None


def _find_spec(name: str, path: list[str]) -> ModuleSpec | None:
    """What the import system's finders say of ``name`` in ``path`` (the editable
    install's finder maps ``recalld.*`` to the source folders)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if spec is not None:
            return spec  # type: ignore[no-any-return]
    return None


def private_accesses(module: str, source: str | ast.Module) -> list[tuple[int, str]]:
    """``(line, expression)`` of every ``x._name`` that reaches into another module's
    class (``source``: its text or its parsed tree)."""
    tree = ast.parse(source) if isinstance(source, str) else source
    own = _own_names(tree)
    modules = _module_names(module, tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in PUBLIC_UNDERSCORE:
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls", *modules):
            continue
        if name in own:
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_access_to_another_class_private_names() -> None:
    offenders = []
    for module, path in sources("daemon", "ipc"):
        rel = str(path.relative_to(ROOT))
        for line, expr in private_accesses(module, _tree(path)):
            offenders.append(f"{rel}:{line}: {expr}")
    assert offenders == []


def test_the_private_access_check_reports_offenders() -> None:
    source = (
        "import os\n"
        "class Health:\n"
        "    def __init__(self, index):\n"
        "        self._seen = 0\n"
        "        self.index = index\n"
        "    async def scan(self, other):\n"
        "        os._exit(0)\n"
        "        other._seen += 1\n"
        "        async with self.index._lock:\n"
        "            self.index._changes += 1\n")
    assert private_accesses("recalld.daemon.demo", source) == [
        (9, "self.index._lock"), (10, "self.index._changes")]
