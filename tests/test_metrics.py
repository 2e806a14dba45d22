"""The metrics registry and its Prometheus text form (no daemon needed)."""

from __future__ import annotations

import re
from pathlib import Path

from recalld.daemon.metrics import HELP, LATENCY_BUCKETS_S, Registry
from recalld.ipc.prometheus import prometheus_text


def test_histogram_buckets_are_cumulative_and_end_at_count() -> None:
    reg = Registry()
    for seconds in (0.00005, 0.003, 0.003, 0.2, 100.0):
        reg.observe("recalld_rpc_seconds", seconds, {"method": "daemon.ping"})
    reg.count("recalld_rpc_errors_total", labels={"method": "daemon.ping"})
    families = {f["name"]: f for f in reg.snapshot()}
    sample = families["recalld_rpc_seconds"]["samples"][0]
    assert sample["count"] == 5 and abs(sample["sum"] - 100.20605) < 1e-9
    bounds = [b for b, _ in sample["buckets"]]
    assert bounds == [*LATENCY_BUCKETS_S, "+Inf"]
    counts = dict((str(b), c) for b, c in sample["buckets"])
    assert counts["0.0001"] == 1 and counts["0.005"] == 3 and counts["0.25"] == 4
    assert counts["30.0"] == 4 and counts["+Inf"] == 5
    assert families["recalld_rpc_errors_total"]["samples"] == [
        {"labels": {"method": "daemon.ping"}, "value": 1.0}]


def test_prometheus_text_escapes_labels_and_types_every_family() -> None:
    reg = Registry()
    reg.observe("recalld_search_seconds", 0.002)
    reg.count("recalld_backups_total", labels={"kind": 'pre "restore"\\x\n'})
    text = prometheus_text(reg.snapshot())
    lines = text.splitlines()
    assert "# TYPE recalld_backups_total counter" in lines
    assert "# TYPE recalld_search_seconds histogram" in lines
    assert 'recalld_backups_total{kind="pre \\"restore\\"\\\\x\\n"} 1' in lines
    assert 'recalld_search_seconds_bucket{le="0.001"} 0' in lines
    assert 'recalld_search_seconds_bucket{le="0.0025"} 1' in lines
    assert 'recalld_search_seconds_bucket{le="+Inf"} 1' in lines
    assert "recalld_search_seconds_count 1" in lines
    assert any(line.startswith("recalld_search_seconds_sum 0.002") for line in lines)
    assert text.endswith("\n")


RECORDED = re.compile(r'metrics\.(?:count|observe|timed)\(\s*"([^"]+)"')


def test_every_metric_the_daemon_records_has_its_help() -> None:
    """A family recorded with no HELP entry would reach an operator with its own name as
    its help line (``# HELP recalld_x_total recalld_x_total``)."""
    daemon = Path(__file__).resolve().parent.parent / "daemon"
    recorded = {name for path in daemon.rglob("*.py")
                for name in RECORDED.findall(path.read_text(encoding="utf-8"))}
    assert {"recalld_rpc_seconds", "recalld_backups_total"} <= recorded  # the scan finds them
    assert sorted(recorded - HELP.keys()) == []
    assert all(HELP[name] != name for name in recorded)
