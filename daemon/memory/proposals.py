"""The model's proposals for a digest node, validated: :func:`parse_integration` turns the
``integrate`` tool's arguments into an :class:`~digest.Integration` (or an
:class:`~digest.IntegrationError` whose message the model can act on), which
:mod:`integration` applies.

Nothing here touches the disk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from recalld.daemon.index.links import legacy_edge
from recalld.daemon.memory.digest import (
    ACTIONS,
    BUCKETS,
    MANAGED,
    MAX_CONTENT_CHARS,
    Integration,
    IntegrationError,
    kind_of,
    link_path,
    node_path,
)
from recalld.daemon.memory.slugs import names_nothing, visible_text


def _one_line(text: str) -> str:
    return visible_text(text)


def _string(args: Mapping[str, object], name: str, *, required: bool = False,
            limit: int = 500, multiline: bool = False) -> str:
    """A string argument; all but the content are single lines (a line break in a name,
    path or reason would split the frontmatter, the title or a History entry)."""
    value = args.get(name, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise IntegrationError(f"{name} must be a string")
    value = value.strip() if multiline else _one_line(value)
    if required and names_nothing(value):  # blank, or only what shows nothing
        raise IntegrationError(f"{name} is required" + (
            " (what was given has no character that is seen)" if value else ""))
    if len(value) > limit:
        raise IntegrationError(f"{name} is longer than {limit} characters")
    return value


def _strings(args: Mapping[str, object], name: str) -> list[str]:
    """A list-of-strings argument (one string: a list of it). An entry that is not a
    string (an object, a number) is refused: as text it would name no node or note."""
    value = args.get(name)
    if value is None or isinstance(value, str):
        return [value] if value else []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise IntegrationError(f"{name} must be a list of strings (node or note paths or "
                               f"names), got {kind_of(value)}")
    return [v for v in value if v]


def _bucket_of(path: str, digest_dir: str) -> str | None:
    """The bucket of ``path`` if it is a node's (``<digest_dir>/<bucket>/<name>.md``;
    ``digest_dir`` may have folders of its own), else None."""
    parts = path.removeprefix(digest_dir + "/").split("/") if path.startswith(
        digest_dir + "/") else []
    ok = len(parts) == 2 and parts[0] in BUCKETS and parts[1].endswith(".md")
    return parts[0] if ok else None


def _named_node(value: str, bucket: str, digest_dir: str) -> str:
    """The path of the node ``value`` names: by its path, also as a link (``[[path]]``)
    and without ``.md`` (as Obsidian links a node), or by its name (a node of
    ``bucket``)."""
    path = link_path(_one_line(value))
    if "/" not in path:
        return node_path(bucket, path, digest_dir)
    return path if path.endswith(".md") else f"{path}.md"


def parse_integration(args: Mapping[str, object], *, digest_dir: str,
                      allowed_sources: Sequence[str], default_source: str) -> Integration:
    """Validate the ``integrate`` tool's arguments. Raises IntegrationError with a message
    the model can act on. Sources outside ``allowed_sources`` (the note the model reads)
    are dropped; none left means the note being read."""
    if not isinstance(args, Mapping):
        raise IntegrationError("arguments must be an object")
    action = _string(args, "action", required=True).upper()
    if action not in ACTIONS:
        raise IntegrationError(f"action must be one of {', '.join(ACTIONS)}")
    node = _string(args, "node", limit=300) or None
    bucket = _string(args, "bucket").lower()
    if node is not None:
        # A node named by its name alone, with no bucket, is looked up in any bucket (as
        # node_read finds it); only a new node needs its bucket named.
        node = _named_node(node, bucket if bucket in BUCKETS or action == "CREATE"
                           else BUCKETS[0], digest_dir)
        in_bucket = _bucket_of(node, digest_dir)
        if in_bucket is None or node.rsplit("/", 1)[-1].startswith("."):
            raise IntegrationError(
                f"node must be a path like {digest_dir}/<bucket>/<name>.md")
        bucket = in_bucket
    if bucket not in BUCKETS:
        raise IntegrationError(f"bucket must be one of {', '.join(BUCKETS)}")
    raw_name = args.get("name")
    if isinstance(raw_name, str) and raw_name and names_nothing(raw_name):
        raise IntegrationError(f"name {raw_name!a} has no character that is seen "
                               "(only invisible ones, marks or spaces): give the node a name")
    name = _string(args, "name", required=node is None, limit=120)
    if not name and node is not None:
        name = node.rsplit("/", 1)[-1].removesuffix(".md")
    content = _string(args, "content", required=action in ("CREATE", "REFINE", "CORRECT"),
                      limit=MAX_CONTENT_CHARS, multiline=True)
    for line in content.splitlines():
        if (line.strip().startswith("## ") and line.strip()[3:].strip() in MANAGED) \
                or legacy_edge(line) is not None:
            raise IntegrationError(
                f"content must not hold {line.strip()[:60]!r}: the sections "
                f"{', '.join(MANAGED)} and source links are written from the arguments")
    allowed = set(allowed_sources)
    sources = tuple(dict.fromkeys(
        s for s in map(link_path, _strings(args, "sources")) if s in allowed)
    ) or (default_source,)
    related: list[str] = []
    not_nodes: list[str] = []
    for r in _strings(args, "related"):
        if names_nothing(r.rstrip("/").rsplit("/", 1)[-1].removesuffix(".md")):
            raise IntegrationError(
                f"related entry {r!a} names no node: its name has no character that "
                "is seen (only invisible ones, marks or spaces); leave it out or name one")
        r = _named_node(r, bucket, digest_dir)
        (related if _bucket_of(r, digest_dir) is not None else not_nodes).append(r)
    return Integration(
        action=action, bucket=bucket, name=name,
        description=_string(args, "description", limit=300),
        content=content, type=_string(args, "type", limit=40),
        sources=sources, related=tuple(dict.fromkeys(related)),
        reason=_string(args, "reason", limit=500),
        node=node if node is not None else node_path(bucket, name, digest_dir),
        not_nodes=tuple(dict.fromkeys(not_nodes)),
    )
