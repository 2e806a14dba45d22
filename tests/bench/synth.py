"""Seeded synthetic memory workspaces for the index benchmarks.

``generate(root, notes=... | target_chunks=..., seed=...)`` writes a QwenPaw/ReMe-shaped
workspace: daily notes ``memory/YYYY-MM-DD/<slug>.md`` in English, Chinese and a mix of
both, and digest nodes ``digest/{personal,procedure,wiki}/<slug>.md`` with frontmatter and
``key:: [[target]]`` links. Everything comes from code (a built-in vocabulary drawn with a
Zipfian distribution), so nothing large is committed and no network is used.

Determinism: note ``i`` depends only on ``(seed, i)``, so a larger workspace is a superset
of a smaller one with the same seed, and the planted needles (``needles``) sit at paths
that do not depend on the workspace size. ``EditStream`` appends unique tokens to existing
notes for write-to-searchable measurements.

Run as a script to generate a workspace: ``python tests/bench/synth.py DIR --chunks 100000``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BLOCKS_PER_NOTE_MIN = 3
BLOCKS_PER_NOTE_MAX = 8
# Mean blocks (~chunks) per file, used to turn a chunk target into a file count.
MEAN_BLOCKS_PER_FILE = (BLOCKS_PER_NOTE_MIN + BLOCKS_PER_NOTE_MAX) / 2
NOTES_PER_DAY = 8
BASE_DATE = dt.date(2015, 1, 1)
DIGEST_BUCKETS = ("personal", "procedure", "wiki")
NEEDLE_COUNT = 24
NEEDLE_STRIDE = 5  # needle k lives in note k*5+1, so all exist from 120 notes on
VOCAB_SEED = 20240601  # the vocabulary is the same for every workspace seed

_COMMON = """
the of and to a in is it you that he was for on are with as his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state keep eye never
last let thought city tree cross farm hard start might story saw far sea draw left late run
while press close night real life few north open seem together next white children begin got
walk example ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain stop once
base hear horse cut sure watch color face wood main enough plain girl usual young ready above
ever red list though feel talk bird soon body dog family direct pose leave song measure door
product black short numeral class wind question happen complete ship area half rock order fire
south problem piece told knew pass since top whole king space heard best hour better true during
hundred five remember step early hold west ground interest reach fast verb sing listen six table
travel less morning ten simple several vowel toward war lay against pattern slow center love
person money serve appear road map rain rule govern pull cold notice voice unit power town fine
certain fly fall lead cry dark machine note wait plan figure star box noun field rest correct
able pound done beauty drive stood contain front teach week final gave green quick develop ocean
warm free minute strong special mind behind clear tail produce fact street inch multiply nothing
course stay wheel full force blue object decide surface deep moon island foot system busy test
record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape
equate miss brought heat snow tire bring yes distant fill east paint language among
"""

_TECH = """
server client socket timeout retry deploy release branch commit merge review test build
pipeline cache index query latency throughput memory disk network request response error
warning log metric dashboard alert incident outage rollback migration schema database table
column backup restore config setting flag feature bug fix patch ticket sprint meeting standup
roadmap deadline customer user account password token session cookie header payload endpoint
service daemon process thread worker queue channel event handler callback promise async await
container image cluster node pod kubernetes docker terraform ansible nginx postgres redis kafka
python rust golang typescript javascript react webpack compiler linker runtime interpreter
benchmark profile flamegraph allocation leak garbage collector heap stack pointer buffer
encoding unicode tokenizer embedding vector search ranking recall precision dataset model
training inference prompt agent workspace notebook notes summary digest wiki procedure habit
coffee lunch dinner commute train bus bicycle weekend vacation flight hotel passport visa
doctor dentist gym running swimming yoga groceries rent invoice budget tax insurance garden
"""

_IDENTIFIERS = (
    "ECONNREFUSED", "ETIMEDOUT", "ENOSPC", "EADDRINUSE", "SIGKILL", "OOMKilled",
    "handleWebSocketReconnect", "parseConfigFile", "retryWithBackoff", "flushWriteBuffer",
    "UserSessionManager", "HttpClientPool", "v2.3.1", "v1.18.0", "v0.9.4-rc2", "C++",
    "README.md", "docker-compose.yml", "pyproject.toml", "main.rs", "index.ts", "HTTP/2",
    "utf-8", "p99", "x86_64", "aarch64", "CVE-2024-3094", "PR#4821", "JIRA-1142",
)

_ZH_WORDS = """
我们 今天 明天 昨天 时间 工作 问题 数据 系统 服务器 用户 项目 会议 需要 已经 可以 没有 因为
所以 但是 如果 然后 现在 这个 那个 一个 什么 怎么 为什么 非常 比较 重要 简单 复杂
方法 结果 原因 情况 计划
完成 开始 结束 继续 修改 更新 发布 测试 部署 配置 文件 目录 代码 程序 函数 接口 网络 连接 失败 成功
错误 日志 监控 报警 性能 内存 磁盘 缓存 索引 查询 搜索 结果 排序 召回 模型 训练 推理 向量 分词 中文
英文 文档 笔记 总结 记录 回顾 想法 建议 讨论 决定 同事 朋友 家人 孩子 父母 老师 学生 医生 周末 假期
旅行 北京 上海 杭州 深圳 广州 成都 天气 下雨 晴天 早上 中午 晚上 吃饭 咖啡 午饭 晚饭 地铁 公交 开车
跑步 游泳 健身 读书 电影 音乐 学习 课程 考试 作业 预算 发票 报销 房租 保险 医院 体检 快递 购物 超市
产品 设计 需求 客户 反馈 版本 分支 合并 回滚 迁移 备份 恢复 容器 集群 节点 线程 进程 队列 事件 超时
重试 延迟 吞吐 基准 优化 瓶颈 分析 报告 指标 目标 进度 风险 依赖 团队 负责 安排 确认 通知 邮件 电话
消息 文章 图片 视频 手机 电脑 键盘 屏幕 软件 硬件 安全 权限 密码 账号 登录 注册 数据库
表格 字段 迁移
我 你 他 她 的 了 在 是 有 和 也 都 很 就 还 要 会 说 去 来 看 想 做 用 把 被 让 给 对 从 到
"""

# Characters kept out of the common vocabulary, so planted Chinese names are unique.
_ZH_RARE = "翊璟曦瑾琰昀珩泓笙翎琛霁毓琮璇砚澈瓒骁珏禛翀芃楠晞"
_ZH_SURNAMES = "欧阳司马诸葛慕容上官东方"

_SYLLABLES = (
    "ka", "ro", "mi", "ta", "ve", "lo", "qua", "zen", "dri", "fal", "gor", "hin", "jus", "kel",
    "mor", "nix", "pla", "rin", "sel", "tor", "ul", "vim", "wex", "yor", "zil", "bre", "cas",
    "dun", "esk", "fio",
)


@dataclass(frozen=True)
class GenStats:
    """What ``generate`` wrote."""

    root: Path
    notes: int
    digests: int
    blocks: int  # paragraphs, lists and headed sections: roughly the chunk count
    bytes: int
    seconds: float
    needles: tuple[tuple[str, str], ...] = field(default=())

    @property
    def files(self) -> int:
        return self.notes + self.digests


@dataclass(frozen=True)
class Edit:
    """One appended token: search for ``token``, expect a hit in ``path``."""

    path: str  # workspace-relative, POSIX separators
    token: str


class _Vocab:
    """Word lists and their Zipfian cumulative weights, built once per process."""

    def __init__(self) -> None:
        rng = random.Random(VOCAB_SEED)
        base = list(dict.fromkeys(_COMMON.split() + _TECH.split()))
        seen = set(base)
        pseudo: list[str] = []
        while len(pseudo) < 3200:
            w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
            if w not in seen:
                seen.add(w)
                pseudo.append(w)
        self.en = np.array(base + pseudo, dtype=object)
        self.en_words: frozenset[str] = frozenset(seen)
        self.en_cum = _zipf_cum(len(self.en))
        zh = list(dict.fromkeys(_ZH_WORDS.split()))
        rng.shuffle(zh)
        self.zh = np.array(zh, dtype=object)
        # Flatter than English: a few hundred words with a steep curve would repeat a handful.
        self.zh_cum = _zipf_cum(len(self.zh), s=1.0, q=12.0)


def _zipf_cum(n: int, s: float = 1.07, q: float = 2.7) -> np.ndarray:
    w = 1.0 / np.power(np.arange(n, dtype=np.float64) + q, s)
    c = np.cumsum(w)
    out: np.ndarray = c / c[-1]
    return out


_VOCAB: _Vocab | None = None


def _vocab() -> _Vocab:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = _Vocab()
    return _VOCAB


def _pseudo_word(rng: random.Random, avoid: frozenset[str]) -> str:
    while True:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(3, 4)))
        if w not in avoid:
            return w


def note_path(i: int, seed: int = 0) -> str:
    """Workspace-relative path of daily note ``i`` (independent of the workspace size)."""
    day = BASE_DATE + dt.timedelta(days=i // NOTES_PER_DAY)
    rng = random.Random(f"slug-{seed}-{i}")
    v = _vocab().en
    words = [str(v[rng.randrange(60, 900)]) for _ in range(2)]
    return f"memory/{day.isoformat()}/{'-'.join(words)}-{i:06d}.md"


def digest_path(j: int, seed: int = 0) -> str:
    rng = random.Random(f"digest-{seed}-{j}")
    v = _vocab().en
    words = [str(v[rng.randrange(60, 1200)]) for _ in range(2)]
    return f"digest/{DIGEST_BUCKETS[j % 3]}/{'-'.join(words)}-{j:05d}.md"


def _needle(seed: int, k: int) -> tuple[str, str]:
    """(query, sentence) for needle ``k``: unique identifiers and rare names."""
    rng = random.Random(f"needle-{seed}-{k}")
    avoid = _vocab().en_words
    kind = k % 6
    if kind == 0:
        code = "ERR_" + "".join(rng.choice("BCDFGHJKLMNPQRSTVWXZ") for _ in range(4))
        code += str(rng.randint(1000, 9999))
        return code, f"The worker crashed with {code} right after the nightly compaction."
    if kind == 1:
        a, b = (_pseudo_word(rng, avoid).capitalize() for _ in range(2))
        ident = f"handle{a}{b}"
        return ident, f"We traced the stall to {ident} holding the lock for too long."
    if kind == 2:
        first, last = (_pseudo_word(rng, avoid).capitalize() for _ in range(2))
        name = f"{first} {last}"
        return name, f"Lunch with {name}, who is moving to the storage team next quarter."
    if kind == 3:
        proj = _pseudo_word(rng, avoid)
        ver = f"v{rng.randint(3, 9)}.{rng.randint(10, 99)}.{rng.randint(0, 9)}"
        return f"{proj} {ver}", f"Pinned {proj} {ver} because the newer build broke our tests."
    if kind == 4:
        name = rng.choice(
            [_ZH_SURNAMES[i:i + 2] for i in range(0, len(_ZH_SURNAMES), 2)]
        ) + "".join(rng.sample(_ZH_RARE, 2))
        return name, f"下午和{name}讨论了数据迁移的计划，他负责回滚方案。"
    tag = _pseudo_word(rng, avoid) + str(rng.randint(10, 99))
    fname = f"{tag}.yaml"
    return fname, f"Moved the retention settings into {fname} so every host reads one file."


def needles(seed: int = 0, *, notes: int | None = None) -> list[tuple[str, str]]:
    """Planted needle queries as ``(query, expected_path)``.

    Needle ``k`` sits in daily note ``k*NEEDLE_STRIDE + 1``; pass ``notes`` (the number of
    daily notes generated) to keep only the needles that exist in a small workspace.
    """
    out = []
    for k in range(NEEDLE_COUNT):
        i = k * NEEDLE_STRIDE + 1
        if notes is not None and i >= notes:
            continue
        out.append((_needle(seed, k)[0], note_path(i, seed)))
    return out


class _Writer:
    """Builds one file's text from a per-file numpy generator."""

    def __init__(self, rng: np.random.Generator, zh: bool) -> None:
        self.rng = rng
        self.zh = zh
        self.v = _vocab()

    def _en_words(self, n: int) -> list[str]:
        idx = np.searchsorted(self.v.en_cum, self.rng.random(n))
        words: list[str] = self.v.en[np.minimum(idx, len(self.v.en) - 1)].tolist()
        return words

    def _zh_words(self, n: int) -> list[str]:
        idx = np.searchsorted(self.v.zh_cum, self.rng.random(n))
        words: list[str] = self.v.zh[np.minimum(idx, len(self.v.zh) - 1)].tolist()
        return words

    def _ident(self) -> str:
        return _IDENTIFIERS[int(self.rng.integers(len(_IDENTIFIERS)))]

    def en_text(self, chars: int, mixed: bool = False) -> str:
        words = self._en_words(max(8, chars // 6))
        if mixed:
            zh = self._zh_words(max(1, len(words) // 12))
            for j, w in enumerate(zh):
                words[(j * 12 + 5) % len(words)] = w
        if self.rng.random() < 0.5:
            words[int(self.rng.integers(len(words)))] = self._ident()
        out: list[str] = []
        pos = 0
        lens = self.rng.integers(6, 18, size=len(words) // 6 + 1)
        for n in lens.tolist():
            if pos >= len(words):
                break
            sent = words[pos:pos + n]
            pos += n
            sent[0] = sent[0].capitalize() if sent[0].islower() else sent[0]
            out.append(" ".join(sent) + ".")
        return " ".join(out)

    def zh_text(self, chars: int) -> str:
        words = self._zh_words(max(6, chars // 2))
        if self.rng.random() < 0.5:
            words[int(self.rng.integers(len(words)))] = " " + self._ident() + " "
        out: list[str] = []
        pos = 0
        lens = self.rng.integers(5, 16, size=len(words) // 5 + 1)
        for n in lens.tolist():
            if pos >= len(words):
                break
            out.append("".join(words[pos:pos + n]) + ("。" if self.rng.random() < 0.6 else "，"))
            pos += n
        return "".join(out)

    def text(self, chars: int) -> str:
        if self.zh:
            return self.zh_text(chars)
        return self.en_text(chars, mixed=self.rng.random() < 0.15)

    def para_chars(self) -> int:
        return int(np.clip(self.rng.lognormal(6.45, 0.45), 300, 1500))

    def title(self) -> str:
        if self.zh:
            return "".join(self._zh_words(int(self.rng.integers(2, 5))))
        return " ".join(self._en_words(int(self.rng.integers(2, 6)))).capitalize()

    def tags(self) -> list[str]:
        ws = self._zh_words(2) if self.zh else self._en_words(3)
        return list(dict.fromkeys(w for w in ws if w.isalnum()))[:3]

    def bullets(self) -> str:
        n = int(self.rng.integers(3, 7))
        return "\n".join(f"- {self.text(int(self.rng.integers(60, 200)))}" for _ in range(n))

    def frontmatter(self, name: str, extra: str = "") -> str:
        desc = self.text(int(self.rng.integers(60, 160)))
        tags = ", ".join(self.tags())
        return f"---\nname: {name}\ndescription: {desc}\ntags: [{tags}]\n{extra}---\n"


def _note_text(i: int, seed: int, zh_fraction: float, n_notes: int,
               needle_sentence: str | None) -> tuple[str, int]:
    rng = np.random.default_rng((seed, 1, i))
    w = _Writer(rng, zh=bool(rng.random() < zh_fraction))
    title = w.title()
    parts = [w.frontmatter(note_path(i, seed).rsplit("/", 1)[1][:-3]), f"# {title}\n"]
    blocks = int(rng.integers(BLOCKS_PER_NOTE_MIN, BLOCKS_PER_NOTE_MAX + 1))
    for _ in range(blocks):
        r = rng.random()
        if r < 0.2:
            parts.append(w.bullets() + "\n")
        else:
            if r < 0.45:
                parts.append(f"## {w.title()}\n")
            para = w.text(w.para_chars())
            if rng.random() < 0.12 and n_notes > 1:
                target = note_path(int(rng.integers(n_notes)), seed)[:-3]
                para += f" See [[{target}]]."
            if needle_sentence is not None:
                para = f"{para} {needle_sentence}"
                needle_sentence = None
            parts.append(para + "\n")
    if needle_sentence is not None:  # every block was a list: the needle gets its own
        parts.append(f"{w.text(w.para_chars())} {needle_sentence}\n")
        blocks += 1
    return "\n".join(parts), blocks


def _digest_text(j: int, seed: int, zh_fraction: float, n_notes: int,
                 n_digests: int) -> tuple[str, int]:
    rng = np.random.default_rng((seed, 2, j))
    w = _Writer(rng, zh=bool(rng.random() < zh_fraction))
    name = digest_path(j, seed).rsplit("/", 1)[1][:-3]
    extra = f"bucket: {DIGEST_BUCKETS[j % 3]}\n"
    parts = [w.frontmatter(name, extra), f"# {w.title()}\n"]
    links = []
    for key in ("source", "related", "supports"):
        if key == "source" and n_notes:
            links.append(f"{key}:: [[{note_path(int(rng.integers(n_notes)), seed)[:-3]}]]")
        elif n_digests > 1:
            links.append(f"{key}:: [[{digest_path(int(rng.integers(n_digests)), seed)[:-3]}]]")
    parts.append("\n".join(links) + "\n")
    blocks = int(rng.integers(BLOCKS_PER_NOTE_MIN, BLOCKS_PER_NOTE_MAX + 1))
    for _ in range(blocks):
        parts.append((w.bullets() if rng.random() < 0.3 else w.text(w.para_chars())) + "\n")
    return "\n".join(parts), blocks


def sizes_for(notes: int | None, target_chunks: int | None,
              digest_fraction: float) -> tuple[int, int]:
    """(daily notes, digest nodes) for a requested note count or approximate chunk count."""
    if notes is None and target_chunks is None:
        raise ValueError("give notes or target_chunks")
    if not 0.0 <= digest_fraction < 1.0:
        raise ValueError("digest_fraction must be in [0, 1)")
    if notes is not None:
        n_notes = notes
        n_digests = round(notes * digest_fraction / (1.0 - digest_fraction))
    else:
        assert target_chunks is not None
        files = max(1, round(target_chunks / MEAN_BLOCKS_PER_FILE))
        n_digests = round(files * digest_fraction)
        n_notes = files - n_digests
    return n_notes, n_digests


def generate(root: Path, *, notes: int | None = None, target_chunks: int | None = None,
             seed: int = 0, zh_fraction: float = 0.3,
             digest_fraction: float = 0.1) -> GenStats:
    """Write a workspace under ``root`` (created if needed; existing files are overwritten)."""
    t0 = time.perf_counter()
    n_notes, n_digests = sizes_for(notes, target_chunks, digest_fraction)
    root = Path(root)
    needle_at = {k * NEEDLE_STRIDE + 1: k for k in range(NEEDLE_COUNT)}
    made_dirs: set[str] = set()
    total_bytes = 0
    blocks = 0
    planted: list[tuple[str, str]] = []

    def write(rel: str, text: str) -> int:
        d = rel.rsplit("/", 1)[0]
        if d not in made_dirs:
            (root / d).mkdir(parents=True, exist_ok=True)
            made_dirs.add(d)
        data = text.encode("utf-8")
        (root / rel).write_bytes(data)
        return len(data)

    for i in range(n_notes):
        sentence = None
        k = needle_at.get(i)
        if k is not None:
            query, sentence = _needle(seed, k)
            planted.append((query, note_path(i, seed)))
        text, b = _note_text(i, seed, zh_fraction, n_notes, sentence)
        total_bytes += write(note_path(i, seed), text)
        blocks += b
    for j in range(n_digests):
        text, b = _digest_text(j, seed, zh_fraction, n_notes, n_digests)
        total_bytes += write(digest_path(j, seed), text)
        blocks += b
    return GenStats(root=root, notes=n_notes, digests=n_digests, blocks=blocks,
                    bytes=total_bytes, seconds=time.perf_counter() - t0,
                    needles=tuple(planted))


class EditStream:
    """Appends a paragraph with a fresh unique token to existing daily notes.

    Each ``next()`` picks a note (seeded), appends the token as a new paragraph (an
    in-place append, as an agent writing a follow-up does) and returns the ``Edit``.
    Tokens are lowercase letters only, so every tokenizer keeps them whole.
    """

    def __init__(self, root: Path, *, seed: int = 0, subdir: str = "memory") -> None:
        self.root = Path(root)
        self._rng = random.Random(f"edits-{seed}")
        self._paths = sorted(p.relative_to(self.root).as_posix()
                             for p in (self.root / subdir).rglob("*.md"))
        if not self._paths:
            raise ValueError(f"no notes under {self.root / subdir}")
        self._count = 0

    def _token(self) -> str:
        n, letters = self._count, []
        while True:
            n, r = divmod(n, 26)
            letters.append(chr(97 + r))
            if n == 0:
                break
        salt = "".join(self._rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
        return f"qzedit{''.join(letters)}x{salt}"

    def next(self) -> Edit:
        token = self._token()
        self._count += 1
        rel = self._paths[self._rng.randrange(len(self._paths))]
        with (self.root / rel).open("a", encoding="utf-8") as f:
            f.write(f"\nFollow-up: {token} confirmed during the review.\n")
        return Edit(path=rel, token=token)

    def __iter__(self) -> Iterator[Edit]:
        while True:
            yield self.next()


def edit_stream(root: Path, *, seed: int = 0) -> Iterator[Edit]:
    """An endless stream of appended-token edits (see ``EditStream``)."""
    return iter(EditStream(root, seed=seed))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("root", type=Path)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--notes", type=int)
    g.add_argument("--chunks", type=int, help="approximate chunk count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--zh-fraction", type=float, default=0.3)
    ap.add_argument("--digest-fraction", type=float, default=0.1)
    a = ap.parse_args(argv)
    st = generate(a.root, notes=a.notes, target_chunks=a.chunks, seed=a.seed,
                  zh_fraction=a.zh_fraction, digest_fraction=a.digest_fraction)
    print(f"{st.root}: {st.notes} notes, {st.digests} digests, ~{st.blocks} chunks, "
          f"{st.bytes / 1e6:.1f} MB in {st.seconds:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
