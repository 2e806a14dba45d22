"""A shared workspace's replica in ``recalld status`` and ``doctor``: its state, what
waits in the outbox, deletions held back, and what to do when it is failing or offline.
Only reads the status mappings; no I/O."""

from __future__ import annotations

from collections.abc import Mapping

from recalld.ipc.agent_ids import workspace_table
from recalld.ipc.answers import WorkspaceInfo
from recalld.ipc.commands import agent_operand
from recalld.ipc.problems import Assessment, Problem


def remote_facts(a: Assessment, ws: WorkspaceInfo) -> None:
    """A shared workspace's replica: its state and the local changes waiting to go up."""
    remote = ws.get("remote")
    if not isinstance(remote, Mapping):
        return
    state = remote.get("state")
    searched = ", searched in the server" if remote.get("search_mode") == "server" else ""
    behind = f", {remote.get('behind')} change(s) to pull" if remote.get("behind") else ""
    held = remote.get("held")
    count = held.get("deletions") if isinstance(held, Mapping) else 0
    held_text = f", {count} deletion(s) held" if count else ""
    a.facts.append(("remote", f"{state}, outbox {remote.get('outbox')}{behind}{held_text}"
                              f"{searched} ({remote.get('name')} at {remote.get('server')})"))
    if count and isinstance(held, Mapping):
        a.problems.append(Problem(
            "warn", f"shared workspace {a.agent_id}: {count} note deletion(s) held back, "
                    f"not sent to the other hosts: {held.get('why')} (e.g. "
                    f"{', '.join(str(p) for p in held.get('paths') or ())})",
            "restore the files, or run `recalld remote release --restore "
            f"{agent_operand(a.agent_id)}` to write them back from the server, or "
            f"`recalld remote release --upload {agent_operand(a.agent_id)}` to delete them "
            "on every host"))
    outside = remote.get("outside")
    if isinstance(outside, Mapping) and outside.get("notes"):
        a.problems.append(Problem(
            "warn", f"shared workspace {a.agent_id}: {outside.get('notes')} note(s) of "
                    f"{remote.get('name')} lie outside this host's daily_dir and "
                    f"digest_dir (e.g. {outside.get('example')}) and are not replicated "
                    "here: the hosts sharing it name other folders",
            f"give {workspace_table(a.agent_id)} the same daily_dir and digest_dir as the other "
            "hosts; once changed, the whole change feed is read again"))
    unshared = remote.get("unshared")
    if isinstance(unshared, Mapping) and unshared.get("notes"):
        a.problems.append(Problem(
            "warn", f"shared workspace {a.agent_id}: {unshared.get('notes')} note(s) stay "
                    f"on this host, not shared: their name is not valid UTF-8 (e.g. "
                    f"{unshared.get('example')})",
            "rename them with UTF-8 names (convmv, or mv by hand)"))
    if state == "misconfigured":  # not a fault of the server: nothing to wait for
        a.problems.append(Problem(
            "fail", f"shared workspace {a.agent_id}: remote misconfigured: "
                    f"{remote.get('last_error')}; {remote.get('outbox')} local change(s) "
                    "wait in the outbox",
            f"fix the dsn of {workspace_table(a.agent_id)}.remote in the config file, then "
            "restart the daemon (or reload it and open the workspace again)"))
    elif state == "failing":  # the server answers; this host cannot apply or send a change
        a.problems.append(Problem(
            "warn", f"shared workspace {a.agent_id}: remote failing: "
                    f"{remote.get('last_error')}; {remote.get('outbox')} local change(s) wait "
                    "in the outbox",
            _failing_advice(remote.get("blocked"), remote.get("refused"))))
    elif state == "refusing":  # the server answers, reads may go on; writes wait
        a.problems.append(Problem(
            "warn", f"shared workspace {a.agent_id}: remote refusing writes: "
                    f"{remote.get('last_error')}; {remote.get('outbox')} local change(s) "
                    "wait in the outbox",
            f"{_REFUSING_ADVICE.get(str(remote.get('refusing')), _REFUSING_ADVICE[''])} "
            f"(the server named by {workspace_table(a.agent_id)}.remote); the outbox goes "
            "up by itself once it takes writes again"))
    elif state == "denied":  # the server answers: it refuses the login it was given
        a.problems.append(Problem(
            "warn", f"shared workspace {a.agent_id}: remote denied, the server refused the "
                    f"login: {remote.get('last_error')}; {remote.get('outbox')} local "
                    "change(s) wait in the outbox",
            f"check the user and password the dsn of {workspace_table(a.agent_id)}.remote "
            "gives (its passfile or password_env too) against the server's; the outbox goes "
            "up once the server takes the login"))
    elif state != "online":
        a.problems.append(Problem(
            "warn", f"shared workspace {a.agent_id}: remote {state}: "
                    f"{remote.get('last_error') or 'connecting'}; "
                    f"{remote.get('outbox')} local change(s) wait in the outbox",
            f"check that the PostgreSQL server named by {workspace_table(a.agent_id)}.remote is "
            "reachable and accepts this host (the user, password, database and TLS settings "
            "of its dsn); the outbox goes up once it does"))


_REFUSING_ADVICE = {
    "read-only": "the server is read-only (a standby after a failover, or "
                 "default_transaction_read_only): point the dsn at the primary, or make "
                 "the server writable",
    "disk full": "the server's disk is full: free space there",
    "permission denied": "the dsn's user lacks rights: grant it SELECT, INSERT, UPDATE "
                         "and DELETE on the recalld_* tables (and CREATE on the schema "
                         "for the first start of a new database; a migration of the "
                         "schema needs the tables' owner, as the error says)",
    "": "the error says what the server refuses",
}


def _failing_advice(blocked: object, refused: object = None) -> str:
    """What to do about a failing replica: files of the feed this host cannot write, and
    local changes the server refuses to store, are named (their errors are in status'
    ``blocked`` and ``refused``); else the log says what failed."""
    advice = []
    if isinstance(blocked, Mapping) and blocked:
        advice.append(f"on this host, move what stands where {_named(blocked)} must be "
                      "written (a folder, or a file that may not be replaced); each "
                      "catch-up tries again")
    if isinstance(refused, Mapping) and refused:
        # A note too slow to chunk for the server's search waits on this host's side.
        slow = {p: why for p, why in refused.items() if SLOW_TO_PREPARE in str(why)}
        stored = {p: why for p, why in refused.items() if p not in slow}
        if stored:
            advice.append(f"the server refuses to store {_named(stored)} (the reason is "
                          "in status' refused: a path too long for its index, a character "
                          "its encoding lacks): rename the note; the rest goes up meanwhile")
        if slow:
            advice.append(f"{_named(slow)} take(s) too long to prepare for searching in the "
                          "server (masking and chunking): split the note into smaller ones; "
                          "it goes up once it changes, the rest meanwhile")
    return "; ".join(advice) or ("the error says what fails (the daemon's log has the "
                                 "details); the replica retries by itself")


#: What a change held back for its chunking's time says (``remote/chunkplan.too_slow``).
SLOW_TO_PREPARE = "to prepare for searching in the server"


def _named(paths: Mapping[object, object]) -> str:
    named = sorted(str(p) for p in paths)
    return ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
