"""The Prometheus text exposition format (version 0.0.4) of ``daemon.metrics`` families,
for ``recalld metrics --prometheus`` (e.g. a node-exporter textfile collector)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from recalld.ipc.answers import MetricFamily


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels_text(labels: Mapping[str, object], extra: Sequence[tuple[str, str]] = ()) -> str:
    """``{k="v",...}`` with the values escaped; empty when there are none."""
    pairs = [*((str(k), str(v)) for k, v in sorted(labels.items())), *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def number(value: object) -> str:
    """A sample value as Prometheus writes it: ``+Inf``, whole floats without ``.0``."""
    if value == "+Inf" or (isinstance(value, float) and math.isinf(value)):
        return "+Inf"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def prometheus_text(families: Sequence[MetricFamily]) -> str:
    """The text exposition format (version 0.0.4) of ``daemon.metrics`` families."""
    lines: list[str] = []
    for fam in families:
        name, kind = str(fam["name"]), str(fam["type"])
        help_ = str(fam.get("help", name)).replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for sample in fam.get("samples", []):
            labels = sample.get("labels") or {}
            if kind == "histogram":
                for le, count in sample["buckets"]:
                    lines.append(f"{name}_bucket{labels_text(labels, [('le', number(le))])} "
                                 f"{number(count)}")
                lines.append(f"{name}_sum{labels_text(labels)} {number(float(sample['sum']))}")
                lines.append(f"{name}_count{labels_text(labels)} {number(sample['count'])}")
            else:
                lines.append(f"{name}{labels_text(labels)} {number(float(sample['value']))}")
    return "\n".join(lines) + "\n"
