"""auto_dream: consolidate the daily notes changed since the last dream into digest nodes.

Owns the dream catalog (``<metadata_dir>/catalog/dream.jsonl.zst``: every daily note
processed, with the SHA-256 of the text that was read; ReMe's ``file_catalog/`` beside it
stays as ReMe wrote it) and one run at a time (the job kind is exclusive). No task.

A run: find the daily notes whose digest differs from the catalog (``index.md`` day
indexes are skipped), then for each note hold a short tool-calling conversation with the
workspace's chat model (a note longer than ``max_note_chars`` in parts, one conversation
each, so its end is consolidated too; a note with nothing beyond its frontmatter is
recorded as read without one). The model sees the note and the node names, and
has four tools:
``node_search`` (keyword search restricted to the digest folder), ``node_read``,
``integrate`` (one CREATE / CORROBORATE / REFINE / CORRECT proposal) and
``note_interests``. ``integrate`` is applied at once by :mod:`integration` (deterministic
rules: sources, history, refusal of destructive rewrites) and written through the shared
file operations, so the next search sees it. A note whose conversation failed (provider
down, malformed answers or tool calls, or cut off at ``max_steps_per_note`` while the model
still called tools: the rest of the note may be unread) is recorded failed in the catalog and read
again by a later run (a few times while its text is unchanged, then on request:
:mod:`dreamretry`); what it integrated stays; other notes go on. Then ``digest/interests.yaml`` is
refreshed, the change log and undo record are written (:mod:`changelog`) and, if memory
changed, one inbox item is pushed (:mod:`dreaminbox`; a run cancelled or failed too).

Cancellation: files already written stay written; the run's summary goes to ``keep``; the
run log and catalog of what was done so far are still saved (shielded, under a deadline),
so undo and the next run see them.
A daemon killed mid-run loses neither: each write and action goes to the run's journal
(:mod:`runjournal`) as it happens, and the catalog is saved after each note processed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import trio

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import has_body, open_fields
from recalld.daemon.index.search import parse_filters, search
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import (
    changelog,
    contentlinks,
    digest,
    dreaminbox,
    dreaminterests,
    dreamlinks,
    dreamnotes,
    dreamprompt,
    dreamread,
    dreamretry,
    integration,
    nodefiles,
    proposals,
    runjournal,
    textlines,
)
from recalld.daemon.memory.catalog import catalog_path, load_catalog, save_catalog
from recalld.daemon.memory.dreamruns import RUNNING as _RUNNING
from recalld.daemon.memory.fileops import (
    FileOps,
    WriteConflict,
    WritePolicy,
    fileops_for,
)
from recalld.daemon.memory.llm import ContextExceeded, LoopFailed, ToolBudget, run_tools
from recalld.daemon.memory.redact import redact_async
from recalld.daemon.providers.chat import ChatClient, ChatMessage
from recalld.daemon.providers.errors import (
    MalformedToolCall,
    ProviderConfigError,
    ProviderError,
)
from recalld.daemon.textcost import chars_within
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import JobFailed, PathOutsideWorkspace, UnknownWorkspace
from recalld.ipc.textcut import cut_text

if TYPE_CHECKING:
    from recalld.daemon.remote.hook import SharedCatalog

log = logging.getLogger(__name__)

CATALOG_JOB: Final = "dream"
#: The catalog state of a note whose frontmatter was not closed when a run saw it (being
#: written, or ``key: value`` prose after a rule): the next run reads it if it stayed so.
OPEN_STATE: Final = "open_frontmatter"
SAVE_TIMEOUT_S: Final = 20.0
WRITE_ATTEMPTS: Final = 3


@dataclass(frozen=True, slots=True)
class DreamConfig:
    """The limits of one dream run."""

    max_note_chars: int = 12_000
    max_notes_per_run: int = 200
    max_steps_per_note: int = 12
    max_tool_calls_per_note: int = 64  # times the notes read: the run's tool budget
    deadline_per_note_s: float = 300.0
    max_nodes_listed: int = 80
    node_search_results: int = 8


@dataclass(slots=True)
class _Run:
    """One run's mutable state, shared by the tool dispatcher and the job."""

    ws: Workspace
    files: FileOps
    log: changelog.RunLog
    journal: runjournal.Journal
    today: str
    note: str = ""
    topics: dict[str, float] = field(default_factory=dict)
    #: The topics the model noted about the current note: counted in :attr:`topics` once
    #: the note is processed (a failed note is read again, and its topics noted then).
    noted: dict[str, float] = field(default_factory=dict)
    #: The text of each node as the model last saw it in this conversation (node_read,
    #: or what its own integrate wrote): a rewrite is proposed on that text.
    seen: dict[str, str] = field(default_factory=dict)
    #: The nodes of :attr:`seen` whose content was shown cut, with their size: not
    #: rewritten (:func:`dreamread.refuse_unread`).
    read_in_part: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: What each node written by the model's current answer held before its first write
    #: of that answer (None: it made the node): its calls were all written before any ran.
    answer_first: dict[str, str | None] = field(default_factory=dict)
    #: Why this note's integrations could not all be applied until a person acts (a node
    #: whose frontmatter cannot be read): the note is read again by the next run.
    blocked: list[str] = field(default_factory=list)
    #: The nodes of :attr:`blocked`, each with what it held then (:func:`node_digest`):
    #: the note is read again once one of them changes (mended by a person).
    blocked_on: dict[str, str | None] = field(default_factory=dict)
    config: DreamConfig = field(default_factory=DreamConfig)
    budget: ToolBudget = field(default_factory=lambda: ToolBudget(0))
    names: nodefiles.NameIndex = field(default_factory=nodefiles.NameIndex)
    #: The SHA-256 of what the last runs left in each file they wrote: a node that holds
    #: something else was edited by hand (or another tool) since.
    written: dict[str, str | None] = field(default_factory=dict)

    @property
    def digest_dir(self) -> str:
        return self.ws.settings.digest_dir

    async def dispatch(self, name: str, args: Mapping[str, object]) -> str:
        if name == "node_search":
            return await self._node_search(args)
        if name == "node_read":
            return await dreamread.node_read(self, args)
        if name == "integrate":
            return await self._integrate(args)
        if name == "note_interests":
            topics = args.get("topics")
            if not isinstance(topics, list):
                return "error: topics must be a list of strings"
            noted = [t.strip() for t in topics[:20] if isinstance(t, str) and t.strip()]
            for t in noted:
                self.noted[t] = 0.6
            left = len(topics) - len(noted)
            return f"noted {len(noted)} topic(s)" + (
                f"; {left} left out (not text, empty, or beyond 20)" if left else "")
        return f"error: unknown tool {name!r}"

    async def _node_search(self, args: Mapping[str, object]) -> str:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return "error: query must be a non-empty string"
        try:
            index = self.ws.services.index
        except UnknownWorkspace:
            return "error: the index is not available"
        answer = await search(
            index, query, max_results=self.config.node_search_results, min_score=None,
            filters=parse_filters({"path_prefix": self.digest_dir}),
            config=self.ws.settings.search, agent_id=self.ws.agent_id)
        seen: dict[str, str] = {}
        for r in answer["results"]:  # each hit one line, of at most what 300 of English cost
            line = " ".join(str(r.get("text", "")).split())
            seen.setdefault(r["path"], cut_text(line, chars_within(line, 300)))
        if not seen:
            return "no matching nodes"
        return "\n".join(f"{p}: {snippet}" for p, snippet in seen.items())

    async def write(self, rel: str, before: str | None, text: str) -> str:
        """Write ``text`` (its secrets masked, as every write is) over ``before``, what the
        file held when read (WriteConflict if it holds something else now: an undo or a
        person wrote it meanwhile), and record, for undo, the bytes the file really holds;
        returns that text."""
        # Lines of a person no model read, carried along (a CORROBORATE, a link followed):
        # the next rewrite still needs the node read.
        unread = self._by_hand(rel, before) and self.seen.get(rel) != before
        written = (await self.files.replace(rel, before, text)).text
        entry = self.log.record_write(rel, None if before is None else before.encode(),
                                      written.encode(), unread)
        # A daemon killed from now on leaves this write undoable.
        await self.journaled({"file": rel, **entry})
        return written

    async def remove(self, rel: str, before: str) -> None:
        """Remove ``rel`` if it still holds ``before`` (WriteConflict if not), recorded
        for undo as :meth:`write` records a write."""
        await self.files.remove(rel, before)
        entry = self.log.record_write(rel, before.encode(), None)
        await self.journaled({"file": rel, **entry})

    async def journaled(self, entry: JsonObject) -> None:
        await trio.to_thread.run_sync(self.journal.append, [entry])

    async def set_catalog(self, catalog: dict[str, JsonObject], rel: str,
                          rec: JsonObject | None) -> None:
        """Change ``rel``'s catalog record (None: remove it), kept for undo (and journaled)."""
        before = catalog.pop(rel, None)
        if rec is not None:
            catalog[rel] = rec
        self.log.record_catalog(rel, before, rec)
        await self.journaled({"catalog": rel, "before": before, "after": rec})

    async def act(self, record: changelog.Action) -> None:
        """Keep one action in the run's log (and its journal)."""
        self.log.actions.append(record)
        await self.journaled({"action": dict(record)})

    async def _integrate(self, args: Mapping[str, object]) -> str:
        # What the model writes in words is masked before use: a node's name becomes its
        # file name, the reason is kept in the run's change log and inbox item.
        args = {k: await redact_async(v) if k in ("name", "description", "reason")
                and isinstance(v, str) else v for k, v in args.items()}
        try:
            # The model reads one note per conversation: another note it names (copied
            # from a node it read, or guessed) never backed what it integrates here.
            proposal = proposals.parse_integration(
                args, digest_dir=self.digest_dir, allowed_sources=(self.note,),
                default_source=self.note)
        except digest.IntegrationError as exc:
            return f"error: {exc}"
        # Nodes hold their secrets masked: compare the proposal with them as it will be kept.
        proposal = dataclasses.replace(proposal, content=await redact_async(proposal.content))
        proposal, unknown, alike = await trio.to_thread.run_sync(lambda: nodefiles.on_nodes(
            self.names.scan(self.ws.root, self.digest_dir), proposal, self.digest_dir))
        missing = await contentlinks.dangling_in(self, proposal)
        for _ in range(WRITE_ATTEMPTS):  # the node read again if it changed meanwhile
            before_text, utf8 = await trio.to_thread.run_sync(nodefiles.read_node,
                                                              self.ws.root, proposal.path)
            # ...and the node as the model was shown it: lines a person typed a secret
            # into are kept by a proposal that keeps them masked.
            existing = None if before_text is None else digest.parse_node(
                proposal.path, await redact_async(before_text))
            if existing is not None and not utf8:
                existing.problem = "its text is not saved as UTF-8"
            shaped, unlinked = contentlinks.unlink(proposal, missing, before_text)
            outcome = integration.integrate(existing, shaped, self.today,
                                            None if existing is not None else alike)
            if existing is not None and existing.unreadable:
                self.blocked.append(outcome.detail)
                self.blocked_on[proposal.path] = dreamnotes.node_digest(before_text, utf8)
            outcome = integration.unknown_to_model(
                outcome, before_text, shown=self.seen.get(proposal.path),
                by_answer=self._changed_by_answer(proposal.path, before_text),
                by_hand=self._by_hand(proposal.path, before_text))
            outcome = dreamread.refuse_unreadable(dreamread.refuse_unread(self, outcome))
            if outcome.text is None:
                break
            try:
                if outcome.archive:
                    await dreamlinks.archive_history(self, outcome.path, outcome.archive)
                written = await self.write(outcome.path, before_text, outcome.text)
            except WriteConflict:
                continue
            self.seen[outcome.path] = written
            self.answer_first.setdefault(outcome.path, before_text)
            name = existing.name if existing is not None else proposal.name
            self.topics[name] = max(self.topics.get(name, 0.0),
                                    digest.parse_node(outcome.path, written).confidence)
            break
        else:
            return f"error: {proposal.path} kept changing while it was integrated; try again"
        record: changelog.Action = {
            "action": outcome.action, "path": outcome.path, "status": outcome.status,
            "detail": outcome.detail, "reason": proposal.reason,
            "sources": list(proposal.sources), "note": self.note}
        await self.act(record)
        not_linked = f"; not linked, no such node: {', '.join(unknown)}" if unknown else ""
        if unlinked and outcome.text is not None:
            not_linked += f"; kept as text, no such note: {', '.join(unlinked)}"
        if proposal.not_nodes:
            not_linked += (f"; not linked, not a node path ({self.digest_dir}/<bucket>/"
                           f"<name>.md): {', '.join(proposal.not_nodes)}")
        return f"{outcome.status}: {outcome.action} {outcome.path}: {outcome.detail}{not_linked}"

    def _by_hand(self, rel: str, now: str | None) -> bool:
        """Whether node ``rel`` holds ``now`` other than a dream last wrote in it: also
        when no run kept says what a dream left in it (made by a person or by ReMe, or
        written before the oldest run record kept): its lines may all be a person's. A
        file a person only renamed or copied holds what a dream left in another."""
        last = (None if rel in self.log.unread else self.log.after[rel]) \
            if rel in self.log.after else self.written.get(rel)
        sha = None if now is None else changelog.sha256(now.encode())
        return sha not in (None, last) and sha not in self.written.values() and not any(
            after == sha for p, after in self.log.after.items() if p not in self.log.unread)

    def _changed_by_answer(self, rel: str, now: str | None) -> bool:
        """Whether a call of the current answer changed the content of node ``rel``."""
        if rel not in self.answer_first:
            return False
        first, content = self.answer_first[rel], textlines.content_lines
        return first is None or now is None or content(digest.parse_node(rel, first).content) \
            != content(digest.parse_node(rel, now).content)


async def run_dream(
    ws: Workspace,
    chat: ChatClient,
    *,
    trigger: str,
    now: datetime | None = None,
    progress: Callable[[int, int | None, str], None] = lambda d, t, m: None,
    config: DreamConfig | None = None,
    job_id: str | None = None,
    shared: SharedCatalog | None = None,
    retry_failed: bool = False,
    keep: Callable[[changelog.RunSummary], None] = lambda s: None,
) -> changelog.RunSummary:
    """One dream over ``ws`` (see the module docstring); returns the job result.
    ``shared``: the catalog of a shared workspace's hosts, where what one host dreamed is
    recorded for all (and read first, so no note is dreamed twice). ``retry_failed``: the
    notes that wait after failed tries (:mod:`dreamretry`) are read too. ``keep``: given
    the run's summary as it ends, cancelled too (a cancelled job's result).

    Raises ProviderConfigError without a chat model, JobFailed when every note failed.
    """
    cfg = config or DreamConfig()
    if not chat.enabled:
        raise ProviderConfigError("no chat model configured")
    started = now or datetime.now(UTC)
    today = started.astimezone().date().isoformat()
    settings = ws.settings
    cat_path = catalog_path(ws.root, settings.metadata_dir, "dream")
    catalog = await trio.to_thread.run_sync(load_catalog, cat_path)
    if shared is not None:
        catalog.update(await shared.load(CATALOG_JOB))
    known = dict(catalog)

    def save_in_place() -> None:
        safepath.check_in_place(ws.root)
        save_catalog(cat_path, catalog)

    async def save() -> None:  # here, and for every host of a shared workspace
        await trio.to_thread.run_sync(save_in_place)
        if shared is not None:
            # What changed since ``known``, which then holds what was sent.
            await shared.store(CATALOG_JOB, catalog, known)

    recognised = await trio.to_thread.run_sync(dreamnotes.recognise_reme_dreamed, ws, catalog)
    todo = await trio.to_thread.run_sync(
        dreamnotes.changed_notes, ws.root, settings.daily_dir, catalog)
    moves = await trio.to_thread.run_sync(dreamnotes.renamed_notes, ws.root, catalog, todo)
    copies = await trio.to_thread.run_sync(dreamnotes.copied_notes, ws.root, catalog, todo)
    same = dreamnotes.unchanged_notes(catalog, todo)
    for rel, sha, text in todo:
        if rel in copies:  # read as the original was: nothing new to integrate
            catalog[rel] = {"path": rel, "digest": sha, "state": "processed",
                            "copy_of": copies[rel], **dreamnotes.says(text)}
        elif rel in same:  # rewritten in place, saying what was read: nothing new either
            catalog[rel] = {**catalog[rel], "digest": sha}
    gone, back = await trio.to_thread.run_sync(dreamnotes.deleted_notes, ws.root, catalog,
                                               moves)
    moved = {t[0]: t for t in todo if t[0] in moves}
    nodes_now = await trio.to_thread.run_sync(dreamnotes.awaited_nodes, ws.root, catalog)
    pending, waiting = dreamretry.hold_back(catalog, [
        t for t in todo if t[0] not in moves and t[0] not in copies and t[0] not in same],
        retry=retry_failed, nodes_now=nodes_now)
    todo = pending[: cfg.max_notes_per_run]
    runs_dir = changelog.runs_dir(ws.root, settings.metadata_dir)
    await dreaminbox.recover_journals(ws, runs_dir, _RUNNING)  # also with nothing to do
    names = nodefiles.NameIndex()
    renamed = await trio.to_thread.run_sync(dreamlinks.renamed_nodes, ws, names)
    if not todo and not moves and not gone and not back and not renamed.found:
        if catalog != known:
            await save()
        return changelog.add_waiting({"run_id": None, "notes": 0, "changed": False,
                                      "actions": {}, "recognised_from_reme": recognised},
                                     waiting)
    run_log = changelog.RunLog(changelog.new_run_id(started), started.isoformat(), trigger,
                               notes=[p for p, _, _ in todo], left=len(pending) - len(todo),
                               waiting=waiting,
                               seq=await trio.to_thread.run_sync(changelog.next_seq, runs_dir))
    run = _Run(ws, fileops_for(ws, policy=WritePolicy((settings.digest_dir,),
                                                 (".md", ".yaml", ".history.txt"))),
               run_log, runjournal.Journal(runs_dir, run_log), today, config=cfg,
               budget=ToolBudget(cfg.max_tool_calls_per_note * len(todo)), names=names,
               written=await trio.to_thread.run_sync(changelog.last_writes, runs_dir))
    _RUNNING.add(run.log.run_id)
    ended = False  # True once the run went through every note: not cancelled, no error
    try:
        await dreamlinks.follow_notes(run, catalog, moved, moves, gone, back,
                                      started.isoformat())
        await dreamlinks.follow_renamed_nodes(run, renamed)
        for i, (note, sha, text) in enumerate(todo):
            progress(i, len(todo), safepath.masked(note))  # as search names it
            run.note = note
            run.blocked.clear()
            run.blocked_on.clear()
            run.noted.clear()
            # A note with nothing beyond its frontmatter (yet) has nothing to integrate:
            # a model asked about it can only invent. Written later, it is read then. One
            # whose block is still open, unchanged since the last run saw it so, is not
            # being written: its lines are text (``---`` then ``note: buy milk``).
            opened = open_fields(text)
            waited = opened and catalog.get(note, {}).get("state") == OPEN_STATE \
                and catalog[note].get("digest") == sha
            asked = False  # a model was asked about the note: its failure is one try
            try:
                parts = (dreamnotes.note_parts(text, cfg.max_note_chars)
                         if has_body(text) or waited else [])
                for n, body in enumerate(parts, 1):
                    run.seen.clear()  # a new conversation: the model has read nothing
                    run.read_in_part.clear()
                    run.answer_first.clear()
                    # Listed again for each part: the part before may have made nodes.
                    nodes = await trio.to_thread.run_sync(
                        nodefiles.list_nodes, ws.root, settings.digest_dir, cfg.max_nodes_listed)
                    messages: list[ChatMessage] = [
                        {"role": "system", "content": dreamprompt.SYSTEM_PROMPT},
                        {"role": "user",
                         "content": dreamprompt.user_message(note, body, nodes, n,
                                                                len(parts))}]
                    asked = asked or not run.budget.spent()
                    result = await run_tools(chat, messages, dreamprompt.tool_schemas(),
                                             run.dispatch,
                                             max_steps=cfg.max_steps_per_note,
                                             deadline_s=cfg.deadline_per_note_s,
                                             budget=run.budget,
                                             on_step=lambda _s, _m: run.answer_first.clear())
                    if not result.finished:  # cut off: the rest of the note may be unread
                        raise LoopFailed(result.unfinished(cfg.max_steps_per_note))
                if run.blocked:
                    raise dreamretry.NodeUnreadable(run.blocked[0])
            except ProviderConfigError:
                raise
            except (ProviderError, JobFailed) as exc:
                log.warning("dream of %s: %s not processed: %s", ws.agent_id,
                            safepath.masked(note), exc)
                run.log.failed_notes[note] = exc.message
                await run.journaled({"failed_note": note, "reason": exc.message})
                await run.set_catalog(catalog, note, dreamretry.failed_record(
                    catalog.get(note), note, sha, exc.message, run.log.run_id,
                    counted=asked and isinstance(exc, JobFailed | MalformedToolCall)
                    and not isinstance(exc, ContextExceeded),
                    waits_on=run.blocked_on if isinstance(exc, dreamretry.NodeUnreadable)
                    else None))
                continue
            for topic, weight in run.noted.items():
                run.topics[topic] = max(run.topics.get(topic, 0.0), weight)
            await run.set_catalog(catalog, note, {
                "path": note, "digest": sha,
                "state": OPEN_STATE if opened and not waited else "processed",
                "run_id": run.log.run_id, "processed_at": started.isoformat(),
                **dreamnotes.says(text)})
            await save()  # a daemon killed later does not dream this note again
        progress(len(todo), len(todo), "interests")
        await dreaminterests.refresh(run)
        ended = True
    finally:
        run.log.finished = datetime.now(UTC).isoformat()
        run.log.tool_calls_refused = run.budget.refused
        dreamlinks.remember_made(run)
        summary = dreaminbox.run_summary(run.log, settings.metadata_dir)
        summary["recognised_from_reme"] = recognised
        keep(summary)
        with trio.CancelScope(shield=True), trio.move_on_after(SAVE_TIMEOUT_S):
            try:
                await save()
                await trio.to_thread.run_sync(changelog.write_run, runs_dir, run.log)
                # Even when the job then fails or is cancelled: what was written stays
                # written. An inbox already closed (the daemon stopping) is told later.
                told = await dreaminbox.push_run(ws, summary, run.log, job_id=job_id,
                                                 ended=ended)
                await trio.to_thread.run_sync(lambda: run.journal.remove(keep=not told))
            except PathOutsideWorkspace as exc:
                # Its journal stays in the folder it was written to: the next dream there
                # records the run from it.
                log.warning("dream of %s: the run was not recorded: %s", ws.agent_id,
                            exc.message)
            finally:
                _RUNNING.discard(run.log.run_id)
    if todo and len(run.log.failed_notes) == len(todo):
        raise JobFailed(f"no note could be processed: {next(iter(run.log.failed_notes.values()))}",
                        summary)
    return summary

