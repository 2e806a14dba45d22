"""Packaging: the sdist and wheel build from the tree, the wheel installs into a fresh venv
(dependencies from the package index, as a person would get them), and the installed
``recalld`` serves, answers ``status``, writes its user units and removes them again while
the Markdown stays."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from waits import wait_for

from recalld.ipc import __version__

ROOT = Path(__file__).resolve().parent.parent


def _tree_files(*, new: bool = True) -> list[str]:
    """The files git knows (tracked, and with ``new`` those not added yet, not ignored):
    what a clone would hold; in an unpacked sdist, which is no git work tree, the files
    its SOURCES.txt lists."""
    sources = ROOT / "recalld.egg-info" / "SOURCES.txt"
    if (ROOT / "PKG-INFO").is_file() and not (ROOT / ".git").exists() and sources.is_file():
        return sources.read_text(encoding="utf-8").splitlines()
    others = ["--others", "--exclude-standard"] if new else []
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", *others],
        cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return [raw.decode() for raw in listed]


def _tracked_tree(dest: Path) -> None:
    """Copy the files of the tree (:func:`_tree_files`) to ``dest``."""
    for rel in _tree_files():
        if not rel or rel.startswith("recalld.egg-info/"):
            continue
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the work tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    found = set()
    for top, name in (("daemon", "recalld.daemon"), ("ipc", "recalld.ipc")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((name, *rel)))
    assert found <= listed, f"missing from pyproject packages: {sorted(found - listed)}"


def _base_install() -> set[str]:
    """The distributions ``pip install recalld`` brings (no extras): recalld's requirements
    without an extra marker, and theirs, as the installed metadata says."""
    found: set[str] = set()
    todo = ["recalld"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found.add(name)
        for line in metadata.distribution(name).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def test_the_commands_of_an_install_without_extras_import_only_what_it_installs() -> None:
    # An optional dependency (jsonschema of the mcp extra) imported on the command line's
    # way made every `recalld` command, --version too, end in ModuleNotFoundError on a
    # plain install; this environment has every extra, so loaded modules are checked.
    code = (  # what the interpreter loads at its start (site's .pth files) is not counted
        "import json, sys\n"
        "started = set(sys.modules)\n"
        "import recalld.ipc.client, recalld.ipc.aclient, recalld.daemon.main\n"
        "from recalld.ipc.cli import main\n"
        "rc = main(['status', '--socket', '/nonexistent/recalld.sock'])\n"
        "print(json.dumps([rc, sorted(set(sys.modules) - started)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    rc, loaded = json.loads(proc.stdout)
    assert rc == 3 and "recalld.ipc.cli_search" in loaded
    base = _base_install()
    owners = metadata.packages_distributions()
    outside = sorted({f"{top} ({', '.join(owners[top])})" for top in
                      (m.split(".")[0] for m in loaded) if top in owners
                      and not {canonicalize_name(d) for d in owners[top]} & base})
    assert outside == [], f"not installed by `pip install recalld`: {outside}"


def test_the_sdist_holds_every_file_of_the_tree(tmp_path: Path) -> None:
    # Built from it, the tests ran without conftest.py, their helpers and fixtures, and the
    # docs and unit files the README points to were missing.
    src = tmp_path / "src"
    _tracked_tree(src)
    build = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    built = subprocess.run([sys.executable, "-c", build, str(tmp_path)], cwd=src,
                           capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    with tarfile.open(tmp_path / built.stdout.split()[-1]) as tar:
        names = {n.partition("/")[2] for n in tar.getnames()}
    # What the project holds (a file of one's own beside it in a checkout is not its).
    tree = {rel for rel in _tree_files(new=False) if (src / rel).is_file()}
    missing = sorted(n for n in tree if not n.startswith(".") and n not in names)
    assert missing == [], f"{len(missing)} file(s) of the tree not in the sdist: {missing[:20]}"


def _wheel_metadata(src: Path, out: Path) -> list[str]:
    """The lines of the METADATA a wheel built from ``src`` would carry."""
    prepare = ("import sys; from setuptools import build_meta as b; "
               "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))")
    built = subprocess.run([sys.executable, "-c", prepare, str(out)], cwd=src,
                           capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    info = out / built.stdout.split()[-1]
    return (info / "METADATA").read_text(encoding="utf-8").splitlines()


def test_the_package_version_is_the_one_recalld_reports(tmp_path: Path) -> None:
    # pyproject.toml and recalld.ipc.__version__ each held it: a release that changed one
    # installed a package whose --version and status said another.
    src = tmp_path / "src"
    _tracked_tree(src)
    init = src / "ipc" / "__init__.py"
    text = init.read_text(encoding="utf-8")
    assert f'__version__ = "{__version__}"' in text
    init.write_text(text.replace(f'"{__version__}"', '"7.3.1rc2"'), encoding="utf-8")
    lines = _wheel_metadata(src, tmp_path)
    assert "Version: 7.3.1rc2" in lines, lines[:5]


def test_the_declared_license_ships_with_its_text(tmp_path: Path) -> None:
    # The metadata said Apache-2.0 but neither the wheel nor the sdist held the license
    # text, which the license asks every copy to carry.
    src = tmp_path / "src"
    _tracked_tree(src)
    lines = _wheel_metadata(src, tmp_path)
    assert "License-Expression: Apache-2.0" in lines
    files = [line.partition(": ")[2] for line in lines if line.startswith("License-File: ")]
    assert files, "no License-File in the metadata"
    text = " ".join((src / files[0]).read_text(encoding="utf-8").split())
    assert text.startswith("Apache License Version 2.0, January 2004"), text[:200]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wheel_installs_in_a_fresh_venv_and_serves(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tracked_tree(src)
    dist = tmp_path / "dist"
    dist.mkdir()
    # The PEP 517 hooks of the declared backend, run in the copy (they rewrite sys.argv).
    build = (
        "import sys; from setuptools import build_meta as b; out = sys.argv[1]; "
        "print(b.build_sdist(out)); print(b.build_wheel(out))"
    )
    built = subprocess.run([sys.executable, "-c", build, str(dist)], cwd=src,
                           capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    sdist = next(dist.glob("recalld-*.tar.gz"))
    wheel = next(dist.glob("recalld-*-py3-none-any.whl"), None)
    assert wheel is not None, (built.stdout[-3000:], sorted(p.name for p in dist.iterdir()))
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    for needed in ("pyproject.toml", "README.md", "daemon/app.py", "ipc/cli.py"):
        assert f"{top}/{needed}" in names, needed
    with zipfile.ZipFile(wheel) as zf:
        wheel_names = set(zf.namelist())
        metadata = next(zf.read(n).decode() for n in wheel_names
                        if n.endswith(".dist-info/METADATA"))
    # The license as an SPDX expression: setuptools stops building the older table form
    # (`license = {text = ...}`) after February 2027.
    assert "License-Expression: Apache-2.0" in metadata.splitlines(), metadata[:2000]
    for needed in ("recalld/daemon/app.py", "recalld/daemon/backup.py", "recalld/ipc/cli.py",
                   "recalld/daemon/py.typed", "recalld/ipc/py.typed"):
        assert needed in wheel_names, needed
    assert not any(n.startswith("tests/") for n in wheel_names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel_names)

    # A fresh venv without its own pip (bootstrapping one is most of a venv's creation
    # time); the test environment's pip installs into it (pip --python), without
    # compiling the bytecode of every installed module (a third of the install's time;
    # the daemon compiles what it imports).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--disable-pip-version-check", "--no-compile", "-q", str(wheel)],
        capture_output=True, text=True, timeout=240, check=False)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-3000:]
    recalld = venv / "bin" / "recalld"
    assert recalld.is_file()

    home = tmp_path / "home"
    runtime = Path(tempfile.mkdtemp(prefix="rdp-", dir="/tmp"))
    os.chmod(runtime, 0o700)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECALLD_", "NOTIFY_", "LISTEN_", "WATCHDOG_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(runtime),
               XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"),
               PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    note = home / "data" / "recalld" / "workspaces" / "default" / "memory" / "2026-07-23"
    note.mkdir(parents=True)
    (note / "a.md").write_text("# A\n\nthe installed daemon indexes this pangolin note\n")
    log = (tmp_path / "serve.log").open("wb")
    # Runs with cwd outside the tree, so only the installed copy can be imported.
    proc = subprocess.Popen([str(recalld), "serve"], env=env, cwd=tmp_path, stdout=log,
                            stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        def serving() -> Any:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            got = subprocess.run([str(recalld), "status", "--json"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=30, check=False)
            return orjson.loads(got.stdout) if got.returncode == 0 else None
        status = wait_for(serving, "the installed daemon's status")
        assert status["version"] and status["pid"] == proc.pid
        assert [w["agent_id"] for w in status["workspaces"]] == ["default"]
        where = subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import recalld.daemon.app as a; print(a.__file__)"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True)
        assert where.stdout.startswith(str(venv)), where.stdout
        found = subprocess.run([str(recalld), "search", "pangolin", "--sync", "--json"],
                               env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=30, check=False)
        assert found.returncode == 0, found.stderr
        assert orjson.loads(found.stdout)["results"][0]["path"] == "memory/2026-07-23/a.md"

        units = subprocess.run([str(recalld), "install-service", "--write-only"], env=env,
                               cwd=tmp_path, capture_output=True, text=True, timeout=30,
                               check=False)
        assert units.returncode == 0, units.stderr
        service = home / "config" / "systemd" / "user" / "recalld.service"
        assert f"ExecStart={recalld} serve" in service.read_text()
        removed = subprocess.run([str(recalld), "uninstall-service", "--write-only"], env=env,
                                 cwd=tmp_path, capture_output=True, text=True, timeout=30,
                                 check=False)
        assert removed.returncode == 0 and not service.exists()
        assert (note / "a.md").is_file(), "uninstall keeps the Markdown"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)
