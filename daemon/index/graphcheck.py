"""The link graph checked against the links the notes' texts name now (``index.verify``).

Pure: the caller reads the notes (``prepare.unchanged_links``, in a worker thread, no
lock) and hands their links here with the digests it read them against; this compares,
under the index lock, each such note's edges in the graph with those links resolved as
the index resolves them (``links.resolve_links`` against the notes indexed now). A note
whose digest in the index is no longer the one read (an edit applied meanwhile) is left
out: the next verify sees it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TypedDict

from recalld.daemon.index.links import Link, normalize_target, resolve_links
from recalld.daemon.index.state import IndexState
from recalld.daemon.memory.secret_names import mask_path

__all__ = ["EdgeDiff", "LinkCheck", "check_links", "masked_examples"]

#: How many differing edges are shown.
MAX_EXAMPLES = 10


class EdgeDiff(TypedDict):
    """One edge the graph has and the text does not (``stale``), or the reverse."""

    path: str
    line: int
    dst: str
    kind: str
    resolved: bool
    found: str  # "missing" (in the text, not in the graph) or "stale" (the reverse)


class LinkCheck(TypedDict):
    files_checked: int
    edges_checked: int
    missing_edges: int
    stale_edges: int
    examples: list[EdgeDiff]  # the first MAX_EXAMPLES


_Key = tuple[str, str, int, str, str, bool]


def _key(link: Link) -> _Key:
    # An edge waiting for its note is compared by the name it waits as: one made
    # waiting by a deletion keeps the name as written (``wiki/foo``), one read so the
    # cleaned path (``wiki/foo.md``); both wait for the same note.
    dst = link.dst if link.resolved else normalize_target(link.dst)[0]
    return (dst, link.kind, link.line, link.heading, link.alias, link.resolved)


def _diff(path: str, keys: Iterable[_Key], found: str) -> Iterable[EdgeDiff]:
    for dst, kind, line, _heading, _alias, resolved in sorted(keys):
        yield {"path": path, "line": line, "dst": dst, "kind": kind, "resolved": resolved,
               "found": found}


def check_links(state: IndexState, read: Mapping[str, tuple[str, list[Link]]],
                ) -> tuple[list[str], LinkCheck]:
    """Compare ``state``'s graph with ``read`` (path -> (the digest its text was read
    against, its links as extracted)), and look for edges of notes the index does not
    hold: the notes whose edges differ (sorted) and the counts. Call under the index
    lock."""
    files, graph = state.files, state.graph
    checked = edges = missing = stale = 0
    paths: list[str] = []
    examples: list[EdgeDiff] = []
    for path in sorted(read):
        digest, links = read[path]
        info = files.get(path)
        if info is None or info.digest != digest or info.read_again:
            continue
        checked += 1
        want = Counter(_key(lk) for lk in resolve_links(path, links, state.resolve))
        have = Counter(_key(lk) for lk in graph.outgoing(path))
        edges += have.total()
        if want == have:
            continue
        paths.append(path)
        lacking, extra = want - have, have - want
        missing += lacking.total()
        stale += extra.total()
        if len(examples) < MAX_EXAMPLES:
            examples += _diff(path, lacking.elements(), "missing")
            examples += _diff(path, extra.elements(), "stale")
    for path in graph.files():
        if path not in files:  # edges of a note the index no longer has
            out = graph.outgoing(path)
            paths.append(path)
            stale += len(out)
            edges += len(out)
            if len(examples) < MAX_EXAMPLES:
                examples += _diff(path, map(_key, out), "stale")
    return sorted(paths), {
        "files_checked": checked, "edges_checked": edges, "missing_edges": missing,
        "stale_edges": stale, "examples": examples[:MAX_EXAMPLES]}


def masked_examples(links: LinkCheck) -> LinkCheck:
    """``links`` as an answer shows it: each example's note and target named as status
    names them, a name that holds what looks like a credential masked."""
    examples: list[EdgeDiff] = [{**e, "path": mask_path(e["path"]), "dst": mask_path(e["dst"])}
                                for e in links["examples"]]
    return {**links, "examples": examples}
