"""A generated bilingual workspace with identifier needles: exact terms across scripts.

Seeded and self-contained (no data files). A few hundred short notes, a third of them
written in Chinese; each *needle* is a generated identifier planted once, in one
Chinese-heavy note, while a couple of dozen short English notes carry *siblings* of it:
identifiers of the same shape that share its common parts (the same prefix and word with
another number, the same camelCase humps in another order, the same project with another
version), plus those parts on their own. A keyword search for the needle must put the one
Chinese note that holds it first (hit@1), ahead of English notes that only share its parts.

Shapes (every string generated from the seed; none is a fixed example):
- ``error``:   an error code ``<PFX>_<WORD>_<NNNN>``            (``QX_TORVEL_5831``)
- ``camel``:   a camelCase function name ``<verb><Word><Noun>``  (``flushKarmoLedger``)
- ``snake``:   a snake_case name ``<verb>_<word>_<noun>``        (``sync_ravel_queue``)
- ``hex``:     a hex id with its kind ``<kind>-<8 hex>``          (``build-3fa9c21e``)
- ``version``: a project and its version ``<word> v<M>.<m>.<p>`` (``kelmo v4.27.3``)
- ``dotted``:  a dotted settings key ``<word>.<word>.<noun>``     (``zenra.cache.max_age``)
- ``release``: a project and a bare release number ``<word> <M>.<m>.<p>`` (``kelmo 4.27.3``)
- ``address``: an IPv4 address ``10.<a>.<b>.<c>``                 (``10.0.3.17``)

Each needle is asked three ways: the identifier alone, the identifier with two Chinese
words of its note, and the identifier in a short English question.

    .venv/bin/python tests/bench/bilingual.py /tmp/ws --notes 300   # just a workspace
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

SHAPES = ("error", "camel", "snake", "hex", "version", "dotted", "release", "address")
DEFAULT_NOTES = 300
DEFAULT_NEEDLES = 30
DISTRACTORS_PER_NEEDLE = 24
DATE = "2025-03-14"

_SYL = ("ka", "ro", "mi", "ta", "ve", "lo", "zen", "dri", "fal", "gor", "hin", "jus", "kel",
        "mor", "nix", "pla", "rin", "sel", "tor", "vim", "wex", "yor", "zil", "bre", "cas",
        "dun", "esk", "fio", "qua", "tal")
_VERBS = ("flush", "sync", "load", "parse", "drain", "merge", "retry", "spawn", "reset",
          "fetch", "render", "verify")
_NOUNS = ("ledger", "queue", "cache", "buffer", "index", "socket", "handler", "budget",
          "session", "manifest", "cursor", "window")
_KINDS = ("build", "commit", "trace", "object", "job", "blob")
_EN = """
the team looked at the logs again this morning and found that the nightly job had stopped
after the restart we moved the service to another host and kept an eye on the dashboard
someone asked whether the fix should go out before the weekend or wait for review the
numbers look better now but latency still jumps when the cache is cold we wrote down what
happened so the next person on call knows where to start the meeting ran long and nobody
had time to finish the migration plan coffee first then the review of open tickets
""".split()
_ZH = """
今天 上午 我们 检查 日志 发现 夜间 任务 重启 以后 停止 运行 下午 和 同事 讨论 迁移 方案 决定
先 回滚 再 观察 一天 监控 显示 延迟 明显 升高 缓存 命中率 下降 需要 进一步 分析 原因 记录 在
这里 方便 值班 的 人 查找 周末 之前 不要 发布 新 版本 数据库 连接 偶尔 超时 客户 反馈 页面 很
慢 产品 经理 希望 尽快 修复 测试 环境 已经 准备 好 明天 继续 跟进
""".split()


@dataclass(frozen=True)
class Needle:
    shape: str
    ident: str
    siblings: tuple[str, ...]  # same shape, sharing the common parts, never the ident
    parts: tuple[str, ...]  # the common parts, as an English note would mention them


@dataclass(frozen=True)
class BilingualSet:
    notes: dict[str, str]  # workspace-relative path -> Markdown
    queries: list[str]
    targets: list[str]  # the path each query must rank first
    shapes: list[str]  # the needle shape per query
    forms: list[str]  # how the query asks: ident / ident+zh / question


def _word(rng: random.Random, n: tuple[int, int] = (2, 3)) -> str:
    return "".join(rng.choice(_SYL) for _ in range(rng.randint(*n)))


def _needle(rng: random.Random, shape: str) -> Needle:
    w = _word(rng)
    if shape == "error":
        pfx = "".join(rng.choice("BCDFGHJKLMNPQRSTVWXZ") for _ in range(2))
        num = rng.randint(1000, 9999)
        ident = f"{pfx}_{w.upper()}_{num}"
        sibs = tuple(f"{pfx}_{w.upper()}_{n}" for n in rng.sample(
            [x for x in range(1000, 10000) if x != num], 4))
        return Needle(shape, ident, sibs, (pfx, w.upper(), str(num)))
    if shape == "camel":
        verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
        ident = f"{verb}{w.capitalize()}{noun.capitalize()}"
        others = [n for n in _NOUNS if n != noun]
        sibs = (f"{verb}{w.capitalize()}{rng.choice(others).capitalize()}",
                f"{rng.choice([v for v in _VERBS if v != verb])}{w.capitalize()}"
                f"{noun.capitalize()}", f"{verb}{noun.capitalize()}")
        return Needle(shape, ident, sibs, (verb, w, noun))
    if shape == "snake":
        verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
        ident = f"{verb}_{w}_{noun}"
        sibs = (f"{verb}_{w}_{rng.choice([n for n in _NOUNS if n != noun])}",
                f"{rng.choice([v for v in _VERBS if v != verb])}_{w}_{noun}", f"{w}_{noun}")
        return Needle(shape, ident, sibs, (verb, w, noun))
    if shape == "hex":
        kind = rng.choice(_KINDS)
        hexid = f"{rng.getrandbits(32):08x}"
        ident = f"{kind}-{hexid}"
        sibs = tuple(f"{kind}-{hexid[:5]}{rng.getrandbits(12):03x}" for _ in range(3))
        return Needle(shape, ident, tuple(s for s in sibs if s != ident), (kind, hexid[:5]))
    if shape == "version":
        major, minor, patch = rng.randint(2, 9), rng.randint(10, 60), rng.randint(0, 9)
        ident = f"{w} v{major}.{minor}.{patch}"
        sibs = (f"{w} v{major}.{minor}.{(patch + 1) % 10}", f"{w} v{major}.{minor + 1}.{patch}",
                f"{w} v{major}.{minor}")
        return Needle(shape, ident, sibs, (w, f"v{major}", str(minor)))
    if shape == "release":
        major, minor, patch = rng.randint(2, 9), rng.randint(10, 60), rng.randint(0, 9)
        ident = f"{w} {major}.{minor}.{patch}"
        sibs = (f"{w} {major}.{minor}.{(patch + 1) % 10}", f"{w} {major}.{minor + 1}.{patch}",
                f"{w} {major}.{minor}")
        return Needle(shape, ident, sibs, (w, str(major), str(minor)))
    if shape == "address":
        a, b, c = rng.randint(0, 40), rng.randint(0, 250), rng.randint(2, 250)
        ident = f"10.{a}.{b}.{c}"
        sibs = (f"10.{a}.{b}.{c + 1}", f"10.{a}.{b + 1}.{c}", f"10.{a}.{b}.{c}0")
        return Needle(shape, ident, sibs, ("10", str(a), str(b)))
    section, noun = _word(rng), rng.choice(_NOUNS)
    ident = f"{w}.{section}.{noun}_max"
    sibs = (f"{w}.{section}.{noun}_min", f"{w}.{section}.{rng.choice(_NOUNS)}_max",
            f"{w}.{noun}_max")
    return Needle(shape, ident, tuple(s for s in sibs if s != ident), (w, section, noun))


def en_text(rng: random.Random, words: int) -> str:
    """An English sentence of ``words`` words of the notes' vocabulary."""
    out = [rng.choice(_EN) for _ in range(words)]
    out[0] = out[0].capitalize()
    return " ".join(out) + "."


def zh_text(rng: random.Random, words: int) -> str:
    """A Chinese sentence of ``words`` words of the notes' vocabulary."""
    return "".join(rng.choice(_ZH) for _ in range(words)) + "。"


def generate(*, notes: int = DEFAULT_NOTES, needles: int = DEFAULT_NEEDLES,
             seed: int = 0, distractors: int = DISTRACTORS_PER_NEEDLE) -> BilingualSet:
    """The notes, queries and targets of one seeded workspace (nothing written)."""
    rng = random.Random(f"bilingual-{seed}")
    n_zh = notes // 3
    if needles > n_zh:
        raise ValueError(f"{needles} needles need at least {needles} Chinese notes")
    zh_paths = [f"memory/{DATE}/zh-{i:04d}.md" for i in range(n_zh)]
    en_paths = [f"memory/{DATE}/en-{i:04d}.md" for i in range(notes - n_zh)]
    # Chinese-heavy notes: 150-400 Chinese words (300-800 characters), a few English words.
    body: dict[str, list[str]] = {p: [zh_text(rng, rng.randint(20, 40))
                                      for _ in range(rng.randint(5, 10))] for p in zh_paths}
    # English notes are short, as the notes that bury a needle by length are.
    for p in en_paths:
        body[p] = [en_text(rng, rng.randint(12, 25)) for _ in range(rng.randint(2, 4))]
    seen: set[str] = set()
    idents: set[str] = set()
    planted: list[tuple[Needle, str]] = []
    while len(planted) < needles:
        nd = _needle(rng, SHAPES[len(planted) % len(SHAPES)])
        # No needle is another's sibling (a note holding it would hold the needle).
        mine = {nd.ident.lower(), *(sib.lower() for sib in nd.siblings)}
        if nd.ident.lower() in seen or mine & idents:
            continue
        seen |= mine
        idents.add(nd.ident.lower())
        home = zh_paths[len(planted)]
        paras = body[home]
        at = rng.randrange(len(paras))
        paras[at] = paras[at][:-1] + f"，问题出在 {nd.ident} 上，" + zh_text(rng, 6)
        for p in rng.sample(en_paths, min(distractors, len(en_paths))):
            sib = rng.choice(nd.siblings)
            parts = " and ".join(nd.parts)
            body[p].append(f"We hit {sib} again, see the notes on {parts}.")
        planted.append((nd, home))
    files = {p: f"# {p.rsplit('/', 1)[1][:-3]}\n\n" + "\n\n".join(paras) + "\n"
             for p, paras in body.items()}
    queries: list[str] = []
    targets: list[str] = []
    shapes: list[str] = []
    forms: list[str] = []
    for nd, home in planted:
        zh_words = [w for w in _ZH if len(w) >= 2 and w in files[home]][:2]
        for form, q in (("ident", nd.ident), ("ident+zh", f"{nd.ident} {' '.join(zh_words)}"),
                        ("question", f"what went wrong with {nd.ident}?")):
            queries.append(q)
            targets.append(home)
            shapes.append(nd.shape)
            forms.append(form)
    return BilingualSet(files, queries, targets, shapes, forms)


def write(root: Path, bs: BilingualSet) -> None:
    for rel, text in bs.notes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--notes", type=int, default=DEFAULT_NOTES)
    ap.add_argument("--needles", type=int, default=DEFAULT_NEEDLES)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    bs = generate(notes=a.notes, needles=a.needles, seed=a.seed)
    write(a.root, bs)
    json.dump({"notes": len(bs.notes), "queries": list(zip(bs.queries, bs.targets,
                                                           strict=True))},
              sys.stdout, ensure_ascii=False, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
