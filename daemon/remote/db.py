"""The shared workspace's rows in PostgreSQL: connecting, uploading a change, reading the feed.

Blocking psycopg 3 calls, run by the replica (:mod:`recalld.daemon.remote.replica` and its
``filesync.py``, ``searcher.py``) in worker threads (``trio.to_thread.run_sync``);
nothing here touches trio. Every call is bounded on the server side
(``statement_timeout``) and the network side (``connect_timeout``, TCP keepalives,
``tcp_user_timeout``), and the caller gives a call on a connection up after
:data:`CALL_TIMEOUT_S` (``filesync.on_conn``): a server that accepts and acknowledges
but never answers (stopped, its disk hung) gets the connection shut down under the call
(:func:`sever`), so a worker thread never waits on a dead server for long. Errors are
psycopg's or :class:`NoAnswer`; the caller treats any of them as "the server is
unavailable" (:data:`UNAVAILABLE`).

Uploading a change (:func:`upload`; :func:`upload_many` commits a run of changes to
distinct files in one transaction, each as below):

1. if the change id is already in ``recalld_changes`` the change was committed before (a
   crash came between the commit and the local bookkeeping): its recorded outcome is
   returned and nothing is written again;
2. the workspace's ``last_version`` is incremented (its row lock orders the writers of
   one workspace, so versions commit in increasing order and a reader of ``version > n``
   never misses a row committed later with a smaller version);
3. the file's row decides: no row, or the version the change was based on → ``applied``;
   the same content already there → ``same``; a deletion of a file changed since →
   ``kept`` (the change loses, nothing is lost); a file deleted since → ``applied`` (an
   edit outlives a deletion); otherwise ``conflict``: the first committed version keeps
   the path and this change is stored as a conflict copy beside it, named with the
   server's time (the transaction's ``now()``), not the host's;
4. when a host searches the workspace in the server (``search_chunked``), the file's
   chunks and postings are replaced (``chunks.replace``). The uploader makes the chunk
   rows before the transaction (:class:`ChunkPlan`, from the settings
   :func:`chunk_settings` read): masking and tokenizing a big note takes long, and the
   transaction holds the workspace row's lock every other host's upload waits on, and
   runs under :data:`CALL_TIMEOUT_S`. The transaction checks the settings again and makes
   the rows itself only where they changed meanwhile (or were not made);
5. the change id and outcome go into ``recalld_changes``; ``pg_notify`` (once per
   transaction) wakes the listeners of the workspace's channel at commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import psycopg

from recalld.daemon import dsn
from recalld.daemon.config import RemoteConfig
from recalld.daemon.remote import chunks, passfile
from recalld.daemon.remote.forms import forms_of, server_path
from recalld.daemon.remote.localfs import conflict_name
from recalld.daemon.remote.outbox import Change
from recalld.daemon.remote.schema import migrate

Outcome = Literal["applied", "same", "kept", "conflict"]
Conn = psycopg.Connection[tuple[object, ...]]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 30_000
FEED_PAGE = 500
#: A notification's payload saying vectors were stored or claims given back (``embeddings``).
VECTORS_STORED = "vectors"
#: A page of the feed ends with the file that brings its content to this size.
FEED_PAGE_BYTES = 16 << 20
#: How long a call on a connection may wait for the server (above statement_timeout:
#: the server gives up a slow statement first).
CALL_TIMEOUT_S = 45.0
#: How long the uploader may take to make one note's chunk rows before its upload
#: (``chunks.chunk_rows``, outside the transaction); a note that takes longer waits in
#: the outbox, named in status, so the notes after it go up.
PREPARE_TIMEOUT_S = 60.0
#: How long a search waits for the server before the local index answers it (a search
#: is waited on by an agent; the replica's own calls can wait longer).
SEARCH_TIMEOUT_S = 5.0
#: After a search the server left unanswered that long, how long searches go to the
#: local index at once rather than each waiting on a server that may hang (a new session
#: with the server ends it sooner).
SEARCH_PAUSE_S = 30.0


class WorkspaceGone(Exception):
    """The shared workspace's row is no longer on the server (removed there while this
    host was connected). Taken for an outage: the replica connects again, which creates
    the workspace anew under a new identity, and every host starts over with it (files
    the server lacks go up, the rest comes down), as after a restore."""

    def __init__(self, workspace_id: int) -> None:
        super().__init__(f"the shared workspace (id {workspace_id}) is no longer on the "
                         "server (removed there): every host starts over with it")


#: What the callers of these functions take for "the server is unavailable now" (a
#: schema too new, :class:`~recalld.daemon.remote.schema.SchemaTooNew`, is not: the
#: replica tells it apart).
UNAVAILABLE = (psycopg.Error, OSError, WorkspaceGone)


class NoAnswer(TimeoutError):
    """The server did not answer a call in time; its connection was shut down."""


def sever(conn: Conn) -> None:
    """Shut ``conn``'s socket down, from any thread: a call waiting on it fails at once
    (closing ``conn`` stays with the thread that uses it)."""
    try:
        fd = conn.fileno()
    except psycopg.Error:
        return  # closed already
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


class BadDsn(ValueError):
    """The configured DSN cannot be used (``daemon/dsn.py``): a fault of the configuration,
    not of the server. Its text never quotes the DSN (libpq's message does)."""


class LoginRefused(psycopg.OperationalError):
    """The server answered and refused the login it was given a password for (a wrong
    password, a role that may not log in there): not an outage, though retried as one
    (the password may be changed on either side). Its text is libpq's, which says why."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The server's answer to one uploaded change."""

    outcome: Outcome
    version: int
    stored_path: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Row:
    """One file as the server has it."""

    path: str
    data: bytes | None  # None: deleted
    hash: str | None
    version: int
    author_host: str


def connect(cfg: RemoteConfig, *, environ: dict[str, str] | None = None,
            application_name: str = "recalld") -> Conn:
    """An autocommit connection with bounded waits; the password never leaves libpq.
    BadDsn when the DSN cannot be used."""
    env = os.environ if environ is None else environ
    extra: dict[str, str] = {}
    if cfg.passfile:
        extra["passfile"] = passfile.expanded(cfg.passfile, env)
    if cfg.password_env and env.get(cfg.password_env):
        extra["password"] = env[cfg.password_env]
    try:
        dsn.params(cfg.dsn)
    except dsn.UnusableDsn as exc:
        raise BadDsn(str(exc)) from None
    conninfo = psycopg.conninfo.make_conninfo(cfg.dsn, **extra)
    try:
        return _connect(conninfo, application_name)
    except psycopg.OperationalError as exc:
        refused = LoginRefused if passfile.refused_login(exc) else psycopg.OperationalError
        unusable = passfile.unusable_password_sources(cfg, env)
        if not unusable:
            if refused is LoginRefused:
                raise LoginRefused(str(exc)) from None
            raise
        # libpq passes over such a source without a word and reports only what the
        # server then says ("no password supplied"): say which configured one it skipped.
        raise refused(f"{exc} ({'; '.join(unusable)})") from None


def _connect(conninfo: str, application_name: str) -> Conn:
    conn = psycopg.connect(
        conninfo, autocommit=True,
        connect_timeout=CONNECT_TIMEOUT_S,
        application_name=application_name, keepalives=1, keepalives_idle=10,
        keepalives_interval=5, keepalives_count=3, tcp_user_timeout=20_000,
        # The server's side of the session ends as soon as this one's, even when this
        # host vanished (power, network): its locks (a job's, the host's) go with it.
        options=(f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c tcp_keepalives_idle=10"
                 " -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
                 " -c tcp_user_timeout=20000 -c lock_timeout=0"
                 " -c idle_in_transaction_session_timeout=0"),
    )
    # Held open (the host's name, LISTEN), bounded by the settings above and the call
    # deadline: the role's or database's timeouts must not end the sessions or uploads.
    for setting, since in (("idle_session_timeout", 140000), ("transaction_timeout", 170000)):
        if conn.info.server_version >= since:
            conn.execute(f"SET {setting} = 0".encode())
    return conn


def open_workspace(conn: Conn, name: str) -> tuple[int, str]:
    """Migrate the schema if needed; the shared workspace's id (created once) and its
    identity (name, id and creation time: another server or a recreated database gives
    another identity for the same name)."""
    migrate(conn)
    find = "SELECT workspace_id, created_at FROM recalld_workspaces WHERE name = %s"
    # Only a missing row is written: a server that refuses writes can still be read.
    row = conn.execute(find, (name,)).fetchone()
    if row is None:
        with conn.transaction():
            conn.execute("INSERT INTO recalld_workspaces (name) VALUES (%s) "
                         "ON CONFLICT (name) DO NOTHING", (name,))
            row = conn.execute(find, (name,)).fetchone()
    assert row is not None
    workspace_id = int(str(row[0]))
    return workspace_id, f"{name}/{workspace_id}/{row[1]}"


#: The tables that hold a shared workspace's rows besides ``recalld_workspaces``.
WORKSPACE_TABLES = ("recalld_postings", "recalld_chunks", "recalld_embeddings",
                    "recalld_catalog", "recalld_changes", "recalld_files")


def last_version(conn: Conn, workspace_id: int) -> int:
    """The highest version the shared workspace has given out."""
    row = conn.execute("SELECT last_version FROM recalld_workspaces WHERE workspace_id = %s",
                       (workspace_id,)).fetchone()
    if row is None:
        raise WorkspaceGone(workspace_id)
    return int(str(row[0]))


def renew_identity(conn: Conn, name: str, workspace_id: int, ident: str) -> str:
    """Give the shared workspace a new identity (its creation time becomes now) unless it
    no longer is ``ident`` (another host renewed it first): every replica that synced with
    the old one starts over on its next connection. The identity now."""
    with conn.transaction():
        row = conn.execute("SELECT created_at FROM recalld_workspaces WHERE workspace_id = %s "
                           "FOR UPDATE", (workspace_id,)).fetchone()
        assert row is not None
        if f"{name}/{workspace_id}/{row[0]}" == ident:
            row = conn.execute("UPDATE recalld_workspaces SET created_at = clock_timestamp() "
                               "WHERE workspace_id = %s RETURNING created_at",
                               (workspace_id,)).fetchone()
            assert row is not None
    return f"{name}/{workspace_id}/{row[0]}"


def channel(workspace_id: int) -> str:  # schema migration 4's trigger spells it too
    return f"recalld_ws_{workspace_id}"


def listen(conn: Conn, workspace_id: int) -> None:
    conn.execute(f'LISTEN "{channel(workspace_id)}"'.encode())


def try_write(conn: Conn, workspace_id: int) -> None:
    """A write that changes nothing (the workspace row rewritten as it is, under its lock
    as an upload takes it): raises what the server says to a write of this host now (a
    read-only server, a role without the right to write)."""
    with conn.transaction():
        conn.execute("UPDATE recalld_workspaces SET last_version = last_version"
                     " WHERE workspace_id = %s", (workspace_id,))


def drain_notifies(conn: Conn) -> list[str]:
    """Consume notifications already received (without waiting); their payloads: a
    version (the feed changed, "0": the workspace removed) or :data:`VECTORS_STORED`."""
    return [n.payload for n in conn.notifies(timeout=0.0)]


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Chunk rows made before an upload (see the module docstring), under the settings
    read then: whether the workspace is searched in the server and at what chunk size.
    ``rows`` by change id; a change not in it has its rows made in the transaction."""

    search_chunked: bool
    max_chars: int
    rows: Mapping[str, list[chunks.ChunkRow]]


def chunk_settings(conn: Conn, workspace_id: int) -> tuple[bool, int]:
    """Whether the workspace's uploads write chunks (``search_chunked``), and at what
    chunk size (``chunks.workspace_max_chars``). A removed workspace writes none: the
    upload then finds it gone, and wakes the other hosts (:func:`upload_many`)."""
    row = conn.execute("SELECT search_chunked FROM recalld_workspaces WHERE workspace_id"
                       " = %s", (workspace_id,)).fetchone()
    return row is not None and bool(row[0]), chunks.workspace_max_chars(conn, workspace_id)


def upload(conn: Conn, workspace_id: int, host: str, change: Change, target: str,
           base_version: int) -> Answer:
    """Commit ``change`` (stored at ``target``) if it was based on the current version,
    with its chunks for searching in the server (at the workspace's chunk size, see
    ``remote/chunks.py``)."""
    return upload_many(conn, workspace_id, host, [(change, target, base_version)])[0]


def upload_many(conn: Conn, workspace_id: int, host: str,
                changes: Sequence[tuple[Change, str, int]],
                plan: ChunkPlan | None = None) -> list[Answer]:
    """Commit several changes, each as :func:`upload` would, in one transaction: their
    answers in order, all or none recorded. Each ``(change, target, base_version)``
    must name a target no other one in the list names (its base is this host's, not
    one an earlier change of the list is about to make). ``plan``: their chunk rows,
    made before, used where the settings are still the ones it was made under."""
    answers: list[Answer] = []
    try:
        with conn.transaction():
            notify = 0
            rows = _Rows(conn, workspace_id, plan)
            for change, target, base_version in changes:
                answer = _upload_one(conn, workspace_id, host, change, target, base_version,
                                     rows)
                answers.append(answer)
                if answer.outcome in ("applied", "conflict") and not answer.replayed:
                    notify = max(notify, answer.version)
            if notify:
                conn.execute("SELECT pg_notify(%s, %s)", (channel(workspace_id), str(notify)))
    except WorkspaceGone:
        # The other hosts still listen on the gone workspace's channel: woken, each reads
        # its feed, finds it gone and starts over now, not at its next catch-up.
        conn.execute("SELECT pg_notify(%s, %s)", (channel(workspace_id), "0"))
        raise
    return answers


class _Rows:
    """The chunk rows of an upload's changes, inside its transaction (which holds the
    workspace row's lock by the time :meth:`of` is asked): the plan's where it was made
    under the settings the transaction sees, else made here."""

    def __init__(self, conn: Conn, workspace_id: int, plan: ChunkPlan | None) -> None:
        self._conn, self._workspace_id, self._plan = conn, workspace_id, plan
        self._max_chars: int | None = None

    def of(self, change: Change, target: str) -> list[chunks.ChunkRow] | None:
        if change.data is None:
            return None
        if self._max_chars is None:
            self._max_chars = chunks.workspace_max_chars(self._conn, self._workspace_id)
        plan = self._plan
        if (plan is not None and plan.search_chunked and plan.max_chars == self._max_chars
                and change.id in plan.rows):
            return plan.rows[change.id]
        return chunks.chunk_rows(target, change.data, max_chars=self._max_chars)


def _upload_one(conn: Conn, workspace_id: int, host: str, change: Change, target: str,
                base_version: int, rows: _Rows) -> Answer:
    cid = uuid.UUID(change.id)
    done = conn.execute(
        "SELECT outcome, version, stored_path FROM recalld_changes "
        "WHERE workspace_id = %s AND change_id = %s", (workspace_id, cid)).fetchone()
    if done is not None:
        return Answer(str(done[0]), int(str(done[1])), str(done[2]),  # type: ignore[arg-type]
                      replayed=True)
    bumped = conn.execute(
        "UPDATE recalld_workspaces SET last_version = last_version + 1 WHERE workspace_id"
        " = %s RETURNING last_version, search_chunked, extract(epoch FROM now())::float8",
        (workspace_id,)).fetchone()
    if bumped is None:
        raise WorkspaceGone(workspace_id)
    version = int(str(bumped[0]))
    search_chunked = bool(bumped[1])
    # A conflict copy is named at the server's time: a host's clock may be far off (1970
    # after a boot without a clock, a year past 9999 that no date can name).
    now = float(str(bumped[2]))
    asked = target  # as this host's disk spells it
    target = server_path(conn, workspace_id, target)  # one row per name in any form
    current = conn.execute(
        "SELECT version, content_hash, deleted FROM recalld_files "
        "WHERE workspace_id = %s AND path = %s FOR UPDATE", (workspace_id, target)
    ).fetchone()
    outcome: Outcome
    stored = target
    if current is None:
        outcome = "same" if change.deleted else "applied"
        kept_version = 0
    else:
        cur_version, cur_hash, cur_deleted = int(str(current[0])), current[1], current[2]
        kept_version = cur_version
        if cur_version == base_version:
            outcome = "applied"
        elif (bool(cur_deleted) and change.deleted) or (
                not cur_deleted and not change.deleted and cur_hash == change.hash):
            outcome = "same"
        elif cur_deleted:
            outcome = "applied"
        elif change.deleted:
            outcome = "kept"
        else:
            outcome = "conflict"
            # A new note, spelt as the host spells the name it conflicts on: its copy
            # lands beside that host's file, in the folder as its disk spells it.
            stored = _free_conflict_name(conn, workspace_id, asked, now, host)
    if outcome in ("applied", "conflict"):
        _write_row(conn, workspace_id, stored, change, version, host, cid)
        if search_chunked:
            # Some host searches this workspace in the server: its chunks go along.
            chunks.replace(conn, workspace_id, stored, rows.of(change, target), version)
    else:
        version = kept_version
    conn.execute(
        "INSERT INTO recalld_changes (workspace_id, change_id, path, stored_path, outcome,"
        " version, author_host) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (workspace_id, cid, change.path, stored, outcome, version, host))
    return Answer(outcome, version, stored)


def _free_conflict_name(conn: Conn, workspace_id: int, path: str, when: float,
                        host: str) -> str:
    for attempt in range(1000):
        name = conflict_name(path, when, host, attempt)
        taken = conn.execute(
            "SELECT 1 FROM recalld_files WHERE workspace_id = %s AND path = ANY(%s) "
            "AND NOT deleted", (workspace_id, forms_of(name))).fetchone()
        if taken is None:
            return name
    raise RuntimeError(f"no free conflict copy name for {path}")


def _write_row(conn: Conn, workspace_id: int, path: str, change: Change, version: int,
               host: str, cid: uuid.UUID) -> None:
    conn.execute(
        "INSERT INTO recalld_files (workspace_id, path, content, content_hash, version,"
        " author_host, deleted, change_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (workspace_id, path) DO UPDATE SET content = EXCLUDED.content,"
        " content_hash = EXCLUDED.content_hash, version = EXCLUDED.version,"
        " author_host = EXCLUDED.author_host, deleted = EXCLUDED.deleted,"
        " change_id = EXCLUDED.change_id, changed_at = now()",
        (workspace_id, path, change.data or b"", change.hash, version, host, change.deleted,
         cid))


def _row(r: tuple[object, ...]) -> Row:
    deleted = bool(r[4])
    data = r[1]
    assert isinstance(data, bytes | memoryview)
    return Row(path=str(r[0]), data=None if deleted else bytes(data),
               hash=None if deleted else str(r[2]), version=int(str(r[3])),
               author_host=str(r[5]))


def feed(conn: Conn, workspace_id: int, after: int, limit: int = FEED_PAGE,
         max_bytes: int = FEED_PAGE_BYTES) -> list[Row]:
    """Files changed after version ``after``, oldest change first (latest state of each):
    at most ``limit``, ending with the one that brings their content to ``max_bytes``
    (so a host catching up on big notes holds a bounded page; a bigger one comes alone).
    :class:`WorkspaceGone` when there is none and the workspace was removed."""
    rows = conn.execute(
        "SELECT path, content, content_hash, version, deleted, author_host FROM ("
        " SELECT *, sum(octet_length(content)) OVER (ORDER BY version) AS upto FROM ("
        "  SELECT * FROM recalld_files WHERE workspace_id = %s AND version > %s"
        "  ORDER BY version LIMIT %s) next) page"
        " WHERE upto - octet_length(content) < %s ORDER BY version",
        (workspace_id, after, limit, max_bytes)).fetchall()
    if not rows:
        last_version(conn, workspace_id)  # nothing new, or no workspace any more
    return [_row(r) for r in rows]


def left_after(conn: Conn, workspace_id: int, page: list[Row], limit: int = FEED_PAGE,
               max_bytes: int = FEED_PAGE_BYTES) -> int:
    """How many rows of the feed follow ``page`` (0 without asking when the page was not
    cut short by either limit of :func:`feed`)."""
    if len(page) < limit and sum(len(r.data or b"") for r in page) < max_bytes:
        return 0
    r = conn.execute("SELECT count(*) FROM recalld_files WHERE workspace_id = %s"
                     " AND version > %s", (workspace_id, page[-1].version)).fetchone()
    return 0 if r is None else int(str(r[0]))


def fetch(conn: Conn, workspace_id: int, path: str) -> Row | None:
    """The row of the note a host names ``path`` (in any Unicode form: ``forms.py``)."""
    path = server_path(conn, workspace_id, path)
    r = conn.execute(
        "SELECT path, content, content_hash, version, deleted, author_host FROM recalld_files"
        " WHERE workspace_id = %s AND path = %s", (workspace_id, path)).fetchone()
    return None if r is None else _row(r)


def outside(conn: Conn, workspace_id: int, folders: Sequence[str]) -> tuple[int, str | None]:
    """How many notes of the workspace lie outside ``folders`` (which another host's
    ``daily_dir`` or ``digest_dir`` put there), and the first of them."""
    likes = [f.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"
             for f in folders]
    row = conn.execute(
        "SELECT count(*), min(path) FROM recalld_files WHERE workspace_id = %s"
        " AND NOT deleted AND NOT (path LIKE ANY(%s))", (workspace_id, likes)).fetchone()
    if row is None or not row[0]:
        return 0, None
    return int(str(row[0])), str(row[1])
