"""What a stop waits for, told in the log when it takes more than a moment.

:func:`report_slow_stop` runs beside the stopping daemon (the supervisor starts it when a
stop begins and cancels it when the stop ends). It sleeps ``STOP_SLOW_S``, then logs the
stop's stage and what still runs: the trio tasks that have not ended (by name, counted)
and the worker threads busy with a call (trio names each after its function and task);
then again after twice as long, and so on. An operator whose stop is cut off by systemd's
``TimeoutStopSec`` thus sees in the journal what held it. It does nothing else.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import trio

log = logging.getLogger(__name__)

# A stop that has not ended after this long says what it waits for.
STOP_SLOW_S = 2.0
# Names listed per kind (tasks, threads); the others are counted.
MAX_NAMED = 8


async def report_slow_stop(stage: Callable[[], str], *, first_s: float = STOP_SLOW_S) -> None:
    """Log what the stop waits for after ``first_s``, then after each doubling of the
    time; ``stage()`` says the stop's step. Runs until cancelled (the stop's end)."""
    began = trio.current_time()
    wait = first_s
    me = trio.lowlevel.current_task()
    while True:
        await trio.sleep_until(began + wait)
        log.warning("stopping for %.0f s (%s); waiting for tasks: %s; worker threads: %s",
                    trio.current_time() - began, stage(), _listed(_running_tasks(me)),
                    _listed(_busy_threads()))
        wait *= 2


def _running_tasks(skip: trio.lowlevel.Task) -> Iterator[str]:
    """The names of the tasks that wait on something other than their own children."""
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        if task is None or task is skip:
            continue
        children = [t for n in task.child_nurseries for t in n.child_tasks]
        if children:
            todo += children
        elif not task.name.startswith(("trio.", "<")):  # trio's own (its entry queue)
            yield _short(task.name)


def _busy_threads() -> Iterator[str]:
    """Trio's worker threads running a call (idle ones are named ``Trio thread N``)."""
    for thread in threading.enumerate():
        name = thread.name
        if " from " in name and not name.startswith("Trio thread"):
            function, _, task = name.partition(" from ")
            yield f"{function} (for {_short(task)})"


def _short(name: str) -> str:
    """A task's qualified name without its module path and ``<locals>`` steps."""
    return ".".join(part for part in name.split(".")[-3:] if part != "<locals>")


def _listed(names: Iterator[str]) -> str:
    counted = Counter(names).most_common()
    if not counted:
        return "none"
    shown = [name if n == 1 else f"{name} x{n}" for name, n in counted[:MAX_NAMED]]
    more = sum(n for _, n in counted[MAX_NAMED:])
    return ", ".join(shown) + (f" and {more} more" if more else "")
