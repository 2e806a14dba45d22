"""What auto_resource reports: a job's result (and one result of two passes over the
catalog) and the catalog's status, its failed and skipped files listed first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypedDict

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.secret_names import mask_path
from recalld.daemon.watchrecords import WatcherStatus

SHOWN_FAILED: Final = 5  # failed (and skipped) files status names, with why


class ResourceStatus(TypedDict):
    files: dict[str, int]  # catalog records by state
    failed: list[dict[str, str]]  # the first SHOWN_FAILED failed files: path, reason
    skipped: list[dict[str, str]]  # the first SHOWN_FAILED skipped files: path, reason
    watcher: WatcherStatus


class ResourceResult(TypedDict):
    """The result of an auto_resource job."""

    outcomes: dict[str, int]  # files by what became of them
    notes: list[str]  # notes written or updated
    catalog: dict[str, int]  # catalog records by state, after the job


def listed(records: Mapping[str, JsonObject], state: str) -> list[dict[str, str]]:
    """The first :data:`SHOWN_FAILED` files of the catalog ``records`` in ``state``, with
    why, shown as every path is (a file skipped for a name that looks like a credential
    is listed here, its name masked)."""
    paths = sorted(p for p, r in records.items() if r["state"] == state)
    return [{"path": mask_path(p), "reason": str(records[p].get("reason", ""))}
            for p in paths[:SHOWN_FAILED]]


def merged_results(first: ResourceResult, then: ResourceResult) -> ResourceResult:
    """One job's result from two passes over the catalog, ``first`` then ``then``."""
    outcomes = dict(first["outcomes"])
    for outcome, n in then["outcomes"].items():
        outcomes[outcome] = outcomes.get(outcome, 0) + n
    return {"outcomes": outcomes, "notes": list(dict.fromkeys(first["notes"] + then["notes"])),
            "catalog": then["catalog"]}
