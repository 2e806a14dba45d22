"""Texts the embedding provider will not take, kept parked across restarts.

When the provider refuses a text (HTTP 400/413/422) or keeps failing on it while it embeds
the others (``passages.py``), the backfill parks that text's chunk for
``permanent_retry_s``. :class:`ParkedTexts` keeps those texts in the workspace's derived
state, ``<metadata_dir>/vectors/parked.log``, an append log (``store/applog.py``: one CRC'd
JSON line each) of ``{"space", "config", "h", "why", "at", "until"}``: the vector space,
a digest of the embedding config's public fields, the text's hash (``embedcache.text_hash``),
the provider's reason, and the wall-clock times it was parked and is tried again. So a
restart keeps them parked until their time instead of paying the provider (a refusal, or
a full call deadline per round) for them again.

Records of another space or another embedding config are dropped when the log is opened:
a changed provider or model config tries every parked text again at once. A text is
dropped as soon as one of its vectors is installed; the last record of a hash wins;
a text no chunk holds any more (its note deleted or edited) is dropped when the backfill
next rests; the log keeps at most :data:`MAX_RECORDS` texts (the newest). A log that cannot be
written leaves the records in memory only (logged once): parking is a saving, never
worth stopping a workspace for.

Blocking I/O: call ``open``, ``park`` and ``drop`` from a worker thread. Nothing here starts
a task.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import orjson

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.applog import AppendLog
from recalld.daemon.store.errors import StorageError
from recalld.daemon.store.fsio import FS, REAL

log = logging.getLogger(__name__)
#: Where the log lives, under the workspace's metadata directory.
PARKED_LOG = Path("vectors") / "parked.log"
#: Parked texts kept at most (the newest); an older one is tried again at its next round.
MAX_RECORDS = 4096


def config_digest(public: JsonObject) -> str:
    """A short digest of an embedding config's public fields (``spaces.public_config``)."""
    return hashlib.blake2b(orjson.dumps(public, option=orjson.OPT_SORT_KEYS),
                           digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Parked:
    """Why a text is parked, when it was, and when it is tried again (epoch seconds)."""

    why: str
    at: float
    until: float


class ParkedTexts:
    """The parked texts (by hash) of one workspace in one space and embedding config."""

    def __init__(self, path: Path, space: str, config: str, *, fs: FS = REAL) -> None:
        self.path = path
        self.space = space
        self.config = config
        self._log = AppendLog(path, fs)
        self._opened = False
        self._texts: dict[str, Parked] = {}
        #: The last write's error, None while writes work.
        self.write_error: str | None = None

    def __len__(self) -> int:
        return len(self._texts)

    def __contains__(self, text_hash: object) -> bool:
        return text_hash in self._texts

    def get(self, text_hash: str) -> Parked | None:
        return self._texts.get(text_hash)

    def newest(self) -> Parked | None:
        """The text parked last, if any."""
        return max(self._texts.values(), key=lambda p: p.at, default=None)

    def open(self) -> int:
        """Read the log: the records of this space and config; how many texts are parked.
        Records of others are dropped from the file (their texts are tried again)."""
        try:
            records, _ = self._log.open()
        except StorageError as exc:
            self._failed(exc)
            return 0
        self._opened = True
        texts: dict[str, Parked] = {}
        for rec in records:
            h, why, at, until = rec.get("h"), rec.get("why"), rec.get("at"), rec.get("until")
            if (rec.get("space") != self.space or rec.get("config") != self.config
                    or not isinstance(h, str) or not isinstance(why, str)
                    or not _is_time(at) or not _is_time(until)):
                continue
            texts.pop(h, None)
            texts[h] = Parked(why, float(at), float(until))
        self._texts = _newest(texts)
        if len(self._texts) != len(records):
            self._write(rewrite=True)
        return len(self._texts)

    def park(self, texts: Mapping[str, Parked]) -> None:
        """Park ``texts`` (hash -> why and when), persisted with one append."""
        if not texts:
            return
        for h, p in texts.items():
            self._texts.pop(h, None)
            self._texts[h] = p
        if len(self._texts) > MAX_RECORDS:
            self._texts = _newest(self._texts)
            self._write(rewrite=True)
        else:
            self._write(records=[self._record(h, p) for h, p in texts.items()])

    def drop(self, hashes: Iterable[str]) -> int:
        """Unpark ``hashes`` (their vectors are in); how many were parked."""
        gone = [h for h in hashes if self._texts.pop(h, None) is not None]
        if gone:
            self._write(rewrite=True)
        return len(gone)

    def keep(self, live: Iterable[str]) -> int:
        """Unpark every text but ``live`` (hashes of texts still in a chunk): a deleted
        note's texts do not stay on parking for good; how many were dropped."""
        return self.drop(self._texts.keys() - set(live))

    def close(self) -> None:
        self._log.close()

    def _record(self, h: str, p: Parked) -> JsonObject:
        return {"space": self.space, "config": self.config, "h": h, "why": p.why,
                "at": p.at, "until": p.until}

    def _write(self, *, rewrite: bool = False, records: list[JsonObject] | None = None) -> None:
        if not self._opened:
            return
        try:
            if rewrite:
                self._log.rewrite(self._record(h, p) for h, p in self._texts.items())
            else:
                self._log.append(records or [])
        except StorageError as exc:
            self._failed(exc)
            return
        self.write_error = None

    def _failed(self, exc: StorageError) -> None:
        if self.write_error is None:
            log.warning("parked texts %s: %s; kept in memory only until it can be written",
                        self.path, exc)
        self.write_error = str(exc)


def _is_time(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _newest(texts: dict[str, Parked]) -> dict[str, Parked]:
    """At most :data:`MAX_RECORDS` of ``texts``, the newest (insertion order is age)."""
    if len(texts) <= MAX_RECORDS:
        return texts
    return dict(list(texts.items())[-MAX_RECORDS:])


__all__ = ["MAX_RECORDS", "PARKED_LOG", "Parked", "ParkedTexts", "config_digest"]
