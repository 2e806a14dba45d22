"""The dream's ``node_read`` tool: the node a path the model names stands for, and its
text as the model is shown it. No task; the file is read in a worker thread.

The model names a node by its path (also as a link, without ``.md``) or by its name,
as ``integrate`` takes it. A node longer than a tool result may be (a person's long
page) is shown cut, saying so. When the cut falls inside its content, the model has not
read all it would rewrite: a REFINE or CORRECT of it is refused (:func:`refuse_unread`),
never applied on the part read, which would push the rest it never saw out of the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import trio

from recalld.daemon.memory import digest, integration, nodefiles
from recalld.daemon.memory.fileops import read_confined
from recalld.daemon.memory.llm import MAX_TOOL_RESULT_CHARS
from recalld.daemon.textcost import chars_within, text_cost
from recalld.ipc.textcut import cut_text

#: What the part of a node shown may cost at most (:mod:`~recalld.daemon.textcost`: that
#: many characters of English, a ninth as many of Chinese): a tool result's bound, less
#: room for the node's path and the note saying where it was cut.
SHOWN_CHARS: Final = MAX_TOOL_RESULT_CHARS - 1000

if TYPE_CHECKING:
    from recalld.daemon.memory.dream import _Run


async def node_read(run: _Run, args: Mapping[str, object]) -> str:
    """The ``node_read`` tool's answer; the node as shown is kept in ``run.seen``."""
    if not isinstance(args.get("path"), str):  # as text, a list would be no path
        return f"error: path must be a string: a node path ({run.digest_dir}/...)"
    path = digest.link_path(str(args["path"]))
    if "/" not in path:
        # A node named by its name (``Café Zoë``, ``[[Café Zoë]]``), as integrate's
        # ``node`` takes one: the node of that name in any bucket.
        path = digest.node_path(digest.BUCKETS[0], path.removesuffix(".md"), run.digest_dir)
    if not path.startswith(run.digest_dir + "/"):
        return f"error: node paths start with {run.digest_dir}/"
    found = await trio.to_thread.run_sync(find_and_read, run, path)
    if found is None:
        return f"error: no node {path}"
    rel, text = found
    shown, whole = _shown(rel, text)
    if shown != text:
        if not whole:
            run.read_in_part[rel] = (len(text), len(shown))
        shown += (f"\n[cut: the node has {len(text)} characters, only the first "
                  f"{len(shown)} are shown; "
                  + ("the rest is past its content (History, links), which a rewrite keeps]"
                     if whole else "its content goes on past them, so it cannot be "
                     "rewritten (REFINE, CORRECT): CORROBORATE it, or CREATE a node for what "
                     "the note adds]"))
    run.seen[rel] = text
    return shown if rel == path else f"(the node {rel})\n{shown}"


def _shown(rel: str, text: str) -> tuple[str, bool]:
    """What node_read shows of node ``rel`` holding ``text`` (without the note saying
    where it was cut), and whether that holds its content whole."""
    if (n := chars_within(text, SHOWN_CHARS)) == len(text):
        return text, True
    shown = cut_text(text, n)
    return shown, digest.parse_node(rel, shown).content == digest.parse_node(rel, text).content


def refuse_unreadable(outcome: integration.Outcome) -> integration.Outcome:
    """``outcome``, or its refusal when the content it writes (CREATE, REFINE, CORRECT)
    would leave a node node_read could not show whole: no later dream could rewrite it.
    A length in characters does not bound that: Chinese text costs a model about nine
    times as much as English of the same length."""
    if outcome.text is None or outcome.action not in ("CREATE", "REFINE", "CORRECT") \
            or _shown(outcome.path, outcome.text)[1]:
        return outcome
    return integration.Outcome(
        outcome.action, outcome.path, "refused", None,
        f"the node would be too long to be read whole again ({text_cost(outcome.text)} "
        f"of the {SHOWN_CHARS} a read may show, in thirds of a token): no later rewrite "
        "could keep it; write its content shorter, or CREATE another node for the rest")


def refuse_unread(run: _Run, outcome: integration.Outcome) -> integration.Outcome:
    """``outcome``, or its refusal when it rewrites (REFINE, CORRECT) a node whose content
    the model was shown only in part."""
    sizes = run.read_in_part.get(outcome.path)
    if sizes is None or outcome.action not in ("REFINE", "CORRECT") or outcome.text is None:
        return outcome
    return integration.Outcome(
        outcome.action, outcome.path, "refused", None,
        f"the node is too long to be shown whole ({sizes[0]} characters, node_read shows "
        f"the first {sizes[1]}) and its content goes on past them: a rewrite would drop "
        "what you did not read. CORROBORATE it, or CREATE a node for what this note adds")


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
