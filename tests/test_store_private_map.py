"""Mapped array files are private copies; generations notice files changed under them.

Real files under tmp_path: the published file is truncated, overwritten, replaced and
removed after mapping, and the arrays read from the mapping stay what was written.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from recalld.daemon.store import arrays
from recalld.daemon.store.errors import CorruptState
from recalld.daemon.store.fsio import REAL
from recalld.daemon.store.manifest import GenerationStore


def _write(path: Path) -> tuple[dict[str, np.ndarray], arrays.FileEntry]:
    data = {"a": np.arange(300_000, dtype=np.int64), "b": np.linspace(0, 1, 5000)}
    return data, arrays.write_arrays(REAL, path, data, {"m": 1})


@pytest.mark.parametrize("how", ["truncate", "garbage", "unlink"])
def test_mapped_arrays_survive_the_file_changing(tmp_path: Path, how: str) -> None:
    path = tmp_path / "x.arr"
    data, entry = _write(path)
    mapped = arrays.map_arrays(path, entry)
    assert mapped.matches()
    if how == "truncate":
        os.truncate(path, 0)
    elif how == "garbage":
        with path.open("r+b") as f:
            f.write(os.urandom(entry.size))
    else:
        path.unlink()
    for name, want in data.items():  # every page read: no SIGBUS, the bytes as written
        assert np.array_equal(mapped.arrays[name], want)
    assert mapped.matches()
    assert mapped.meta == {"m": 1}
    assert os.listdir(tmp_path) == ([] if how == "unlink" else ["x.arr"])  # copy unnamed


def test_a_file_that_cannot_be_copied_is_read_into_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "x.arr"
    data, entry = _write(path)

    def full(*args: object, **kwargs: object) -> object:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    mapped = arrays.map_arrays(path, entry)
    os.truncate(path, 0)
    assert np.array_equal(mapped.arrays["a"], data["a"])
    assert mapped.matches()
    assert "no private copy to map" in caplog.text


def test_a_file_of_the_wrong_size_is_refused_before_copying(tmp_path: Path) -> None:
    path = tmp_path / "x.arr"
    _, entry = _write(path)
    os.truncate(path, entry.size // 2)
    with pytest.raises(CorruptState, match="size"):
        arrays.map_arrays(path, entry)


def _generation(tmp_path: Path) -> tuple[GenerationStore, Path, Path]:
    store = GenerationStore(tmp_path / "index", REAL)
    store.open()
    with store.transaction() as txn:
        for name in ("one", "two"):
            txn.add(name, arrays.write_arrays(REAL, txn.path(name, ".arr"),
                                              {"v": np.arange(1000)}))
    gen = store.current
    assert gen is not None
    return store, gen.path("one"), gen.path("two")


@pytest.mark.parametrize("how, why", [
    ("truncate", "size 10 != expected"),
    ("write", "written to in place"),
    ("replace", "replaced by another file"),
    ("remove", "missing"),
])
def test_generation_notices_a_file_changed_on_disk(tmp_path: Path, how: str,
                                                   why: str) -> None:
    store, one, _two = _generation(tmp_path)
    gen = store.current
    assert gen is not None
    assert gen.changed_on_disk() == {}
    if how == "truncate":
        os.truncate(one, 10)
    elif how == "write":
        st = one.stat()
        with one.open("r+b") as f:
            f.write(b"\xff" * 64)
        os.utime(one, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif how == "replace":
        copy = one.with_suffix(".new")
        copy.write_bytes(one.read_bytes())
        os.replace(copy, one)
    else:
        one.unlink()
    found = gen.changed_on_disk()
    assert set(found) == {"one"}
    assert why in found["one"]
    assert "one" in gen.corrupt
    assert gen.changed_on_disk() == {}  # reported once
    with pytest.raises(CorruptState), store.transaction() as txn:
        txn.carry("one")  # never carried into a new generation


def test_a_reopened_generation_remembers_its_files(tmp_path: Path) -> None:
    _store, one, _ = _generation(tmp_path)
    again = GenerationStore(tmp_path / "index", REAL)
    gen = again.open()
    assert gen is not None and gen.changed_on_disk() == {}
    os.truncate(one, 1)
    assert set(gen.changed_on_disk()) == {"one"}
