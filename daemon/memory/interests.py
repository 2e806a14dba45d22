"""``digest/interests.yaml``: interest topics with weights, refreshed by every dream.

The file is plain YAML that we write ourselves and read back in exactly that form (no YAML
library): a comment, ``updated: <date>`` and ``topics:`` followed by ``- topic: "<text>"``
/ ``  weight: <0..1>`` pairs, heaviest first. A hand-edited file that does not follow the
form is read as far as it does; unknown lines are ignored. Pure functions, no I/O.

Refreshing decays every known weight by ``DECAY`` (interests fade unless they come back),
then raises each topic seen in this run to at least its new weight, drops topics below
``MIN_WEIGHT`` and keeps the ``MAX_TOPICS`` heaviest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

from recalld.ipc.textcut import cut_text

DECAY: Final = 0.9
MIN_WEIGHT: Final = 0.05
MAX_TOPICS: Final = 50
# The value of a topic is read in Python (:func:`_topic`) and a weight's number has one
# way to match: a lazy value before ``\s*$``, or ``[0-9]*`` before ``[0-9]+``, tried
# the rest of the line again from each of its characters, by the square of its length
# (a hand-edited line of 16,000 spaces or digits took 2-6 s).
_TOPIC_RE: Final = re.compile(r"^\s*-\s*topic:(.*)$")
_WEIGHT_RE: Final = re.compile(
    r"^\s*weight:\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*$")


def _topic(line: str) -> str | None:
    """The raw value of a ``- topic:`` line: a quoted string, or a plain one holding no
    ``#``, without the spaces around it; None for any other line."""
    m = _TOPIC_RE.match(line)
    if m is None:
        return None
    raw = m.group(1).strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return raw
    return None if "#" in raw else raw


def parse_interests(text: str) -> dict[str, float]:
    topics: dict[str, float] = {}
    current: str | None = None
    for line in text.splitlines():
        raw = _topic(line)
        if raw is not None:
            try:
                current = json.loads(raw) if raw.startswith('"') else raw.strip()
            except ValueError:
                current = None
            if current:
                topics.setdefault(current, 0.0)
            continue
        w = _WEIGHT_RE.match(line)
        if w and current:
            topics[current] = min(1.0, float(w.group(1)))
    return topics


def render_interests(topics: Mapping[str, float], today: str) -> str:
    lines = ["# Interest topics, refreshed by auto_dream (weights 0..1, heaviest first).",
             f"updated: {today}", "topics:"]
    for topic, weight in sorted(topics.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  - topic: {json.dumps(topic, ensure_ascii=False)}")
        lines.append(f"    weight: {weight:.2f}")
    return "\n".join(lines) + "\n"


def refresh(old: Mapping[str, float], seen: Mapping[str, float]) -> dict[str, float]:
    """Decay ``old``, raise each topic in ``seen`` to its weight, prune."""
    merged = {t: round(w * DECAY, 2) for t, w in old.items()}
    for topic, weight in seen.items():
        topic = cut_text(" ".join(topic.split()), 80)
        if topic:
            merged[topic] = round(max(merged.get(topic, 0.0), min(1.0, weight)), 2)
    kept = sorted(((t, w) for t, w in merged.items() if w >= MIN_WEIGHT),
                  key=lambda kv: (-kv[1], kv[0]))[:MAX_TOPICS]
    return dict(kept)
