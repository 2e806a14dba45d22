"""Digest nodes: their Markdown format and the model's proposals, as pure functions.

A node is ``digest/<bucket>/<slug>.md`` with frontmatter ``name``, ``description``, ``type``,
``bucket``, ``created``, ``updated``, ``confidence``, ``corroborations``, ``sources``,
``deleted_sources`` and ``overturned_sources`` (if any) and ``related``, a ``# <name>``
title, the content, and three
sections the code owns: ``## Related`` (``[[digest/...]]`` links), ``## History``
(corrected claims with date, old text, source and reason) and ``## Sources``
(``[[memory/<date>/<note>.md]]`` links; ``memory/<date>/<note>.md (deleted)`` for a
source note deleted since, which still counts). ``confidence`` counts the sources that
back the content: a correction starts them again from its own note, and the notes whose
claim it overturned go to ``overturned_sources`` (and its History entry), no longer
counted nor listed under ``## Sources``. A person
may edit a node by hand; every other heading stays part of the content, and the title and
what a person wrote under ``## Related`` and ``## Sources`` stay as written (new links go
below). Older nodes (ReMe's format) name their sources and related nodes in
``derived_from:: [[...]]`` and ``relates_to:: [[...]]`` lines; those count as sources and
related nodes, and a node written again has them in its sections instead.

The model never writes a node: it proposes an :class:`Integration`, which
:func:`proposals.parse_integration` validates and :mod:`integration` applies.

Nothing here touches the disk.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from recalld.daemon.index.frontmatter import block_problem, parse_frontmatter
from recalld.daemon.index.frontmatter_edit import render_frontmatter
from recalld.daemon.index.links import legacy_edge
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.slugs import slugify as slugify
from recalld.daemon.memory.slugs import visible_text as visible_text

BUCKETS: Final = ("personal", "procedure", "wiki")
ACTIONS: Final = ("CREATE", "CORROBORATE", "REFINE", "CORRECT")
MIN_KEEP_FRACTION: Final = 0.5
MAX_CONTENT_CHARS: Final = 8000
#: The ``## History`` entries a node keeps; older ones move to its archive file
#: (:func:`history_archive`), which search does not index, and one line counts them.
MAX_HISTORY_ENTRIES: Final = 20
_ARCHIVED_RE: Final = re.compile(
    r"- (\d+) older (?:entry is|entries are) in (\S.*\.history\.txt)")
MANAGED: Final = ("Related", "History", "Sources")
LINK_RE: Final = re.compile(r"\[\[([^\]\n]+)\]\]")
# LINK_RE for scanning a line: an opening ``[[`` that is no link is read to where its run
# ends (group 2 then unset), not tried again from each ``[[`` inside the run, which ends
# at the same place; a line of many ``[[`` and no ``]]`` took time by the square of its
# length. The links it finds (group 1 not empty, group 2 set) are LINK_RE's.
_LINK_SCAN_RE: Final = re.compile(r"\[\[([^\]\n]*)(\]\])?")


class IntegrationError(ValueError):
    """The model's proposal cannot be applied; the message says why (it is shown to it)."""


def confidence_for(source_count: int) -> float:
    """1 source 0.5, 2 sources 0.75, 3 sources 0.88 ...: each corroboration halves the doubt."""
    return round(1.0 - 0.5 ** max(1, source_count), 2)


@dataclass(slots=True)
class Node:
    """A parsed node. ``extra`` keeps frontmatter keys the code does not own."""

    path: str
    name: str
    description: str = ""
    type: str = ""
    bucket: str = "wiki"
    created: str = ""
    updated: str = ""
    corroborations: int = 0
    sources: list[str] = field(default_factory=list)
    #: Sources whose note was deleted since it was dreamed: still counted (the claim
    #: stands on them), no longer linked (``memory/<date>/<note>.md (deleted)``).
    deleted_sources: list[str] = field(default_factory=list)
    #: Notes whose claim a correction overturned: recorded, no longer counted nor listed
    #: under ``## Sources`` (the correction's History entry names them too).
    overturned_sources: list[str] = field(default_factory=list)
    related: list[str] = field(default_factory=list)
    content: str = ""
    history: list[str] = field(default_factory=list)
    #: How many older History entries are in the node's archive file.
    archived: int = 0
    #: The archive file its History names ("" if none): :func:`history_archive` of its
    #: path, or of the path it had before a person renamed its file.
    archive_named: str = ""
    extra: JsonObject = field(default_factory=dict)  # other frontmatter: user metadata
    #: As written by hand: the title, and the lines of ``## Related`` and ``## Sources``
    #: (prose a person put there included), written again as they are.
    title: str = ""
    written: dict[str, list[str]] = field(default_factory=dict)
    #: What keeps it from being read as written (a hand edit): its frontmatter block does
    #: not parse, a field the code owns holds what it cannot be (sources that name no
    #: note, corroborations below 0), or its bytes are not UTF-8; "" if none. Written
    #: again, its fields or text would be lost or counted wrong, so it is not written.
    problem: str = ""

    @property
    def unreadable(self) -> bool:
        return bool(self.problem)

    @property
    def confidence(self) -> float:
        return confidence_for(len(self.sources) + len(self.deleted_sources))


@dataclass(frozen=True, slots=True)
class Integration:
    """One proposed action, as the ``integrate`` tool receives it (already validated)."""

    action: str
    bucket: str
    name: str
    description: str = ""
    content: str = ""
    type: str = ""
    sources: tuple[str, ...] = ()
    related: tuple[str, ...] = ()
    reason: str = ""
    node: str | None = None  # an existing node's path, if the model names one
    #: The ``related`` entries that are no node's path (a daily note, a file outside the
    #: buckets): not linked, and the model is told so.
    not_nodes: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return self.node or node_path(self.bucket, self.name)


def history_archive(path: str) -> str:
    """The file beside node ``path`` that holds its older History entries, oldest first
    (``digest/wiki/editor.history.txt``: not Markdown, so search does not index it)."""
    return f"{path.removesuffix('.md')}.history.txt"


def keep_history(node: Node) -> list[str]:
    """Move all but the newest :data:`MAX_HISTORY_ENTRIES` entries of ``node``'s History
    out of it (counted in ``archived``); returns those moved, oldest first."""
    moved = node.history[:-MAX_HISTORY_ENTRIES]
    if moved:
        node.history = node.history[len(moved):]
        node.archived += len(moved)
    return moved


def node_path(bucket: str, name: str, digest_dir: str = "digest") -> str:
    return f"{digest_dir}/{bucket}/{slugify(name)}.md"


def node_key(path: str) -> str:
    """What tells nodes apart: the file name without ``.md``, in one Unicode form and case
    (``Python.md``, ``python.md`` and ``digest/wiki/python.md`` are one node)."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".md")
    return unicodedata.normalize("NFKC", visible_text(stem)).casefold()


def name_key(name: str) -> str:
    """What tells node names apart: one Unicode form and case, runs of spaces as one,
    without what is not seen (:func:`visible_text`)."""
    return " ".join(unicodedata.normalize("NFKC", visible_text(name)).casefold().split())


def _as_list(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list | tuple):
        return [str(v) for v in value if v not in (None, "")]
    return []


def section_links(line: str) -> list[str]:
    """The targets of the ``[[...]]`` links of a Sources or Related line: without an
    ``|alias`` or a ``#heading``, except a ``#`` of a note's own name (``[[memory/d/
    meeting #3.md]]`` is that note, not a heading of ``meeting``)."""
    return [target for m in _LINK_SCAN_RE.finditer(line)
            if is_link(m) and (target := link_target(m))]


def sub_links(replace: Callable[[re.Match[str]], str], line: str) -> str:
    """``line`` with each link :data:`LINK_RE` finds in it replaced by ``replace(link)``
    (whose groups are LINK_RE's), in time linear in its length."""
    return _LINK_SCAN_RE.sub(lambda m: replace(m) if is_link(m) else m.group(0), line)


def is_link(m: re.Match[str]) -> bool:
    """Whether a match of the scan for links is a link (as LINK_RE matches one)."""
    return m.group(2) is not None and bool(m.group(1))


def link_target(link: re.Match[str]) -> str:
    """The target of a link :data:`LINK_RE` matched (as :func:`section_links` reads it)."""
    target = link.group(1).split("|", 1)[0].strip()
    if "#" in target and not target.lower().endswith(".md"):
        target = target.split("#", 1)[0].strip()
    return target


def link_path(value: str) -> str:
    """A path the model wrote, also as a link (``[[path]]``, ``[[path|alias]]``,
    ``[[Name#heading]]``): what it links to (:func:`link_target`)."""
    value = value.strip()
    link = LINK_RE.fullmatch(value)
    return value if link is None else link_target(link)


# -- parse / render ---------------------------------------------------------------------------


def parse_node(path: str, text: str) -> Node:
    """A node from its text; hand-edited or foreign nodes parse as well as they can."""
    text = text.replace("\r\n", "\n")  # a node saved by an editor with CRLF line ends
    fields, body_start = parse_frontmatter(text)
    body = text.split("\n")[body_start:]
    sections: dict[str, list[str]] = {}
    content: list[str] = []
    current: list[str] = content
    title: str | None = None
    # Older nodes (ReMe's format) name sources and related nodes in ``key:: [[...]]`` lines.
    legacy: dict[str, list[str]] = {"source": [], "related": []}
    for line in body:
        stripped = line.strip()
        edge = legacy_edge(line) if current is content else None
        if edge is not None:
            legacy[edge[0]].extend(edge[1])
            continue
        if title is None and stripped.startswith("# ") and not content:
            title = stripped[2:].strip()
            continue
        if stripped.startswith("## ") and stripped[3:].strip() in MANAGED:
            current = sections.setdefault(stripped[3:].strip(), [])
            continue
        if stripped.startswith("## "):  # a person's own section, after Sources too
            current = content
        current.append(line)
    bucket = str(fields.get("bucket") or (path.split("/")[-2] if path.count("/") >= 2 else "wiki"))
    sources = _section_links(fields.get("sources"), sections.get("Sources", []))
    sources.extend(legacy["source"])
    related = _section_links(fields.get("related"), sections.get("Related", []))
    related.extend(legacy["related"])
    history = [ln for ln in sections.get("History", []) if ln.strip()]
    counted = [m for ln in history if (m := _ARCHIVED_RE.fullmatch(ln.strip()))]
    history = [ln for ln in history if not _ARCHIVED_RE.fullmatch(ln.strip())]
    own = {"name", "description", "type", "bucket", "created", "updated", "confidence",
           "corroborations", "sources", "deleted_sources", "overturned_sources", "related"}
    corr = fields.get("corroborations")
    return Node(
        path=path,
        name=str(fields.get("name") or path.rsplit("/", 1)[-1].removesuffix(".md")),
        description=str(fields.get("description") or ""),
        type=str(fields.get("type") or ""),
        bucket=bucket,
        created=str(fields.get("created") or ""),
        updated=str(fields.get("updated") or ""),
        corroborations=corr if isinstance(corr, int) and not isinstance(corr, bool) else 0,
        sources=list(dict.fromkeys(sources)),
        deleted_sources=[s for s in dict.fromkeys(_as_list(fields.get("deleted_sources")))
                         if s not in sources],
        # A note a person links again under Sources backs the node again.
        overturned_sources=[s for s in dict.fromkeys(_section_links(
            fields.get("overturned_sources"), [])) if s not in sources],
        related=list(dict.fromkeys(related)),
        content="\n".join(content).strip("\n"),
        history=history,
        archived=sum(int(m.group(1)) for m in counted),
        archive_named=counted[0].group(2) if counted else "",
        extra={k: v for k, v in fields.items() if k not in own},
        title=title or "",
        written={k: _trimmed(sections.get(k, [])) for k in ("Related", "Sources")},
        problem=f"in its frontmatter, {why}" if (
            why := block_problem(text) or _fields_problem(fields)) else "",
    )


def _fields_problem(fields: JsonObject) -> str:
    """What a field the code owns holds that it cannot be, as a person may write it: a
    source or related node that is no text (``sources: [1, 2]``), a deleted source that
    is no note's path (``deleted_sources: yes``: only deleted notes go there), counts
    that are none; "" if none. A source may be a bare name: an older (ReMe) node links
    its source notes so, and a node written again lists them as they were."""
    for key in ("sources", "deleted_sources", "overturned_sources", "related"):
        value = fields.get(key)
        entries = value if isinstance(value, list) else [] if value in (None, "") else [value]
        for entry in entries:
            if entry is None:
                continue  # an empty item (``-``): nothing named
            if not isinstance(entry, str):
                return f"{key} holds {kind_of(entry)} ({entry!r}), not a path"
            target = link_path(entry)
            if key == "deleted_sources" and target and not (
                    target.lower().endswith(".md") and not target.startswith("/")):
                return (f"{key} holds {entry[:80]!r}, which is no note's path "
                        "(<folder>/<date>/<note>.md)")
    corr = fields.get("corroborations")
    if corr is not None and (not isinstance(corr, int) or isinstance(corr, bool) or corr < 0):
        return f"corroborations is {corr!r}, not a count (0 or more)"
    return ""


def _link_line(target: str) -> str:
    """The line a section lists ``target`` on."""
    return f"- [[{target}]]"


def _section_links(field: object, lines: list[str]) -> list[str]:
    """The paths the frontmatter's list ``field`` names (also as links a person wrote,
    ``"[[memory/d/a.md]]"``, as Obsidian's properties hold them) and the link targets of
    a section's ``lines``. A line written for a listed path is that path, whatever it
    holds: a note named ``plan [v2].md`` or ``a|b.md`` reads back as another target."""
    listed = [t for v in _as_list(field) for t in (section_links(v) if "[[" in v else [v])]
    own = {_link_line(x) for x in listed}
    return [*listed, *(t for line in lines if line.strip() not in own
                       for t in section_links(line))]


def _trimmed(lines: list[str]) -> list[str]:
    """``lines`` without the blank lines around them."""
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


def _section(written: list[str], links: list[str]) -> str:
    """A section's lines as written, then a ``- [[link]]`` line for each of ``links`` they
    do not link yet."""
    stripped = {line.strip() for line in written}
    have = {link for line in written for link in section_links(line)}
    lines = [*written, *(_link_line(x) for x in links
                         if x not in have and _link_line(x) not in stripped)]
    return "".join(f"{line}\n" for line in lines)


def render_node(node: Node) -> str:
    fields: JsonObject = {
        "name": node.name,
        "description": node.description,
        "type": node.type or node.bucket,
        "bucket": node.bucket,
        "created": node.created,
        "updated": node.updated,
        "confidence": node.confidence,
        "corroborations": node.corroborations,
        "sources": list(node.sources),
        **({"deleted_sources": list(node.deleted_sources)} if node.deleted_sources else {}),
        **({"overturned_sources": list(node.overturned_sources)}
           if node.overturned_sources else {}),
        "related": list(node.related),
        **node.extra,
    }
    parts = [render_frontmatter(fields), f"# {node.title or node.name}\n"]
    if node.content.strip():
        parts.append("\n" + node.content.strip("\n") + "\n")
    related = _section(node.written.get("Related", []), node.related)
    if related:
        parts.append("\n## Related\n\n" + related)
    history = list(node.history)
    if node.archived:
        history.insert(0, f"- {node.archived} older "
                          f"{'entry is' if node.archived == 1 else 'entries are'} in "
                          f"{history_archive(node.path)}")
    if history:
        parts.append("\n## History\n\n" + "\n".join(history) + "\n")
    written = node.written.get("Sources", [])
    # A deleted source keeps the line it had (a person's words after its link too).
    gone = "".join(f"{deleted_line(x)}\n" for x in node.deleted_sources
                   if not any(f"{x} (deleted)" in line for line in written))
    parts.append("\n## Sources\n\n" + _section(written, node.sources) + gone)
    return "".join(parts)


def deleted_line(source: str) -> str:
    """The line ``## Sources`` lists a deleted source on: its path, no link."""
    return f"- {source} (deleted)"


def kind_of(value: object) -> str:
    """What ``value`` is, in JSON's words, for an error message."""
    if isinstance(value, list | tuple):
        return "a list holding " + ", ".join(sorted({kind_of(v) for v in value
                                                     if not isinstance(v, str)}))
    return {dict: "an object", bool: "true/false", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)
