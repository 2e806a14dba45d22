"""Secrets redaction: recall on generated secrets, false positives on ordinary prose.

Two rule sets run side by side on the same inputs: ``recalld`` (the daemon's
``recalld.daemon.memory.redact``) and ``baseline`` (the rule set before the scanner-grade
one, kept in ``redact_baseline.py``).

- recall: a labelled corpus from ``redact_corpus.py`` (seeded; every secret made up in its
  issuer's format and put in a realistic sentence); an item counts as caught when none of
  its ``hide`` strings survive (the secret, its thirds, each body line of a key block,
  each pair of words of a passphrase). Reported overall and per kind.
- false positives: LoCoMo dev (each session as a daily note, one line per turn),
  CMRC 2018 passages and (when present) SciFact abstracts, cut into chunks by the
  daemon's own chunker at its chunk size and, finer, into single lines; the share of
  chunks left untouched (the target is judged on LoCoMo and CMRC). Examples of what
  was masked are listed.
- speed: characters per second over the prose (the engine must not stall indexing).

Targets: recall >= 0.97, clean prose chunks >= 99.9 %.

    .venv/bin/python tests/bench/run.py redact [--seed 7] [--per-kind 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redact_baseline
import redact_corpus
from quality_lexical import DAEMON_MAX_CHARS, locomo_notes

from recalld.daemon.index.chunker import chunk_markdown
from recalld.daemon.memory import redact as current

ROOT = Path(__file__).resolve().parents[2]
TARGET_RECALL = 0.97
TARGET_CLEAN = 0.999
Redactor = Callable[[str], str]


def data_dir(given: Path | None) -> Path:
    for candidate in (given, ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data",
                      Path("/work/shared/data")):
        if candidate is not None and (candidate / "locomo").is_dir():
            return candidate
    raise SystemExit("no data dir with locomo/ and cmrc2018/ found; pass --data")


def prose_texts(data: Path) -> dict[str, list[str]]:
    """Per set, the texts of its chunks at the daemon's chunk size and of its lines."""
    notes: dict[str, str] = {}
    for conv in json.loads((data / "locomo" / "locomo-dev.json").read_text(encoding="utf-8")):
        notes.update(locomo_notes(conv["conversation"], conv["sample_id"])[0])
    passages = []
    with (data / "cmrc2018" / "corpus.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            passages.append(f"# {doc.get('title', '')}\n\n{doc['text']}\n")
    abstracts = []
    scifact = data / "scifact" / "corpus.jsonl"
    if scifact.exists():  # not required; more prose, with gene names and numbers
        with scifact.open(encoding="utf-8") as fh:
            for line in fh:
                doc = json.loads(line)
                abstracts.append(f"# {doc.get('title', '')}\n\n{doc['text']}\n")
    out: dict[str, list[str]] = {}
    for name, docs in (("locomo", list(notes.items())),
                       ("cmrc2018", [(f"memory/c/{i}.md", t) for i, t in enumerate(passages)]),
                       ("scifact", [(f"memory/s/{i}.md", t) for i, t in enumerate(abstracts)])):
        if not docs:
            continue
        out[f"{name}_chunks"] = [c.text for path, text in docs
                                 for c in chunk_markdown(path, text, max_chars=DAEMON_MAX_CHARS)]
        out[f"{name}_lines"] = [ln for _, text in docs for ln in text.splitlines() if ln.strip()]
    return out


def recall(redactor: Redactor, items: Sequence[redact_corpus.Item]) -> dict[str, Any]:
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    missed: list[dict[str, str]] = []
    for item in items:
        out = redactor(item.text)
        caught = all(h not in out for h in item.hide)
        per_kind[item.kind][0] += caught
        per_kind[item.kind][1] += 1
        if not caught and len(missed) < 30:
            missed.append({"kind": item.kind, "text": item.text[:160], "out": out[:160]})
    caught_total = sum(c for c, _ in per_kind.values())
    return {
        "recall": round(caught_total / len(items), 4),
        "caught": caught_total, "items": len(items),
        "per_kind": {k: round(c / n, 3) for k, (c, n) in sorted(per_kind.items())},
        "missed_examples": missed,
    }


def false_positives(redactor: Redactor, sets: dict[str, list[str]]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    chars = 0
    elapsed = 0.0
    for name, texts in sets.items():
        started = time.perf_counter()
        outs = [redactor(t) for t in texts]
        elapsed += time.perf_counter() - started
        chars += sum(map(len, texts))
        hit = [(t, o) for t, o in zip(texts, outs, strict=True) if o != t]
        report[name] = {
            "chunks": len(texts), "redacted": len(hit),
            "clean_rate": round(1 - len(hit) / max(len(texts), 1), 5),
            "examples": [_diff(t, o) for t, o in hit[:5]],
        }
    report["chars_per_s"] = round(chars / elapsed) if elapsed else None
    return report


def _diff(before: str, after: str) -> str:
    """The neighbourhood of the first change."""
    i = next((k for k, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
             min(len(before), len(after)))
    return f"...{before[max(0, i - 60):i + 60]}...  =>  ...{after[max(0, i - 60):i + 60]}..."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="shared data dir (../shared/data)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--per-kind", type=int, default=8)
    args = ap.parse_args(argv)
    items = redact_corpus.generate(args.seed, args.per_kind)
    print(f"redact: {len(items)} secrets of {len(redact_corpus.KINDS)} kinds", file=sys.stderr)
    prose = prose_texts(data_dir(args.data))
    systems: dict[str, Redactor] = {"recalld": current.redact, "baseline": redact_baseline.redact}
    results: dict[str, Any] = {}
    for name, redactor in systems.items():
        print(f"redact: {name}", file=sys.stderr)
        results[name] = {"recall": recall(redactor, items),
                         "false_positives": false_positives(redactor, prose)}
    ours = results["recalld"]
    chunk_sets = [k for k in prose if k.endswith("_chunks") and not k.startswith("scifact")]
    clean = min(ours["false_positives"][k]["clean_rate"] for k in chunk_sets)
    summary = {
        "recall": ours["recall"]["recall"],
        "baseline_recall": results["baseline"]["recall"]["recall"],
        "clean_chunk_rate_min": clean,
        "baseline_clean_chunk_rate_min": min(
            results["baseline"]["false_positives"][k]["clean_rate"] for k in chunk_sets),
        "chars_per_s": ours["false_positives"]["chars_per_s"],
        "baseline_chars_per_s": results["baseline"]["false_positives"]["chars_per_s"],
    }
    report = {
        "benchmark": "redact",
        "corpus": {"seed": args.seed, "items": len(items), "kinds": len(redact_corpus.KINDS)},
        "prose": {k: len(v) for k, v in prose.items()},
        "targets": {"recall": {"min": TARGET_RECALL, "value": summary["recall"],
                               "met": summary["recall"] >= TARGET_RECALL},
                    "clean_chunks": {"min": TARGET_CLEAN, "value": clean,
                                     "met": clean >= TARGET_CLEAN}},
        "summary": summary,
        "systems": results,
    }
    json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
