"""``recalld import-qwenpaw PATH``: open a QwenPaw (ReMe) workspace and report what was reused.

Reads the agent's ``agent.json`` (``PATH/agent.json`` unless ``--agent-json`` names
another; none is fine), opens the workspace in place with those settings through
``workspace.open`` (``import_report``), and prints what the daemon found: notes (and those
not in UTF-8), chunks,
vectors reused from ReMe against those still to embed (with the provider calls that
takes), the notes ReMe's dream already consolidated, and the settings applied or ignored.
Nothing is copied or converted: the workspace is served where it is. A folder that is
not an agent's workspace but holds them (QwenPaw's home, ``~/.qwenpaw/workspaces``) or lies
inside one is refused with the command to give instead.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from recalld.ipc import errors, paths
from recalld.ipc.agent_ids import (
    NOT_ID_CHARS,
    earlier_ids,
    non_latin_agent_id,
    owner_name,
    workspace_name,
)
from recalld.ipc.answers import JsonObject
from recalld.ipc.cli_args import local_file
from recalld.ipc.cli_ops import Subparsers, add_command
from recalld.ipc.client import Client
from recalld.ipc.health_fixes import NAME_NOT_UTF8
from recalld.ipc.progress import following
from recalld.ipc.qwenpaw_places import home_refused, loads_qwenpaw_json, not_a_workspace
from recalld.ipc.render import not_applied_lines, print_json, render_workspaces

EXIT_OK, EXIT_ERROR = 0, 1
# Opening waits for the first indexing pass of the whole workspace.
IMPORT_TIMEOUT_S = 900.0


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    help_ = "open a QwenPaw (ReMe) workspace in place and report what is reused"
    p = add_command(sub, common, "import-qwenpaw", help_)
    p.add_argument("path", help="the QwenPaw workspace directory (where memory/ is)")
    p.add_argument("--agent", help="agent id (default: agent.json's id, else the folder name)")
    p.add_argument("--agent-json", metavar="FILE", type=local_file,
                   help="QwenPaw agent.json to take the settings from (default: PATH/agent.json)")


def agent_id_of(name: str) -> str:
    """The agent id of a QwenPaw agent id or folder name: the one the AgentScope
    middleware and the MCP bridge give that name (``Sales Bot`` is ``Sales_Bot``; one in
    another script keeps a digest of itself), so the agent finds what was imported;
    ``default`` for a name that makes none."""
    try:
        return workspace_name(name)
    except ValueError:
        return "default"


def earlier_agent_id(name: str) -> str:
    """The agent id earlier versions gave a QwenPaw agent id or folder name (``Sales Bot``
    was ``Sales-Bot``; one not in NFC form had the digest of its form as given)."""
    if not name.isascii():
        return (earlier_ids(name, given_as_id=False) or (non_latin_agent_id(name),))[0]
    return NOT_ID_CHARS.sub("-", name).strip("-.")[:64].strip("-.") or "default"


def _qwenpaw_base(agent: str, id_of: Callable[[str], str]) -> str:
    return id_of(f"qwenpaw-{agent}")[:56].rstrip("-.")


def _taken(client: Client) -> dict[str, Path]:
    """The folder of every workspace open, recorded or configured to reopen, by agent
    id (a configured one opens nowhere but at its place)."""
    taken: dict[str, Path] = {}
    for ws in client.call("workspace.list").get("workspaces", []):
        path = ws.get("path")
        if (isinstance(path, str) and isinstance(ws.get("agent_id"), str)
                and (ws.get("state") in ("opening", "ready") or ws.get("registered")
                     or ws.get("configured"))):
            taken[ws["agent_id"]] = Path(path).resolve()
    return taken


def free_agent_id(client: Client, agent: str, root: Path) -> str:
    """``agent``, or ``qwenpaw-<agent>`` when a workspace of that id is open on another
    folder or recorded there to reopen (QwenPaw's first agent and recalld's own workspace
    are both ``default``; two QwenPaw homes both have theirs), then ``qwenpaw-<agent>-2``
    and on: the same id at every import of one folder, never another folder's."""
    taken = _taken(client)
    here = root.resolve()
    candidate = agent
    base = _qwenpaw_base(agent, agent_id_of)
    for n in range(1, 1000):
        if taken.get(candidate, here) == here:
            return candidate
        candidate = base if n == 1 else f"{base}-{n}"
    return candidate


def earlier_imports(client: Client, name: str, agent: str, root: Path) -> list[str]:
    """The ids an earlier version imported the folder ``root`` under for the QwenPaw
    agent ``name`` (its :func:`earlier_agent_id`, or ``qwenpaw-`` that and a number),
    other than ``agent``: the folder is moved from them to ``agent``, where the agent's
    middleware looks (a folder is served under one id only)."""
    earlier = earlier_agent_id(name)
    base = _qwenpaw_base(earlier, earlier_agent_id)
    here = root.resolve()
    return sorted(agent_id for agent_id, path in _taken(client).items()
                  if path == here and agent_id != agent and (
                      agent_id in (earlier, base)
                      or re.fullmatch(re.escape(base) + r"-[0-9]+", agent_id)))


def read_agent_json(path: Path, explicit: bool) -> JsonObject | None:
    """The parsed ``agent.json`` (None when absent and not named explicitly)."""
    try:
        raw = paths.read_regular_file(path)
    except FileNotFoundError:
        if explicit:
            raise errors.InvalidParams(f"{path}: no such file") from None
        return None
    except OSError as exc:
        raise errors.InvalidParams(f"{path}: {exc}") from None
    try:
        data = loads_qwenpaw_json(raw)
    except ValueError as exc:
        raise errors.InvalidParams(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise errors.InvalidParams(f"{path} is not a JSON object")
    if "id" in data and not isinstance(data["id"], str):  # the agent's name, as QwenPaw's
        raise errors.InvalidParams(f"{path}: id (the agent's id) must be a string")
    return data


#: The parts of an ``agent.json``'s ``running`` part that hold its memory settings.
_MEMORY_KEYS = ("reme_light_memory_config", "memory_summary")


def memory_settings(agent: JsonObject) -> JsonObject:
    """What the daemon reads of an ``agent.json``: its ``id`` and the memory settings of
    its ``running`` part. The rest (channels, prompts, MCP clients), which may be larger
    than a request may be, is not sent. A file without a ``running`` part (the memory
    settings alone) is sent as it is."""
    running = agent.get("running")
    if not isinstance(running, dict):
        return agent
    kept: JsonObject = {k: v for k, v in running.items() if k in _MEMORY_KEYS}
    return {**({"id": agent["id"]} if "id" in agent else {}), "running": kept}


def _import(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    root = paths.local_path(ns.path, "PATH")
    if not root.is_dir():
        raise errors.InvalidParams(f"{root} is not a directory")
    # Served as a workspace, QwenPaw's home would hold every agent's folder (and stand
    # in the way of importing each of them).
    why = home_refused(root) or not_a_workspace(root)
    if why is not None:
        raise errors.InvalidParams(why)
    agent_json = (paths.local_path(ns.agent_json, "--agent-json") if ns.agent_json is not None
                  else root / "agent.json")
    config = read_agent_json(agent_json, explicit=bool(ns.agent_json))
    name = str(ns.agent or (config or {}).get("id") or root.name)
    agent = agent_id_of(name)
    if not ns.agent:
        agent = free_agent_id(client, agent, root)
    # The QwenPaw agent's id is the name its MCP bridge and middleware give: recorded as
    # the workspace's owner, so another name making the same id does not take it over.
    owner = (owner_name(name) if not ns.agent and (config or {}).get("id") == name
             and agent == agent_id_of(name) != "default" else None)
    moved = earlier_imports(client, name, agent, root)
    for earlier in moved:  # the notes, index and vectors are the folder's: they come along
        client.workspace_close(earlier, forget=True)
    if getattr(ns, "timeout", None) is None:
        client.timeout_s = IMPORT_TIMEOUT_S
    with following(client, "import-qwenpaw", as_json=as_json,
                   after=f"recalld workspace list shows {agent} once it is open") as token:
        info = client.workspace_open(
            agent, path=str(root), config=memory_settings(config) if config else config,
            import_report=True, progress_token=token,
            name=owner)
    failed = info.get("state") == "failed"  # its services started, then it failed
    if as_json:
        print_json(out, {**info, "moved_from": moved} if moved else info)
    elif failed:
        out.write(render_workspaces([dict(info)]))
    else:
        report = info.get("import") or {}
        out.write(render_report(agent, str(root), report,
                                agent_json if config is not None else None, moved))
    return EXIT_ERROR if failed else EXIT_OK


def render_report(agent: str, path: str, rep: JsonObject,
                  agent_json: Path | None, moved: Sequence[str] = ()) -> str:
    lines = [f"opened {path} as agent {agent}"
             + (f" (settings from {agent_json})" if agent_json else "")]
    if moved:
        lines.append(f"  (imported before as agent {', '.join(moved)}, which is no longer "
                     f"served: its agent finds it as {agent})")
    if not rep.get("complete", True):
        lines.append("  (the first indexing pass is still running: counts are partial)")
    chunks = rep.get("chunks", {})
    lines.append(f"notes:    {rep.get('notes', 0)}")
    for folder, why in (rep.get("folders_not_indexed") or {}).items():
        lines.append(f"          {folder}/ is not indexed: {why}")
    misnamed = rep.get("misnamed") or {}
    if misnamed.get("count"):
        lines.append(f"          {misnamed['count']} not indexed: {NAME_NOT_UTF8} (first: "
                     f"{misnamed['paths'][0]}); rename them to UTF-8")
    odd = rep.get("not_utf8") or {}
    if odd.get("count"):
        # Saved by a Windows editor in GBK, say: read so; one in an encoding not known is
        # indexed with U+FFFD, and is better saved again as UTF-8.
        named = ", ".join(f"{p} ({e})" for p, e in list(odd.get("notes", {}).items())[:5])
        lines.append(f"          {odd['count']} not in UTF-8: " + ", ".join(
            f"{e} {n}" for e, n in odd.get("encodings", {}).items()) + f" ({named}"
            + (", ..." if odd["count"] > 5 else "") + ")" + (
                "; \"unknown\": searchable only where ASCII, save them as UTF-8"
                if "unknown" in odd.get("encodings", {}) else ""))
    lines.append(f"chunks:   {chunks.get('total', 0)} ({chunks.get('reme_boundaries', 0)} "
                 "keep ReMe's boundaries)")
    store = rep.get("reme_store")
    if store:
        lines.append(f"ReMe's chunk store: {store['chunks']} chunks of {store['notes']} notes, "
                     f"{store['vectors']} vectors")
        if store.get("damaged"):
            lines.append(f"          ReMe's chunk store is damaged ({store['damaged']}): the "
                         "notes it lost are chunked and embedded anew")
    unread = rep.get("reme_stores_unread") or {}
    if unread:
        lines.append("          ReMe's stores not read (only ReMe 0.4.2's chunk store "
                     "file_store/file_chunks_default_v1.jsonl.zst and embedding cache are):")
        lines.extend(f"            {path} ({found.get('bytes', 0)} bytes): {found.get('why')}"
                     for path, found in unread.items())
    skipped = rep.get("reme_notes_not_indexed") or {}
    if skipped.get("count"):
        lines.append(f"          {skipped['count']} notes ReMe indexed are not indexed:")
        listed = list((skipped.get("notes") or {}).items())
        lines.extend(f"            {p}: {why}" for p, why in listed[:5])
        if skipped["count"] > 5:
            lines.append(f"            ... ({skipped['count'] - 5} more: --json lists "
                         f"{len(listed)})")
    elsewhere = rep.get("reme_notes_elsewhere") or {}
    if elsewhere:
        lines.append(f"          {sum(elsewhere.values())} notes ReMe indexed outside the note "
                     "folders are not indexed (" + ", ".join(
                         f"{top}/: {n}" for top, n in sorted(elsewhere.items()))
                     + "): recalld indexes daily_dir and digest_dir only")
    vec = rep.get("vectors", {})
    if vec.get("enabled"):
        # The backfill runs meanwhile: what it paid for is said apart from what was there.
        paid = (f"{vec['embedded_since_open']} embedded since the open "
                f"({vec['provider_texts_since_open']} texts sent to the provider), "
                if vec.get("embedded_since_open") or vec.get("provider_texts_since_open")
                else "")
        lines.append(f"vectors:  {vec['reused_from_reme']} reused from ReMe, "
                     f"{vec['embedded_before']} embedded before, {paid}{vec['in_cache']} in "
                     f"the cache, {vec['to_embed']} to embed (about "
                     f"{vec['estimated_provider_calls']} provider calls of up to "
                     f"{vec['batch_size']})")
        reme = vec.get("reme") or {}
        if reme.get("other_spaces") and not reme.get("cache_vectors"):
            lines.append("          ReMe's vectors are of another embedding model or "
                         "endpoint: not reused")
        if reme.get("store_vectors_other_dims"):
            lines.append(f"          {reme['store_vectors_other_dims']} of ReMe's stored "
                         "vectors have other dimensions than configured: not reused")
        if reme.get("store_vectors_other_space"):
            lines.append(f"          {reme['store_vectors_other_space']} of ReMe's stored "
                         "vectors are of another embedding model: not reused")
        for name, why in (reme.get("refused") or {}).items():
            lines.append(f"          refused {name}: {why}")
    else:
        lines.append(f"vectors:  off ({vec.get('disabled_reason') or 'no embedding model'})")
    dream = rep.get("dream", {})
    if dream.get("reme_catalog"):
        lines.append(f"dream:    {dream['recognised']} notes ReMe consolidated are not dreamed "
                     f"again; {dream.get('changed_since', 0)} changed since will be")
        if dream.get("damaged"):
            lines.append(f"          ReMe's dream record is damaged ({dream['damaged']}): "
                         "the notes it lost will be dreamed again")
    else:
        lines.append("dream:    no ReMe dream record")
    if rep.get("reme_resources_damaged"):
        lines.append(f"resources: ReMe's resource record is damaged "
                     f"({rep['reme_resources_damaged']}): the resources it lost will be "
                     "interpreted again")
    if "chat_model" in rep and not rep["chat_model"]:
        lines.append("chat:     no chat model configured: auto_memory and the dream do not run "
                     "until chat_model_config is set (QwenPaw's own model is not taken over; "
                     "README: Chat model)")
    settings = rep.get("settings", {})
    applied = settings.get("applied") or {}
    if applied:
        lines.append("settings applied:")
        lines.extend(f"  {k} = {v}" for k, v in sorted(applied.items()))
    lines.extend(not_applied_lines(agent, settings.get("not_applied") or {}, "import again"))
    ignored = settings.get("ignored") or {}
    if ignored:
        lines.append("settings ignored:")
        lines.extend(f"  {k}: {why}" for k, why in sorted(ignored.items()))
    return "\n".join(lines) + "\n"


HANDLERS = {"import-qwenpaw": _import}

__all__ = ["HANDLERS", "add_parsers", "render_report"]
