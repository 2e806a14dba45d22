"""Who may read which workspace, and searches that span several workspaces.

Each agent owns one workspace and is isolated by default (``memory_isolation = true``).
The owner of workspace Y grants reads to others in Y's own settings: ``shared_with``
names the agents that may search and read Y (``"*"`` for every agent), and
``memory_isolation = false`` opens Y to every agent. Access is never granted by the
asking side.

The caller names itself (``agent_id`` on ``memory.search``, ``as_agent`` on the read
methods). Every client of the socket runs as the same user, so this is a guard against
one agent reading another's memory by mistake, not a boundary between users: that one
is the socket's permissions and the peer-uid check.

Nothing here starts tasks except :func:`search_workspaces`, whose per-workspace searches
run in a nursery it opens and closes (cancelling it cancels them all).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import trio

from recalld.daemon import safepath
from recalld.daemon.config import WorkspaceSettings
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.watchpaths import passed_by
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import SHARED_WITH_EVERYONE, Workspace, check_agent_id, shares
from recalld.ipc.agent_ids import workspace_table
from recalld.ipc.answers import JobInfo
from recalld.ipc.errors import InvalidParams, NotAllowed, UnknownWorkspace
from recalld.ipc.types import render_result

if TYPE_CHECKING:
    from recalld.daemon.index.search import SearchAnswer, SearchHit

EVERYONE = SHARED_WITH_EVERYONE
MAX_WORKSPACES_PER_SEARCH = 64
#: What names a note another agent may read: a file the index takes.
NOTE_SUFFIXES = WatcherConfig().suffixes


def may_read(caller: str, target: Workspace) -> bool:
    """Whether agent ``caller`` may search and read ``target``."""
    return target.shares_with(caller)


def may_see(registry: WorkspaceRegistry, caller: str, agent_id: str) -> bool:
    """Whether ``caller`` may see the events and jobs of ``agent_id``'s workspace: its
    own, or one whose owner shares it with ``caller``, in whatever state it is (its
    failure and its close are events too)."""
    if caller == agent_id:
        return True
    target = registry.find(agent_id)
    return target is not None and may_read(caller, target)


def job_for_reader(job: JobInfo) -> JobInfo:
    """What an agent the owner shares its workspace with sees of one of its jobs: that it
    ran, its kind, state, counts and times, not what it was given, found or wrote (its
    params name the owner's sessions; its result, error and progress message quote its
    conversations, model answers and derived files)."""
    return cast(JobInfo, _job_part(job))


def _job_part(job: Mapping[str, object]) -> dict[str, object]:
    shown = dict(job)
    for key, blank in (("params", {}), ("result", None), ("error", None)):
        if key in shown:
            shown[key] = blank
    progress = shown.get("progress")
    if isinstance(progress, Mapping):
        shown["progress"] = {**progress, "message": ""}
    return shown


def event_view(registry: WorkspaceRegistry, caller: str, topic: str,
               payload: Mapping[str, object]) -> Mapping[str, object] | None:
    """What ``caller``'s subscription gets of the event ``topic``: the whole of one of
    the daemon's or of its own workspace; of a workspace shared with it, the opening,
    closing and failure, and its jobs as :func:`job_for_reader` shows them; nothing else
    (an inbox item tells what the owner's conversations changed, for the owner only)."""
    owner = payload.get("agent_id")
    if not isinstance(owner, str) or owner == caller:
        return payload
    if not may_see(registry, caller, owner):
        return None
    if topic.startswith("workspace."):
        return payload
    if topic in ("job.state", "job.progress"):
        return _job_part(payload)
    return None


def check_read(caller: str, owner: str, settings: WorkspaceSettings) -> None:
    """NotAllowed unless ``caller`` may read the workspace of ``owner`` that has
    ``settings``; the message says how to allow it."""
    if not shares(owner, settings, caller):
        raise NotAllowed(
            f"agent {caller!r} may not read the workspace of {owner!r}: it is "
            f"isolated (add {caller!r} to {workspace_table(owner)} shared_with, or "
            "set its memory_isolation = false)"
        )


def readable(registry: WorkspaceRegistry, caller: str, agent_id: str) -> Workspace:
    """The open workspace ``agent_id`` if ``caller`` may read it. Its settings refuse
    ``caller`` whether it is open or not (closed, failed, not yet reopened): a refusal
    does not wait for the workspace to open, nor pass for its being away."""
    caller, agent_id = check_agent_id(caller), check_agent_id(agent_id)
    settings = registry.settings_of(agent_id)
    if settings is not None:
        check_read(caller, agent_id, settings)
    return registry.get(agent_id)


def check_shared_path(caller: str, target: Workspace, parts: Sequence[str]) -> None:
    """NotAllowed unless ``caller`` owns ``target`` or ``parts`` (a checked relative path)
    is one of its notes: a workspace is shared for its daily notes and digest nodes, what
    its searches and ``memory.list`` show (Markdown files, none hidden or in a folder the
    watcher passes by), not for its pending turns, source conversations, derived state or
    whatever else lies in its note folders (an editor's swap file, a ``.git`` folder)."""
    if caller == target.agent_id:
        return
    settings = target.settings
    rel = "/".join(parts)
    if (safepath.below(parts, (settings.daily_dir, settings.digest_dir))
            and rel.endswith(NOTE_SUFFIXES) and not passed_by(rel)):
        return
    raise NotAllowed(
        f"agent {caller!r} may read only the notes of {target.agent_id!r} (Markdown "
        f"files in {settings.daily_dir}/ and {settings.digest_dir}/, none hidden), "
        f"not {rel}")


def targets(registry: WorkspaceRegistry, caller: str, agents: Sequence[str]
            ) -> tuple[list[Workspace], dict[str, str]]:
    """The workspaces named in ``agents`` (deduplicated, order kept), each checked, and
    those passed by because they are not open now (closed, failed, being restored), with
    the reason: one of many being away does not fail a search of the others. A name no
    workspace may have, or one ``caller`` may not read, is an error; so is none open."""
    if not agents:
        raise InvalidParams("param 'agents' must name at least one workspace")
    names = list(dict.fromkeys(agents))
    if len(names) > MAX_WORKSPACES_PER_SEARCH:
        raise InvalidParams(f"at most {MAX_WORKSPACES_PER_SEARCH} workspaces per search")
    found: list[Workspace] = []
    away: dict[str, str] = {}
    first: UnknownWorkspace | None = None
    for name in names:
        try:
            found.append(readable(registry, caller, name))
        except UnknownWorkspace as exc:
            away[name] = exc.message
            first = first or exc
    if not found and first is not None:
        raise first
    return found, away


def _tag(hits: Iterable[SearchHit], agent_id: str,
         hybrid: bool | None = None) -> list[SearchHit]:
    """Copies of ``hits`` naming ``agent_id``; with ``hybrid``, each with its text form
    naming the workspace before the path (answers of several workspaces carry one per hit,
    since their modes may differ)."""
    out = []
    for hit in hits:
        hit = hit.copy()
        hit["agent_id"] = agent_id
        if hybrid is not None:
            hit["rendered"] = render_result(hit, hybrid=hybrid, agent_id=agent_id)
        out.append(hit)
    return out


def _scale(ws: Workspace, answer: SearchAnswer) -> tuple[str, str]:
    """What a workspace's scores are measured in: BM25 (keyword mode) or its fusion's."""
    hybrid = answer["mode"] == "hybrid"
    return answer["mode"], ws.settings.search.fusion if hybrid else ""


def _cut_neighbours(results: list[SearchHit], cut: list[SearchHit],
                    shown: set[tuple[str | None, str]]) -> list[SearchHit]:
    """The hits ``cut`` from the merged ``results`` whose notes a result of their
    workspace links, as its neighbours: a workspace's search shows no neighbour that is
    one of its own hits, so a hit cut in the merge would be shown nowhere."""
    from recalld.daemon.index.search import as_neighbour

    kept = {(r.get("agent_id"), r["path"]) for r in results}
    first: dict[tuple[str | None, str], SearchHit] = {}
    for hit in cut:  # in rank order: a note's best hit first
        first.setdefault((hit.get("agent_id"), hit["path"]), hit)
    out: list[SearchHit] = []
    for r in results:
        for other in r.get("links", []):
            key = (r.get("agent_id"), other)
            if key in first and key not in kept and key not in shown:
                shown.add(key)
                item = as_neighbour(first[key], r["path"])
                if item is not None:
                    item["agent_id"] = r.get("agent_id", "")
                    out.append(item)
    return out


async def search_workspaces(
    workspaces: Sequence[Workspace],
    search_one: Callable[[Workspace], Awaitable[SearchAnswer]],
    *,
    max_results: int,
) -> SearchAnswer:
    """Run ``search_one`` on every workspace concurrently and merge the answers.

    Hits carry ``agent_id``; they are merged by score (each workspace scores with its own
    statistics, so a merged order is approximate across workspaces) and cut to
    ``max_results``. When the scores are not in one unit (a keyword-only answer scores in
    BM25, a hybrid one in its fusion's), they are merged by rank instead: every
    workspace's first hit (exact ones first, then in the order of ``workspaces``), then
    the second ones, and so on. Counters are summed; ``took_ms`` is the slowest workspace's.
    ``search_mode`` is the one of the workspaces searched in the server (``mixed`` when
    they differ); ``server_error`` and ``vector_error`` name each workspace's reason
    (``agent: reason``, joined by ``; ``).
    """
    answers: dict[str, SearchAnswer] = {}

    async def one(ws: Workspace) -> None:
        answers[ws.agent_id] = await search_one(ws)

    async with trio.open_nursery() as nursery:
        for ws in workspaces:
            nursery.start_soon(one, ws)

    ranked: list[tuple[tuple[int, int, int, float], SearchHit]] = []
    expanded: list[SearchHit] = []
    by_rank = len({_scale(ws, answers[ws.agent_id]) for ws in workspaces}) > 1
    for order, ws in enumerate(workspaces):
        answer = answers[ws.agent_id]
        hits = _tag(answer["results"], ws.agent_id, hybrid=answer["mode"] == "hybrid")
        for place, hit in enumerate(hits):
            key = ((place, not hit.get("exact"), order, 0.0) if by_rank
                   else (0, 0, 0, -hit["score"]))
            ranked.append((key, hit))
        expanded.extend(_tag(answer["expanded"], ws.agent_id))
    ranked.sort(key=lambda kh: kh[0])
    results = [hit for _, hit in ranked[:max_results]]
    # The neighbours of the results kept, those of the first results first, at most
    # max_results of them (as in a search of one workspace).
    rank: dict[tuple[str | None, str | None], int] = {
        (r.get("agent_id"), r["path"]): i for i, r in enumerate(results)}
    expanded = [e for e in expanded if (e.get("agent_id"), e.get("via")) in rank]
    expanded += _cut_neighbours(results, [hit for _, hit in ranked[max_results:]],
                                {(e.get("agent_id"), e["path"]) for e in expanded})
    expanded = sorted(expanded, key=lambda e: (rank[e.get("agent_id"), e.get("via")],
                                               e["path"]))[:max_results]
    modes = sorted({a["mode"] for a in answers.values()} - {""})
    merged: SearchAnswer = {
        "results": results,
        "expanded": expanded,
        "rendered": "\n\n".join(r.get("rendered", "") for r in results),
        "agents": [ws.agent_id for ws in workspaces],
        "vector_hits": sum(a["vector_hits"] for a in answers.values()),
        "keyword_hits": sum(a["keyword_hits"] for a in answers.values()),
        "mode": modes[0] if len(modes) == 1 else "mixed",
        "took_ms": max((a["took_ms"] for a in answers.values()), default=0.0),
    }
    # Who answered a workspace searched in the server, and why a part of an answer is
    # missing, by workspace: a fallback of one is not hidden by the others.
    served = sorted({a["search_mode"] for a in answers.values() if "search_mode" in a})
    if served:
        merged["search_mode"] = served[0] if len(served) == 1 else "mixed"
    ordered = [(ws.agent_id, answers[ws.agent_id]) for ws in workspaces]
    if server := [f"{agent}: {a['server_error']}" for agent, a in ordered
                  if "server_error" in a]:
        merged["server_error"] = "; ".join(server)
    if vector := [f"{agent}: {a['vector_error']}" for agent, a in ordered
                  if "vector_error" in a]:
        merged["vector_error"] = "; ".join(vector)
    return merged
