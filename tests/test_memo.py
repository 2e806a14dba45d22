"""The string memos: bounded, and a long argument is computed each time, never kept."""

from __future__ import annotations

from recalld.daemon.index.memo import Memo


def test_memo_computes_once_and_starts_again_when_full() -> None:
    calls: list[str] = []

    def upper(word: str) -> str:
        calls.append(word)
        return word.upper()

    memo = Memo(upper, 2)
    assert [memo["a"], memo["b"], memo["a"]] == ["A", "B", "A"]
    assert calls == ["a", "b"]
    assert memo["c"] == "C" and len(memo) == 1  # full: emptied, then "c" kept
    assert memo["a"] == "A" and calls == ["a", "b", "c", "a"]


def test_a_long_key_is_computed_each_time_and_never_kept() -> None:
    calls: list[str] = []

    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    memo = Memo(length, 8, max_chars=5)
    assert [memo["abc"], memo["abc"], memo["abcde"], memo["abcde"]] == [3, 3, 5, 5]
    assert calls == ["abc", "abcde"]
    long = "x" * 6
    assert [memo[long], memo[long]] == [6, 6]
    assert calls == ["abc", "abcde", long, long]
    assert long not in memo and len(memo) == 2
