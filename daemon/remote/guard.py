"""The deletion guard of a shared workspace's replica: notes gone in bulk are held, not sent.

The server keeps no history: a deletion uploaded removes the note on every host. So a
note found gone (or emptied) is not queued at once: it waits until the changes have
settled (no new one for ``SETTLE_S``, at most ``SETTLE_MAX_S``), is read again, and the
notes still gone are then judged together:

- the workspace folder, its metadata folder or a replicated folder (``memory/``,
  ``digest/``) is gone or is not the folder it was when the replica opened (``rm -rf``
  of the workspace, whichever folder it took first; a disk unmounted under it), or
- at least ``MASS_MIN`` notes and more than ``MASS_SHARE`` of the notes the replica
  knew are gone at once (``rm -rf memory/*``),

and then they are *held*: not uploaded, kept in the replica state (so a restart keeps
them held), named in status and health, with a log line saying what to do. A held note
that comes back (the files restored) is simply no longer held; the operator releases the
rest with ``remote.release`` (``upload``: send the deletions; ``restore``: write the
notes back from the server). A note emptied (a writer that truncates, then writes) or
made empty (one that creates, then writes) is read again after the settle window too,
so its empty state is not uploaded in between.

Pure bookkeeping plus ``stat`` of four folders (:meth:`DeletionGuard.folders_changed`,
blocking: call it in a worker thread); the replica (``remote/replicafiles.py``) asks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TypedDict

#: How long the changes must have been quiet before notes found gone are judged, and
#: how long a stream of changes may put that off at most.
SETTLE_S = 1.0
SETTLE_MAX_S = 10.0
#: A deletion of at least this many notes, and more than this share of the notes the
#: replica knew, is held.
MASS_MIN = 10
MASS_SHARE = 0.5
#: How many held paths status names.
STATUS_PATHS = 10


class HeldStatus(TypedDict):
    """Held deletions, as the replica's status shows them."""

    deletions: int
    why: str | None
    since: float | None
    paths: list[str]  # the first few, sorted


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class DeletionGuard:
    """What waits to be judged and what is held (see the module docstring)."""

    def __init__(self, root: Path, folders: tuple[str, ...]) -> None:
        self._root = root
        #: Workspace-relative folders whose loss holds deletions ("" is the workspace).
        self._folders = ("", *folders)
        self._identities: dict[str, tuple[int, int] | None] = {}
        #: Folders the watcher saw removed since :meth:`adopt_folders` (a folder made
        #: again at once may get the inode number of the one removed).
        self.lost: set[str] = set()
        #: Paths found gone or emptied, waiting for the settle window: when first found.
        self.pending: dict[str, float] = {}
        #: Held deletions: path to why (the same reason for a batch).
        self.held: dict[str, str] = {}
        self.held_since: float | None = None

    def adopt_folders(self) -> None:
        """Take the folders as they are now as the ones the replica works in (blocking,
        in a worker thread: a folder the watcher reports lost meanwhile stays lost; each
        set operation is one step under the GIL)."""
        seen = set(self.lost)
        self._identities = {rel: _identity(self._root / rel) for rel in self._folders}
        self.lost -= seen

    def folders_changed(self) -> str | None:
        """Which folder is gone or replaced since :meth:`adopt_folders`, said for a
        person (None: none). Blocking."""
        for rel in sorted(self.lost):
            return f"{self._root / rel} was removed"
        for rel in self._folders:
            now = _identity(self._root / rel)
            name = str(self._root / rel) if rel else f"the workspace folder {self._root}"
            if now is None:
                return f"{name} is gone"
            if now != self._identities.get(rel):
                return f"{name} was removed or replaced (another folder or disk is there now)"
        return None

    @staticmethod
    def mass(gone: int, known: int) -> str | None:
        """Why ``gone`` notes of ``known`` going at once is held (None: it is not)."""
        if gone >= MASS_MIN and gone > MASS_SHARE * known:
            return (f"{gone} of {known} notes were deleted at once (at least {MASS_MIN}, "
                    "and more than half of the notes, are held)")
        return None

    def hold(self, paths: list[str], why: str) -> None:
        for path in paths:
            self.held[path] = why
        if self.held and self.held_since is None:
            self.held_since = time.time()

    def restored(self, held: dict[str, str]) -> None:
        """Held paths as the replica state had them at open."""
        self.held = dict(held)
        self.held_since = time.time() if held else None

    def unhold(self, paths: list[str]) -> list[str]:
        """Forget held paths; those that were held."""
        out = [p for p in paths if self.held.pop(p, None) is not None]
        if not self.held:
            self.held_since = None
        return out

    def status(self) -> HeldStatus:
        whys = sorted(set(self.held.values()))
        return {"deletions": len(self.held), "why": "; ".join(whys) or None,
                "since": self.held_since, "paths": sorted(self.held)[:STATUS_PATHS]}
