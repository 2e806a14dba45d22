"""Which folders are QwenPaw agents' workspaces, and which only hold them.

QwenPaw keeps each agent's workspace in a folder of its own (``~/.qwenpaw/workspaces/<id>``,
with the agent's ``agent.json`` and ReMe's ``mem_metadata``), listed in its home's
``config.json``. The home, or the folder of every agent's workspace, served as one
workspace would get recalld's folders among the agents' and keep them from being
imported: ``recalld import-qwenpaw`` refuses them, and so does the daemon's
``workspace.open`` (:mod:`recalld.daemon.workspace_places`), both with the commands that
import each agent instead. Blocking (it reads the folders); no state.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from recalld.ipc import paths


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def loads_qwenpaw_json(raw: bytes) -> object:
    """``raw`` (a QwenPaw ``agent.json`` or ``config.json``) parsed as QwenPaw parses it:
    its ``json.loads`` of the file's bytes takes UTF-8 with or without a byte order mark
    (as a Windows editor saves it) and UTF-16 or UTF-32. NaN and Infinity are refused,
    as every other JSON reader of recalld refuses them. ValueError (a
    ``json.JSONDecodeError`` or ``UnicodeDecodeError``) says what is wrong."""
    return json.loads(raw, parse_constant=_no_constant)


def qwenpaw_home_agents(root: Path) -> dict[str, Path] | None:
    """The agents of a QwenPaw home (``~/.qwenpaw``: a ``config.json`` whose
    ``agents.profiles`` name each agent's workspace), id -> workspace folder; None when
    ``root`` is not one. A ``workspace_dir`` that is not a folder here (the home came from
    another machine) is looked for where QwenPaw keeps it, ``workspaces/<id>``; so are
    all agents when ``config.json`` names none this can read (one with comments or
    trailing commas, which QwenPaw reads by repairing it)."""
    if (root / "agent.json").exists():
        return None  # an agent's workspace
    try:
        data = loads_qwenpaw_json(paths.read_regular_file(root / "config.json"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # QwenPaw repairs a config.json it cannot parse (comments, trailing commas) and
        # goes on: its agents are where it keeps them.
        data = None
    agents = data.get("agents") if isinstance(data, dict) else None
    profiles = agents.get("profiles") if isinstance(agents, dict) else None
    if not isinstance(profiles, dict):
        kept = held_agents(root / "workspaces")
        return {p.name: p for p in kept} if kept else None
    out: dict[str, Path] = {}
    for key, ref in profiles.items():
        ref = ref if isinstance(ref, dict) else {}
        given = ref.get("workspace_dir")
        path = root / Path(given).expanduser() if isinstance(given, str) and given else None
        if path is None or not path.is_dir():
            path = root / "workspaces" / key
        out[str(ref.get("id") or key)] = path
    return out


def home_refused(root: Path) -> str | None:
    """Why ``root`` is refused as QwenPaw's home, with the commands that import each of
    its agents; None when it is not QwenPaw's home."""
    agents = qwenpaw_home_agents(root)
    if agents is None:
        return None
    listed = "; ".join(f"{agent}: recalld import-qwenpaw {shlex.quote(str(path))}"
                       for agent, path in sorted(agents.items())) or "none listed"
    return (f"{root} is QwenPaw's home, not an agent's workspace; import each agent's "
            f"workspace ({listed})")


def agent_workspace(folder: Path) -> bool:
    """Whether ``folder`` is a QwenPaw agent's workspace: it has its ``agent.json`` or
    ReMe's folder of what it stored (``mem_metadata``)."""
    return (folder / "agent.json").is_file() or (folder / "mem_metadata").is_dir()


def held_agents(root: Path) -> list[Path]:
    """The QwenPaw agents' workspaces right in ``root``, by path."""
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and agent_workspace(p))
    except OSError:
        return []


def holds_refused(root: Path, held: list[Path]) -> str:
    """Why ``root``, which holds the agents' workspaces ``held``, is refused, with the
    command that imports each."""
    listed = "; ".join(f"recalld import-qwenpaw {shlex.quote(str(p))}" for p in held)
    return f"{root} holds the workspaces of QwenPaw agents; import each ({listed})"


def not_a_workspace(root: Path) -> str | None:
    """Why ``root`` is not to be served as an agent's workspace, with what to import
    instead: it holds QwenPaw agents' workspaces (``~/.qwenpaw/workspaces``), or it lies
    inside one (its ``memory`` folder, say). Served, it would get folders of its own among
    or inside the agents', and keep them from being imported. None: it may be."""
    if agent_workspace(root) or (root / "memory").is_dir():
        return None
    if held := held_agents(root):
        return holds_refused(root, held)
    around = next((p for p in root.parents if agent_workspace(p)), None)
    if around is not None:
        return (f"{root} lies inside the QwenPaw workspace {around}; import it: "
                f"recalld import-qwenpaw {shlex.quote(str(around))}")
    return None
