"""The shared workspace's schema and upload rules, against a real PostgreSQL."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from waits import wait_for

from recalld.daemon.config import RemoteConfig
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS
from recalld.daemon.remote import chunks, db, leftovers, schema
from recalld.daemon.remote.localfs import content_hash
from recalld.daemon.remote.outbox import Change


@pytest.fixture
def conn(pg_server: PgServer) -> Iterator[db.Conn]:  # noqa: F811
    c = db.connect(RemoteConfig(dsn=pg_server.dsn, name="x"))
    try:
        yield c
    finally:
        c.close()


def change(path: str, text: str | None, when: float = 1_700_000_000.0) -> Change:
    data = None if text is None else text.encode()
    return Change(str(uuid.uuid4()), path, data, None if data is None else content_hash(data),
                  when)


def server_stamp(conn: db.Conn) -> str:
    """The server's time now as a conflict copy's name says it."""
    row = conn.execute("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC',"
                       " 'YYYYMMDD-HH24MISS')").fetchone()
    assert row is not None
    return str(row[0])


def test_migrations_are_recorded_and_run_once(conn: db.Conn) -> None:
    schema.migrate(conn)
    assert schema.migrate(conn) == []
    versions = [r[0] for r in conn.execute(
        "SELECT version FROM recalld_schema_migrations ORDER BY version").fetchall()]
    assert versions == [m.version for m in schema.MIGRATIONS]
    assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'"
                        ).fetchone() is not None


def test_a_newer_schema_is_refused(conn: db.Conn) -> None:
    schema.migrate(conn)
    with conn.transaction():
        conn.execute("INSERT INTO recalld_schema_migrations (version, name) VALUES (999, 'x')")
        with pytest.raises(schema.SchemaTooNew, match="version 999"):
            schema.migrate(conn)
        raise psycopg.Rollback()


def test_a_daemon_that_waited_for_another_s_migration_finds_its_tables(
        pg_server: PgServer) -> None:  # noqa: F811
    # Two daemons (or two workspaces of one) meet an empty database at once: the one that
    # waits for the migration lock then sees the tables the other made, and makes none.
    database = "m" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}".encode())
    cfg = RemoteConfig(dsn=pg_server.dsn.rsplit("/", 1)[0] + "/" + database, name="x")
    first, second = db.connect(cfg), db.connect(cfg)
    outcome: list[object] = []

    def migrate_second() -> None:
        try:
            outcome.append(schema.migrate(second))
        except psycopg.Error as exc:
            outcome.append(exc)

    try:
        with first.transaction():
            first.execute("SELECT pg_advisory_xact_lock(%s, %s)", schema.MIGRATION_LOCK)
            waiter = threading.Thread(target=migrate_second)
            waiter.start()
            wait_for(lambda: first.execute(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
                "pid = %s", (second.info.backend_pid,)).fetchone(),
                what="the second session waiting for the migration lock")
            assert schema.migrate(first) == [m.version for m in schema.MIGRATIONS]
        waiter.join()
        assert outcome == [[]]
        assert schema.migrate(second) == []
    finally:
        first.close()
        second.close()
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {database} WITH (FORCE)".encode())


def test_a_migration_a_role_may_not_run_names_the_tables_owner(
        pg_server: PgServer) -> None:  # noqa: F811
    # An older recalld made the schema as one role; this host logs in as another that
    # may read and write the tables but, not owning them, not alter them.
    database, role = "m" + uuid.uuid4().hex[:12], "r" + uuid.uuid4().hex[:12]
    base = pg_server.dsn.rsplit("/", 1)[0]
    # The last migration that is not optional (an optional one is skipped instead).
    last = [m for m in schema.MIGRATIONS if not m.optional][-1]
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}".encode())
        admin.execute(f"CREATE ROLE {role} LOGIN".encode())
    try:
        with psycopg.connect(f"{base}/{database}", autocommit=True) as owner:
            owner.execute("CREATE TABLE recalld_schema_migrations (version integer PRIMARY "
                          "KEY, name text NOT NULL, applied_at timestamptz DEFAULT now())")
            for m in schema.MIGRATIONS[:schema.MIGRATIONS.index(last)]:
                owner.execute(m.sql.encode())
                owner.execute("INSERT INTO recalld_schema_migrations (version, name) VALUES"
                              " (%s, %s)", (m.version, m.name))
            owner.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                          f"public TO {role}".encode())
        with db.connect(RemoteConfig(dsn=f"{base}/{database}".replace(
                "postgres@", f"{role}@", 1), name="x")) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
                schema.migrate(conn)
        said = str(info.value)
        assert (f"schema is at version {last.version - 1} and needs migration "
                f"{last.version} ({last.name}), which only the owner of its tables "
                "(postgres) may run: must be owner of table") in said, said
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {database} WITH (FORCE)".encode())
            admin.execute(f"DROP ROLE {role}".encode())


def test_upload_rules(conn: db.Conn) -> None:
    name = "rules-" + uuid.uuid4().hex[:8]
    ws, ident = db.open_workspace(conn, name)
    assert db.open_workspace(conn, name) == (ws, ident)
    p = "memory/2026-07-23/a.md"
    first = change(p, "one")
    a1 = db.upload(conn, ws, "ha", first, p, 0)
    assert (a1.outcome, a1.stored_path) == ("applied", p)
    # The same change again (a crash before it was marked done) is answered, not applied.
    again = db.upload(conn, ws, "ha", first, p, 0)
    assert (again.outcome, again.version, again.replayed) == ("applied", a1.version, True)
    a2 = db.upload(conn, ws, "ha", change(p, "two"), p, a1.version)
    assert a2.outcome == "applied" and a2.version > a1.version
    # Based on an old version: the first committed keeps the path, this one is a copy,
    # named at the server's time whatever the host's clock says (1970 after a boot
    # without a clock, a year no date can name).
    before = server_stamp(conn)
    c = db.upload(conn, ws, "hb", change(p, "three", when=0.0), p, a1.version)
    c2 = db.upload(conn, ws, "hb", change(p, "four", when=253_402_300_800.0), p, a1.version)
    after = server_stamp(conn)
    assert (c.outcome, c2.outcome) == ("conflict", "conflict")
    stamp, stamp2 = (x.stored_path.removeprefix("memory/2026-07-23/a.sync-conflict-")[:15]
                     for x in (c, c2))
    assert before <= stamp <= stamp2 <= after, (before, c, c2, after)
    assert c.stored_path == f"memory/2026-07-23/a.sync-conflict-{stamp}-hb.md"
    # A second copy in the same second takes a counter.
    assert c2.stored_path == (f"memory/2026-07-23/a.sync-conflict-{stamp2}-hb"
                              f"{'-1' if stamp2 == stamp else ''}.md")
    # Identical content is no change; a stale delete loses to a newer edit.
    assert db.upload(conn, ws, "hb", change(p, "two"), p, a1.version).outcome == "same"
    assert db.upload(conn, ws, "hb", change(p, None), p, a1.version).outcome == "kept"
    row = db.fetch(conn, ws, p)
    assert row is not None and row.data == b"two" and row.version == a2.version
    # A delete based on the current version applies; an edit outlives a delete.
    d = db.upload(conn, ws, "ha", change(p, None), p, a2.version)
    assert d.outcome == "applied"
    assert db.upload(conn, ws, "hb", change(p, "five"), p, a2.version).outcome == "applied"
    feed = db.feed(conn, ws, 0)
    assert [r.version for r in feed] == sorted(r.version for r in feed)
    assert {r.path for r in feed} == {p, c.stored_path, c2.stored_path}


def test_a_run_of_changes_is_answered_as_one_by_one_in_one_transaction(
        conn: db.Conn, pg_server: PgServer) -> None:  # noqa: F811
    ws, _ = db.open_workspace(conn, "run-" + uuid.uuid4().hex[:8])
    held = "digest/wiki/held.md"
    h1 = db.upload(conn, ws, "ha", change(held, "first"), held, 0)
    gone = "digest/wiki/gone.md"
    g1 = db.upload(conn, ws, "ha", change(gone, "was here"), gone, 0)
    replay = change("memory/2026-07-01/r.md", "again")
    r1 = db.upload(conn, ws, "hb", replay, replay.path, 0)
    listener = db.connect(RemoteConfig(dsn=pg_server.dsn, name="x"))
    try:
        db.listen(listener, ws)
        run = [
            (change("memory/2026-07-01/new.md", "fresh"), "memory/2026-07-01/new.md", 0),
            (change(held, "stale edit", when=0.0), held, 0),  # based on nothing
            (replay, replay.path, 0),  # committed before: answered from the record
            (change(gone, None), gone, 0),  # a stale delete of a file edited since
            (change("digest/wiki/same.md", None), "digest/wiki/same.md", 0),
        ]
        answers = db.upload_many(conn, ws, "hb", run)
        assert [a.outcome for a in answers] == ["applied", "conflict", "applied", "kept", "same"]
        assert re.fullmatch(r"digest/wiki/held\.sync-conflict-\d{8}-\d{6}-hb\.md",
                            answers[1].stored_path), answers[1]
        assert "-1970" not in answers[1].stored_path
        assert answers[2] == db.Answer("applied", r1.version, replay.path, replayed=True)
        assert answers[3].version == g1.version
        assert answers[1].version > answers[0].version > h1.version
        # One notification for the transaction, naming its last version.
        notes = wait_for(lambda: list(listener.notifies(timeout=0.5, stop_after=1)),
                         "the notification")
        assert [n.payload for n in notes] == [str(answers[1].version)]
        assert db.drain_notifies(listener) == []
    finally:
        listener.close()
    # A run that fails on the server records none of its changes.
    ok = change("memory/2026-07-02/ok.md", "fine")
    bad = change("memory/2026-07-02/bad\0.md", "a path the server cannot store")
    with pytest.raises(db.UNAVAILABLE):
        db.upload_many(conn, ws, "hb", [(ok, ok.path, 0), (bad, bad.path, 0)])
    assert db.fetch(conn, ws, ok.path) is None
    assert db.upload(conn, ws, "hb", ok, ok.path, 0) == db.Answer(
        "applied", db.fetch(conn, ws, ok.path).version, ok.path)  # type: ignore[union-attr]


def test_notifications_reach_a_listener(conn: db.Conn, pg_server: PgServer) -> None:  # noqa: F811
    ws, _ = db.open_workspace(conn, "notify-" + uuid.uuid4().hex[:8])
    listener = db.connect(RemoteConfig(dsn=pg_server.dsn, name="x"))
    try:
        db.listen(listener, ws)
        assert db.drain_notifies(listener) == []
        db.upload(conn, ws, "ha", change("digest/wiki/n.md", "x"), "digest/wiki/n.md", 0)
        got = wait_for(lambda: sum(1 for _ in listener.notifies(timeout=0.5, stop_after=1)),
                       "the notification")
        assert got == 1
    finally:
        listener.close()


def test_vectors_stored_or_claims_given_back_notify_the_workspace(
        conn: db.Conn, pg_server: PgServer) -> None:  # noqa: F811
    # A host waiting for vectors another host claimed is woken when they are stored, or
    # the claims given back (it then claims them), not by asking again and again; the
    # notification says the feed did not change.
    from recalld.daemon.remote import embeddings

    ws, _ = db.open_workspace(conn, "vectors-" + uuid.uuid4().hex[:8])
    listener = db.connect(RemoteConfig(dsn=pg_server.dsn, name="x"))
    try:
        db.listen(listener, ws)
        assert embeddings.get_or_claim(conn, ws, "s", ["h1", "h2"], "ha")[1] == ["h1", "h2"]
        assert embeddings.get_or_claim(conn, ws, "s", ["h1", "h2"], "hb") == ({}, [])
        got: list[str] = []
        embeddings.store(conn, ws, "s", [("h1", [1.0, 0.0])])
        wait_for(lambda: got.extend(db.drain_notifies(listener)) or got, "stored said")
        embeddings.release(conn, ws, "s", ["h2"], "ha")
        wait_for(lambda: got.extend(db.drain_notifies(listener)) or len(got) > 1,
                 "given back said")
        assert got == [db.VECTORS_STORED, db.VECTORS_STORED]
        found, mine = embeddings.get_or_claim(conn, ws, "s", ["h1", "h2"], "hb")
        assert list(found) == ["h1"] and mine == ["h2"]
    finally:
        listener.close()


def test_a_page_of_the_feed_is_bounded_by_its_content(conn: db.Conn) -> None:
    # A host catching up on big notes holds one page of the feed at a time: a page ends
    # with the file that brings its content to max_bytes (a bigger file comes alone).
    ws, _ = db.open_workspace(conn, "pages-" + uuid.uuid4().hex[:8])
    sizes = [600, 5, 600, 3000, 0, 600]
    for i, size in enumerate(sizes):
        p = f"memory/2026-07-23/n{i}.md"
        db.upload(conn, ws, "ha", change(p, "x" * size), p, 0)
    gone = "memory/2026-07-23/n1.md"
    db.upload(conn, ws, "ha", change(gone, None), gone, 2)
    pages, after = [], 0
    while rows := db.feed(conn, ws, after, max_bytes=1000):
        pages.append([r.path[-5:-3] for r in rows])
        assert sum(len(r.data or b"") for r in rows[:-1]) < 1000
        after = rows[-1].version
    assert pages == [["n0", "n2"], ["n3"], ["n4", "n5", "n1"]]
    assert [r.path for r in db.feed(conn, ws, 0)] == [  # the default holds them all
        f"memory/2026-07-23/n{i}.md" for i in (0, 2, 3, 4, 5, 1)]


def test_what_follows_a_page_of_the_feed_is_counted_when_it_was_cut(conn: db.Conn) -> None:
    # A host far behind shows how many changes it has still to pull (status "behind").
    ws, _ = db.open_workspace(conn, "left-" + uuid.uuid4().hex[:8])
    for i, size in enumerate([10, 10, 900, 10, 10]):
        p = f"digest/wiki/w{i}.md"
        db.upload(conn, ws, "ha", change(p, "y" * size), p, 0)
    page = db.feed(conn, ws, 0, limit=2)
    assert db.left_after(conn, ws, page, limit=2) == 3
    page = db.feed(conn, ws, page[-1].version, max_bytes=500)  # ends with the 900 bytes
    assert [r.path for r in page] == ["digest/wiki/w2.md"]
    assert db.left_after(conn, ws, page, max_bytes=500) == 2
    last = db.feed(conn, ws, page[-1].version)
    assert len(last) == 2 and db.left_after(conn, ws, last) == 0


def test_a_removed_workspace_s_rows_go_in_batches_and_what_stays_is_said(
        conn: db.Conn) -> None:
    name = "forget-" + uuid.uuid4().hex[:8]
    ws, ident = db.open_workspace(conn, name)
    for i in range(25):
        p = f"memory/2026-02-0{i % 9 + 1}/n{i}.md"
        db.upload(conn, ws, "ha", change(p, f"note {i}"), p, 0)
    # The server cancels a statement deleting more than 10 of its changes, as
    # statement_timeout does a long one, and may not delete its files at all.
    fn, trig = f"cancel_{name.replace('-', '_')}", f"t_{name.replace('-', '_')}"
    conn.execute(f"""CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF TG_TABLE_NAME = 'recalld_files'
             AND EXISTS (SELECT 1 FROM gone WHERE workspace_id = {ws}) THEN
            RAISE EXCEPTION 'permission denied' USING ERRCODE = 'insufficient_privilege';
          END IF;
          IF (SELECT count(*) FROM gone WHERE workspace_id = {ws}) > 10 THEN
            RAISE EXCEPTION 'statement timeout' USING ERRCODE = 'query_canceled';
          END IF;
          RETURN NULL;
        END $$""".encode())
    try:
        for table in ("recalld_changes", "recalld_files"):
            conn.execute(f"CREATE TRIGGER {trig} AFTER DELETE ON {table} REFERENCING OLD "
                         f"TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {fn}()".encode())
        conn.execute("DELETE FROM recalld_workspaces WHERE workspace_id = %s", (ws,))
        new_ws, _ = db.open_workspace(conn, name)
        assert leftovers.forget_removed(conn, ident, new_ws, batch=10) is None  # files stay
        left = {t: conn.execute(f"SELECT count(*) FROM {t} WHERE workspace_id = %s".encode(),
                                (ws,)).fetchone() for t in ("recalld_changes", "recalld_files")}
        assert left == {"recalld_changes": (0,), "recalld_files": (25,)}, left
        conn.execute(f"DROP TRIGGER {trig} ON recalld_files".encode())
        assert leftovers.forget_removed(conn, ident, new_ws, batch=10) == 25  # tried again
        assert conn.execute("SELECT count(*) FROM recalld_files WHERE workspace_id = %s",
                            (ws,)).fetchone() == (0,)
        # Not this replica's to delete: the workspace is there, or it is the new one.
        assert leftovers.forget_removed(conn, f"{name}/{new_ws}/x", new_ws) == 0
    finally:
        conn.execute(f"DROP FUNCTION {fn} CASCADE".encode())


def chunk_texts(conn: db.Conn, ws: int, path: str) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "SELECT text FROM recalld_chunks WHERE workspace_id = %s AND path = %s ORDER BY seq",
        (ws, path)).fetchall()]


def test_chunk_rows_made_before_an_upload_count_only_under_the_settings_it_finds(
        conn: db.Conn) -> None:
    ws, _ = db.open_workspace(conn, "plan-" + uuid.uuid4().hex[:8])
    assert db.chunk_settings(conn, ws) == (False, DEFAULT_MAX_CHARS)
    chunks.start_chunking(conn, ws, max_chars=300)
    assert db.chunk_settings(conn, ws) == (True, 300)
    text = "# Plan\n\n" + "\n\n".join(f"Part {i}: the heron waits by the weir." * 4
                                      for i in range(12)) + "\n"
    made_before = [chunks.ChunkRow(0, 1, 1, "", "made before", "h", None, ["before"], [1], 1)]
    # Made under the settings the transaction finds: stored as made.
    kept = change("digest/wiki/kept.md", text)
    db.upload_many(conn, ws, "ha", [(kept, kept.path, 0)],
                   db.ChunkPlan(True, 300, {kept.id: made_before}))
    assert chunk_texts(conn, ws, kept.path) == ["made before"]
    # Made at another size, or before the workspace was chunked, or not made: the
    # transaction makes them at the workspace's size.
    fresh = [r.text for r in chunks.chunk_rows("digest/wiki/x.md", text.encode(),
                                               max_chars=300)]
    assert len(fresh) > 1
    for i, plan in enumerate([lambda c: db.ChunkPlan(True, 200, {c.id: made_before}),
                              lambda c: db.ChunkPlan(False, 300, {c.id: made_before}),
                              lambda c: db.ChunkPlan(True, 300, {}),
                              lambda c: None]):
        other = change(f"digest/wiki/other-{i}.md", text)
        db.upload_many(conn, ws, "ha", [(other, other.path, 0)], plan(other))
        assert chunk_texts(conn, ws, other.path) == fresh, i
