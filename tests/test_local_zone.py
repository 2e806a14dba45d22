"""The zone cron times are read in is the zone the C library (and so ``date.today()``, the
day of a daily note) reads ``TZ`` as, whatever form ``TZ`` takes: a zone name, a zone
file's path, a POSIX rule with half-hour, 45-minute or DST offsets, empty, or unknown."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from datetime import time as dt_time
from pathlib import Path
from typing import Any

import pytest
from clirun import run_recalld
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_job

from recalld.daemon.localzone import local_zone

ZONEINFO = "/usr/share/zoneinfo"

TZ_VALUES = [
    "Asia/Kolkata", ":Europe/Berlin", "IST-5:30", "<+0545>-5:45", "NPT-5:45",
    "<-0930>9:30", "CET-1CEST,M3.5.0,M10.5.0/3", "EST5EDT,M3.2.0,M11.1.0",
    "<+1345>-13:45<+1445>,M9.5.0/2:45,M4.1.0/3:45",
    f":{ZONEINFO}/Asia/Kathmandu", f"{ZONEINFO}/America/New_York", "", "Nowhere/Atlantis",
]


@pytest.fixture
def tz_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """``TZ`` set in this process, the C library told (and told again afterwards)."""
    try:
        yield monkeypatch
    finally:
        monkeypatch.undo()
        time.tzset()


def _instants() -> list[datetime]:
    """Every 3 hours of 2026 and 2027 (DST changes of both hemispheres included)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [start + timedelta(hours=3 * n) for n in range(2 * 365 * 8)]


@pytest.mark.parametrize("tz", TZ_VALUES)
def test_local_zone_reads_tz_as_the_c_library(tz_env: pytest.MonkeyPatch, tz: str) -> None:
    if tz.lstrip(":").startswith("/") and not os.path.exists(tz.lstrip(":")):
        pytest.skip("no zone files on this system")
    tz_env.setenv("TZ", tz)
    time.tzset()
    zone = local_zone()
    wrong = [(at, at.astimezone(zone).utcoffset(), time.localtime(at.timestamp()).tm_gmtoff)
             for at in _instants()
             if at.astimezone(zone).utcoffset() != timedelta(
                 seconds=time.localtime(at.timestamp()).tm_gmtoff)]
    assert not wrong, wrong[:3]


def test_a_daemon_in_a_posix_rule_zone_dreams_at_its_2300(daemon_factory: Any) -> None:
    daemon = daemon_factory(TZ="IST-5:30")
    ws = next(w for w in daemon.call("daemon.status")["workspaces"]
              if w["agent_id"] == "default")
    assert ws["dream"]["tz"] == "IST-5:30", ws["dream"]
    next_run = datetime.fromisoformat(ws["dream"]["next_run"])
    ist = timezone(timedelta(hours=5, minutes=30))
    assert next_run.astimezone(ist).time() == dt_time(23, 0), ws["dream"]


@pytest.mark.parametrize("tz, hours", [("<+14>-14", 14), ("<-12>12", -12)])
def test_a_note_is_dated_by_the_daemons_zone(daemon_factory: Any, tz: str,
                                             hours: int) -> None:
    # UTC+14 and UTC-12 are never on the same day: a note dated in another zone shows.
    zone = timezone(timedelta(hours=hours))
    before = datetime.now(zone).date().isoformat()
    daemon = daemon_factory(TZ=tz)
    note = daemon.call("memory.add_note", {"agent_id": "default", "content": "a fact"})
    after = datetime.now(zone).date().isoformat()
    assert note["date"] in (before, after), (note, before, after)
    assert f"/{note['date']}/" in note["path"], note


def test_status_names_the_zone_of_the_cron(daemon_factory: Any) -> None:
    # A service started in New York, looked at from a terminal in India.
    daemon = daemon_factory(TZ="America/New_York")
    next_run = datetime.fromisoformat(next(
        w for w in daemon.call("daemon.status")["workspaces"]
        if w["agent_id"] == "default")["dream"]["next_run"])
    out = run_recalld(["--socket", str(daemon.socket_path), "status"],
                      env={**daemon.env, "TZ": "Asia/Kolkata"}).stdout
    ist = next_run.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert (f"next {ist:%Y-%m-%d %H:%M} (cron 0 23 * * * in America/New_York)"
            in out), out


def test_inbox_since_is_read_in_the_terminals_zone(daemon_factory: Any, fake: FakeProvider,
                                                    tmp_path: Path) -> None:
    # The daemon in UTC-12, the terminal in UTC+14: the list shows the terminal's times,
    # and a time copied from it into --since means that moment.
    d = daemon_factory(
        f'[workspaces.w]\npath = "{tmp_path / "ws"}"\nauto_memory_interval = 0\n'
        f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "m"}}\n',
        TZ="<-12>12")
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "pets", "description": "pets", "content": "- Has a dog named Rex"})])),
        Reply(json=chat_answer("saved")))
    r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "flush": True,
                                    "messages": [{"role": "user", "content": "My dog Rex"}]})
    assert wait_job(d, r["job_id"], deadline_s=30.0)["state"] == "succeeded"
    item = d.call("inbox.list", {"agent_id": "w"})["items"][0]
    plus14 = timezone(timedelta(hours=14))
    shown = datetime.fromtimestamp(float(item["time"]), plus14).replace(tzinfo=None)

    def listed(since: datetime) -> str:
        return run_recalld(["--socket", str(d.socket_path), "inbox", "list", "--agent", "w",
                            "--since", since.isoformat(timespec="seconds")],
                           env={**d.env, "TZ": "<+14>-14"}).stdout

    assert str(item["id"]) in listed(shown - timedelta(minutes=1))
    assert str(item["id"]) not in listed(shown + timedelta(minutes=1))
