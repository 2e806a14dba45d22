"""Process-wide counters and latency histograms, served by ``daemon.metrics``.

Owns one :data:`REGISTRY` per daemon process; starts nothing and needs no shutdown.
Instrumented code calls :func:`observe` (a latency in seconds, a histogram sample and a
call counter) or :func:`count`; both are cheap (a dict lookup and a bisect) and never
raise, so a metric can never break the operation it measures. Names and buckets follow
Prometheus conventions (``_seconds`` histograms with cumulative ``le`` buckets), and the
wire form produced by :meth:`Registry.snapshot` is what ``recalld metrics --prometheus``
turns into the text exposition format.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypedDict

#: Latency buckets in seconds: sub-millisecond RPCs up to multi-second rebuilds.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)

# Metrics this daemon knows, with their help text. Unknown names are still accepted
# (recording never raises) and get their name as help: every name a call site records
# belongs here (tests/test_metrics.py checks the daemon's call sites).
HELP: dict[str, str] = {
    "recalld_rpc_seconds": "JSON-RPC call latency by method",
    "recalld_rpc_errors_total": "JSON-RPC calls answered with an error, by method",
    "recalld_search_seconds": "searches of one workspace's index (keyword and vector "
                              "branches, fusion): one per workspace a memory.search reads, "
                              "and those of memory.recall, memory.select and auto_dream",
    "recalld_index_apply_seconds": "time to re-read and apply one batch of changed files",
    "recalld_index_apply_files_total": "files re-read by the index update loop",
    "recalld_embed_seconds": "embedding provider calls (one embed() call, all its batches)",
    "recalld_embed_texts_total": "texts embedded by embedding calls that succeeded",
    "recalld_embed_errors_total": "embedding calls that failed",
    "recalld_chat_seconds": "chat provider calls (one completion, its retries included)",
    "recalld_chat_errors_total": "chat provider calls that failed after their retries",
    "recalld_backups_total": "backups written, by kind (manual, pre-restore snapshot)",
    "recalld_restores_total": "backup restores that completed",
    "recalld_jobs_total": "jobs ended, by kind and end state (succeeded, failed, cancelled)",
}

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Mapping[str, str] | None) -> Labels:
    if not labels:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


@dataclass(slots=True)
class _Histogram:
    """The latency buckets, sum and count of one labelled histogram."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    total: float = 0.0
    n: int = 0

    def add(self, value: float) -> None:
        # counts[i] holds samples <= LATENCY_BUCKETS_S[i]; the last slot is +Inf only.
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, value)] += 1
        self.total += value
        self.n += 1


class Sample(TypedDict):
    labels: dict[str, str]
    value: float


class HistogramSample(TypedDict):
    labels: dict[str, str]
    buckets: list[list[float | str]]  # cumulative [le, count]; the last le is "+Inf"
    sum: float
    count: int


class Family(TypedDict):
    """One metric family on the wire (``daemon.metrics``)."""

    name: str
    type: str  # counter, histogram, gauge
    help: str
    samples: list[Sample | HistogramSample]


class Registry:
    """Counters and histograms keyed by name and label set.

    Guarded by a plain lock because worker threads (embedding, apply) may record too;
    every critical section is a few dict operations.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = {}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {}
        self.started = time.time()

    def count(self, name: str, value: float = 1.0,
              labels: Mapping[str, str] | None = None) -> None:
        key = _labels(labels)
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[key] = series.get(key, 0.0) + value

    def observe(self, name: str, seconds: float,
                labels: Mapping[str, str] | None = None) -> None:
        key = _labels(labels)
        with self._lock:
            series = self._histograms.setdefault(name, {})
            hist = series.get(key)
            if hist is None:
                hist = series[key] = _Histogram()
            hist.add(max(0.0, seconds))

    def reset(self) -> None:
        with self._lock:
            self._counters.clear()
            self._histograms.clear()

    def snapshot(self) -> list[Family]:
        """Every metric family as JSON: ``{name, type, help, samples}``.

        Histogram samples carry cumulative ``buckets`` as ``[le, count]`` pairs (the last
        one ``"+Inf"``), ``sum`` and ``count``, as Prometheus defines them.
        """
        with self._lock:
            counters = {n: dict(s) for n, s in self._counters.items()}
            hists = {n: {k: (list(h.counts), h.total, h.n) for k, h in s.items()}
                     for n, s in self._histograms.items()}
        families: list[Family] = []
        for name in sorted(counters):
            families.append({
                "name": name, "type": "counter", "help": HELP.get(name, name),
                "samples": [{"labels": dict(k), "value": v}
                            for k, v in sorted(counters[name].items())],
            })
        for name in sorted(hists):
            samples: list[Sample | HistogramSample] = []
            for key, (counts, total, n) in sorted(hists[name].items()):
                cumulative = 0
                buckets: list[list[float | str]] = []
                for bound, c in zip(LATENCY_BUCKETS_S, counts, strict=False):
                    cumulative += c
                    buckets.append([bound, cumulative])
                buckets.append(["+Inf", n])
                samples.append({"labels": dict(key), "buckets": buckets, "sum": total,
                                "count": n})
            families.append({"name": name, "type": "histogram",
                             "help": HELP.get(name, name), "samples": samples})
        return families


REGISTRY = Registry()


def observe(name: str, seconds: float, labels: Mapping[str, str] | None = None) -> None:
    """Record one latency sample in seconds (never raises)."""
    try:
        REGISTRY.observe(name, seconds, labels)
    except Exception:  # noqa: S110 - a metric must never break the measured operation
        pass


def count(name: str, value: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
    """Add ``value`` to a counter (never raises)."""
    try:
        REGISTRY.count(name, value, labels)
    except Exception:  # noqa: S110 - as above
        pass


@contextmanager
def timed(name: str, labels: Mapping[str, str] | None = None) -> Iterator[None]:
    """Observe the duration of the ``with`` block, whether it succeeds or raises."""
    started = time.perf_counter()
    try:
        yield
    finally:
        observe(name, time.perf_counter() - started, labels)


def gauge(name: str, help_: str,
          samples: Sequence[tuple[Mapping[str, str], float]]) -> Family:
    """A gauge family in the snapshot's wire form (values computed by the caller)."""
    return {"name": name, "type": "gauge", "help": help_,
            "samples": [{"labels": dict(lbl), "value": v} for lbl, v in samples]}


_METHOD_LABELS: dict[str, dict[str, str]] = {}
_METHOD_LABELS_MAX = 1024


def method_labels(method: str) -> dict[str, str]:
    """The metric labels of ``method``, built once per name (bounded, never mutated)."""
    labels = _METHOD_LABELS.get(method)
    if labels is None:
        labels = {"method": method}
        if len(_METHOD_LABELS) < _METHOD_LABELS_MAX:
            _METHOD_LABELS[method] = labels
    return labels
