"""auto_resource jobs and the files cataloged around their end: a file the watcher finds
while a job is ending has a job of its own. A real daemon, a real resource folder, the
scripted chat model."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider
from hooks import start_hook
from test_dream import ScriptedModel, write
from test_resource import active_jobs, catalog, open_ws, wait_state
from waits import wait_for

#: Start hook lines: the first auto_resource job to succeed is held as its end is journaled
#: (its handler has returned: it looks for work no more, and is still running) until a
#: writer opened the FIFO $HOLD and closed it; $HELD is made once it is held, $REFUSED once
#: an auto_resource job was then refused because that one runs.
END_HELD = (
    "import pathlib, trio",
    "from recalld.daemon.jobjournal import JobJournal",
    "from recalld.daemon.jobs import JobManager",
    "from recalld.ipc.errors import AlreadyRunning",
    "real_append, real_submit, first = JobJournal.append, JobManager.submit, [True]",
    "async def held_append(self, record, retained):",
    "    if (record['kind'] == 'auto_resource' and record['state'] == 'succeeded'",
    "            and first.pop() if first else False):",
    "        pathlib.Path(os.environ['HELD']).touch()",
    "        await trio.to_thread.run_sync(lambda: open(os.environ['HOLD'], 'rb').read())",
    "    await real_append(self, record, retained)",
    "async def told_submit(self, agent_id, kind, params=None):",
    "    try:",
    "        return await real_submit(self, agent_id, kind, params)",
    "    except AlreadyRunning:",
    "        if kind == 'auto_resource' and os.path.exists(os.environ['HELD']):",
    "            pathlib.Path(os.environ['REFUSED']).touch()",
    "        raise",
    "JobJournal.append, JobManager.submit = held_append, told_submit",
)


def _daemon_held_at_a_job_end(daemon_factory: DaemonFactory, tmp_path: Path,
                              lines: tuple[str, ...]) -> DaemonHandle:
    """A daemon started with the hook ``lines`` (:data:`END_HELD` or a variant), its FIFO
    and marks in ``tmp_path``."""
    os.mkfifo(tmp_path / "hold")
    return daemon_factory(**start_hook(tmp_path, *lines), HOLD=str(tmp_path / "hold"),
                          HELD=str(tmp_path / "held"), REFUSED=str(tmp_path / "refused"))


def _write_while_the_job_ends(tmp_path: Path, root: Path, rel: str, text: str) -> None:
    """Once the first job is held at its end, write ``rel``; once a job for it was
    refused (that one runs), let the first end."""
    try:
        wait_for((tmp_path / "held").exists, "the first job held at its end")
        write(root, rel, text)
        wait_for((tmp_path / "refused").exists, "a job refused while the first ends")
    finally:
        with open(tmp_path / "hold", "wb"):
            pass


def test_a_file_cataloged_while_a_job_ends_is_interpreted(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # The job has looked for work for the last time; its end is being journaled when the
    # file comes: the job refused as one runs, the file is still taken up once it ended.
    root = tmp_path / "ws"
    d = _daemon_held_at_a_job_end(daemon_factory, tmp_path, END_HELD)
    ScriptedModel(fake)
    write(root, "resource/Tagesordnung.md", "Punkt 1: Haushalt 2027.\n")
    open_ws(d, "ending", root, fake)
    _write_while_the_job_ends(tmp_path, root, "resource/2025-10-02/付録 B.txt",
                              "予算案の付録、第2版。\n")
    wait_state(root, "resource/2025-10-02/付録 B.txt", "processed")
    wait_for(lambda: not active_jobs(d, "ending", "auto_resource"))
    entries = catalog(root)
    assert [e["state"] for e in entries.values()] == ["processed", "processed"], entries
    assert entries["resource/2025-10-02/付録 B.txt"]["note"].startswith("memory/2025-10-02/")


def test_a_file_cataloged_while_a_job_fails_is_taken_up(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # No chat model: the job marks the files it finds pending and fails. A file cataloged
    # while that failure is journaled is refused a job (one runs), and has one once it
    # ended: it is pending too, not left queued until some other file changes.
    root = tmp_path / "ws"
    lines = tuple(line.replace("'succeeded'", "'failed'") for line in END_HELD)
    d = _daemon_held_at_a_job_end(daemon_factory, tmp_path, lines)
    write(root, "resource/Protokoll.md", "Sitzung vom 3. März: Beschlüsse.\n")
    open_ws(d, "failing", root, None)
    _write_while_the_job_ends(tmp_path, root, "resource/2025-10-02/Приложение 1.csv",
                              "статья;сумма\nаренда;1200\n")
    wait_state(root, "resource/2025-10-02/Приложение 1.csv", "pending")
    wait_for(lambda: not active_jobs(d, "failing", "auto_resource"))
    jobs = [j for j in d.call("jobs.list", {"agent_id": "failing"})["jobs"]
            if j["kind"] == "auto_resource"]
    assert [j["state"] for j in jobs] == ["failed", "failed"], jobs
    entries = catalog(root)
    assert [e["state"] for e in entries.values()] == ["pending", "pending"], entries
