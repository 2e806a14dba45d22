"""Progress of long work as a person or a script wants it, on stderr.

One renderer, :class:`Progress`, for jobs (followed by ``job.*`` events) and for the
long calls that report ``call.progress`` events on their own connection (backup,
restore, rollback, import; :func:`following`). Three forms: a bar redrawn in place on a
terminal (counts, bytes, phase, rate and ETA); a plain line every ``LINE_INTERVAL_S``
seconds, at each phase change and when a phase completes, when stderr is a file or a
pipe; one JSON object per update with ``--json``, so stdout keeps only the result. The
rate is measured within a phase, from the first update that phase reported.
:class:`IndexingNotice` says what a call that waits for indexing is waiting for.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import orjson

from recalld.ipc.answers import JOB_TERMINAL_STATES, DaemonStatus
from recalld.ipc.client import Client
from recalld.ipc.errors import RecalldError
from recalld.ipc.types import visible

Mode = Literal["bar", "lines", "json"]
BAR_WIDTH = 24
MIN_BAR_WIDTH = 8  # narrower, the drawn bar is left out
LINE_INTERVAL_S = 5.0
#: A rate (and so an ETA) is measured over at least this long since its phase's first
#: reading: readings sent together (a phase's start and its first counts) arrive within
#: microseconds, and a rate over that says millions a second and "ETA 0:00" at 0%.
MIN_RATE_SPAN_S = 1.0


@dataclass(frozen=True, slots=True)
class Reading:
    """One update: what the job said and what follows from the ones before."""

    state: str
    phase: str
    done: int | None
    total: int | None
    rate_per_s: float | None
    eta_s: float | None
    bytes_done: int | None = None
    bytes_total: int | None = None

    @property
    def fraction(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return min(max(self.done / self.total, 0.0), 1.0)


def _columns(stream: TextIO) -> int | None:
    """The columns a line may take on the terminal ``stream`` writes to, one short of
    its width (a line that fills the last column wraps on some terminals); None when
    the width cannot be told."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):  # not a terminal, a closed one, or no descriptor
        return None
    return columns - 1 if columns > 1 else None


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    return f"{hours}:{minutes:02d}:{s:02d}" if hours else f"{minutes}:{s:02d}"


class Progress:
    """Turns a job's ``state`` and ``progress`` updates into output on ``stream``."""

    def __init__(self, stream: TextIO, kind: str, job_id: str | None, *, mode: Mode,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.kind = kind
        self.job_id = job_id
        self.mode = mode
        self._clock = clock
        self._phase: str | None = None
        self._phase_start: tuple[float, int] | None = None  # (time, done) of the phase
        self._last_line = float("-inf")
        self._last: Reading | None = None
        self._drawn = False

    def read(self, state: str, progress: object) -> Reading:
        """The reading for an update (tracking rate and ETA per phase)."""
        p = progress if isinstance(progress, Mapping) else {}
        done, total = _count(p.get("done")), _count(p.get("total"))
        phase = str(p.get("message") or state)
        now = self._clock()
        if phase != self._phase or self._phase_start is None or done is None:
            self._phase = phase
            self._phase_start = (now, done or 0)
        start_t, start_done = self._phase_start
        rate = eta = None
        if done is not None and now - start_t >= MIN_RATE_SPAN_S and done > start_done:
            rate = (done - start_done) / (now - start_t)
            if total is not None and total >= done:
                eta = (total - done) / rate
        return Reading(state, phase, done, total, rate, eta, _count(p.get("bytes_done")),
                       _count(p.get("bytes_total")))

    def update(self, state: str, progress: object) -> None:
        if state in JOB_TERMINAL_STATES and self.mode != "bar":
            return  # the result (or the error line) says how it ended
        reading = self.read(state, progress)
        last = self._last
        changed_phase = last is None or reading.phase != last.phase
        completed = (reading.total is not None and reading.done == reading.total and (
            changed_phase or last is None or last.done != reading.done))
        if self.mode == "json" and last is not None and (
                reading.state, reading.phase, reading.done, reading.total,
                reading.bytes_done) == (last.state, last.phase, last.done, last.total,
                                        last.bytes_done):
            return  # nothing new to tell a script
        self._last = reading
        if self.mode == "json":
            self._json(reading)
        elif self.mode == "bar":
            # Kept within the terminal's width: a line that wraps is not redrawn in place
            # (a carriage return goes back to its last row), each update leaving a copy.
            width = _columns(self.stream)
            line = self.text(reading, bar=True, width=width)
            self.stream.write("\r" + (line.ljust(79)[:200] if width is None
                                      else line[:width].ljust(width)))
            self._drawn = True
        elif changed_phase or completed or self._clock() - self._last_line >= LINE_INTERVAL_S:
            self._last_line = self._clock()
            self.stream.write(self.text(reading, bar=False) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line (the result follows on its own line)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def text(self, r: Reading, *, bar: bool, width: int | None = None) -> str:
        """The update as a line; ``width``: the columns a bar may take (its drawn part
        shrinks, or goes, so the counts, rate and ETA fit)."""
        parts = [self.kind]
        fraction = r.fraction
        if r.done is not None and r.total:
            parts.append(f"{r.done:,}/{r.total:,} ({fraction or 0:.0%})")
        elif r.done:
            parts.append(f"{r.done:,} done")
        if r.bytes_total:
            parts.append(f"{size(r.bytes_done or 0)}/{size(r.bytes_total)}")
        parts.append(r.phase if r.phase == r.state else f"{r.phase} ({r.state})")
        if r.rate_per_s is not None:
            parts.append(f"{r.rate_per_s:,.1f}/s")
        if r.eta_s is not None:
            parts.append(f"ETA {duration(r.eta_s)}")
        if bar:
            text = visible(" ".join(parts))
            cells = BAR_WIDTH if width is None else min(BAR_WIDTH, width - len(text) - 3)
            if fraction is not None and cells >= MIN_BAR_WIDTH:
                filled = int(fraction * cells)
                parts.insert(1, f"[{'#' * filled}{'.' * (cells - filled)}]")
            return visible(" ".join(parts))
        who = self.kind if self.job_id is None else f"{self.kind} {self.job_id}"
        return visible(f"{who}: " + " ".join(parts[1:]))

    def _json(self, r: Reading) -> None:
        record = {"event": "progress", "job_id": self.job_id, "kind": self.kind,
                  "state": r.state, "phase": r.phase, "done": r.done, "total": r.total,
                  "bytes_done": r.bytes_done, "bytes_total": r.bytes_total,
                  "rate_per_s": None if r.rate_per_s is None else round(r.rate_per_s, 3),
                  "eta_s": None if r.eta_s is None else round(r.eta_s, 1)}
        self.stream.write(orjson.dumps(record).decode() + "\n")


class IndexingNotice:
    """While a call waits for indexing (``search --sync``, a first build), say on stderr
    what the indexing is doing: after ``after_s``, then every ``LINE_INTERVAL_S``, read
    from the daemon's status over a second connection by a helper thread. Stops (and
    joins the thread) on exit."""

    def __init__(self, socket_path: Path, agent_id: str, stream: TextIO, *,
                 after_s: float = 2.0, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self.agent_id = agent_id
        self.stream = stream
        self.after_s = after_s
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recalld-indexing-notice",
                                        daemon=True)

    def __enter__(self) -> IndexingNotice:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def line(self, status: DaemonStatus) -> str | None:
        ws = next((w for w in status.get("workspaces") or []
                   if w.get("agent_id") == self.agent_id), None)
        if ws is None:
            return None
        idx = ws.get("index") or {}
        reasons = (ws.get("health") or {}).get("reasons") or []
        what = "; ".join(reasons) or f"{idx.get('pending_changes', 0)} change(s) pending"
        return (f"recalld: waiting for the index of {self.agent_id}: {what} "
                f"({idx.get('files', 0):,} file(s) indexed so far)")

    def _run(self) -> None:
        if self._stop.wait(self.after_s):
            return
        try:
            with Client(self.socket_path, timeout_s=self.timeout_s) as client:
                while not self._stop.is_set():
                    text = self.line(client.status())
                    if text is not None and not self._stop.is_set():
                        self.stream.write(text + "\n")
                        self.stream.flush()
                    if self._stop.wait(LINE_INTERVAL_S):
                        return
        except (RecalldError, OSError, TimeoutError):
            return  # only a notice: the waiting call reports real failures


def _goes_on(why: str, kind: str, after: str | None) -> str:
    """What became of a call the client stopped waiting for (see :func:`following`)."""
    if after is None:
        return f"{why}; nothing was changed"
    return (f"{why}; the {kind} goes on in the daemon and finishes by itself"
            + (f" ({after})" if after else ""))


@contextmanager
def following(client: Client, kind: str, *, as_json: bool, stream: TextIO | None = None,
              after: str | None = "") -> Iterator[str]:
    """A fresh ``progress_token`` for one long call made inside the block; the call's
    ``call.progress`` events are drawn by a :class:`Progress` on ``stream`` (stderr) in
    the form its reader wants. The daemon is reached first (a ping when not connected
    yet), so a daemon that is down is one error line, not a progress line and then the
    error. Ctrl-C stops waiting, not the call: the daemon finishes it, and the
    KeyboardInterrupt says so (``after``: how to see the outcome; None for a call that
    changes nothing, a dry run); so does the TimeoutError of a call that outlasts the
    client's timeout."""
    if not client.connected:
        client.ping()
    out = stream if stream is not None else sys.stderr
    mode: Mode = "json" if as_json else "bar" if out.isatty() else "lines"
    progress = Progress(out, kind, None, mode=mode)
    token = os.urandom(8).hex()

    def show(event: Mapping[str, object]) -> None:
        progress.update("running", {
            "message": event.get("phase"), "done": event.get("done"),
            "total": event.get("total"), "bytes_done": event.get("bytes_done"),
            "bytes_total": event.get("bytes_total")})

    with client.progress_of(token, show):
        try:
            yield token
        except KeyboardInterrupt:
            progress.close()
            raise KeyboardInterrupt(_goes_on("interrupted", kind, after)) from None
        except TimeoutError as exc:
            progress.close()
            raise TimeoutError(_goes_on(str(exc), kind, after)
                               + "; a longer --timeout waits for it") from None
        finally:
            progress.close()
