"""The shape of a backup's ``meta.json`` (``backup.py`` writes it, ``backup_check.py``
checks it)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

__all__ = ["AgentEntry", "BackupMeta", "Member"]


class Member(TypedDict):
    """A file in the archive, as meta.json lists it."""

    path: str  # the zip member's name
    size: int
    sha256: str
    #: The file's modification time (a restore sets it again: ReMe's records of what
    #: its dream and auto_resource read know a file by it).
    mtime_ns: NotRequired[int]


class AgentEntry(TypedDict):
    path: str  # the workspace's root when backed up
    dirs: dict[str, str]  # directory settings by role
    files: int


class BackupMeta(TypedDict):
    """meta.json of an archive."""

    format: str
    version: int
    created: float
    recalld_version: str
    include_derived: bool
    note: str
    agents: dict[str, AgentEntry]
    files: list[Member]
    daemon: list[str]  # daemon files, by name
    secrets: bool  # whether the config kept its secrets
    secrets_left_out: dict[str, list[str]]  # by agent
    config_secrets_left_out: list[str]  # dotted keys of the config file's
