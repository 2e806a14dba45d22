"""The catalog's file records (``FileInfo``): what a warm start reads back for each file."""

from __future__ import annotations

from typing import Any

import pytest

from recalld.daemon.index.records import FileInfo


def _record(keys: Any) -> dict[str, Any]:
    return {"path": "memory/a.md", "mtime_ns": 5, "size": 9, "digest": "d0", "keys": keys}


@pytest.mark.parametrize(("keys", "expected"), [
    ([4, 5, 6], range(4, 7)),
    ([7], range(7, 8)),
    ([], ()),
    ([3, 5, 6], (3, 5, 6)),
    ([6, 5], (6, 5)),
    ([2, 3.0, True + 3], range(2, 5)),  # what the ints compare equal to
    ([2.0, 3], range(2, 4)),
    (["2", "3"], range(2, 4)),
])
def test_a_file_record_s_keys_come_back_as_a_range_when_consecutive(
        keys: Any, expected: range | tuple[int, ...]) -> None:
    info = FileInfo.from_record(_record(keys))
    assert info.keys == expected and type(info.keys) is type(expected)
    assert all(type(k) is int for k in info.keys)
    again = FileInfo.from_record(dict(info.to_record()))
    assert again == info


@pytest.mark.parametrize("keys", [None, 3, ["x"], [{}]])
def test_keys_that_are_no_ints_are_refused(keys: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        FileInfo.from_record(_record(keys))
