"""Links between notes: ``[[wikilinks]]`` and ``key:: [[target]]`` typed edges, and their graph.

Owns extraction (pure: text in, edges out) and ``LinkGraph``, an in-memory adjacency in both
directions used for link expansion of search results. No I/O: the graph is saved and loaded as a
list of JSON-able records by the caller (``file_graph/default.jsonl.zst``).

Targets are resolved as Obsidian resolves them, by the caller's ``resolve(target, src)``,
which knows the workspace's notes: a bare name (``[[foo]]``, ``[[Foo.md]]``) names the note
of that name in any folder, a target with a ``/`` the note at that path from the workspace
root, else one whose path ends with it (``[[wiki/foo]]`` -> ``digest/wiki/foo.md``),
``./foo`` and ``../foo`` from the linking note's folder, ``/foo`` (or a path from
there that lands at the root) only the root's ``foo`` (kept as ``/foo.md`` while it waits),
``/wiki/foo`` (or ``../wiki/foo`` landing so) only ``wiki/foo.md`` (``/wiki/foo.md``),
a folder (``wiki/``) no note; ``.md`` optional, any case; of
several, the one :func:`pick_note` picks, whatever order they came in. Unresolved targets
are kept as written, a path cleaned (``/a/./b`` -> ``a/b.md``; a file that is no note,
``[[resource/a.txt]]``, keeps its own suffix) and ``resolved`` false; the graph lists the
sources waiting for each name (:meth:`LinkGraph.waiting_for`), and those whose links name
a note by name (:meth:`LinkGraph.naming`), so that the edge is resolved anew as soon as a
note of that name is indexed (``IndexState.apply``), in
whatever order the files came.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypedDict

from recalld.daemon.index.codelines import visible_lines
from recalld.daemon.index.filters import composed
from recalld.daemon.jsontypes import JsonObject

__all__ = ["LEGACY_KINDS", "Link", "LinkGraph", "extract_links", "legacy_edge", "link_target",
           "name_key", "normalize_target", "note_name", "pick_note", "resolve_links",
           "wikilinks"]

_WIKILINK_RE: Final = re.compile(
    r"(!?)\[\[([^\[\]\n|#]*)(?:#([^\[\]\n|]*))?(?:\|([^\[\]\n]*))?\]\]"
)
# The key's run is taken whole (a lookahead and its backreference: a possessive repeat,
# which Python before 3.11.5 could get wrong; its spaces are stripped where it is read):
# a lazy one tried the spaces after each of its characters again, by the square of a
# run's length (a line of 16,000 spaces took 0.8 s).
_TYPED_RE: Final = re.compile(r"^\s*(?:[-*+]\s+)?(\w(?=([\w .\-]*))\2)\s*::\s*(.*)$")

#: ``resolve(target, src)``: the note the link ``target`` in the note ``src`` names.
Resolver = Callable[[str, str], str | None]

#: Typed keys of older digest nodes (ReMe's format) and the edge kind they stand for: a
#: node's sources and its related nodes, like links under its ``## Sources`` and
#: ``## Related`` headings.
LEGACY_KINDS: Final = {"derived_from": "source", "relates_to": "related"}
_SECTION_KINDS: Final = {"sources": "source", "related": "related"}
_HEADING_RE: Final = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$")


class LinkRecord(TypedDict):
    """A :class:`Link` as the graph records store it."""

    src: str
    dst: str
    kind: str
    line: int
    heading: str
    alias: str
    resolved: bool
    by_name: bool
    name: str


@dataclass(frozen=True, slots=True)
class Link:
    """One edge. ``kind`` is ``"link"`` for a plain wikilink, else the typed key (``parent``);
    ``line`` is 1-based in the source file; ``by_name``: a bare ``[[name]]`` resolved to
    the file ``dst`` (it names another file of that name should ``dst`` go, or should a
    note it names before ``dst`` come); ``name``: the target as written where it named
    ``dst`` by another name (a bare name, the last folders of its path, another case),
    so that it names another note should ``dst`` go, or should one it names before
    ``dst`` come."""

    src: str
    dst: str
    kind: str
    line: int
    heading: str = ""
    alias: str = ""
    resolved: bool = True
    by_name: bool = False
    name: str = ""

    def __reduce__(self) -> tuple[type[Link],
                                  tuple[str, str, str, int, str, str, bool, bool, str]]:
        # Worker processes send links to the daemon by the thousand: as the arguments of a
        # call, unpickled in C, not through the generic dataclass state functions.
        return Link, (self.src, self.dst, self.kind, self.line, self.heading, self.alias,
                      self.resolved, self.by_name, self.name)

    def to_record(self) -> LinkRecord:
        return {
            "src": self.src, "dst": self.dst, "kind": self.kind, "line": self.line,
            "heading": self.heading, "alias": self.alias, "resolved": self.resolved,
            "by_name": self.by_name, "name": self.name,
        }

    @classmethod
    def from_record(cls, rec: JsonObject) -> Link:
        return cls(
            str(rec["src"]), str(rec["dst"]), str(rec["kind"]), int(rec["line"]),
            str(rec.get("heading", "")), str(rec.get("alias", "")), bool(rec.get("resolved", True)),
            bool(rec.get("by_name", False)), str(rec.get("name", "")),
        )


def normalize_target(target: str, resolve: Resolver | None = None,
                     src: str = "") -> tuple[str, bool]:
    """(the note's workspace-relative path, True) where ``resolve`` finds it, else (the
    cleaned name or path, False). ``src``: the note linking; a target it names relative
    to its own folder (``./x``, ``../x``) is read from there, as Obsidian reads it."""
    name = target.strip().replace("\\", "/")
    if not name:
        return "", False
    if name.endswith(("/", "/.", "/..")) or name in (".", ".."):
        return name, False  # a folder (``[[wiki/]]``, ``[[./]]``, ``[[../]]``), no note
    if src and name.startswith(("./", "../")):
        # A path from the note's folder names one place: from the root where it lands there.
        name = "/" + posixpath.join(posixpath.dirname(src), name)
    if "/" in name:
        rooted = name.startswith("/")
        name = posixpath.normpath(name.lstrip("/"))
        if name.startswith("../") or name in ("..", "."):
            return target.strip().replace("\\", "/"), False
        if rooted:
            # ``[[/x]]``, ``[[../x]]`` from ``memory/n.md``: the note ``x`` at the root, not
            # the bare name ``x`` of any folder; ``[[/wiki/x]]`` the note at ``wiki/x.md``,
            # not one whose path ends so (``digest/wiki/x.md``). The ``/`` stays, so that
            # it waits as such.
            name = "/" + name
    if resolve is not None:
        found = resolve(name, src)
        if found is not None:
            return found, True
    if "/" in name and not posixpath.splitext(name)[1]:
        # Waiting as the path of the note it names: a note written there later has the
        # edge at once.
        name += ".md"
    return name, False


def note_name(target: str) -> str:
    """The name of the note ``target`` (a bare name or a path) names, as
    :func:`name_key` compares names: ``wiki/Foo.md`` -> ``foo``."""
    base = posixpath.basename(target)
    return name_key(base[:-3] if base.lower().endswith(".md") else base)


def pick_note(target: str, paths: Sequence[str], src: str = "") -> str | None:
    """Of ``paths``, the notes of the name ``target`` names (:func:`note_name`), the one
    it names from the note ``src``, as Obsidian resolves a link: a bare name (``[[foo]]``,
    ``[[Foo.md]]``) any of them, a path (``[[wiki/foo]]``) the one at that path from the
    workspace root, else one whose path ends with it; any case, composed or not. Of
    several, one of the very path written, then of the very name (``Kafka.md`` for
    ``[[Kafka]]`` beside ``kafka.md``: a case-blind match never hides the note named);
    of those, as Obsidian picks, the one in ``src``'s own folder, else the shortest
    path, else the first in code point order: whatever order the notes came in."""
    rooted = target.startswith("/")  # ``/x``: the note ``x`` at the root, no other
    target = target.lstrip("/")
    note = target if target.lower().endswith(".md") else f"{target}.md"
    if "/" in target or rooted:
        want = name_key(note)
        keys = {p: name_key(p) for p in paths}
        paths = ([p for p in paths if keys[p] == want]
                 or [p for p in paths if not rooted and keys[p].endswith("/" + want)])
    if len(paths) < 2:
        return paths[0] if paths else None
    written = composed(note)
    for want in (written, posixpath.basename(written)):
        exact = [p for p in paths if (c := composed(p)) == want or c.endswith("/" + want)]
        if exact:
            paths = exact
            break
    folder = posixpath.dirname(src)
    return min(paths, key=lambda p: (composed(p) != written,
                                     posixpath.dirname(p) != folder, len(p), composed(p)))


def extract_links(path: str, text: str, resolve: Resolver | None = None, *,
                  body_start: int | None = None) -> list[Link]:
    """Edges of one note, in text order; code blocks, code spans, comments (``<!-- -->``,
    ``%% %%``) and escaped links (``\\[[x]]``) are skipped, and an edge to the note itself
    is dropped. Duplicates (same dst, kind, line, heading and alias) are kept once.

    Kinds: the typed key (``parent::``), ``source`` / ``related`` for links under a
    ``## Sources`` / ``## Related`` heading and for the older ``derived_from::`` /
    ``relates_to::`` keys, else ``link``. ``body_start``: the line the note's body starts
    at, as ``frontmatter.recall_block`` gives it (found when not given)."""
    out: list[Link] = []
    if "[[" not in text and "[`" not in text:
        # No line can hold a link: removing code spans makes a ``[[`` only where a ``[``
        # stood right before a span's opening backtick. Most notes, not walked line by
        # line.
        return out
    seen: set[tuple[str, str, int, str, str]] = set()
    section = "link"
    for number, line in visible_lines(text, body_start):
        heading = _HEADING_RE.match(line)
        if heading is not None:
            section = _SECTION_KINDS.get(heading.group(1).strip().lower(), "link")
        if "[[" not in line:
            continue
        typed = _TYPED_RE.match(line)
        kind = typed.group(1).strip().lower() if typed is not None else section
        kind = LEGACY_KINDS.get(kind, kind)
        for m in wikilinks(line):
            name, part = link_target(m)
            ext = posixpath.splitext(name)[1].lower()
            if m.group(1) and ext and ext != ".md":
                continue  # an embedded image or attachment, not a note
            dst, resolved = normalize_target(name, resolve, path)
            if not dst or dst == path:
                continue
            alias = (m.group(4) or "").strip()
            key = (dst, kind, number, part, alias)
            if key in seen:
                continue
            seen.add(key)
            out.append(Link(path, dst, kind, number, part, alias, resolved))
    return out


def wikilinks(line: str) -> Iterator[re.Match[str]]:
    """The wikilinks of one visible line (:func:`visible_lines`), those escaped
    (``\\[[x]]``: a bracket shown as it is) left out."""
    return (m for m in _WIKILINK_RE.finditer(line)
            if m.group(1) or not _escaped(line, m.start()))


def link_target(m: re.Match[str]) -> tuple[str, str]:
    """The target (a name or a path) and the heading a wikilink of :func:`wikilinks`
    names."""
    name, part = m.group(2).strip(), (m.group(3) or "").strip()
    if m.group(4) is not None:
        # ``[[name\|alias]]``: the pipe escaped, as a link in a table cell is.
        name = name.removesuffix("\\").rstrip()
        part = part.removesuffix("\\").rstrip()
    if part.lower().endswith(".md"):
        # ``[[memory/d/meeting #3.md]]``: a ``#`` of the note's own name (as the
        # dream writes sources), not a heading of ``meeting``.
        name = f"{m.group(2)}#{m.group(3)}".strip().removesuffix("\\").rstrip()
        part = ""
    return name, part


def _escaped(line: str, at: int) -> bool:
    """Whether the character at ``at`` is escaped: an odd run of backslashes before it."""
    start = at
    while start and line[start - 1] == "\\":
        start -= 1
    return (at - start) % 2 == 1


def legacy_edge(line: str) -> tuple[str, list[str]] | None:
    """``("source" | "related", targets)`` for a ``derived_from::`` or ``relates_to::``
    line of an older digest node (targets with a ``/`` as ``.md`` paths, like
    :func:`normalize_target`); None for any other line."""
    typed = _TYPED_RE.match(line)
    if typed is None:
        return None
    kind = LEGACY_KINDS.get(typed.group(1).strip().lower())
    if kind is None:
        return None
    targets = [normalize_target(m.group(2))[0] for m in _WIKILINK_RE.finditer(typed.group(3))]
    # A path from the root (``[[/memory/d/n]]``) is the note's path from the root.
    return kind, [t[1:] if t.startswith("/") and "/" in t[1:] else t for t in targets if t]


def resolve_links(path: str, links: list[Link], resolve: Resolver) -> list[Link]:
    """``links`` of ``path`` (extracted without a resolver) with their names resolved now,
    bare names again (another note of the name may have come): a name that turns out to
    be ``path`` itself is dropped, and an edge that now repeats another (same dst, kind,
    line, heading and alias) is kept once."""
    if all(link.resolved and not (link.by_name or link.name) for link in links):
        return links
    out: list[Link] = []
    seen: set[tuple[str, str, int, str, str]] = set()
    for link in links:
        if not link.resolved or link.by_name or link.name:
            name = link.dst if not link.resolved else written_name(link)
            dst, resolved = normalize_target(name, resolve, path)
            if dst == path:
                continue
            # Only a bare name follows its note to another folder; a path names one place.
            link = Link(link.src, dst, link.kind, link.line, link.heading, link.alias, resolved,
                        resolved and "/" not in name, name if resolved and dst != name else "")
        key = (link.dst, link.kind, link.line, link.heading, link.alias)
        if key not in seen:
            seen.add(key)
            out.append(link)
    return out


def written_name(link: Link) -> str:
    """The target a link resolved by another name was written with (a bare name: its
    note's stem in a graph saved before the name was kept)."""
    return link.name or posixpath.splitext(posixpath.basename(link.dst))[0]


def name_key(name: str) -> str:
    """How a bare link name and a file's stem are compared: NFKC (an NFD name from
    another system, full-width letters), any case."""
    return unicodedata.normalize("NFKC", name.strip()).lower()


def _uncount(index: dict[str, dict[str, int]], key: str, src: str) -> None:
    """One edge of ``src`` fewer under ``key`` of ``index``."""
    srcs = index.get(key)
    if srcs is None:
        return
    left = srcs.get(src, 0) - 1
    if left > 0:
        srcs[src] = left
    else:
        srcs.pop(src, None)
        if not srcs:
            del index[key]


class LinkGraph:
    """Directed edges between files, queryable in both directions."""

    def __init__(self) -> None:
        self._out: dict[str, list[Link]] = {}
        self._in: dict[str, dict[str, int]] = {}  # dst -> {src: number of edges}
        # The note names of unresolved edges (``note_name``) -> the sources holding such
        # an edge, with how many.
        self._dangling: dict[str, dict[str, int]] = {}
        # Likewise the names of edges resolved by name: a note of that name applied later
        # may be the one they name (one in their own folder, or of the case written).
        self._named: dict[str, dict[str, int]] = {}
        # Counted as edges come and go: status asks for it on every call, also while an
        # apply in a worker thread changes ``_out`` (which it must not iterate then).
        self._edges = 0

    def __len__(self) -> int:
        return self._edges

    def add_file(self, path: str, links: Iterable[Link]) -> None:
        """Set ``path``'s outgoing edges (replacing any earlier ones)."""
        self.remove_file(path)
        edges = [lk for lk in links if lk.src == path]
        if edges:
            self._set_edges(path, edges)

    def _set_edges(self, path: str, edges: list[Link]) -> None:
        """``path`` (which has none) has ``edges``, every one from it."""
        self._out[path] = edges
        self._edges += len(edges)
        for lk in edges:
            srcs = self._in.setdefault(lk.dst, {})
            srcs[path] = srcs.get(path, 0) + 1
            if not lk.resolved:
                srcs = self._dangling.setdefault(note_name(lk.dst), {})
                srcs[path] = srcs.get(path, 0) + 1
            elif lk.by_name or lk.name:
                srcs = self._named.setdefault(note_name(written_name(lk)), {})
                srcs[path] = srcs.get(path, 0) + 1

    def remove_file(self, path: str) -> None:
        """Drop ``path``'s outgoing edges; edges pointing at it stay (they may resolve again)."""
        edges = self._out.pop(path, [])
        self._edges -= len(edges)
        for lk in edges:
            _uncount(self._in, lk.dst, path)
            if not lk.resolved:
                _uncount(self._dangling, note_name(lk.dst), path)
            elif lk.by_name or lk.name:
                _uncount(self._named, note_name(written_name(lk)), path)

    def relink(self, notes: Container[str], resolve: Resolver) -> None:
        """Resolve anew each edge to none of ``notes`` (the indexed ones): a graph saved
        under older rules named some notes by paths no note has (``[[Kafka.md]]`` as
        ``Kafka.md`` from the root)."""
        for src in list(self._out):
            links = self._out[src]
            if all(lk.dst in notes for lk in links):
                continue
            self.add_file(src, resolve_links(src, [
                lk if lk.dst in notes else Link(lk.src, lk.dst, lk.kind, lk.line, lk.heading,
                                                lk.alias, False)
                for lk in links], resolve))

    def unresolve(self, path: str) -> list[str]:
        """``path`` is gone: the links that named it wait for it again, by name those that
        named it by name (a note moved to another folder, or a new note of that name, takes
        them), by the path written the others (``[[wiki/foo]]``: a note at another path
        ending so takes them; a note there in another case too). Returns the files holding
        such links."""
        srcs = [src for src in sorted(self._in.get(path, ()))
                if any(lk.dst == path and lk.resolved for lk in self._out[src])]
        for src in srcs:
            self.add_file(src, [Link(lk.src,
                                     written_name(lk) if lk.by_name else lk.name or path,
                                     lk.kind, lk.line, lk.heading, lk.alias, False)
                                if lk.dst == path and lk.resolved else lk
                                for lk in self._out[src]])
        return srcs

    @property
    def has_dangling(self) -> bool:
        """Whether some edge waits for a name no file has had yet."""
        return bool(self._dangling)

    def waiting_for(self, name: str) -> list[str]:
        """The files with an unresolved edge to the bare name ``name`` (any case)."""
        return sorted(self._dangling.get(name_key(name), ()))

    def naming(self, name: str) -> list[str]:
        """The files with an edge resolved by the bare name ``name`` (any case): a note of
        that name that comes may be the one it names (:func:`pick_note`)."""
        return sorted(self._named.get(name_key(name), ()))

    def outgoing(self, path: str) -> list[Link]:
        return list(self._out.get(path, ()))

    def incoming(self, path: str) -> list[Link]:
        return [lk for src in sorted(self._in.get(path, ())) for lk in self._out[src]
                if lk.dst == path]

    def linked(self, path: str) -> set[str]:
        """Files one hop from ``path`` along edges in either direction (``path`` excluded);
        what ``neighbours(path, 1)`` finds, without the ordering."""
        out = {lk.dst for lk in self._out.get(path, ())}
        out.update(self._in.get(path, ()))
        out.discard(path)
        return out

    def neighbours(self, path: str, depth: int = 1) -> dict[str, int]:
        """Files within ``depth`` hops along edges in either direction -> their distance.

        Breadth-first, ``path`` itself excluded; deterministic order (distance, then path).
        """
        dist = {path: 0}
        queue = deque([path])
        while queue:
            cur = queue.popleft()
            if dist[cur] >= depth:
                continue
            for other in sorted(self.linked(cur)):
                if other not in dist:
                    dist[other] = dist[cur] + 1
                    queue.append(other)
        del dist[path]
        return dict(sorted(dist.items(), key=lambda kv: (kv[1], kv[0])))

    def files(self) -> list[str]:
        return sorted(self._out)

    def to_records(self) -> list[LinkRecord]:
        """All edges as JSON-able dicts, sorted by source path then line."""
        return list(self.records())

    def records(self) -> Iterator[LinkRecord]:
        """:meth:`to_records`, one at a time."""
        for src in sorted(self._out):
            for lk in self._out[src]:
                yield lk.to_record()

    @classmethod
    def from_records(cls, records: Iterable[JsonObject]) -> LinkGraph:
        by_src: dict[str, list[Link]] = {}
        for rec in records:
            lk = Link.from_record(rec)
            by_src.setdefault(lk.src, []).append(lk)
        graph = cls()
        for src, links in by_src.items():  # a new graph: nothing to replace
            graph._set_edges(src, links)
        return graph
