"""Is a workspace's memory OK? Facts and problems read from ``daemon.status`` and the jobs.

One reading serves the human ``recalld status`` and ``recalld doctor``: per workspace,
:func:`assess` returns the lines a person needs first (health, pending work, vectors and
why they are off or lagging, the next and the last dream, resources waiting, failed jobs)
and the :class:`Problem` list, each with the fix. Only reads the status mappings; no I/O.
The daemon's answers are open objects, so every field is read leniently.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import PurePath
from typing import Any

from recalld.ipc.agent_ids import workspace_table
from recalld.ipc.answers import DaemonStatus, JobInfo, WorkspaceInfo
from recalld.ipc.commands import agent_operand, agent_option
from recalld.ipc.health_fixes import (
    NOTICES,
    OVERSIZED,
    WRITES_FAIL,
    degraded_fix,
    failed_fix,
    provider_fix,
    refused_fix,
    set_aside_problem,
    write_problem,
)
from recalld.ipc.health_remote import remote_facts
from recalld.ipc.problems import Assessment, Problem, disk_problems, restore_problems
from recalld.ipc.render import _uptime
from recalld.ipc.types import visible

#: Why an LLM job fails, or capture waits, while the workspace has no chat model.
NO_CHAT_MODEL = "no chat model configured"
RESTART_FIX = ("then restart the daemon (systemctl --user restart recalld, or stop and "
               "start recalld serve)")


def _when(value: object) -> str:
    """A time from the daemon (epoch seconds or ISO-8601) as local 'YYYY-MM-DD HH:MM'."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(value))
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M")
        except ValueError:
            return value
    return "-"


def _vectors(ws: WorkspaceInfo) -> Mapping[str, Any]:
    v = ws.get("vectors") or (ws.get("index") or {}).get("vectors") or {}
    return v if isinstance(v, Mapping) else {}


def _key_fix(reason: str) -> str:
    if "API key" in reason:
        return ("put the key in the daemon's environment (RECALLD_EMBEDDING_API_KEY, or the "
                "backend's variable such as OPENAI_API_KEY) or set api_key in "
                "[workspace_defaults.embedding_model_config]; " + RESTART_FIX)
    if "model_name" in reason or "no embedding model" in reason:
        return ("set embedding_model_config.model_name (README: Embedding models); "
                + RESTART_FIX)
    if "not installed (pip install " in reason:  # a local model's packages
        return ("install them into the daemon's Python environment with the pip command "
                "above, " + RESTART_FIX + "; or name another model in embedding_model_config")
    return ("fix embedding_model_config in the config file (or in the config the workspace "
            "is opened with); " + RESTART_FIX)


def _index(a: Assessment, ws: WorkspaceInfo) -> None:
    agent = a.agent_id
    h = ws.get("health") or {}
    idx = ws.get("index") or {}
    state = h.get("state") or "-"
    pending = idx.get("pending_changes") or 0
    reasons = [str(r) for r in h.get("reasons") or []]
    # Notes named by a credential, or left out for their name's encoding, are no index
    # state: a problem of their own, any state.
    notices = [Problem(level, r, fix) for r in reasons for said, level, fix in NOTICES
               if said in r]
    notices += [write_problem(r, agent, ws.get("path")) for r in reasons
                if r.startswith(WRITES_FAIL)]
    reasons = [r for r in reasons if all(p.what != r for p in notices)]
    if state == "degraded" and not reasons:  # the index is sound: its notes fail to write
        state = "clean"
    # Turns waiting for auto_memory make the workspace pending, not its index (chunks
    # whose vectors are parked leave it clean: the daemon does not count them as pending).
    shown = "clean" if state == "pending" and reasons and all(
        _is_capture(r, ws) for r in reasons) else state
    text = f"{shown}: {idx.get('files', '-')} file(s), {idx.get('chunks', '-')} chunk(s) indexed"
    if pending:
        text += f", {pending} change(s) waiting"
    if h.get("unindexed"):
        text += f", {h['unindexed']} file(s) on disk not indexed yet"
    if h.get("read_again"):
        text += f", {h['read_again']} note(s) left to read again under this version's rules"
    if not idx and ws.get("state") == "failed":  # no index to count ("-: - file(s)")
        text = "none: the workspace is not open (the problem below says why)"
    a.facts.append(("index", text))
    if ws.get("state") == "failed" and ws.get("refused"):
        a.problems.append(Problem("fail", f"workspace not opened: {ws.get('error')}",
                                  refused_fix(agent, ws.get("refused_for"))))
    elif ws.get("state") == "failed":
        a.problems.append(Problem("fail", f"workspace failed: {ws.get('error')}",
                                  failed_fix(agent, ws.get("error_errno"), ws.get("path"))))
    elif state == "degraded":
        partly = h.get("partly_indexed_paths") or []
        shown = [f"{r}: {', '.join(map(str, partly))}" if r.endswith(OVERSIZED) and partly
                 else r for r in reasons]
        a.problems.append(Problem("fail", "index degraded: " + "; ".join(shown),
                                  degraded_fix(reasons, agent)))
    elif state == "pending" and reasons:
        capture = [r for r in reasons if _is_capture(r, ws)]
        others = [r for r in reasons if r not in capture]
        stuck = _provider_failing(ws)
        behind = [r for r in others if stuck and r.startswith("vectors:")]
        others = [r for r in others if r not in behind]
        if others:
            a.problems.append(Problem(
                "info", "pending: " + "; ".join(others),
                "wait: it catches up by itself (recalld search --sync waits)"))
        if behind:
            # The chunks wait for the provider, which no wait of the daemon brings back
            # when it fails for good (the problem of the provider says what it answers).
            a.problems.append(Problem(
                "warn" if stuck == "for good" else "info", "pending: " + "; ".join(behind),
                f"no wait brings their vectors: fix what the embedding provider refuses "
                f"(the problem below), then: {_reopen(agent)}" if stuck == "for good"
                else "wait: the backfill resumes by itself once the embedding provider "
                     "answers again (the problem below says what fails)"))
        if capture:
            a.problems.append(Problem("info", "pending: " + "; ".join(capture),
                                      _capture_fix(agent, ws)))
    a.problems.extend(notices)


def _reopen(agent: str) -> str:
    """The commands that open ``agent``'s workspace again, with its settings of now."""
    return (f"recalld workspace close {agent_operand(agent)}; "
            f"recalld workspace open {agent_operand(agent)}")


def _is_capture(reason: str, ws: WorkspaceInfo) -> bool:
    """True for the health reason that says which conversation turns wait and why."""
    why = (ws.get("capture") or {}).get("reason")
    return isinstance(why, str) and reason.endswith(f" wait for auto_memory: {why}")


def _chat_model_fix(agent: str) -> str:
    return (f"give the workspace a chat model (chat_model_config in {workspace_table(agent)} or "
            f"[workspace_defaults] of the config file, {RESTART_FIX}; or let the agent hand "
            "its own over)")


def _capture_fix(agent: str, ws: WorkspaceInfo) -> str:
    """What writes the waiting turns: only a chat model, or a flush when nothing is timed,
    or (the idle flush and its retries are on) time itself."""
    capture = ws.get("capture") or {}
    if capture.get("reason") == NO_CHAT_MODEL:
        return _chat_model_fix(agent) + "; the turns wait on disk"
    if capture.get("reason") == "auto_memory job queued or running":
        return "wait: the queued or running auto_memory job writes them"
    if not capture.get("idle_s"):
        return ("they are written at the session's next auto_memory_interval user turns or "
                "flush (memory.add_turns with flush: true, end_session); or set "
                f"auto_memory_idle_s for {agent} so that idle sessions are written")
    return "wait: the idle flush writes them, and retries a failed job by itself"


def _provider_failing(ws: WorkspaceInfo) -> str | None:
    """How the embedding provider of a workspace with vectors on fails now: "for good"
    (a retry of the same request will not help: the fix is the user's), "for now" (an
    outage, a rate limit: the backfill waits for it), or None while it answers."""
    v = _vectors(ws)
    provider = v.get("provider") or {}
    breaker = (provider.get("breaker") or {}).get("state")
    if not v.get("enabled") or (v.get("health") != "fail" and breaker != "open"):
        return None
    return "for good" if provider.get("fails_for_good") else "for now"


def _vector_facts(a: Assessment, ws: WorkspaceInfo) -> None:
    v = _vectors(ws)
    if not v:
        return
    provider = v.get("provider") or {}
    if not v.get("enabled"):
        reason = str(provider.get("disabled_reason") or "disabled")
        a.facts.append(("vectors", f"off: {reason} (search is keyword only)"))
        if provider.get("model"):  # a model is named, so vectors were meant to be on
            a.problems.append(Problem("fail", f"vectors are off: {reason}", _key_fix(reason)))
        return
    embedded, total = v.get("embedded"), v.get("total")
    coverage = v.get("coverage")
    state = str(v.get("state", "-"))
    wait_s = v.get("wait_s")
    if isinstance(wait_s, int | float):
        state += f" (next try in {max(wait_s, 1):.0f} s)"
    text = (f"{state}, {embedded} of {total} chunk(s) embedded" if v.get("counted", True)
            else f"{state}, not counted yet (the first scan of the notes is under way)")
    if v.get("migrating"):
        text += " with the new model"
    if isinstance(coverage, int | float) and coverage < 1:
        rest_parked = v.get("parked") and v.get("parked") == v.get("pending")
        failing = _provider_failing(ws)
        text += f" ({coverage:.0%}, " + (
            "the rest parked" if rest_parked else
            "stopped: the provider fails for good" if failing == "for good" else
            "waiting for the provider" if failing else "backfill under way")
        if v.get("migrating"):
            text += ("; the previous model's vectors serve searches meanwhile"
                     if v.get("serving_space") else
                     "; searches are keyword-only meanwhile: the previous model cannot "
                     "embed a query")
        text += ")"
    text += f", provider {v.get('health', '-')}"
    a.facts.append(("vectors", text))
    error = v.get("last_error") or provider.get("last_error")
    breaker = (provider.get("breaker") or {}).get("state")
    if v.get("health") == "fail" or breaker == "open":
        a.problems.append(Problem(
            "fail", f"embedding provider failing: {error or 'circuit open'}",
            provider_fix(_reopen(a.agent_id), for_good=_provider_failing(ws) == "for good",
                         local=provider.get("backend") == "local")))
    if v.get("parked"):
        a.problems.append(Problem(
            "fail", f"{v['parked']} chunk(s) parked after errors on their texts"
            + (f" ({', '.join(v['parked_paths'][:3])}"
               + (", ..." if v["parked"] > 3 else "") + ")" if v.get("parked_paths") else "")
            + f": {v.get('parked_error') or error}",
            "the provider refuses these texts or keeps failing on them while it embeds "
            "others; they are tried again when their hour is up (a restart keeps them "
            "parked until then), and at once when the workspace opens with a changed "
            "embedding_model_config (if it refuses every text, a wrong dimensions value "
            f"or a rejected key: fix it, then: {_reopen(a.agent_id)})"))


def _last_job(jobs: Sequence[JobInfo], kind: str) -> JobInfo | None:
    done = [j for j in jobs if j.get("kind") == kind and j.get("finished_at")]
    return max(done, key=lambda j: float(j.get("finished_at") or 0), default=None)


def _waiting(a: Assessment, result: Mapping[str, object]) -> None:
    """The notes the last dream did not read after the model failed on them (dreamretry)."""
    count, named = result.get("waiting_notes"), result.get("waiting")
    if not isinstance(count, int) or count <= 0:
        return
    shown = "; ".join(f"{visible(str(p))}: {why}" for p, why in list(
        named.items())[:3]) if isinstance(named, Mapping) else ""
    a.problems.append(Problem(
        "warn", f"{count} daily note(s) wait after the model failed on them as they are"
                + (f" ({shown}{'; ...' if count > 3 else ''})" if shown else ""),
        "each unchanged note is tried a few times, a run apart, then waits until it changes; "
        "see why in the last dream's job (recalld jobs list), fix the cause (a node that "
        f"cannot be read, max_tokens, the model), then: recalld dream --retry-failed "
        f"{agent_option(a.agent_id)}"))


def _dream(a: Assessment, ws: WorkspaceInfo, jobs: Sequence[JobInfo]) -> None:
    d = ws.get("dream")
    if not isinstance(d, Mapping):
        return
    last = _last_job(jobs, "auto_dream")
    if last is None:
        last_text = "no run yet"
    elif last.get("state") == "succeeded":
        last_text = f"last run {_when(last.get('finished_at'))} succeeded"
        result = last.get("result") or {}
        failed = result.get("failed_notes")
        if isinstance(failed, int) and failed > 0:
            last_text += f", {failed} note(s) not processed"
            a.problems.append(Problem(
                "warn", f"the last dream left {failed} daily note(s) not processed; they "
                        "are tried again by later runs (a few times while unchanged)",
                f"its run log names each and why: {result.get('log')} (recalld jobs get "
                f"{last.get('job_id')})"))
        left = result.get("left")
        if isinstance(left, int) and left > 0:
            last_text += f", {left} changed note(s) left for the next run"
            a.problems.append(Problem(
                "info", f"the last dream read as many notes as a run reads; {left} changed "
                        "daily note(s) wait for the next run",
                f"to read them now: recalld dream {agent_option(a.agent_id)}"))
    else:
        last_text = (f"last run {_when(last.get('finished_at'))} {last.get('state')}: "
                     f"{last.get('error') or '-'}")
    # The daemon keeps the last run's waiting notes, failed or not; after a restart, the
    # last run that succeeded says them.
    _waiting(a, d if "waiting_notes" in d else last.get("result") or {}
             if last is not None and last.get("state") == "succeeded" else {})
    if d.get("error"):
        a.facts.append(("dream", f"NOT scheduled: {d['error']}; {last_text}"))
        a.problems.append(Problem(
            "fail", f"dream_cron {d.get('cron')!r} is not scheduled: {d['error']}",
            "set dream_cron to 5 cron fields, e.g. \"0 23 * * *\", then: "
            + _reopen(a.agent_id)))
    elif not d.get("enabled"):
        a.facts.append(("dream", f"off (dream_cron_enabled = false); {last_text}"))
    else:
        # The next run in this terminal's time; the cron's fields read in the daemon's
        # zone, which a service started with another TZ does not share.
        zone = f" in {d['tz']}" if d.get("tz") else ""
        a.facts.append(("dream", f"next {_when(d.get('next_run'))} (cron {d.get('cron')}"
                                 f"{zone}); {last_text}"))
    if last is not None and last.get("state") == "failed":
        error = str(last.get("error"))
        # Without a chat model, running it again fails again: the model comes first.
        first = (_chat_model_fix(a.agent_id) if error.startswith(NO_CHAT_MODEL)
                 else f"recalld jobs get {last.get('job_id')}")
        a.problems.append(Problem("warn", f"the last dream failed: {error}",
                                  f"{first}; then recalld dream {agent_option(a.agent_id)}"))


def _resources(a: Assessment, ws: WorkspaceInfo) -> None:
    r = ws.get("resource")
    files = r.get("files") if isinstance(r, Mapping) else None
    if not isinstance(files, Mapping) or not files:
        return
    shown = ", ".join(f"{n} {state}" for state, n in sorted(files.items()))
    a.facts.append(("resources", shown))
    chat = ws.get("chat") or {}
    if files.get("pending"):
        a.problems.append(Problem(
            "warn", f"{files['pending']} resource file(s) wait for a chat model",
            "set chat_model_config.model_name (and base_url, and a key if the server wants "
            f"one); {RESTART_FIX}"))
    if files.get("failed"):
        dream = ws.get("dream") or {}
        again = ("the nightly dream (dream_cron) tries them again, and so does a change to "
                 "the file" if dream.get("enabled") and not dream.get("error") else
                 "a change to the file tries it again (the nightly dream would too, but it "
                 "is " + ("not scheduled: dream_cron" if dream.get("enabled") else
                          "off: dream_cron_enabled = false") + ")")
        # Which, and why (not the chat model's last error: a note not written, a file
        # unreadable, fail with no chat error at all).
        named = [f"{visible(str(f.get('path')))}: {f.get('reason')}"
                 for f in (r.get("failed") if isinstance(r, Mapping) else None) or []
                 if isinstance(f, Mapping)]
        why = ""
        if named:
            why = ": " + "; ".join(named) + ("; ..." if len(named) < files["failed"] else "")
        elif chat.get("last_error"):
            why = f" (chat: {chat['last_error']})"
        a.problems.append(Problem(
            "warn", f"{files['failed']} resource file(s) failed{why}",
            f"{again}; to try now, submit an auto_resource job over the protocol "
            "(jobs.submit). `recalld --json status` lists the catalog counts and the first "
            "failed files"))


def _failed_jobs(a: Assessment, jobs: Sequence[JobInfo],
                 resources_waiting: bool) -> None:
    skip = {"auto_dream"} | ({"auto_resource"} if resources_waiting else set())
    for kind in sorted({str(j.get("kind")) for j in jobs} - skip):
        last = _last_job(jobs, kind)
        if last is not None and last.get("state") == "failed":
            a.problems.append(Problem(
                "warn", f"the last {kind} job ({last.get('job_id')}, "
                        f"{_when(last.get('finished_at'))}) failed: {last.get('error')}",
                f"recalld jobs get {last.get('job_id')}"))


def daemon_problems(status: DaemonStatus) -> list[Problem]:
    """Problems of the daemon itself (not of one workspace)."""
    out = restore_problems(status) + disk_problems(status)
    cfg = (status.get("queues") or {}).get("config") or {}
    if cfg.get("reload_error"):
        out.append(Problem(
            "fail", f"the configuration reload at {_when(cfg.get('reload_failed_at'))} "
                    f"failed, the daemon runs on the previous one: {cfg['reload_error']}",
            f"fix {cfg.get('path') or 'the config file'}, then: systemctl --user reload "
            f"recalld (or kill -HUP {status.get('pid', '<pid>')})", "config",
            str(cfg["reload_error"])))
    restart = [str(name) for name in cfg.get("waiting_for_restart") or ()]
    if restart:
        out.append(Problem(
            "info", f"{', '.join(restart)} changed in the config file; the daemon keeps what "
                    "it started with until it is restarted",
            "systemctl --user restart recalld (or recalld stop, then recalld serve)",
            "config"))
    out.extend(Problem("warn", str(w.get("what")), str(w.get("fix")), "config",
                       str(w.get("what"))) for w in cfg.get("warnings") or [])
    left_out = [str(k) for k in cfg.get("secrets_left_out") or ()]
    if left_out:
        path = cfg.get("path") or "the config file"
        out.append(Problem(
            "warn", f"{', '.join(left_out)} of {path} left out of the backup it was restored "
                    "from (made without --include-secrets)",
            f"set {'it' if len(left_out) == 1 else 'them'} in {path} (or take out those "
            "the environment provides, or a dsn's password: passfile, password_env), then: "
            f"systemctl --user reload recalld (or kill -HUP {status.get('pid', '<pid>')}); "
            "or restore a backup made with --include-secrets", "config secrets"))
    files = (status.get("queues") or {}).get("state_files") or {}
    for failed in files.get("errors") or []:
        where = PurePath(str(failed.get("file"))).parent
        out.append(Problem(
            "fail", f"recalld cannot save {failed.get('file')} since "
                    f"{_when(failed.get('since'))}: {failed.get('error')}; a restart would "
                    "start from what it last held",
            f"make {where} writable and give its disk room (recalld doctor: disk); the "
            "daemon saves it again with its next change", "state files"))
    for aside in files.get("set_aside") or []:
        out.append(set_aside_problem(str(aside)))
    return out



def not_open(listed: Sequence[WorkspaceInfo], status: DaemonStatus,
             jobs: Sequence[JobInfo] = ()) -> list[str]:
    """``recalld status``'s lines for the workspaces ``workspace.list`` has and
    ``daemon.status`` does not (closed, recorded: they open at the next start), each with
    the jobs that wait, held, for it to open."""
    shown = {w.get("agent_id") for w in status.get("workspaces") or []}
    lines: list[str] = []
    for ws in listed:
        agent = ws.get("agent_id")
        if agent in shown:
            continue
        held = [j for j in jobs if j.get("agent_id") == agent
                and j.get("state") in ("queued", "running")]
        lines += ["", f"{agent}: not open  ({ws.get('state')}, {ws.get('path')})"]
        if ws.get("why"):
            lines.append(f"  now: {ws.get('why')}")
        if held:
            lines.append(f"  jobs: {', '.join(str(j.get('kind')) for j in held)} wait for it "
                         f"to open (recalld workspace open {agent_operand(agent)})")
    return lines


def _active_job(job: JobInfo) -> str:
    """``auto_dream running 1/4 for 12m 3s``: how far a queued or running job is and for
    how long, so that one stuck (a provider that never answers) shows as such."""
    state = job.get("state")
    text = f"{job.get('kind')} {state}"
    progress = job.get("progress")
    done, total = (progress.get("done"), progress.get("total")) if progress else (None, None)
    if isinstance(done, int) and isinstance(total, int) and total > 0:
        text += f" {done}/{total}"
    since = job.get("started_at") if state == "running" else job.get("submitted_at")
    if isinstance(since, int | float) and not isinstance(since, bool):
        text += f" for {_uptime(max(time.time() - since, 0.0))}"
    return text


def assess(ws: WorkspaceInfo, jobs: Sequence[JobInfo] = ()) -> Assessment:
    """Facts and problems of one workspace of ``daemon.status``; ``jobs`` are its jobs."""
    a = Assessment(str(ws.get("agent_id", "?")))
    mine = [j for j in jobs if j.get("agent_id") in (None, a.agent_id)]
    _index(a, ws)
    _vector_facts(a, ws)
    _dream(a, ws, mine)
    _resources(a, ws)
    remote_facts(a, ws)
    left_out = [str(k) for k in ws.get("secrets_left_out") or ()]
    if left_out:
        a.problems.append(Problem(
            "warn", f"{', '.join(left_out)} was left out of the backup this workspace was "
            "restored from (made without --include-secrets)",
            "let the agent hand its model over again (an AgentScope middleware given "
            "chat_model / embedding_model does when it opens the workspace), or set it in "
            "the config file, or restore a backup made with --include-secrets"))
    if ws.get("left_behind"):
        a.problems.append(Problem(
            "warn", f"opened at {ws.get('path')}, where the configuration now puts it; the "
                    f"files of {ws['left_behind']}, where it was before, are not served",
            f"if the path was changed by mistake, put it back in the config file, then: "
            f"recalld workspace close {a.agent_id}, and reload; else move those files "
            f"to {ws.get('path')}"))
    reopen = [str(name) for name in ws.get("waiting_for_reopen") or ()]
    if reopen:
        a.problems.append(Problem(
            "info", f"{', '.join(reopen)} changed in the config file; the workspace keeps "
                    "what it was opened with until it is opened again",
            f"recalld workspace close {a.agent_id}, then: recalld workspace open {a.agent_id}"))
    sessions = ws.get("sessions") or {}
    if sessions.get("pending_messages"):
        a.facts.append(("capture", f"{sessions['pending_messages']} conversation message(s) "
                                   "wait for auto_memory"))
    inbox = ws.get("inbox") or {}
    if inbox.get("unacked"):
        a.facts.append(("inbox", f"{inbox['unacked']} unseen item(s) "
                                 f"(recalld inbox list {agent_option(a.agent_id)})"))
    active = [j for j in mine if j.get("state") in ("queued", "running")]
    if active:
        a.facts.append(("jobs", ", ".join(map(_active_job, active))))
    # Resources waiting for a chat model already say why their job failed.
    waiting = any("wait for a chat model" in p.what for p in a.problems)
    _failed_jobs(a, mine, waiting)
    return a
