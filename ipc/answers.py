"""The shapes of the daemon's answers, as the client libraries type them.

Each TypedDict says what one method answers (the daemon builds the same keys, and
``tests/test_answers.py`` holds the two sides together). Nothing is checked at run time:
an answer is the decoded JSON object, so a key a newer daemon adds is simply there too.
Objects whose contents are open (job params and results, workspace settings, the status
each service reports) are :data:`JsonObject`.
"""

# Annotations are evaluated, not postponed: a TypedDict compiles each string
# annotation into a ForwardRef at import, which every client process would pay.
from typing import Any, Final, Literal, NotRequired, TypedDict

from recalld.ipc.disks import DiskSpace

#: A JSON object as it crosses the socket: the one name for what is left open (params as
#: decoded or passed through, job params and results, user metadata, the status sections
#: of a workspace that each service fills). The daemon uses the same alias
#: (``recalld.daemon.jsontypes``).
JsonObject = dict[str, Any]


class Pong(TypedDict):
    """``daemon.ping``."""

    pong: bool
    time: float  # the daemon's clock, unix seconds


class WorkspaceInfo(TypedDict):
    """One workspace as ``workspace.open`` / ``workspace.list`` / ``daemon.status`` show it.

    Besides who, where and its state, each of the workspace's services reports under its
    own key (``index``, ``health``, ``vectors``, ...: open objects, read leniently). A
    recorded or configured workspace that is not open (``workspace.list``) has only
    ``agent_id``, ``path``, ``state`` ``closed``, ``registered``, ``configured`` (and
    ``registered_at`` and ``name`` if recorded, ``why`` while a restore or backup holds it).
    """

    agent_id: str
    path: str
    state: str  # opening | ready | closing | closed | failed
    opened_at: NotRequired[float]
    settings: NotRequired[JsonObject]  # secrets masked; not in daemon.status
    error: NotRequired[str]  # why it failed
    error_errno: NotRequired[str]  # the file system's refusal of its opening (EROFS, ...)
    why: NotRequired[str]  # workspace.list: why it is not open now (a restore, a backup)
    refused: NotRequired[bool]  # its path or settings were refused: never opened
    # Why: "place" (its folder), "missing" (its folder gone), "settings", "replica".
    refused_for: NotRequired[str]
    registered: NotRequired[bool]  # workspace.list: reopened at start
    configured: NotRequired[bool]  # workspace.list: the config file names it
    registered_at: NotRequired[float]
    #: workspace.list: the agent's name recorded as the workspace's owner, if one was
    name: NotRequired[str]
    secrets_left_out: NotRequired[list[str]]  # restored without these override secrets
    #: The folder it served before the configuration moved it (its files stay there).
    left_behind: NotRequired[str]
    #: Settings a reload changed that it keeps as opened until it is opened again.
    waiting_for_reopen: NotRequired[list[str]]
    #: workspace.open: given settings a workspace open already does not use (until it is
    #: opened again): dotted field -> the value in use, secrets masked.
    not_applied: NotRequired[dict[str, object]]
    index: NotRequired[JsonObject]
    health: NotRequired[JsonObject]
    vectors: NotRequired[JsonObject]
    sessions: NotRequired[JsonObject]
    capture: NotRequired[JsonObject]
    inbox: NotRequired[JsonObject]
    dream: NotRequired[JsonObject]
    resource: NotRequired[JsonObject]
    chat: NotRequired[JsonObject]  # once a chat model was used
    remote: NotRequired[JsonObject]  # a shared workspace's replica


# ``import`` is a keyword: this part can only be spelled in the functional form.
_ImportReport = TypedDict("_ImportReport", {"import": NotRequired[JsonObject]})


class WorkspaceOpened(WorkspaceInfo, _ImportReport):
    """``workspace.open``: the workspace; with ``import_report``, also ``import`` (what was
    found and reused of a QwenPaw workspace)."""


class DaemonStatus(TypedDict):
    """``daemon.status``: who answers, since when, and the state of every workspace."""

    version: str
    pid: int
    started_at: float
    uptime_s: float
    socket: str
    socket_path: str  # the same path as ``socket``
    data_dir: str
    config_path: str
    workspaces: list[WorkspaceInfo]  # without ``settings``
    queues: dict[str, JsonObject]  # statistics by component (server, events, jobs, ...)
    # Free space of the data directory's file system and each open workspace's, measured
    # when asked (absent from an older daemon's answer).
    disks: NotRequired[list[DiskSpace]]
    # A restore the daemon was stopped in, finished or rolled back at this start
    # (``outcome``: finished, rolled_back or unresolved).
    restore_recovery: NotRequired[JsonObject]


class WorkspaceClosed(TypedDict):
    """``workspace.close``."""

    agent_id: str
    closed: bool  # it was open
    forgotten: bool
    # The configuration names it: it opens again at the next start or reload all the same.
    configured: NotRequired[bool]


class ReadResult(TypedDict):
    """``memory.read``: text of a workspace file, or of a 1-based inclusive line range."""

    agent_id: str
    path: str
    text: str
    start_line: int
    end_line: int
    total_lines: int
    truncated: bool  # the range did not fit one answer: ``end_line`` says where it stops


class Subscribed(TypedDict):
    """``events.subscribe``: every topic pattern of the connection's subscription, the
    daemon run's event ``stream`` and the ``seq`` of its last event; with ``after``, how
    many events since then the subscriber ``missed`` (None: not known)."""

    subscribed: list[str]
    stream: NotRequired[str]
    seq: NotRequired[int]
    missed: NotRequired[int | None]


class Synced(TypedDict):
    """``index.sync``."""

    synced: bool
    files: int
    chunks: int


class JobSubmitted(TypedDict):
    """``jobs.submit``."""

    job_id: str


class JobProgress(TypedDict):
    done: int
    total: int | None
    message: str


class JobInfo(TypedDict):
    """``jobs.get`` / ``jobs.list`` / ``jobs.cancel``, and the ``job.state`` event."""

    job_id: str
    agent_id: str
    kind: str
    params: JsonObject
    state: str  # queued | running | succeeded | failed | cancelled
    progress: JobProgress
    result: JsonObject | None
    error: str | None
    error_code: int | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    resumed: bool  # picked up again after a daemon restart
    held: bool  # queued until its workspace opens (closed, failed, not open since a start)


JOB_TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


class TurnsAdded(TypedDict):
    """``memory.add_turns``: what waits for auto_memory; ``job_id`` when one was submitted
    (or a queued or running one covers the turns)."""

    session_id: str
    added_messages: int
    pending_turns: int
    pending_messages: int
    user_turns_total: int
    job_id: NotRequired[str]


#: The roles of the messages ``memory.add_turns`` takes (OpenAI's chat format,
#: Anthropic's and Gemini's); only what ``user`` and ``assistant`` (``model``) said is kept.
MESSAGE_ROLES = frozenset({"user", "assistant", "model", "tool", "system", "developer",
                           "function"})
#: The roles whose words are kept, as what they are kept as (Gemini's ``model`` is the
#: assistant).
SPEAKERS: Final = {"user": "user", "assistant": "assistant", "model": "assistant"}
#: The field of a message, ``true``, that says the next message of its session is the
#: rest of it: one message too large for one ``memory.add_turns`` request, sent in pieces
#: (one user turn, one line of the dialog log).
CONTINUED: Final = "continued"


class NoteAdded(TypedDict):
    """``memory.add_note``."""

    agent_id: str
    session_id: str
    date: str
    path: str
    created: bool
    changed: bool


class NoteWritten(NoteAdded):
    """A text written in one or more ``memory.add_note`` calls: the last call's answer,
    ``created``/``changed`` if any call was, and ``paths``, every note the text went into
    in order (a note that could take no more is continued in the next of its name)."""

    paths: list[str]


class IndexEntry(TypedDict):
    path: str
    name: str
    description: str
    bucket: str


class MemoryIndex(TypedDict):
    """``memory.index``: the long-term nodes, as entries and as Markdown (``rendered``)."""

    agent_id: str
    entries: list[IndexEntry]
    total: int
    truncated: bool
    rendered: str


class FileEntry(TypedDict):
    """One file of ``memory.list``."""

    path: str
    size: int
    mtime: float


class RecallItem(TypedDict):
    kind: Literal["hit", "linked"]
    path: str
    start_line: int
    end_line: int
    text: str
    score: float
    via: str | None  # linked context: the hit that links to it


class Recall(TypedDict):
    """``memory.recall``: the block to put before a reply (``rendered``) and its items."""

    agent_id: str
    query: str
    items: list[RecallItem]
    index_included: bool
    interests_included: bool
    truncated: bool
    budget_chars: int
    rendered: str


class TopicEntry(TypedDict):
    path: str
    name: str
    description: str
    type: str  # user | feedback | project | reference


class Selected(TypedDict):
    """``memory.select``: the topic files chosen for a query, and who chose them."""

    agent_id: str
    query: str
    method: Literal["model", "search"]
    fallback: str | None  # why the search chose instead of the model
    files: list[TopicEntry]


class Interest(TypedDict):
    topic: str
    weight: float


class Interests(TypedDict):
    """``memory.interests``: heaviest first."""

    agent_id: str
    topics: list[Interest]
    total: int


class TopicWritten(TypedDict):
    """``memory.topic_write`` / ``memory.topic_edit``."""

    agent_id: str
    path: str
    created: bool
    changed: bool
    memory_md: str  # the index file that lists it


class InboxItem(TypedDict):
    """One item of ``inbox.list`` (and of the ``inbox.item`` event)."""

    id: str
    time: float
    kind: str  # auto_memory | auto_dream | auto_resource | sync_conflict | sync_restored
    summary: str
    changes: list[str]
    job_id: str | None
    details: JsonObject
    acked: bool


class InboxAcked(TypedDict):
    """``inbox.ack``."""

    agent_id: str
    acked: list[str]
    unknown: list[str]


class DreamRun(TypedDict):
    """One run of ``dream.runs``."""

    run_id: str
    started: str | None
    #: The run's place among the workspace's runs (0: recorded before places were kept);
    #: runs are listed by it, as the wall clock can be set back between them.
    seq: int
    trigger: str | None
    notes: int
    files: list[str]
    undone: str | None  # when it was undone


class ChangeRecord(TypedDict):
    """One record of ``memory.changes``: ``kind``, ``run_id``, ``started`` and ``log``,
    then an auto_memory run's outcome or a dream run's summary (as ``dream.runs``)."""

    kind: str  # auto_memory | auto_dream
    run_id: str
    started: str | None
    log: str  # the workspace-relative path of its Markdown record
    trigger: str | None
    files: list[str]
    outcome: NotRequired[str | None]
    agent_id: NotRequired[str | None]
    session_id: NotRequired[str | None]
    job_id: NotRequired[str | None]
    note: NotRequired[str | None]
    added: NotRequired[int]
    refused: NotRequired[int]
    notes: NotRequired[int]
    seq: NotRequired[int]  # a dream run's place among the runs (see ``DreamRun``)
    undone: NotRequired[str | None]


class DreamUndone(TypedDict):
    """``dream.undo``."""

    run_id: str
    restored: list[str]
    removed: list[str]
    forced_over: list[str]
    #: The run's notes the next run reads again (their catalog records were put back).
    dreamed_again: list[str]
    #: The files a forced undo wrote over hand edits in: their text is kept in ``log``.
    hand_edits_kept: NotRequired[list[str]]
    log: NotRequired[str]  # the run's change log, relative to the workspace


class BackupSummary(TypedDict):
    """``backup.create`` and ``backup.verify``: the archive's ``meta.json`` without its
    member list, where the archive is, and how many members and bytes it holds."""

    format: str
    version: int
    created: float  # unix seconds
    recalld_version: str
    include_derived: bool
    note: str
    agents: dict[str, JsonObject]  # agent id -> {path, dirs, files}
    daemon: list[str]  # the daemon's files in the archive (config, workspace record)
    secrets: bool  # the config file kept its secrets
    secrets_left_out: dict[str, list[str]]  # agent id -> dotted keys left out
    config_secrets_left_out: NotRequired[list[str]]  # the config file's, dotted keys
    file: str
    members: int
    bytes: int
    size: NotRequired[int]  # backup.create: the archive's size on disk
    # backup.create: files left out because their names are not UTF-8, by agent
    passed_by: NotRequired[dict[str, list[str]]]
    # backup.create: files left out because a restore takes none that large, by agent
    too_large: NotRequired[dict[str, list[str]]]
    # backup.create: symlinks and hidden files and folders left out, by agent
    symlinks: NotRequired[dict[str, list[str]]]
    hidden: NotRequired[dict[str, list[str]]]
    # backup.create: FIFOs, sockets and device files left out, by agent
    special: NotRequired[dict[str, list[str]]]
    # backup.create of every workspace: those left out (failed, opening, closed without a folder)
    not_open: NotRequired[list[str]]
    ok: NotRequired[bool]  # backup.verify: every check passed


class BackupList(TypedDict):
    """``backup.list``: the archives (each ``file``, ``name``, ``size``, ``modified_at`` and
    what its ``meta.json`` says) and the pre-restore snapshot record, if any."""

    dir: str
    backups: list[JsonObject]
    rollback: JsonObject | None


class IndexCompacted(TypedDict):
    """``index.compact``."""

    agent_id: str
    keyword_before: dict[str, int]  # the keyword index's rows, terms and merges
    keyword_after: dict[str, int]
    generation: int | None  # the generation committed
    duration_s: float


class MetricFamily(TypedDict):
    name: str
    type: str  # counter | gauge | histogram
    help: str
    samples: list[JsonObject]


class Metrics(TypedDict):
    """``daemon.metrics``."""

    time: float
    families: list[MetricFamily]
