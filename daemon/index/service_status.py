"""What a :class:`~recalld.daemon.index.service.WorkspaceIndex` reports about itself
(a mixin: the index sets every attribute below): its part of ``daemon.status``
(:class:`IndexStatus`), the last commit and persist error, the notes that would not read,
the idle trims, and the damage checks of its files and of the state in memory, each read
from the part that keeps it. It starts no task and holds no state of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from recalld.daemon.index.commits import CommitRecord, Committer, DamagedFile, PersistError
from recalld.daemon.index.passes import Passes, UnreadableNote
from recalld.daemon.index.persist import LoadReport
from recalld.daemon.index.reads import StateAccess
from recalld.daemon.index.state import IndexState
from recalld.daemon.memory.secret_names import mask_path
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherStatus

if TYPE_CHECKING:
    from recalld.daemon.index.embedder import VectorWorker
    from recalld.daemon.index.vector_status import VectorStatus

__all__ = ["MAX_LISTED", "IndexReport", "IndexStatus"]

#: Paths listed in status and health per kind (counts are always complete).
MAX_LISTED = 20


class IndexStatus(TypedDict):
    files: int
    chunks: int
    links: int
    pending_changes: int
    preparing: int
    adding: int
    applying: bool
    uncommitted_changes: int
    rebuilding: bool
    watcher: WatcherStatus
    last_commit: CommitRecord | None
    commit_waiting_s: float | None
    persist_error: PersistError | None
    loaded_generation: int | None
    load_checked: bool
    load_corrupt: dict[str, str]
    load_rebuilt: list[str]
    damaged_files: dict[str, DamagedFile]
    live_damage: dict[str, str]
    unreadable: int
    unreadable_paths: list[str]
    searches: int
    idle_trims: int
    keyword: dict[str, int]
    vectors: VectorStatus | None


class IndexReport:
    """What a :class:`~recalld.daemon.index.service.WorkspaceIndex` reports about itself
    (a mixin: the index sets every attribute below)."""

    state: IndexState
    watcher: Watcher
    load_report: LoadReport | None
    searches: int
    vectors: VectorWorker | None
    _access: StateAccess
    _passes: Passes
    _commits: Committer
    _rebuilding: bool

    @property
    def last_commit(self) -> CommitRecord | None:
        """The generation, time, duration and counts of the last commit (None before one)."""
        return self._commits.last_commit

    @property
    def persist_error(self) -> PersistError | None:
        """The last failure to save the index (None once a commit succeeds)."""
        return self._commits.persist_error

    @persist_error.setter
    def persist_error(self, error: PersistError | None) -> None:
        self._commits.persist_error = error

    @property
    def unreadable(self) -> dict[str, UnreadableNote]:
        """Notes whose last read failed (path -> error, time), the index keeping the
        version it had of each, if any, until they read again or are gone."""
        return self._passes.unreadable

    @property
    def idle_trims(self) -> int:
        """How many times the state was trimmed after an idle period."""
        return self._access.idle_trims

    # -- damage ----------------------------------------------------------------------

    def check_files(self) -> dict[str, DamagedFile]:
        """Files of the current generation changed on disk since they were opened or
        written (see :meth:`Committer.check_files`)."""
        return self._commits.check_files()

    def check_live(self, state: IndexState) -> dict[str, str]:
        """Check the state in memory (call under the index lock, in a worker thread; see
        :meth:`Committer.check_live`)."""
        return self._commits.check_live(state)

    def live_problems(self) -> dict[str, str]:
        """What the last ``check_live`` found, while that state is still the one served."""
        return self._commits.live_problems()

    # -- status ----------------------------------------------------------------------

    def status(self) -> IndexStatus:
        """This index's part of ``daemon.status``: counts, pending and uncommitted
        changes, the last commit, load and persist problems, the watcher's state."""
        watcher = self.watcher.status()
        report = self.load_report
        commits = self._commits
        return {
            "files": len(self.state.files),
            "chunks": len(self.state.chunks),
            "links": len(self.state.graph),
            "pending_changes": watcher.get("pending", 0),
            "preparing": self._passes.preparing,
            "adding": self._passes.adding,
            "applying": self._passes.applying > 0,
            "uncommitted_changes": commits.unsaved,
            "rebuilding": self._rebuilding,
            "watcher": watcher,
            "last_commit": self.last_commit,
            "commit_waiting_s": commits.waiting_s(),
            "persist_error": self.persist_error,
            "loaded_generation": None if report is None else report.generation,
            "load_checked": commits.checked.is_set(),
            "load_corrupt": {} if report is None else report.corrupt,
            "load_rebuilt": [] if report is None else list(report.rebuilt),
            "damaged_files": dict(commits.damaged),
            "live_damage": dict(self.live_problems()),
            "unreadable": len(self.unreadable),
            "unreadable_paths": [mask_path(p) for p in sorted(self.unreadable)[:MAX_LISTED]],
            "searches": self.searches,
            "idle_trims": self.idle_trims,
            "keyword": self.state.bm25.stats(),
            "vectors": None if self.vectors is None else self.vectors.status(),
        }
