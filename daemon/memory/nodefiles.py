"""The digest nodes on disk: listing them for the model, finding the node a path or a
name stands for, and the nodes a proposal of the model names (:func:`on_nodes`). Blocking
functions; run them in a thread.

A node is found by its file name's key (:func:`digest.node_key`: Unicode form and case
folded), else by its slug (:func:`digest.slugify`), in any bucket, so that a path the
model writes in another case or Unicode form, or with the node's name for its file name
(``digest/wiki/Tea preference.md``), or a name already used in another bucket, lands on
the node that exists instead of making a second one, and a link to a node is written only
when that node exists. A node whose file a person renamed (``tea-preference.md`` to
``drinks.md``, its frontmatter ``name`` kept) is found by that name too: a
:class:`NameIndex` reads each node's name once, and again only when its file changed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import unicodedata
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.memory import digest
from recalld.daemon.memory.confined import read_checked, read_confined
from recalld.daemon.textcost import chars_within, text_cost
from recalld.ipc.errors import RecalldError
from recalld.ipc.textcut import cut_text

_SLUG_RE: Final = re.compile(r"[^\w]+", re.UNICODE)
#: Latin letters no accent decomposes from their base letter (``Ø`` is not ``O`` + mark).
_UNACCENTED: Final = str.maketrans({"ø": "o", "ł": "l", "đ": "d", "ð": "d", "ħ": "h",
                                    "þ": "th", "æ": "ae", "œ": "oe", "ı": "i"})


def legacy_slug(stem: str) -> str:
    """The file name :func:`digest.slugify` gave before it kept combining marks (a node
    made then is found by the name it was made for)."""
    return _SLUG_RE.sub("-", stem).strip("-_")[:60].rstrip("-_") or "node"


def _entries(root: Path, digest_dir: str) -> list[tuple[int, str]]:
    """``(mtime_ns, path)`` of every node of every bucket."""
    return [(stamp[0], rel) for stamp, rel in _stamped(root, digest_dir)]


def _stamped(root: Path, digest_dir: str) -> list[tuple[tuple[int, int], str]]:
    """``((mtime_ns, size), path)`` of every node of every bucket."""
    found: list[tuple[tuple[int, int], str]] = []
    for bucket in digest.BUCKETS:
        try:
            entries = list(os.scandir(root / digest_dir / bucket))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.endswith(".md") and not entry.name.startswith("."):
                try:
                    if entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        found.append(((st.st_mtime_ns, st.st_size),
                                      f"{digest_dir}/{bucket}/{entry.name}"))
                except FileNotFoundError:
                    continue
    return found


def read_node(root: Path, rel: str) -> tuple[str | None, bool]:
    """The text of node ``rel`` (None: no such file) and whether it is UTF-8. One saved in
    another encoding reads as written (Windows-1252, GBK) or with U+FFFD in place of what
    it holds: written again, it would no longer be in its person's encoding, or what they
    wrote would be lost, so it is not written."""
    return read_checked(root, rel)


#: What a node's name and its description may cost in a listing
#: (:mod:`~recalld.daemon.textcost`: that many characters of English, a ninth as many of
#: Chinese; a description the dream writes is at most 300 characters): a person's or
#: ReMe's node may hold a page of description, and a prompt lists 80 nodes.
LISTED_NAME_CHARS: Final = 120
LISTED_DESCRIPTION_CHARS: Final = 300


def list_nodes(root: Path, digest_dir: str, limit: int) -> list[dict[str, str]]:
    """Names and descriptions of the ``limit`` newest nodes, each on one line and cut to
    :data:`LISTED_NAME_CHARS` and :data:`LISTED_DESCRIPTION_CHARS`."""
    found = sorted(_entries(root, digest_dir), reverse=True)
    out = []
    for _, rel in found[:limit]:  # only the listed nodes are read
        try:
            fields, _ = parse_frontmatter(read_confined(root, rel, strict=True) or "")
        except RecalldError:  # unreadable, or not UTF-8: listed by its file name
            fields = {}
        name = str(fields.get("name") or rel.rsplit("/", 1)[-1][:-3])
        out.append({"path": rel, "name": _listed(name, LISTED_NAME_CHARS),
                    "description": _listed(str(fields.get("description") or ""),
                                           LISTED_DESCRIPTION_CHARS)})
    return out


def _listed(text: str, limit: int) -> str:
    """``text`` on one line, cut to what costs ``limit`` (saying so)."""
    line = " ".join(text.split())
    if text_cost(line) <= limit:
        return line
    return cut_text(line, chars_within(line, limit - 1)).rstrip() + "…"


def node_paths(root: Path, digest_dir: str) -> list[str]:
    """Every node's path, sorted."""
    return sorted(rel for _, rel in _entries(root, digest_dir))


def _name_of(root: Path, rel: str) -> str:
    """The ``name`` of node ``rel``'s frontmatter; "" if it has none or cannot be read."""
    try:
        fields, _ = parse_frontmatter(read_confined(root, rel) or "")
    except RecalldError:  # too large, or a link: found by its file name only
        return ""
    name = fields.get("name")
    return name if isinstance(name, str) else ""


class NameIndex:
    """The frontmatter ``name`` of every node, by path, for :func:`find_node`: a node is
    read when first seen and again only when its file changed (modification time, size),
    so that a look-up lists the digest folder instead of reading every node."""

    def __init__(self) -> None:
        self._names: dict[str, tuple[tuple[int, int], str]] = {}

    def scan(self, root: Path, digest_dir: str) -> dict[str, str]:
        """Every node's path and name (its frontmatter's, "" if none), sorted by path
        (blocking)."""
        seen: dict[str, tuple[tuple[int, int], str]] = {}
        for stamp, rel in sorted(_stamped(root, digest_dir), key=lambda e: e[1]):
            known = self._names.get(rel)
            seen[rel] = known if known is not None and known[0] == stamp else (
                stamp, _name_of(root, rel))
        self._names = seen
        return {rel: name for rel, (_, name) in seen.items()}


def find_node(nodes: Collection[str], path: str,
              names: Mapping[str, str] | None = None) -> str | None:
    """The node of ``nodes`` (:func:`node_paths`) that ``path``
    (``digest/<bucket>/<file>.md``) stands for: itself if it is one, else the node of any
    bucket whose file name has the same key (the one of the same bucket first), else the
    node whose file name has the same slug, else the node named as
    :func:`legacy_slug` named it, else (with ``names``, :meth:`NameIndex.scan`) the node
    whose frontmatter name is the file name's, in that key or slug (a node renamed by
    hand); None if there is none."""
    if path in nodes:
        return path
    key = digest.node_key(path)
    same = [rel for rel in nodes if digest.node_key(rel) == key]
    slug = digest.slugify(key)
    if not same:
        same = [rel for rel in nodes if digest.slugify(digest.node_key(rel)) == slug]
    legacy = legacy_slug(key)
    if not same and legacy != key:
        same = [rel for rel in nodes if digest.node_key(rel) == legacy]
    named = {rel: name for rel, name in (names or {}).items() if name}
    if not same:
        same = [rel for rel, name in named.items()
                if digest.name_key(name) == digest.name_key(key)]
    if not same:
        same = [rel for rel, name in named.items() if digest.slugify(name) == slug]
    bucket = path.split("/")[-2:-1]
    return next((rel for rel in same if rel.split("/")[-2:-1] == bucket),
                same[0] if same else None)


def alike_key(name: str) -> str:
    """What is left of a name read in a hurry: :func:`digest.name_key` without the accents
    of Latin letters (``Zoë Ørsted``, ``Zoe Orsted``) nor punctuation (``e-mail``,
    ``email``). Marks of other scripts stay (a Devanagari vowel sign makes another word);
    a name of no letter or digit is its own key."""
    key = digest.name_key(name)
    out: list[str] = []
    for ch in unicodedata.normalize("NFKD", key).translate(_UNACCENTED):
        if unicodedata.category(ch)[0] == "M":  # kept on a letter of another script
            if out and not out[-1].isascii() and not out[-1].isspace():
                out.append(ch)
        elif ch.isalnum() or ch.isspace():
            out.append(ch)
    folded = " ".join("".join(out).split())
    return folded if any(ch.isalnum() for ch in folded) else key


def alike_node(names: Mapping[str, str], name: str) -> str | None:
    """The node of ``names`` (:meth:`NameIndex.scan`; a node of no name by its file name)
    whose name is ``name`` but for accents, case or punctuation (:func:`alike_key`);
    None if there is none."""
    key = alike_key(name)
    return next((rel for rel, named in names.items()
                 if alike_key(named or rel.rsplit("/", 1)[-1][:-3]) == key), None)


def on_nodes(nodes: Mapping[str, str], proposal: digest.Integration, digest_dir: str
             ) -> tuple[digest.Integration, list[str], tuple[str, str] | None]:
    """``proposal`` on the nodes that exist (``nodes``: :meth:`NameIndex.scan`): its path
    the node it stands for (:func:`find_node`: never a second node of one name), its
    related nodes those that exist (a link is never written to nothing); the related
    paths that name no node (each with the node of a name alike, if any); and, when it
    names no node, the node of a name alike, if any (:func:`alike_node`; by the name
    proposed or the file name) and that name."""
    path = find_node(nodes, proposal.path, nodes)
    alike = None
    if path is None and proposal.action == "CREATE":
        # A new node's file is named by the slug of its name, whatever path the model
        # wrote: one name is one file, found again by that name.
        named = digest.node_path(proposal.bucket, proposal.name, digest_dir)
        path = find_node(nodes, named, nodes)
        alike = None if path else alike_node(nodes, proposal.name)
        path = path or named
    elif path is None:  # a node named in another spelling: the model is told which
        stem = proposal.path.rsplit("/", 1)[-1].removesuffix(".md")
        alike = alike_node(nodes, proposal.name) or alike_node(
            nodes, stem.replace("-", " ").replace("_", " "))
    path = path or proposal.path
    related: list[str] = []
    unknown: list[str] = []
    for rel in proposal.related:
        found = find_node(nodes, rel, nodes)
        if found is None and rel != proposal.path:
            # Named in another spelling (no accents): the model is told which node.
            near = alike_node(nodes, rel.rsplit("/", 1)[-1].removesuffix(".md")
                              .replace("-", " ").replace("_", " "))
            unknown.append(rel if near is None
                           else f"{rel} (a node of a name alike: {near})")
        elif found is not None and found != path:
            related.append(found)
    return dataclasses.replace(proposal, node=path, related=tuple(dict.fromkeys(
        related))), unknown, None if alike is None else (alike, nodes[alike] or alike)
