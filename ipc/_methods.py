"""The one table of daemon methods that drives the blocking and the async client.

Each builder below takes the Python arguments of one method and returns a
:class:`~recalld.ipc._call.Call`: the wire method name, its params (``None`` values left
out) and a function that turns the raw result into its typed shape. A client flavour only
knows how to run a ``Call``; :func:`~recalld.ipc._flavours.sync_method` and
:func:`~recalld.ipc._flavours.async_method` turn each builder into a bound method with the
builder's exact signature, so the two flavours cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from recalld.ipc._call import Call, _answer, _as_dict, _as_list, _listed, _mapped, _params
from recalld.ipc.answers import (
    BackupList,
    BackupSummary,
    ChangeRecord,
    DaemonStatus,
    DreamRun,
    DreamUndone,
    FileEntry,
    InboxAcked,
    InboxItem,
    IndexCompacted,
    Interests,
    JobInfo,
    JobSubmitted,
    JsonObject,
    MemoryIndex,
    Metrics,
    NoteAdded,
    Pong,
    ReadResult,
    Recall,
    Selected,
    Subscribed,
    Synced,
    TopicWritten,
    TurnsAdded,
    WorkspaceClosed,
    WorkspaceInfo,
    WorkspaceOpened,
)
from recalld.ipc.types import SearchResponse

# ---------------------------------------------------------------------------- the table


def _messages(messages: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    return [_mapped(m, f"messages[{i}]") for i, m in enumerate(_listed(messages, "messages"))]


def ping() -> Call[Pong]:
    """``daemon.ping``: a round trip that touches no workspace."""
    return Call("daemon.ping", {}, _answer(Pong))


def status() -> Call[DaemonStatus]:
    """``daemon.status``: version, uptime, pid, workspaces and queue statistics."""
    return Call("daemon.status", {}, _answer(DaemonStatus))


def workspace_open(
    agent_id: str, path: str | None = None, config: Mapping[str, object] | None = None,
    import_report: bool = False, progress_token: str | None = None, name: str | None = None,
) -> Call[WorkspaceOpened]:
    """``workspace.open``: open (or create) agent ``agent_id``'s workspace; with
    ``import_report``, once indexed, with what was found and reused of a QwenPaw workspace
    (under ``import``). ``config={}`` asks for the config file's settings alone (none:
    the ones the workspace was recorded with). ``progress_token``: see
    :meth:`Client.progress_of`. ``name``: the agent's own name ``agent_id`` was made
    of (:func:`recalld.ipc.agent_ids.workspace_id`); the daemon refuses another name
    whose id is the same."""
    return Call(
        "workspace.open",
        _params(agent_id=agent_id, path=path, name=name,
                config=_mapped(config, "config") if config is not None else None,
                import_report=import_report or None, progress_token=progress_token),
        _answer(WorkspaceOpened),
    )


def workspace_list() -> Call[list[WorkspaceInfo]]:
    """``workspace.list``: every open workspace."""
    return Call("workspace.list", {}, _as_list("workspaces", WorkspaceInfo))


def workspace_close(agent_id: str, forget: bool = False) -> Call[WorkspaceClosed]:
    """``workspace.close``: stop serving a workspace (its files stay); with ``forget`` the
    daemon also stops reopening it at start."""
    return Call("workspace.close", _params(agent_id=agent_id, forget=forget or None),
                _answer(WorkspaceClosed))


def read(
    agent_id: str, path: str, start_line: int | None = None, end_line: int | None = None,
    as_agent: str | None = None, masked: bool = False,
) -> Call[ReadResult]:
    """``memory.read``: a workspace file, or lines ``start_line..end_line`` (1-based).

    ``as_agent`` names the reader when it is not the workspace's owner; the owner's
    settings must allow it (:class:`~recalld.ipc.errors.NotAllowed` otherwise).
    ``masked``: what looks like a secret masked, as search serves it (for text that goes
    on to a model; another agent always reads so)."""
    return Call(
        "memory.read",
        _params(agent_id=agent_id, path=path, start_line=start_line, end_line=end_line,
                as_agent=as_agent, masked=masked or None),
        _answer(ReadResult),
    )


def search(
    agent_id: str,
    query: str,
    max_results: int = 5,
    min_score: float | None = None,
    filters: Mapping[str, object] | None = None,
    sync: bool = False,
    agents: Sequence[str] | None = None,
) -> Call[SearchResponse]:
    """``memory.search``: ranked hits (iterate the answer); ``sync=True`` first waits until
    every earlier file change is indexed. ``agents`` searches those workspaces instead of
    ``agent_id``'s, as agent ``agent_id`` (each hit then carries ``agent_id``)."""
    return Call(
        "memory.search",
        _params(
            agent_id=agent_id, query=query, max_results=max_results, min_score=min_score,
            filters=_mapped(filters, "filters") if filters else None, sync=sync or None,
            agents=_listed(agents, "agents") if agents is not None else None,
        ),
        SearchResponse.from_wire,
    )


def index_sync(agent_id: str) -> Call[Synced]:
    """``index.sync``: returns once every change made before the call is indexed."""
    return Call("index.sync", _params(agent_id=agent_id), _answer(Synced))


def jobs_submit(
    agent_id: str, kind: str, params: Mapping[str, object] | None = None
) -> Call[JobSubmitted]:
    """``jobs.submit``: start a job (reindex, auto_dream, ...); the result has ``job_id``."""
    return Call(
        "jobs.submit",
        _params(agent_id=agent_id, kind=kind, params=_mapped(params, "params") if params else None),
        _answer(JobSubmitted),
    )


def jobs_get(agent_id: str, job_id: str, as_agent: str | None = None) -> Call[JobInfo]:
    """``jobs.get``: state, progress, result and error of one job; ``as_agent`` names
    the reader when it is not the workspace's owner (it sees no params, result nor
    error)."""
    return Call(
        "jobs.get", _params(agent_id=agent_id, job_id=job_id, as_agent=as_agent),
        _answer(JobInfo),
    )


def jobs_list(agent_id: str | None = None) -> Call[list[JobInfo]]:
    """``jobs.list``: the jobs of ``agent_id``'s workspace and of those shared with it
    (the default agent's without one), those as a reader sees them."""
    return Call("jobs.list", _params(agent_id=agent_id), _as_list("jobs", JobInfo))


def jobs_cancel(agent_id: str, job_id: str) -> Call[JobInfo]:
    """``jobs.cancel``: ask a queued or running job to stop; the job as it is then."""
    return Call("jobs.cancel", _params(agent_id=agent_id, job_id=job_id), _answer(JobInfo))


def add_turns(
    agent_id: str,
    session_id: str,
    messages: Sequence[Mapping[str, object]],
    flush: bool = False,
    request_id: str | None = None,
) -> Call[TurnsAdded]:
    """``memory.add_turns``: hand conversation turns over for auto_memory.

    A retry with the same ``request_id`` adds nothing and returns the first answer.
    """
    return Call(
        "memory.add_turns",
        _params(agent_id=agent_id, session_id=session_id,
                messages=_messages(messages), flush=flush or None,
                request_id=request_id),
        _answer(TurnsAdded),
    )


def end_session(agent_id: str, session_id: str) -> Call[TurnsAdded]:
    """The conversation ended: its pending turns go to auto_memory now
    (``memory.add_turns`` with no messages and ``flush``); the answer carries the
    ``job_id`` when there was something to write."""
    return Call("memory.add_turns",
                _params(agent_id=agent_id, session_id=session_id, messages=[], flush=True),
                _answer(TurnsAdded))


def add_note(
    agent_id: str, content: str, session_id: str | None = None, name: str | None = None,
    description: str | None = None, author: str | None = None,
    request_id: str | None = None, dialog: bool = True,
) -> Call[NoteAdded]:
    """``memory.add_note``: append ``content`` to the agent's note of the day (one note
    per ``session_id`` and ``name``; ``author``, the writing agent, goes in its
    frontmatter for the ``author`` search filter); returns once it is searchable. With
    ``request_id`` a call sent again adds nothing twice, and content the note holds
    already is appended again; without, content the note holds is not. ``dialog=False``:
    the session's conversation is kept in no dialog log (``memory.add_turns`` is not
    given it), so the note links none."""
    return Call("memory.add_note",
                _params(agent_id=agent_id, content=content, session_id=session_id, name=name,
                        description=description, author=author, request_id=request_id,
                        dialog=None if dialog else False),
                _answer(NoteAdded))


def memory_index(
    agent_id: str, max_entries: int | None = None, as_agent: str | None = None
) -> Call[MemoryIndex]:
    """``memory.index``: names and one-line descriptions of the long-term (digest) nodes;
    ``rendered`` is a Markdown index ready for a system prompt."""
    return Call("memory.index",
                _params(agent_id=agent_id, max_entries=max_entries, as_agent=as_agent),
                _answer(MemoryIndex))


def memory_list(
    agent_id: str, prefix: str | None = None, as_agent: str | None = None,
    limit: int | None = None,
) -> Call[list[FileEntry]]:
    """``memory.list``: the workspace's Markdown files (``path``, ``size``, ``mtime``), at
    most ``limit`` of them (default and cap 10,000)."""
    return Call("memory.list",
                _params(agent_id=agent_id, prefix=prefix, as_agent=as_agent, limit=limit),
                _as_list("files", FileEntry))


def recall(
    agent_id: str, query: str | None = None,
    messages: Sequence[Mapping[str, object]] | None = None, max_results: int | None = None,
    budget_chars: int | None = None, include_index: bool = False,
    include_interests: bool = False,
) -> Call[Recall]:
    """``memory.recall``: the block to put before a reply for ``query`` (or the last user
    ``messages``): hits, their linked context and, with ``include_index`` /
    ``include_interests``, the memory index and the top interest topics, labelled with
    path and lines, in at most ``budget_chars`` (``rendered``)."""
    return Call("memory.recall",
                _params(agent_id=agent_id, query=query,
                        messages=_messages(messages) if messages is not None else None,
                        max_results=max_results, budget_chars=budget_chars,
                        include_index=include_index or None,
                        include_interests=include_interests or None),
                _answer(Recall))


def select(agent_id: str, query: str, limit: int | None = None) -> Call[Selected]:
    """``memory.select``: up to ``limit`` topic files for ``query``, chosen by the
    workspace's chat model (``method`` ``model``) or, without one, by the search."""
    return Call("memory.select", _params(agent_id=agent_id, query=query, limit=limit),
                _answer(Selected))


def interests(agent_id: str, limit: int | None = None) -> Call[Interests]:
    """``memory.interests``: the weighted interest topics each dream refreshes."""
    return Call("memory.interests", _params(agent_id=agent_id, limit=limit),
                _answer(Interests))


def topic_write(
    agent_id: str, path: str, name: str, description: str, type: str, body: str,
) -> Call[TopicWritten]:
    """``memory.topic_write``: create or replace a topic file in the digest folder
    (``type`` one of user, feedback, project, reference); MEMORY.md lists it on return."""
    return Call("memory.topic_write",
                _params(agent_id=agent_id, path=path, name=name, description=description,
                        type=type, body=body),
                _answer(TopicWritten))


def topic_edit(agent_id: str, path: str, old: str, new: str) -> Call[TopicWritten]:
    """``memory.topic_edit``: replace the one occurrence of ``old`` in a topic file."""
    return Call("memory.topic_edit", _params(agent_id=agent_id, path=path, old=old, new=new),
                _answer(TopicWritten))


def inbox_list(
    agent_id: str, since: str | None = None, include_acked: bool = False
) -> Call[list[InboxItem]]:
    """``inbox.list``: memory changes pushed to this workspace's inbox (unacked ones
    unless ``include_acked``), oldest first; ``since`` is an item id or ISO-8601 time."""
    return Call("inbox.list",
                _params(agent_id=agent_id, since=since, include_acked=include_acked or None),
                _as_list("items", InboxItem))


def inbox_ack(agent_id: str, ids: Sequence[str]) -> Call[InboxAcked]:
    """``inbox.ack``: mark inbox items as seen."""
    return Call("inbox.ack", _params(agent_id=agent_id, ids=_listed(ids, "ids")),
                _answer(InboxAcked))


def dream_runs(agent_id: str, limit: int | None = None) -> Call[list[DreamRun]]:
    """``dream.runs``: the latest auto_dream runs of a workspace, newest first (``run_id``,
    ``started``, ``trigger``, ``notes``, ``files``, ``undone``); ``limit`` defaults to 20
    (at most 200)."""
    return Call("dream.runs", _params(agent_id=agent_id, limit=limit),
                _as_list("runs", DreamRun))


def memory_changes(agent_id: str, kind: str | None = None,
                   limit: int | None = None) -> Call[list[ChangeRecord]]:
    """``memory.changes``: the change log records of the memory jobs (``auto_memory``:
    every run that changed or refused to change a note; ``auto_dream``: every dream run),
    newest first, each with ``kind``, ``run_id``, ``started`` and ``log`` (the
    workspace-relative path of its Markdown record); ``limit`` defaults to 20."""
    return Call("memory.changes", _params(agent_id=agent_id, kind=kind, limit=limit),
                _as_list("changes", ChangeRecord))


def dream_undo(agent_id: str, run_id: str, force: bool = False) -> Call[DreamUndone]:
    """``dream.undo``: restore the files one dream run changed (``restored``,
    ``removed``); refused if they changed since, unless ``force``."""
    return Call("dream.undo", _params(agent_id=agent_id, run_id=run_id, force=force or None),
                _answer(DreamUndone))


def subscribe(topics: Sequence[str], agent_id: str | None = None,
              after: JsonObject | None = None) -> Call[Subscribed]:
    """``events.subscribe``: receive ``event`` notifications for these topics, of the
    workspaces ``agent_id`` may read (its own and those shared with it); with ``after``
    (``{stream, seq}``), told how many events since then were missed."""
    return Call("events.subscribe", _params(topics=_listed(topics, "topics"),
                                            agent_id=agent_id, after=after),
                _answer(Subscribed))


def backup_create(
    agents: Sequence[str] | None = None, out: str | None = None, include_derived: bool = False,
    include_secrets: bool = False, progress_token: str | None = None,
) -> Call[BackupSummary]:
    """``backup.create``: zip the agents' Markdown, sessions, resources and resumable
    state (pending turns, inbox, dream runs; all open workspaces by default) and the
    daemon's config (secrets masked unless ``include_secrets``) and workspace record into
    ``out`` or ``<data_dir>/backups/``."""
    # An empty list goes as it is: the daemon refuses it (it selects no agent).
    selected = None if agents is None else _listed(agents, "agents")
    return Call("backup.create", _params(agents=selected, out=out,
                                         include_derived=include_derived or None,
                                         include_secrets=include_secrets or None,
                                         progress_token=progress_token),
                _answer(BackupSummary))


def backup_list() -> Call[BackupList]:
    """``backup.list``: the archives in the backups folder and the rollback record."""
    return Call("backup.list", {}, _answer(BackupList))


def backup_verify(file: str, progress_token: str | None = None) -> Call[BackupSummary]:
    """``backup.verify``: check an archive completely (structure, limits, checksums)."""
    return Call("backup.verify", _params(file=file, progress_token=progress_token),
                _answer(BackupSummary))


def backup_restore(
    file: str, agents: Sequence[str] | None = None, snapshot: bool = True,
    dry_run: bool = False, progress_token: str | None = None,
    overwrite_shared: bool = False,
) -> Call[JsonObject]:
    """``backup.restore``: validate, snapshot the current state, restore, reindex (with
    ``dry_run``: only validate and say what it would write and remove). A workspace
    shared with other hosts is restored only with ``overwrite_shared`` (the restore
    reaches every host)."""
    selected = None if agents is None else _listed(agents, "agents")  # empty: refused by the daemon
    return Call("backup.restore", _params(file=file, agents=selected,
                                          snapshot=None if snapshot else False,
                                          dry_run=True if dry_run else None,
                                          progress_token=progress_token,
                                          overwrite_shared=overwrite_shared or None),
                _as_dict)


def backup_rollback(progress_token: str | None = None,
                    overwrite_shared: bool = False) -> Call[JsonObject]:
    """``backup.rollback``: restore the snapshot taken before the last restore
    (``overwrite_shared`` as for :func:`backup_restore`)."""
    return Call("backup.rollback", _params(progress_token=progress_token,
                                           overwrite_shared=overwrite_shared or None),
                _as_dict)


def index_verify(agent_id: str) -> Call[JsonObject]:
    """``index.verify``: compare derived state with the Markdown; report differences."""
    return Call("index.verify", _params(agent_id=agent_id), _as_dict)


def index_compact(agent_id: str) -> Call[IndexCompacted]:
    """``index.compact``: merge the keyword index now and commit a generation."""
    return Call("index.compact", _params(agent_id=agent_id), _answer(IndexCompacted))


def metrics() -> Call[Metrics]:
    """``daemon.metrics``: counters, gauges and latency histograms."""
    return Call("daemon.metrics", {}, _answer(Metrics))


#: Wire name of every method above, for docs and tests.
METHODS: dict[str, str] = {
    builder.__name__: builder(*args).method
    for builder, args in (
        (ping, ()), (status, ()), (workspace_open, ("a",)), (workspace_list, ()),
        (add_note, ("a", "c")), (memory_index, ("a",)), (memory_list, ("a",)),
        (recall, ("a", "q")), (topic_write, ("a", "p", "n", "d", "user", "b")),
        (topic_edit, ("a", "p", "o", "n")), (interests, ("a",)), (select, ("a", "q")),
        (workspace_close, ("a",)), (read, ("a", "p")),
        (search, ("a", "q")),
        (index_sync, ("a",)), (jobs_submit, ("a", "k")), (jobs_get, ("a", "j")),
        (jobs_list, ()), (jobs_cancel, ("a", "j")), (add_turns, ("a", "s", [])),
        (end_session, ("a", "s")),
        (inbox_list, ("a",)), (inbox_ack, ("a", [])), (subscribe, ([],)),
        (dream_runs, ("a",)), (dream_undo, ("a", "r")), (memory_changes, ("a",)),
        (backup_create, ()), (backup_list, ()), (backup_verify, ("f",)),
        (backup_restore, ("f",)), (backup_rollback, ()), (index_verify, ("a",)),
        (index_compact, ("a",)), (metrics, ()),
    )
}
