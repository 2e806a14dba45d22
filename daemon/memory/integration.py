"""The four integration actions on a digest node, as pure functions.

The model never writes a node. It proposes an :class:`Integration` and :func:`integrate`
decides, deterministically, what the node becomes:

- CREATE: a new node (on an existing node of the same name it acts as CORROBORATE: a fact
  seen twice is stronger, not a second node; but only if the node holds every line of the
  proposed content: one that says more or otherwise is refused, the model told to read
  the node and REFINE or CORRECT it; a name of another node that only shares its slug is
  refused);
- CORROBORATE: the node gains the new sources, ``corroborations`` (each source after
  the first: a node a person wrote citing none is backed, not corroborated, by its first)
  and ``confidence`` rise;
  the content is not touched (nothing is ever just appended);
- REFINE: the content is replaced by a more detailed version that must keep at least
  ``MIN_KEEP_FRACTION`` of the old content lines (a line with detail added keeps it); a
  rewrite that would drop most of a node is refused with the reason; the lines it rewrote
  or dropped are kept under ``## History``, as a correction's;
- CORRECT: the content is replaced; the lines it drops are kept under ``## History`` with
  the date, the source and the reason. The node's backing starts again (:func:`_overturn`):
  its sources are the correcting note's, ``corroborations`` 0, ``confidence`` 0.5; the
  notes of the claim it overturned are recorded (``overturned_sources``, and named in the
  History entry) but no longer count: a claim corrected back and forth is no surer for
  it. Notes of a day before the node's newest source
  do not correct it, nor refine it but by adding detail: a REFINE from them must keep
  every line (an old note edited, or read again, never turns a node back).

A REFINE or CORRECT of a node whose content is longer than a proposal's may be
(``MAX_CONTENT_CHARS``: a person's long page) is refused: no rewrite could keep its
lines, and what it dropped would go to History as one entry.

A REFINE or CORRECT proposed on a node other than the model was shown is refused
(:func:`unknown_to_model`): one changed since it read it, one a call of the same answer
changed, one it did not read that holds what no dream wrote (a hand edit, a node a person
or ReMe made).

Nothing here touches the disk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from recalld.daemon.index.filters import note_date
from recalld.daemon.memory.digest import (
    MAX_CONTENT_CHARS,
    MIN_KEEP_FRACTION,
    Integration,
    Node,
    deleted_line,
    keep_history,
    name_key,
    render_node,
    section_links,
)
from recalld.daemon.memory.textlines import changed_lines, content_lines, kept_fraction


@dataclass(frozen=True, slots=True)
class Outcome:
    """What :func:`integrate` decided: ``text`` is None when nothing is written."""

    action: str  # the action actually taken (CREATE on an existing node -> CORROBORATE)
    path: str
    status: str  # "applied" | "unchanged" | "refused"
    text: str | None
    detail: str
    sources: tuple[str, ...] = ()
    #: Older History entries moved out of the node: appended to its archive file first.
    archive: tuple[str, ...] = ()



def _merge(into: list[str], more: Iterable[str], exclude: str = "") -> list[str]:
    return [x for x in dict.fromkeys([*into, *more]) if x != exclude]


def _history_entry(today: str, dropped: list[str], sources: Sequence[str], reason: str,
                   what: str = "corrected", stood_on: str = "") -> str:
    claim = " / ".join(ln.strip().lstrip("-*+ ").strip() for ln in dropped if ln.strip())
    src = ", ".join(f"[[{s}]]" for s in sources)
    why = f"; reason: {reason}" if reason else ""
    was = f"; it stood on: {stood_on}" if stood_on else ""
    return f"- {today}: {what}; previously: \"{claim}\" (source: {src}{why}{was})"


def _overturn(node: Node, backing: Sequence[str]) -> str:
    """Start ``node``'s backing again from ``backing`` (the correcting note): its other
    sources, deleted ones too, are overturned (recorded, no longer counted nor listed
    under ``## Sources``: a person's line that links only them goes with them). Returns
    them as the History entry names them ("" if none)."""
    old = [s for s in [*node.sources, *node.deleted_sources] if s not in backing]
    if not old:
        return ""
    gone = set(node.deleted_sources)
    named = ", ".join(deleted_line(s)[2:] if s in gone else f"[[{s}]]" for s in old)
    node.written = {**node.written, "Sources": [
        ln for ln in node.written.get("Sources", []) if not _names_only(ln, old)]}
    node.overturned_sources = _merge(node.overturned_sources, old)
    node.sources = list(dict.fromkeys(backing))
    node.deleted_sources = []
    node.corroborations = len(node.sources) - 1
    return named


def _names_only(line: str, notes: Sequence[str]) -> bool:
    """Whether a ``## Sources`` line names only (some of) ``notes``, linked or deleted."""
    links = section_links(line)
    named = any(f"{s} (deleted)" in line for s in notes)
    return (bool(links) or named) and all(link in notes for link in links)


def _other_name(existing: Node, proposal: Integration) -> bool:
    """True when a CREATE lands on a node of another name (``C++ tips`` and ``C# tips``
    share a slug): that is not the same fact seen twice."""
    stem = existing.path.rsplit("/", 1)[-1].removesuffix(".md")
    ours = name_key(proposal.name)
    return name_key(existing.name) not in (ours, stem) and ours != stem


def _newest_day(paths: Iterable[str], today: str) -> str:
    """The latest day (``YYYY-MM-DD``: a note's day folder, or a note named by its date)
    of ``paths``; "" if none has one. A day that cannot be, or after tomorrow (a typo in
    a folder's year; tomorrow: a note written where it is already), dates nothing: it
    would be newer than every note to come, and no note could correct a node it backs."""
    latest = (date.fromisoformat(today) + timedelta(days=1)).isoformat()
    return max((day for p in paths if (day := note_date(p)) and day <= latest), default="")


def _older_than(proposal: Integration, existing: Node, today: str) -> str:
    """Why the notes ``proposal`` is from are older than what ``existing`` says (of a day
    before its newest source: an old note edited, or read again); "" if they are not."""
    # A deleted note still dated what the node says.
    said = _newest_day(proposal.sources, today)
    held = _newest_day([*existing.sources, *existing.deleted_sources,
                        *existing.overturned_sources], today)
    if said and said < held:
        return (f"the note(s) of {said} are older than what {existing.path} says (sources "
                f"up to {held})")
    return ""


def integrate(existing: Node | None, proposal: Integration, today: str,
              alike: tuple[str, str] | None = None) -> Outcome:
    """Decide what ``proposal`` does to ``existing`` (None: the node does not exist).
    ``alike``: the path and name of a node whose name only accents, case or punctuation
    tell from the one proposed: a CREATE is refused, pointing at it; another action, which
    needs a node that exists, is pointed at it too."""
    path = proposal.path
    action = proposal.action
    if existing is None:
        if action == "CREATE" and alike is not None:
            return Outcome(action, path, "refused", None,
                           f"the node {alike[0]} ({alike[1]!r}) has this name but for "
                           "accents, case or punctuation: name it in `node` to CORROBORATE "
                           "or REFINE it; if this is something else, give the new node a "
                           "name told apart by more than that")
        if action != "CREATE" and alike is not None:
            return Outcome(action, path, "refused", None,
                           f"{action} needs an existing node; {path} does not exist, but "
                           f"the node {alike[0]} ({alike[1]!r}) has this name but for "
                           "accents, case or punctuation: name it in `node` if it is the "
                           "one meant")
        if action != "CREATE":
            return Outcome(action, path, "refused", None,
                           f"{action} needs an existing node; {path} does not exist "
                           "(use CREATE, or node_search to find the right node)")
        node = Node(path=path, name=proposal.name, description=proposal.description,
                    type=proposal.type or proposal.bucket, bucket=proposal.bucket,
                    created=today, updated=today, sources=list(proposal.sources),
                    related=_merge([], proposal.related, path),
                    content=proposal.content.strip())
        return Outcome("CREATE", path, "applied", render_node(node),
                       f"created {proposal.bucket} node", proposal.sources)

    if existing.unreadable:
        return Outcome(action, path, "refused", None,
                       f"{path} cannot be read as written (a hand edit: {existing.problem}); "
                       "it is left as it is until it is fixed, and this note is read again "
                       "by later dreams (if it waits after a few tries: by the next dream "
                       "once the node is changed, or recalld dream --retry-failed)")
    if action in ("REFINE", "CORRECT") and len(existing.content) > MAX_CONTENT_CHARS:
        return Outcome(action, path, "refused", None,
                       f"{path} holds {len(existing.content)} characters of content, more "
                       f"than a rewrite may hold ({MAX_CONTENT_CHARS}): it is not rewritten "
                       "by a dream; CORROBORATE it, or CREATE a node for what the note adds")
    node = dataclasses.replace(existing, sources=list(existing.sources),
                               deleted_sources=list(existing.deleted_sources),
                               overturned_sources=list(existing.overturned_sources),
                               written=dict(existing.written),
                               related=list(existing.related),
                               history=list(existing.history), extra=dict(existing.extra))
    new_sources = [s for s in proposal.sources if s not in node.sources]
    node.related = _merge(node.related, proposal.related, path)
    if action == "CREATE":
        if _other_name(existing, proposal):
            return Outcome(action, path, "refused", None,
                           f"{path} is the node {existing.name!r}, not {proposal.name!r}: "
                           "give the new node a more distinct name, or name this one in "
                           "`node` to CORROBORATE it")
        if kept_fraction(proposal.content, existing.content) < 1.0:
            # What the note says against the node (or beyond it) would be lost, and the
            # node's claim would gain the note as a source.
            return Outcome(action, path, "refused", None,
                           f"{path} ({existing.name!r}) exists and does not say all of "
                           "this content: read it with node_read, then CORROBORATE it if "
                           "the note repeats it, REFINE it if the note adds detail, or "
                           "CORRECT it if the note contradicts it")
        action = "CORROBORATE"
    if action == "CORROBORATE":
        # Content that says more than the node (a CREATE's was refused above): not
        # written, and the model told so, or it takes what the note adds as kept.
        unsaid = ("; the content given says what the node does not and was not written "
                  "(CORROBORATE adds sources only): REFINE the node to add detail, or "
                  "CORRECT it if the note contradicts it"
                  if kept_fraction(proposal.content, existing.content) < 1.0 else "")
        if not new_sources:
            if node.related == existing.related:
                return Outcome(action, path, "unchanged", None,
                               "already backed by these sources" + unsaid)
        else:
            # The first note of a node that cited none (a person wrote it) backs it as a
            # created node's does: a corroboration is each note after the first.
            first = not node.sources and not node.deleted_sources
            node.corroborations += len(new_sources) - first
            node.sources.extend(new_sources)
        detail = (f"corroborated by {len(new_sources)} new source(s); confidence "
                  f"{existing.confidence} -> {node.confidence}{unsaid}")
    elif action == "REFINE":
        kept = kept_fraction(existing.content, proposal.content)
        older = _older_than(proposal, existing, today)
        if older and kept < 1.0:
            return Outcome(action, path, "refused", None,
                           f"{older}: it may add detail, not rewrite or drop a line of what "
                           "a newer note said; REFINE keeping every line (detail added "
                           "inside a line keeps it), CORROBORATE, or leave the node")
        if kept < MIN_KEEP_FRACTION:
            return Outcome(action, path, "refused", None,
                           f"the rewrite keeps only {kept:.0%} of the node's lines (at least "
                           f"{MIN_KEEP_FRACTION:.0%} required); use CORRECT for a "
                           "contradiction")
        if content_lines(proposal.content) == content_lines(existing.content) \
                and not new_sources:
            return Outcome(action, path, "unchanged", None, "no new detail")
        # A line the refinement rewrote or left out is kept under History, as a
        # correction's: nothing the node said goes without a trace.
        dropped = changed_lines(existing.content, proposal.content)
        if dropped:
            node.history.append(_history_entry(today, dropped, proposal.sources,
                                               proposal.reason, "refined"))
        node.content = proposal.content.strip()
        node.sources.extend(new_sources)
        detail = f"refined (kept {kept:.0%} of the previous lines)"
    else:  # CORRECT
        older = _older_than(proposal, existing, today)
        if older:
            return Outcome(action, path, "refused", None,
                           f"{older}: an older note does not correct a newer claim; "
                           "CORROBORATE, or REFINE keeping every line if it adds detail, "
                           "else leave the node")
        dropped = changed_lines(existing.content, proposal.content)
        if not dropped and not new_sources:
            return Outcome(action, path, "unchanged", None, "nothing to correct")
        node.sources.extend(new_sources)
        if dropped:
            # The claim overturned: only the correcting note backs what the node says now.
            stood_on = _overturn(node, proposal.sources)
            node.history.append(_history_entry(today, dropped, proposal.sources,
                                               proposal.reason, stood_on=stood_on))
        node.content = proposal.content.strip()
        detail = (f"corrected; {len(dropped)} old line(s) kept under History; confidence "
                  f"{existing.confidence} -> {node.confidence}")
    if proposal.description and action != "CORROBORATE":
        node.description = proposal.description
    # A note that backs the node again (one overturned, now read anew) is a source.
    node.overturned_sources = [s for s in node.overturned_sources if s not in node.sources]
    node.updated = today
    moved = tuple(keep_history(node))
    return Outcome(action, path, "applied", render_node(node), detail, tuple(new_sources),
                   moved)


def unknown_to_model(outcome: Outcome, before: str | None, *, shown: str | None,
                     by_answer: bool, by_hand: bool = False) -> Outcome:
    """``outcome``, or its refusal when it rewrites a node's content (REFINE, CORRECT) that
    is not what the model was shown: the node as it read it (``shown``; None if it did not
    read it) changed since (``before``: it now), or a call of the same model answer
    changed it (``by_answer``), which this call did not know; or a node that holds what no
    dream wrote (``by_hand``: edited by hand since, or never written by a dream run kept)
    that it did not read: the lines a person wrote would go to History on a guess of what
    the node says."""
    if outcome.action not in ("REFINE", "CORRECT"):
        return outcome
    if shown is None and by_hand and outcome.text is not None:
        return Outcome(outcome.action, outcome.path, "refused", None,
                       "the node holds what no dream wrote (edited by hand, or made by a "
                       "person or another tool), and you have not read it: node_read it and "
                       "propose on what it says now, keeping what the person wrote unless "
                       "this note contradicts it")
    if shown not in (None, before):
        return Outcome(outcome.action, outcome.path, "refused", None,
                       "the node changed since you read it (edited meanwhile): node_read it "
                       "again and propose the new content on what it says now")
    if outcome.text is not None and by_answer:
        return Outcome(outcome.action, outcome.path, "refused", None,
                       "an earlier call of this same answer changed the node's content, "
                       "which this call did not know: read that call's result and propose "
                       "on what the node says now, in your next answer")
    return outcome
