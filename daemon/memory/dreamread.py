"""The dream's ``node_read`` tool: the node a path the model names stands for, and its
text as the model is shown it. No task; the file is read in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import trio

from recalld.daemon.memory import digest, nodefiles
from recalld.daemon.memory.fileops import read_confined

if TYPE_CHECKING:
    from recalld.daemon.memory.dream import _Run


async def node_read(run: _Run, args: Mapping[str, object]) -> str:
    """The ``node_read`` tool's answer; the node as shown is kept in ``run.seen``."""
    if not isinstance(args.get("path"), str):  # as text, a list would be no path
        return f"error: path must be a string: a node path ({run.digest_dir}/...)"
    path = digest.link_path(str(args["path"]))
    if not path.startswith(run.digest_dir + "/"):
        return f"error: node paths start with {run.digest_dir}/"
    found = await trio.to_thread.run_sync(find_and_read, run, path)
    if found is None:
        return f"error: no node {path}"
    rel, text = found
    run.seen[rel] = text
    return text if rel == path else f"(the node {rel})\n{text}"


def find_and_read(run: _Run, path: str) -> tuple[str, str] | None:
    """The node ``path`` stands for and its text (blocking): itself, else the node
    :func:`nodefiles.find_node` finds, as integrate lands on; None if there is none."""
    text = read_confined(run.ws.root, path, strict=True)  # not UTF-8: the model is told
    if text is not None:
        return path, text
    nodes = run.names.scan(run.ws.root, run.digest_dir)
    found = nodefiles.find_node(nodes, path, nodes)
    text = None if found is None else read_confined(run.ws.root, found, strict=True)
    return None if found is None or text is None else (found, text)
