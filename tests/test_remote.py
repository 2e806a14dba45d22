"""Shared workspaces through a real PostgreSQL: two daemons ("two hosts") share one.

Each daemon has its own data directory, socket and workspace directory; both name the
same shared workspace on the server started by ``pg_server`` (tests/pgserver.py). Every
wait is on a condition with a generous cap.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from clirun import run_recalld
from conftest import DaemonFactory, DaemonHandle
from markers import marker
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from waits import wait_for


def config(dsn: str, name: str, host: str, extra: str = "") -> str:
    return (f'[workspaces.default]\nremote = {{ kind = "postgres", dsn = "{dsn}", '
            f'name = "{name}", host = "{host}"{extra} }}\n')


def root(d: DaemonHandle) -> Path:
    return d.data_dir / "workspaces" / "default"


def remote_status(d: DaemonHandle) -> dict[str, Any]:
    for ws in d.call("daemon.status")["workspaces"]:
        if ws["agent_id"] == "default":
            return dict(ws["remote"])
    raise AssertionError("no default workspace")


def search_paths(d: DaemonHandle, query: str) -> list[str]:
    res = d.call("memory.search", {"agent_id": "default", "query": query, "sync": True,
                                   "max_results": 20})
    return [r["path"] for r in res["results"]]


def notes(d: DaemonHandle) -> dict[str, str]:
    """Every replicated Markdown file of the workspace, path to sha256."""
    out = {}
    base = root(d)
    for top in ("memory", "digest"):
        # The daemon removes and makes folders as it applies other hosts' changes: a
        # folder or note gone between listing and reading is simply not there yet.
        for folder, dirs, files in os.walk(base / top):
            dirs.sort()
            for name in sorted(files):
                p = Path(folder, name)
                rel = p.relative_to(base)
                if name.endswith(".md") and not any(part.startswith(".") for part in rel.parts):
                    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                        out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def write(d: DaemonHandle, rel: str, text: str) -> None:
    p = root(d) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name("." + p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.rename(p)


def pair(daemon_factory: DaemonFactory, pg: PgServer, extra: str = "", settings: str = ""
         ) -> tuple[DaemonHandle, DaemonHandle, str]:
    """Two hosts, both online, of one new shared workspace: ``extra`` goes in its
    ``remote`` table, ``settings`` (TOML) after it; returns them and the workspace's name."""
    name = "t" + uuid.uuid4().hex[:12]
    a = daemon_factory(config(pg.dsn, name, "hosta", extra) + settings)
    b = daemon_factory(config(pg.dsn, name, "hostb", extra) + settings)
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    return a, b, name


def cli(d: DaemonHandle, *args: str) -> str:
    proc = run_recalld(["--socket", str(d.socket_path), *args], env=d.env)
    return proc.stdout + proc.stderr


def converged(a: DaemonHandle, b: DaemonHandle) -> bool:
    return (notes(a) == notes(b) and remote_status(a)["outbox"] == 0
            and remote_status(b)["outbox"] == 0)


def test_note_edit_rename_delete_propagate(daemon_factory: DaemonFactory,
                                           pg_server: PgServer) -> None:  # noqa: F811
    daemon_factory.preload_driver = False  # the daemon's own import of the driver
    a, b, _ = pair(daemon_factory, pg_server)
    assert "psycopg" in Path(f"/proc/{a.pid}/maps").read_text()  # the driver, on demand
    write(a, "memory/2026-07-23/commute.md", "# Commute\nbike on Mondays zebracrossing\n")
    wait_for(lambda: "memory/2026-07-23/commute.md" in search_paths(b, "zebracrossing"),
             what="note searchable on b")

    write(a, "memory/2026-07-23/commute.md", "# Commute\ntrain on Tuesdays quokkaferry\n")
    wait_for(lambda: "memory/2026-07-23/commute.md" in search_paths(b, "quokkaferry"),
             what="edit searchable on b")
    assert search_paths(b, "zebracrossing") == []

    # A rename is a delete and a create; it comes back from the other host as well.
    (root(b) / "digest" / "wiki").mkdir(parents=True, exist_ok=True)
    (root(b) / "memory/2026-07-23/commute.md").rename(root(b) / "digest/wiki/commute.md")
    wait_for(lambda: search_paths(a, "quokkaferry") == ["digest/wiki/commute.md"],
             what="rename on a")
    assert not (root(a) / "memory/2026-07-23/commute.md").exists()

    (root(a) / "digest/wiki/commute.md").unlink()
    wait_for(lambda: not (root(b) / "digest/wiki/commute.md").exists(), what="delete on b")
    assert search_paths(b, "quokkaferry") == []
    wait_for(lambda: converged(a, b), what="converged")
    # A file the replica wrote is not uploaded back as a change of its own.
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0
    # Notifications are read one way only (the driver warns when two are mixed).
    assert "not reliable" not in a.log() + b.log()


def test_concurrent_edits_keep_both_versions(daemon_factory: DaemonFactory,
                                             pg_server: PgServer) -> None:  # noqa: F811
    a, b, _ = pair(daemon_factory, pg_server)
    write(a, "digest/wiki/plan.md", "# Plan\nfirst draft\n")
    wait_for(lambda: (root(b) / "digest/wiki/plan.md").exists(), what="plan on b")
    wait_for(lambda: converged(a, b), what="converged before the edits")

    # Both hosts edit the file while b cannot reach the server: a's edit commits first.
    uploaded = remote_status(a)["uploaded"]
    b.signal(signal.SIGSTOP)
    try:
        write(b, "digest/wiki/plan.md", "# Plan\nversion of host b wombat\n")
        write(a, "digest/wiki/plan.md", "# Plan\nversion of host a koala\n")
        wait_for(lambda: remote_status(a)["uploaded"] > uploaded
                 and remote_status(a)["outbox"] == 0, what="a uploaded")
    finally:
        b.signal(signal.SIGCONT)

    def copies(d: DaemonHandle) -> list[str]:
        return sorted(p for p in notes(d) if ".sync-conflict-" in p)

    wait_for(lambda: converged(a, b) and copies(a), what="converged with a conflict copy")
    assert (root(a) / "digest/wiki/plan.md").read_text() == "# Plan\nversion of host a koala\n"
    assert (root(b) / "digest/wiki/plan.md").read_text() == "# Plan\nversion of host a koala\n"
    [copy] = copies(b)
    assert copy.startswith("digest/wiki/plan.sync-conflict-") and copy.endswith("-hostb.md")
    assert (root(b) / copy).read_text() == "# Plan\nversion of host b wombat\n"
    assert (root(a) / copy).read_text() == "# Plan\nversion of host b wombat\n"
    items = b.call("inbox.list", {"agent_id": "default"})["items"]
    assert [i["kind"] for i in items] == ["sync_conflict"]
    assert items[0]["changes"] == ["digest/wiki/plan.md", copy]
    assert a.call("inbox.list", {"agent_id": "default"})["items"] == []
    wait_for(lambda: search_paths(a, "wombat") == [copy], what="copy searchable on a")

    # A deletion that crosses an edit loses: the edit is restored where it was deleted.
    uploaded = remote_status(a)["uploaded"]
    b.signal(signal.SIGSTOP)
    try:
        (root(b) / "digest/wiki/plan.md").unlink()
        write(a, "digest/wiki/plan.md", "# Plan\nversion of host a emu\n")
        wait_for(lambda: remote_status(a)["uploaded"] > uploaded
                 and remote_status(a)["outbox"] == 0, what="a uploaded")
    finally:
        b.signal(signal.SIGCONT)
    wait_for(lambda: converged(a, b)
             and (root(b) / "digest/wiki/plan.md").exists(), what="edit restored on b")
    assert (root(b) / "digest/wiki/plan.md").read_text() == "# Plan\nversion of host a emu\n"
    # The host whose deletion lost is told why the note came back; the other is not.
    items = b.call("inbox.list", {"agent_id": "default"})["items"]
    assert [(i["kind"], i["changes"]) for i in items] == [
        ("sync_conflict", ["digest/wiki/plan.md", copy]),
        ("sync_restored", ["digest/wiki/plan.md"])], items
    assert items[1]["details"]["path"] == "digest/wiki/plan.md"
    assert "deleted here but changed on another host first" in items[1]["summary"]
    assert a.call("inbox.list", {"agent_id": "default"})["items"] == []


def test_notes_with_the_longest_names_replicate_and_conflict(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # File names of up to 255 bytes are valid: the replica's temp files and conflict
    # copies beside them must fit too (Latin and a multi-byte script).
    a, b, _ = pair(daemon_factory, pg_server)

    def put(d: DaemonHandle, rel: str, text: str) -> None:  # in place: no room for a temp name
        (root(d) / rel).parent.mkdir(parents=True, exist_ok=True)
        (root(d) / rel).write_text(text, encoding="utf-8")

    long_names = ["memory/2026-07-23/" + "l" * 252 + ".md",
                  "digest/wiki/" + "长" * 84 + ".md"]
    for i, rel in enumerate(long_names):
        put(a, rel, f"# Long\nlongname{i} first\n")
    write(a, "memory/2026-07-23/after.md", "# After\nwritten after the long ones\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 3, what="long names on b")
    assert remote_status(b)["state"] == "online", remote_status(b)

    uploaded = remote_status(a)["uploaded"]
    b.signal(signal.SIGSTOP)
    try:
        for i, rel in enumerate(long_names):
            put(b, rel, f"# Long\nlongname{i} of host b\n")
            put(a, rel, f"# Long\nlongname{i} of host a\n")
        wait_for(lambda: remote_status(a)["uploaded"] >= uploaded + 2
                 and remote_status(a)["outbox"] == 0, what="a uploaded")
    finally:
        b.signal(signal.SIGCONT)

    def copies(d: DaemonHandle) -> list[str]:
        return sorted(p for p in notes(d) if ".sync-conflict-" in p)

    wait_for(lambda: converged(a, b) and len(copies(a)) == 2, what="both conflict copies")
    for copy in copies(b):
        assert len(copy.rpartition("/")[2].encode()) <= 255 and copy.endswith("-hostb.md")
        assert "of host b" in (root(a) / copy).read_text()
    for rel in long_names:
        assert "of host a" in (root(b) / rel).read_text()


def test_a_change_the_replica_cannot_apply_is_failing_not_offline(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # b has a folder where a's note arrives: a fault of b's files, not of the server.
    a, b, _ = pair(daemon_factory, pg_server)
    (root(b) / "digest/wiki/plan.md").mkdir(parents=True)
    write(a, "digest/wiki/plan.md", "# Plan\nblocked on b\n")
    wait_for(lambda: remote_status(b)["state"] == "failing", what="b failing")
    status = remote_status(b)
    assert "plan.md" in str(status["last_error"]), status
    assert list(status["blocked"]) == ["digest/wiki/plan.md"], status
    # Only that file waits: what a writes afterwards reaches b, and b's own notes go up.
    write(a, "memory/2026-07-24/after.md", "# After\nwritten after the blocked one\n")
    write(b, "memory/2026-07-24/fromb.md", "# From b\nb still uploads\n")
    wait_for(lambda: (root(b) / "memory/2026-07-24/after.md").exists()
             and (root(a) / "memory/2026-07-24/fromb.md").exists(), what="the rest flows")
    assert remote_status(b)["state"] == "failing"
    shown = cli(b, "status")
    assert re.search(r"remote: +failing, outbox 0 ", shown), shown
    assert "reachable" not in shown and "must be written" in shown, shown
    assert "digest/wiki/plan.md" in shown.split("must be written")[0].rsplit("\n", 1)[-1]
    assert remote_status(a)["state"] == "online"
    # The folder gone, the replica catches up by itself.
    (root(b) / "digest/wiki/plan.md").rmdir()
    wait_for(lambda: converged(a, b) and remote_status(b)["state"] == "online",
             what="b online again")
    assert (root(b) / "digest/wiki/plan.md").read_text() == "# Plan\nblocked on b\n"


def test_offline_keeps_serving_then_converges(daemon_factory: DaemonFactory,
                                              pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    write(a, "memory/2026-07-20/base.md", "# Base\nshared before the outage\n")
    wait_for(lambda: converged(a, b) and "memory/2026-07-20/base.md" in notes(b))

    pg_server.stop()
    try:
        for d in (a, b):
            wait_for(lambda d=d: remote_status(d)["state"] == "offline", what="offline")
        # Both keep serving and accepting writes; the outbox holds them.
        for i in range(3):
            write(a, f"memory/2026-07-21/a{i}.md", f"# A{i}\noffline note {marker(i, 'alpaca')}\n")
            write(b, f"memory/2026-07-21/b{i}.md", f"# B{i}\noffline note {marker(i, 'bison')}\n")
        (root(b) / "memory/2026-07-20/base.md").unlink()
        b.call("memory.add_note", {"agent_id": "default", "content": "added through rpc ibex",
                                   "name": "rpcnote"})
        assert search_paths(a, marker(1, "alpaca")) == ["memory/2026-07-21/a1.md"]
        assert search_paths(b, "ibex")
        wait_for(lambda: remote_status(a)["outbox"] == 3, what="a's queue")
        wait_for(lambda: remote_status(b)["outbox"] == 5, what="b's queue")
        # A note saved again and again keeps two versions in the outbox, not one a save:
        # the one that goes up first and the latest.
        outbox = root(a) / "mem_metadata/remote/outbox.log"
        for i in range(6):
            text = f"# A0\noffline note {marker(0, 'alpaca')} saved {i} times\n"
            write(a, "memory/2026-07-21/a0.md", text)
            queued = base64.b64encode(text.encode()).decode()
            wait_for(lambda q=queued: q in outbox.read_text(), what=f"save {i} queued")
        assert remote_status(a)["outbox"] == 4
        shown = cli(b, "status")
        assert re.search(r"remote: +offline, outbox 5 ", shown), shown
        assert "shared workspace default" in cli(b, "doctor")
        # Work done once for all hosts waits for the server rather than running twice.
        job = finished_job(a, "auto_dream")
        assert job["error_code"] == -32003 and "is offline" in str(job["error"]), job
    finally:
        pg_server.start()

    # Equal files may come before the end of a catch-up that reads this host's own rows.
    wait_for(lambda: converged(a, b)
             and remote_status(a)["behind"] == remote_status(b)["behind"] == 0,
             what="converged after the outage")
    files = notes(a)
    assert "memory/2026-07-20/base.md" not in files
    assert {f"memory/2026-07-21/a{i}.md" for i in range(3)} <= files.keys()
    assert {f"memory/2026-07-21/b{i}.md" for i in range(3)} <= files.keys()
    assert any(p.endswith("rpcnote.md") for p in files)
    wait_for(lambda: search_paths(a, marker(2, "bison")) == ["memory/2026-07-21/b2.md"])
    wait_for(lambda: search_paths(b, marker(0, "alpaca")) == ["memory/2026-07-21/a0.md"])
    assert (root(b) / "memory/2026-07-21/a0.md").read_text() == (
        f"# A0\noffline note {marker(0, 'alpaca')} saved 5 times\n")
    assert changes_of(pg_server, name, "memory/2026-07-21/a0.md") == 2


def changes_by(pg: PgServer, name: str, host: str) -> tuple[int, int]:
    """(changes recorded, distinct change ids) that ``host`` committed to ``name``."""
    import psycopg

    with psycopg.connect(pg.dsn) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT c.change_id) FROM recalld_changes c JOIN "
            "recalld_workspaces w USING (workspace_id) WHERE w.name = %s AND c.author_host = %s",
            (name, host)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def changes_of(pg: PgServer, name: str, path: str) -> int:
    """How many changes of ``path`` were uploaded to ``name``."""
    import psycopg

    with psycopg.connect(pg.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM recalld_changes c JOIN recalld_workspaces w "
            "USING (workspace_id) WHERE w.name = %s AND c.path = %s", (name, path)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_kill_during_upload_and_catch_up_changes_nothing(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    b.stop()
    n = 400
    for i in range(n):
        text = f"# N{i}\nbulk note {i} {marker(i, 'yak')}\n"
        write(a, f"memory/2026-07-{10 + i % 20:02d}/n{i}.md", text)
    # kill -9 while uploading, then again at once after the restart.
    wait_for(lambda: remote_status(a)["uploaded"] > 20, what="a uploading")
    a.kill()
    cfg_a = config(pg_server.dsn, name, "hosta")
    a = daemon_factory(cfg_a, RECALLD_DATA_DIR=str(a.data_dir))
    a.kill()
    a = daemon_factory(cfg_a, RECALLD_DATA_DIR=str(a.data_dir))
    wait_for(lambda: remote_status(a)["outbox"] == 0 and remote_status(a)["state"] == "online",
             what="a uploaded everything")
    expected = notes(a)
    assert len(expected) == n
    # Every file went up exactly once: one recorded change per file, none twice.
    assert changes_by(pg_server, name, "hosta") == (n, n)

    # kill -9 of b while it catches up: with some files written, then with more.
    cfg_b = config(pg_server.dsn, name, "hostb")
    during = []
    for at_least in (1, n // 3):
        b = daemon_factory(cfg_b, RECALLD_DATA_DIR=str(b.data_dir))
        wait_for(lambda b=b, k=at_least: len(notes(b)) >= k, what="b catching up")
        b.kill()
        during.append(len(notes(b)))
    assert min(during) < n, f"no kill landed during the catch-up: {during}"
    b = daemon_factory(cfg_b, RECALLD_DATA_DIR=str(b.data_dir))
    wait_for(lambda: converged(a, b), what="converged after kills")
    assert notes(b) == expected
    # Nothing b received went back up as a change of its own.
    assert changes_by(pg_server, name, "hostb") == (0, 0)
    assert remote_status(b)["conflicts"] == 0
    wait_for(lambda: search_paths(b, marker(399, "yak")) == ["memory/2026-07-29/n399.md"])


def finished_job(d: DaemonHandle, kind: str) -> dict[str, Any]:
    job_id = d.call("jobs.submit", {"agent_id": "default", "kind": kind})["job_id"]
    return dict(wait_for(lambda: (lambda j: j if j["state"] in ("succeeded", "failed")
                                  else None)(d.call("jobs.get", {"agent_id": "default",
                                                                 "job_id": job_id})),
                         what=f"{kind} finished"))


def test_dream_and_resource_run_on_one_host_at_a_time(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    import psycopg

    from recalld.daemon.remote import locks

    a, _b, name = pair(daemon_factory, pg_server)
    with psycopg.connect(pg_server.dsn, autocommit=True,
                         application_name="recalld hostc auto_dream") as other:
        row = other.execute("SELECT workspace_id FROM recalld_workspaces WHERE name = %s",
                            (name,)).fetchone()
        assert row is not None
        for kind in ("auto_dream", "auto_resource"):
            other.execute("SELECT pg_advisory_lock(%s, %s)", locks.job_lock_key(row[0], kind))
            job = finished_job(a, kind)
            assert job["state"] == "failed", job
            assert f"{kind} of shared workspace {name} is running on hostc" in str(job["error"])
            assert job["error_code"] == -32002
            other.execute("SELECT pg_advisory_unlock(%s, %s)", locks.job_lock_key(row[0], kind))
    # With the lock free the job runs (and needs a chat model, which these hosts lack).
    job = finished_job(a, "auto_dream")
    assert "no chat model configured" in str(job["error"]), job
    assert finished_job(a, "auto_resource")["state"] == "succeeded"


def vectors_of(d: DaemonHandle) -> dict[str, Any]:
    for ws in d.call("daemon.status")["workspaces"]:
        if ws["agent_id"] == "default":
            return dict(ws["index"]["vectors"])
    raise AssertionError("no default workspace")


@pytest.mark.slow
def test_each_text_is_embedded_once_for_all_hosts(daemon_factory: DaemonFactory,
                                                  pg_server: PgServer) -> None:  # noqa: F811
    from collections import Counter

    from fakes.provider_server import FakeProvider

    n = 1000  # enough for both hosts to be embedding the same texts at the same time
    with FakeProvider(dims=8, api_key="k") as fake:
        vec = (f'embedding_model_config = {{ backend = "openai", base_url = "{fake.url}/v1", '
               'api_key = "k", model_name = "m", dimensions = 8 }\n')
        a, b, _ = pair(daemon_factory, pg_server, settings=vec)
        # Written on both hosts at once, so both index (and want vectors) concurrently.
        for i in range(n):
            write(a if i % 2 else b, f"memory/2026-07-{1 + i % 28:02d}/v{i}.md",
                  f"# V{i}\nshared vector note {marker(i)} end\n")

        def done(d: DaemonHandle) -> bool:
            v = vectors_of(d)
            return v["total"] == n and v["embedded"] == n
        wait_for(lambda: done(a) and done(b), what="every chunk embedded")
        asked: Counter[str] = Counter()
        for req in fake.requests:
            if req.path.endswith("/embeddings"):
                for text in req.json["input"]:
                    asked[text] += 1
        ours = {t: c for t, c in asked.items() if "shared vector note" in t}
        assert len(ours) == n, len(ours)
        assert max(ours.values()) == 1, [t for t, c in ours.items() if c > 1][:5]
        shared = remote_status(a)["vectors"]["shared"] + remote_status(b)["vectors"]["shared"]
        assert shared >= n, (remote_status(a)["vectors"], remote_status(b)["vectors"])
        res = b.call("memory.search", {"agent_id": "default", "query": marker(7), "sync": True})
        assert res["mode"] == "hybrid"


def test_pointing_a_replica_at_another_shared_workspace_starts_over(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    first, second = "t" + uuid.uuid4().hex[:12], "t" + uuid.uuid4().hex[:12]
    a = daemon_factory(config(pg_server.dsn, first, "hosta"))
    wait_for(lambda: remote_status(a)["state"] == "online", what="online")
    write(a, "digest/wiki/kept.md", "# Kept\nmoves with the replica\n")
    wait_for(lambda: remote_status(a)["uploaded"] >= 1 and remote_status(a)["outbox"] == 0)
    a.stop()
    a = daemon_factory(config(pg_server.dsn, second, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    b = daemon_factory(config(pg_server.dsn, second, "hostb"))
    wait_for(lambda: (root(b) / "digest/wiki/kept.md").exists(), what="file in the new one")
    wait_for(lambda: converged(a, b), what="converged")
    assert "every local file goes up again" in a.log()
