"""The workspace layout's rule: which of a workspace's folders may lie in which (each
folder setting's own rule is in :mod:`~recalld.daemon.config_rules`)."""

from __future__ import annotations

from collections.abc import Mapping

from recalld.daemon.config_rules import dir_parts, shown

#: The folders the index watches: every ``.md`` file under them is a note.
NOTE_DIRS = ("daily_dir", "digest_dir")
_OTHER_DIRS = ("metadata_dir", "session_dir", "mem_session_dir", "resource_dir")
#: Every folder setting of a workspace.
LAYOUT_DIRS = NOTE_DIRS + _OTHER_DIRS

#: What a folder's contents are taken for: why another folder cannot be in it.
_TAKEN_FOR = {
    "daily_dir": "every .md file under daily_dir is a daily note (the index watches it, "
                 "the dream reads it)",
    "digest_dir": "every .md file under digest_dir is a digest node (the index watches it, "
                  "memory.index lists it)",
    "metadata_dir": "metadata_dir holds the daemon's own state and nothing else",
    "resource_dir": "every file under resource_dir is cataloged as a resource",
    "session_dir": "session_dir holds session files (a restore puts back only those)",
    "mem_session_dir": "mem_session_dir holds session files (a restore puts back only "
                       "those)",
}

#: ``(inner, outer)``: the folder ``inner`` may be neither ``outer`` nor inside it.
_REFUSED: tuple[tuple[str, str], ...] = (
    # A note folder holds notes only.
    *((other, notes) for notes in NOTE_DIRS for other in _OTHER_DIRS),
    # Daily notes and digest nodes are told apart by their folder: the dream would read
    # its own nodes, memory.index list daily notes as nodes.
    ("digest_dir", "daily_dir"), ("daily_dir", "digest_dir"),
    # The daemon's state, its own to write and rebuild: the watchers pass the default one
    # by (a daily_dir of "mem_metadata/notes" would never be indexed).
    *((other, "metadata_dir") for other in LAYOUT_DIRS if other != "metadata_dir"),
    # The resource job takes every file it finds for a resource to turn into notes.
    ("metadata_dir", "resource_dir"), ("session_dir", "resource_dir"),
    ("mem_session_dir", "resource_dir"),
    *((notes, other) for notes in NOTE_DIRS
      for other in ("session_dir", "mem_session_dir", "resource_dir")),
    # A restore removes from a session folder what the backup does not put back there:
    # the daemon's state, most of it not in a backup.
    ("metadata_dir", "session_dir"), ("metadata_dir", "mem_session_dir"),
)


def layout_problem(dirs: Mapping[str, str]) -> str | None:
    """What is wrong with a workspace's folders (``dirs``: each of :data:`LAYOUT_DIRS`)
    taken together: one that is or lies inside another where that cannot work (None:
    nothing). Folders are compared by their parts, so ``memory2`` is not inside
    ``memory`` and ``./memory/`` is ``memory``."""
    parts = {name: dir_parts(dirs[name]) for name in LAYOUT_DIRS}
    for inner, outer in _REFUSED:
        held, holder = parts[inner], parts[outer]
        if held[:len(holder)] != holder:
            continue
        how = "must not be the same folder as" if held == holder else "must not lie inside"
        return (f"{inner} = {shown(dirs[inner])} {how} {outer} = {shown(dirs[outer])}: "
                f"{_TAKEN_FOR[outer]}")
    if len(parts["metadata_dir"]) == 1 and parts["metadata_dir"][0] in parts["resource_dir"]:
        return (f"resource_dir = {shown(dirs['resource_dir'])} must not be in a folder named "
                f"as metadata_dir = {shown(dirs['metadata_dir'])}: the resource watcher "
                "passes folders of that name by")
    return None
