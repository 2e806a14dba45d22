"""What fixes a workspace's problem that :mod:`recalld.ipc.health` finds: a workspace
refused before it opened, a degraded index, by the reasons the daemon gives, notes
named by what looks like a credential, and a state file set aside at a start."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

from recalld.ipc.agent_ids import workspace_table
from recalld.ipc.commands import agent_operand, agent_option
from recalld.ipc.problems import Problem, Severity

__all__ = ["CREDENTIAL_NAMED", "DEGRADED_FIXES", "FOLDER_MISSING", "NAME_NOT_UTF8",
           "NOTICES", "NOT_UTF8", "OVERSIZED", "RENAME_FIX", "WRITES_FAIL", "degraded_fix",
           "failed_fix", "provider_fix", "refused_fix", "set_aside_problem", "write_problem"]

#: How the daemon's health reason of a workspace folder gone while open begins.
FOLDER_MISSING = "the workspace folder is missing"
#: How the daemon's health reason of notes too large to index whole ends.
OVERSIZED = "indexed only up to that size"
#: How its reason of notes in an encoding it does not recognise ends.
NOT_UTF8 = "save them as UTF-8"
#: How the daemon's health reason of note writes that fail begins (a problem of its own,
#: not of the index), and what fixes each cause, by what follows.
WRITES_FAIL = "writing notes fails: "
WRITE_FIXES = (
    ("the disk is full", "free space on the file system of {path} (recalld doctor: disk)"),
    ("the disk quota", "free space under your disk quota on the file system of {path}, or "
     "have it raised"),
    ("the file system is read-only", "make {path} writable again (remount its file system "
     "read-write), or serve the workspace from a writable folder: recalld workspace close "
     "{operand}, then: recalld workspace open {operand} --path DIR"),
    ("permission denied", "give the daemon's user write permission on {path} and the "
     "folders in it (ls -ld shows their owner and mode)"),
)
WRITE_CLEARS = "; the problem clears at the next note written"

#: A degraded index's reasons, by how each begins (or ends), and what fixes each: reindex
#: fixes only a damaged index in memory (a full disk it makes worse, a large note it
#: leaves as it was).
DEGRADED_FIXES = (
    (FOLDER_MISSING, "put the folder back where it was (or mount its disk): recalld does "
     "not make it again, and catches up by itself once it is back; or stop serving it: "
     "recalld workspace close {operand}"),
    ("saving the index fails", "free disk space or make the workspace's metadata folder "
     "writable again (recalld doctor checks free disk); the index is saved by itself once "
     "it can"),
    ("watcher failed", "fix what the reason names; the watcher tries again by itself and a "
     "rescan every reconcile_interval_s catches up meanwhile (README: Troubleshooting)"),
    ("derived state was corrupt", "recalld compact {agent} saves it again now"),
    ("index file ", "recalld compact {agent} saves a new generation now"),
    ("the index in memory is damaged", "recalld reindex {agent}"),
    (OVERSIZED, "split the note(s) named into smaller ones (only the first part of each is "
     "searchable); recalld verify {agent} lists them"),
    (NOT_UTF8, "open the note(s) named in an editor that reads their encoding and save them "
     "as UTF-8; they are indexed again as they change"),
    ("note(s) could not be read", "check the disk and the permissions of the note named; "
     "it is read again at its next change or rescan"),
)

#: What the daemon's health reason of notes named by what looks like a credential holds
#: (the daemon adds it whatever the index's state).
CREDENTIAL_NAMED = "named by what looks like a credential"
RENAME_FIX = ("rename the note(s) in the folders named so their names hold no credential "
              "(if it is a real one, revoke it: a file name is seen by every tool); until "
              "then they are searched and read by their masked names")
#: What its reason of notes left out because their name is not UTF-8 holds (added
#: whatever the index's state: what it holds is sound).
NAME_NOT_UTF8 = "their name is not valid UTF-8"
#: The daemon's health reasons that are no index state, by what each holds: their level
#: and what fixes them.
NOTICES: tuple[tuple[str, Severity, str], ...] = (
    (CREDENTIAL_NAMED, "info", RENAME_FIX),
    (NAME_NOT_UTF8, "warn", "rename them to UTF-8, naming the encoding they were written in "
     "(convmv -f latin1 -t utf8 --notest FILE); each is indexed once renamed (recalld "
     "verify lists them)"))


def write_problem(reason: str, agent: str, path: object) -> Problem:
    """The problem of a health reason of failing note writes (:data:`WRITES_FAIL`)."""
    cause = reason.removeprefix(WRITES_FAIL)
    fix = next((f for key, f in WRITE_FIXES if cause.startswith(key)),
               "fix what the error names")
    return Problem("fail", reason, fix.format(path=path, operand=agent_operand(agent))
                   + WRITE_CLEARS)


def failed_fix(agent: str, cause: object, path: object) -> str:
    """What to do about a workspace whose opening failed, by the errno name the file
    system refused it with (``error_errno``): opening it again as it is fails the same
    way where its folder is read-only, not writable or full."""
    operand = agent_operand(agent)
    again = f"recalld workspace open {operand}"
    elsewhere = (f"or open it in a writable folder: recalld workspace close {operand}, "
                 f"then: recalld workspace open {operand} --path DIR")
    if cause == "EROFS":
        return (f"{path} is on a read-only file system: remount it read-write, then: "
                f"{again}; {elsewhere}")
    if cause in ("EACCES", "EPERM"):
        return (f"the daemon's user may not write in {path} (ls -ld shows owner and mode): "
                f"make it writable for that user, then: {again}; {elsewhere}")
    if cause in ("ENOSPC", "EDQUOT"):
        return f"free space on the file system of {path} (recalld doctor: disk), then: {again}"
    return again


def refused_fix(agent: str, cause: object) -> str:
    """What to do about a workspace refused before it opened, by the daemon's
    ``refused_for`` (its folder when the daemon does not say)."""
    table = workspace_table(agent)
    stop = (f"stop serving it: take {table} out of the config file if it is there, kill -HUP "
            f"the daemon, then: recalld workspace close --forget {agent_operand(agent)}")
    reopen = f"recalld workspace open --config-json JSON {agent_operand(agent)}"
    if cause == "missing":
        return (f"put its folder back (mount its disk), then: recalld workspace open "
                f"{agent_operand(agent)}; or {stop}")
    if cause == "replica":
        return (f"give one of the two replicas a host of its own: host in {table[:-1]}.remote] "
                f"of the config file, then kill -HUP the daemon, or {reopen} with its remote "
                "and a \"host\" in JSON (or share one workspace between the agents with "
                f"shared_with); or {stop}")
    if cause == "settings":
        return (f"open it with settings that go with the config file: {reopen}, or mend "
                f"{table} in the config file, then kill -HUP the daemon; or {stop}")
    return (f"give it a folder of its own ({table} path in the config file, then kill -HUP "
            f"the daemon), or {stop}")


def degraded_fix(reasons: Sequence[str], agent: str) -> str:
    """The fix of each degraded reason known; the checks that find more otherwise."""
    def told(key: str) -> bool:
        # A reason may begin with its count ("3 note(s) could not be read ...").
        return any(r.endswith(key) if key in (OVERSIZED, NOT_UTF8)
                   else r.startswith(key) or r.lstrip("0123456789 ").startswith(key)
                   for r in reasons)

    option, operand = agent_option(agent), agent_operand(agent)
    fixes = [fix.format(agent=option, operand=operand) for key, fix in DEGRADED_FIXES
             if told(key)]
    return "; ".join(fixes) or (f"recalld verify {option} says what differs; "
                                f"recalld reindex {option} rebuilds the index")


def set_aside_problem(aside: str) -> Problem:
    """What a state file set aside at a start meant, and what to do with its copy."""
    said = (f"{aside} is a copy of a state file that did not verify at a start and was set "
            "aside: what it held is not in use")
    name = PurePath(aside).name
    if name.startswith("workspaces.json."):
        return Problem(
            "warn", f"{said} (the workspaces served before are not reopened until their "
                    "agents open them)",
            f"open again what it lists (recalld workspace open AGENT --path PATH), then "
            f"remove {aside}", "state files")
    if name.startswith("scheduler.json."):
        return Problem(
            "warn", f"{said} (the scheduler started afresh then: a scheduled run missed "
                    "while the daemon was down may have been skipped, none runs twice)",
            f"nothing to open again: remove {aside} once looked at", "state files")
    return Problem("warn", said, f"remove {aside} once looked at", "state files")


def provider_fix(reopen: str, *, for_good: bool, local: bool) -> str:
    """What to do about a failing embedding provider (the local model when ``local``)
    that no wait brings back (``for_good``) or that may answer again; ``reopen`` opens
    its workspace again."""
    if for_good and local:
        return f"the local model cannot run as installed: repair it as said, then: {reopen}"
    reopen = f"a fixed embedding_model_config applies when the workspace opens again: {reopen}"
    if for_good:
        return ("check base_url, the key, model_name and dimensions: the provider refuses "
                f"what it is sent, and no wait changes that; {reopen}")
    return ("the provider is unreachable, overloaded or rate-limiting: the backfill waits "
            "(growing waits, the provider's Retry-After, the circuit breaker) and resumes "
            "by itself once it answers (see the [EMBEDDING HEALTH CHECK] line in the "
            f"log); if it lasts, check base_url and the network; {reopen}")
