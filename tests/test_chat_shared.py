"""One chat provider seen once by the daemon: the workspaces sending to one endpoint with
one key share its circuit breaker and Retry-After wait, and are woken together when it
answers again.

A real daemon with several workspaces, a real socket, a scripted OpenAI-compatible chat
server on 127.0.0.1 that refuses (503, 429 with Retry-After) until the test lets it
answer. Requests are counted at the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply
from test_auto_memory import done, turn, write_note
from test_capture import notes
from waits import wait_for, wait_job


def flushed(d: Any, i: int, text: str) -> str:
    """:func:`flush` of a new turn: the id of the job that covers it."""
    job_id = flush(d, i, text)
    assert job_id is not None
    return job_id


def many(tmp_path: Path, fake: FakeProvider, keys: list[str], *, idle_s: float = 600.0,
         timeout_s: float = 60.0, models: tuple[str, ...] = (), breaker_s: float = 5.0) -> str:
    """A daemon config of one workspace ``w<i>`` per key, all on ``fake``'s URL, with
    model ``models[i]`` (``m`` past them)."""
    text = "[daemon]\ngraceful_timeout_s = 5\n"
    for i, key in enumerate(keys):
        text += (f'[workspaces.w{i}]\npath = "{tmp_path / f"ws{i}"}"\n'
                 f"auto_memory_interval = 50\nauto_memory_idle_s = {idle_s}\n"
                 f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "{key}", '
                 f'model_name = "{(models[i:] or ("m",))[0]}", timeout_s = {timeout_s}, '
                 f"breaker_open_s = {breaker_s}}}\n")
    return text


def flush(d: Any, i: int, text: str = "") -> str | None:
    """Add a turn (none when ``text`` is empty) to session s1 of ``w<i>`` and flush it:
    the job id (None when no turn is pending)."""
    job_id: str | None = d.call("memory.add_turns", {
        "agent_id": f"w{i}", "session_id": "s1", "messages": turn(text) if text else [],
        "flush": True}).get("job_id")
    return job_id


def sent(fake: FakeProvider, *, text: str | None = None, key: str | None = None) -> int:
    """Chat requests the fake was sent (holding ``text``, with ``key``)."""
    return sum(1 for r in list(fake.requests) if r.path.endswith("/chat/completions")
               and (text is None or text in str(r.json))
               and (key is None or r.headers.get("authorization") == f"Bearer {key}"))


def answer_with_a_note(body: Any) -> Reply:
    """A note, then done once its tool result is back."""
    if body["messages"][-1]["role"] == "tool":
        return done()
    return write_note("mate", "- Le gusta el mate amargo")


@pytest.mark.slow
def test_an_outage_costs_the_same_requests_whatever_the_number_of_workspaces(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Each workspace had its own breaker: every one of them sent its five attempts
    # to a provider already known down, twelve workspaces sixty requests.
    n = 10
    d = daemon_factory(many(tmp_path, fake, ["sk-Zq9-shared"] * n))
    fake.reply_for = lambda body: Reply(status=503)
    assert wait_job(d, flushed(d, 0, "Mi perro se llama Ñandú."), agent="w0")["state"] == "failed"
    first = sent(fake)
    assert first >= 1
    jobs = [flushed(d, i, f"Ich wohne in Köln, Nummer {i}.") for i in range(1, n)]
    ended = [wait_job(d, job_id, agent=f"w{i}") for i, job_id in enumerate(jobs, 1)]
    assert {j["state"] for j in ended} == {"failed"}, ended
    # The breaker opened by w0's failures holds every other workspace's call; at most
    # its single half-open probes went out meanwhile (one per open period: 5, 10, 20 s).
    assert sent(fake) - first <= 3, sent(fake) - first
    listed = d.call("workspace.list")
    views = [ws["chat"] for ws in listed["workspaces"] if ws["agent_id"] != "default"]
    assert len(views) == n  # each workspace's view, of the one breaker
    assert all(v["breaker"]["consecutive_failures"] >= 5 for v in views), views
    assert "Zq9" not in str(listed) + str(d.call("daemon.status"))


@pytest.mark.slow
def test_a_retry_after_holds_the_same_key_only(daemon_factory: Any, fake: FakeProvider,
                                               tmp_path: Path) -> None:
    # A 429 with Retry-After told to one workspace did not hold back the others on the
    # same key and model; another key on the same URL has its own quota and is not held.
    d = daemon_factory(many(tmp_path, fake, ["key-a", "key-a", "key-b", "key-a"],
                            timeout_s=20.0, models=("m", "m", "m", "m-mini")))
    fake.reply_for = lambda body: (Reply(status=429, headers={"Retry-After": "300"})
                                   if "gatos" in str(body) else answer_with_a_note(body))
    assert wait_job(d, flushed(d, 0, "Tengo dos gatos."), agent="w0")["state"] == "failed"
    held = wait_job(d, flushed(d, 1, "Она живёт в Казани."), agent="w1")
    assert held["state"] == "failed", held
    assert "Retry-After" in held["error"], held["error"]
    assert sent(fake, text="Казани") == 0
    other = wait_job(d, flushed(d, 2, "彼は京都に住んでいる。"), agent="w2")
    assert other["state"] == "succeeded", other
    assert sent(fake, text="京都", key="key-b") == 2
    assert notes(tmp_path / "ws2")
    assert sent(fake, key="key-b") == sent(fake, text="京都")
    # Another model on the same key: rate limits are per model, so is the wait.
    mini = wait_job(d, flushed(d, 3, "Ο σκύλος μου λέγεται Άργος."), agent="w3")
    assert mini["state"] == "succeeded", mini
    assert notes(tmp_path / "ws3")


@pytest.mark.slow
def test_the_provider_answering_again_wakes_every_workspace_waiting_on_it(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # After an outage each session waited out its own retry delay (here ten minutes, up
    # to an hour): turns were written long after the provider answered again.
    n = 4
    d = daemon_factory(many(tmp_path, fake, ["k"] * n, breaker_s=1.0))
    fake.reply_for = lambda body: Reply(status=503)
    jobs = [flushed(d, i, f"Vivo en Montevideo desde {2000 + i}.") for i in range(n)]
    for i, job_id in enumerate(jobs):
        assert wait_job(d, job_id, agent=f"w{i}")["state"] == "failed"
    fake.reply_for = answer_with_a_note

    def w0_written() -> bool:
        # Flushed until a call of w0's gets through (the breaker's probe).
        job_id = flush(d, 0)
        if job_id is None:  # written between two looks
            return True
        state: str = d.call("jobs.get", {"agent_id": "w0", "job_id": job_id})["state"]
        return state == "succeeded"

    wait_for(w0_written, "w0's turns written once the provider answers", poll_s=0.5)
    # Nobody flushes the others: they are woken by the provider answering w0.
    wait_for(lambda: all(notes(tmp_path / f"ws{i}") for i in range(1, n)),
             "every workspace's turns written soon after the provider answers",
             deadline_s=60.0)
    for i in range(1, n):
        assert "mate" in notes(tmp_path / f"ws{i}")[0].read_text()


@pytest.mark.slow
def test_workspaces_held_by_one_outage_do_not_all_queue_a_run_for_its_probe(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Sessions of several workspaces held by one open breaker were all looked at again
    # when it turned half-open: each queued a run, one of them was the probe and every
    # other one failed at once, refused unsent (one more failed job per workspace and
    # probe).
    n = 4
    d = daemon_factory(many(tmp_path, fake, ["k"] * n, idle_s=0.02, breaker_s=1.0))
    fake.reply_for = lambda body: Reply(status=503)
    for i in range(n):
        d.call("memory.add_turns", {"agent_id": f"w{i}", "session_id": "s1",
                                    "messages": turn(f"Nací en Rosario en {1990 + i}.")})

    def breaker() -> dict[str, Any]:
        listed = d.call("workspace.list")["workspaces"]
        found: dict[str, Any] = next(w for w in listed if w["agent_id"] == "w0")["chat"]
        return found["breaker"]

    def failed() -> list[str]:
        return [str(j["error"]) for i in range(n)
                for j in d.call("jobs.list", {"agent_id": f"w{i}"})["jobs"]
                if j["kind"] == "auto_memory" and j["state"] == "failed"]

    wait_for(lambda: breaker()["open_for_s"] >= 4, "two failed probes")
    refused = [e for e in failed() if "circuit open" in e]
    # At most the runs already queued when the breaker first opened.
    assert len(refused) <= n - 1, refused
    fake.reply_for = answer_with_a_note
    wait_for(lambda: all(notes(tmp_path / f"ws{i}") for i in range(n)),
             "every workspace's turns written at the breaker's next probe",
             deadline_s=60.0)
