"""What recalld found and reused of a QwenPaw (ReMe) workspace: the import report.

``workspace.open`` with ``import_report`` (and ``recalld import-qwenpaw``) answers with it
once the first indexing pass is done: the notes (and those not in UTF-8: read as GBK, say)
and chunks, how many chunks kept ReMe's boundaries, for every chunk whether its vector
comes from ReMe (its chunk store or its embedding cache), was embedded by recalld
before the workspace opened, was paid for since (the backfill starts with the open and
runs beside the report), or still has to be paid for (with the provider calls that
takes at the configured batch size), the notes ReMe's dream already consolidated, and the QwenPaw
settings applied or ignored (with the reason). It reads state; it changes nothing.
Cancellation just stops the waiting.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

import trio

from recalld.daemon import qwenpaw, safepath
from recalld.daemon.config import ConfigError
from recalld.daemon.index import reme_unread
from recalld.daemon.index.embedcache import text_hash
from recalld.daemon.index.encodings import NotUtf8Notes, not_utf8_notes
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import reme_dream, reme_resource
from recalld.daemon.memory.catalog import catalog_path, load_catalog
from recalld.daemon.memory.slugs import shows_no_word
from recalld.daemon.providers.errors import mask_model
from recalld.daemon.settings_diff import shown_setting
from recalld.daemon.verifyreport import Listed, listed
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import InvalidParams

if TYPE_CHECKING:
    from recalld.daemon.index.embedder import VectorWorker
    from recalld.daemon.index.service import WorkspaceIndex
    from recalld.daemon.index.state import IndexState


class ChunkCounts(TypedDict):
    total: int
    reme_boundaries: int  # chunks cut where ReMe cut them


class DreamReport(TypedDict):
    reme_catalog: bool  # whether the workspace has ReMe's dream catalog
    recognised: int  # notes ReMe's dream consolidated, not dreamed again
    changed_since: NotRequired[int]
    gone: NotRequired[int]
    #: Why part of ReMe's dream catalog could not be read (its notes are dreamed again).
    damaged: NotRequired[str]


class SettingsReport(TypedDict):
    applied: dict[str, object]  # dotted field -> the value in use (secrets masked)
    ignored: dict[str, str]  # field -> why recalld does not act on it
    #: Given fields the workspace does not use (it was open already with other
    #: settings): dotted field -> the value in use (secrets masked).
    not_applied: NotRequired[dict[str, object]]


class NotIndexed(TypedDict):
    count: int  # notes of ReMe's chunk store that are there but not indexed
    notes: dict[str, str]  # the first hundred: path (shown masked) -> why


#: How many of ReMe's notes not indexed the report names.
MAX_NOT_INDEXED_NAMED = 100


class ImportReport(TypedDict):
    """What recalld made of a QwenPaw workspace (``workspace.open`` with
    ``import_report``)."""

    complete: bool
    notes: int
    #: The notes not in UTF-8: read in another encoding, or with U+FFFD where not known.
    not_utf8: NotUtf8Notes
    #: Notes not indexed because their name is not valid UTF-8 (ReMe indexes them).
    misnamed: NotRequired[Listed]
    chunks: ChunkCounts
    reme_store: dict[str, int | str] | None
    #: ReMe chunk stores under other names or versions, not read (metadata_dir-relative).
    reme_stores_not_read: NotRequired[list[str]]
    #: Every store of ReMe found and not read (those of an older ReMe too), by
    #: workspace-relative path: its size and why it is not read.
    reme_stores_unread: NotRequired[dict[str, reme_unread.StoreNotRead]]
    #: Notes ReMe indexed that are there but recalld does not index (behind a link).
    reme_notes_not_indexed: NotRequired[NotIndexed]
    #: Notes ReMe indexed outside the note folders (a QwenPaw knowledge base, say),
    #: which recalld does not index: top folder -> how many.
    reme_notes_elsewhere: NotRequired[dict[str, int]]
    #: Note folders recalld cannot index (a link in their place, say) -> why.
    folders_not_indexed: NotRequired[dict[str, str]]
    vectors: JsonObject
    dream: DreamReport
    #: Why part of ReMe's resource catalog could not be read: the resources it lost are
    #: interpreted again (by the chat model), as if ReMe had not.
    reme_resources_damaged: NotRequired[str]
    #: The chat model the LLM jobs (auto_memory, the dream) use; None: none is
    #: configured, and they do not run (QwenPaw's own model is not taken over).
    chat_model: str | None
    settings: SettingsReport


class _ChunkTexts(TypedDict):
    notes: int
    adopted: int
    texts: list[tuple[str, bool]]  # each chunk's text, and whether it has a vector


async def import_report(ws: Workspace, given: Mapping[str, object] | None, *,
                        timeout_s: float) -> ImportReport:
    """The report for ``ws`` (``given``: the config passed to ``workspace.open``).

    Waits up to ``timeout_s`` for the first indexing pass and for ReMe's vectors to be
    read; ``complete`` says whether both were done in time.
    """
    index: WorkspaceIndex = ws.services.index
    worker: VectorWorker | None = index.vectors
    complete = False
    with trio.move_on_after(timeout_s):
        await index.sync()
        if worker is not None:
            await worker.seeded_event.wait()
        complete = True
    chunks = await index.locked(_chunk_texts)
    encoded = await index.locked(not_utf8_notes)
    vectors = await trio.to_thread.run_sync(_vectors, worker, chunks["texts"])
    dream = await trio.to_thread.run_sync(_dream, ws)
    unread = await trio.to_thread.run_sync(
        reme_unread.stores_not_read, ws.root, ws.settings.metadata_dir)
    reme_paths = index.reme.paths
    absent = await index.locked(lambda state: sorted(reme_paths - state.files.keys()))
    folders = (ws.settings.daily_dir, ws.settings.digest_dir)
    chat = ws.settings.chat_model_config
    not_indexed = await trio.to_thread.run_sync(_not_indexed, ws.root, absent, folders)
    folders_out = await trio.to_thread.run_sync(_folders_not_indexed, ws.root, folders)
    out: ImportReport = {
        "complete": complete,
        "notes": chunks["notes"],
        "not_utf8": encoded,
        "chunks": {"total": len(chunks["texts"]), "reme_boundaries": chunks["adopted"]},
        "reme_store": index.reme.summary,
        "vectors": vectors,
        "dream": dream,
        "chat_model": mask_model(chat.model_name) or None if chat is not None else None,
        "settings": _settings(ws, given),
    }
    if unread:
        out["reme_stores_unread"] = unread
        if others := reme_unread.other_chunk_stores(unread, ws.settings.metadata_dir):
            out["reme_stores_not_read"] = others
    if folders_out:
        out["folders_not_indexed"] = folders_out
    if resources := await trio.to_thread.run_sync(
            reme_resource.reme_resources_damage, ws.root, ws.settings.metadata_dir):
        out["reme_resources_damaged"] = resources
    if misnamed := index.watcher.misnamed():
        out["misnamed"] = listed(misnamed)
    if elsewhere := await trio.to_thread.run_sync(_elsewhere, ws.root, absent, folders):
        out["reme_notes_elsewhere"] = elsewhere
    if not_indexed:
        out["reme_notes_not_indexed"] = {
            "count": len(not_indexed),
            "notes": dict(list(not_indexed.items())[:MAX_NOT_INDEXED_NAMED])}
    return out


def _not_indexed(root: Path, paths: Iterable[str], folders: Iterable[str],
                 ) -> dict[str, str]:
    """Of ``paths`` (notes of ReMe's chunk store that recalld has not indexed), those
    still there below the indexed ``folders``, with why they are not indexed (path and
    reason shown masked). ReMe follows symbolic links; recalld reads nothing through
    one, so a folder or note linked into the workspace stays out of its index, which
    the report must say rather than give counts that look complete. A note deleted
    since ReMe indexed it is not named: nothing of it is lost."""
    out: dict[str, str] = {}
    for rel in paths:
        why = _why_not_indexed(root, rel, folders)
        if why is not None:
            out[safepath.masked(rel)] = why
    return out


def _why_not_indexed(root: Path, rel: str, folders: Iterable[str]) -> str | None:
    """Why the note ``rel`` below ``root`` is not indexed, if it is there below one of
    ``folders``: a link on its way (or in its place), or something other than a file.
    Only file metadata is read, never through a link."""
    try:
        parts = safepath.split_relative(rel)
        if not safepath.below(parts, folders):
            return None  # ReMe indexed more than notes (its raw dialogs, say)
    except InvalidParams:  # a path no note can have (ReMe's store says odd things)
        return None
    link, mode = _link_on_the_way(root, parts, "the note")
    if link is not None or mode is None:
        return link  # None: gone since ReMe indexed it
    return None if stat.S_ISREG(mode) else "not a regular file"


def _elsewhere(root: Path, paths: Iterable[str], folders: Iterable[str]) -> dict[str, int]:
    """Of ``paths`` (notes of ReMe's chunk store recalld has not indexed), how many are
    still there below ``root`` outside the note ``folders``, by top folder (shown
    masked): QwenPaw has ReMe index more than the notes (a knowledge base's published
    folders), which recalld does not serve; the report must say so rather than give
    counts that look complete."""
    out: dict[str, int] = {}
    for rel in paths:
        try:
            parts = safepath.split_relative(rel)
        except InvalidParams:  # a path no note can have (ReMe's store says odd things)
            continue
        if not safepath.below(parts, folders) and os.path.lexists(root.joinpath(*parts)):
            top = safepath.masked(parts[0]) if len(parts) > 1 else "."
            out[top] = out.get(top, 0) + 1
    return out


def _folders_not_indexed(root: Path, folders: Iterable[str]) -> dict[str, str]:
    """Of the note ``folders`` (``daily_dir``, ``digest_dir``), those recalld cannot
    index, with why: a link on their way or in their place (kept elsewhere, in a synced
    folder say, and linked in, which ReMe follows), or not a folder. Said whether or not
    ReMe's chunk store names their notes: without it the counts would look complete.
    One not there is not named (it is made when a note is written)."""
    out: dict[str, str] = {}
    for rel in folders:
        try:
            parts = safepath.split_relative(rel)
        except InvalidParams:
            continue
        link, mode = _link_on_the_way(root, parts, "the folder")
        if link is None and mode is not None and not stat.S_ISDIR(mode):
            link = "not a folder: its notes cannot be indexed"
        if link is not None:
            out[safepath.masked(rel)] = link
    return out


def _link_on_the_way(root: Path, parts: list[str], what: str,
                     ) -> tuple[str | None, int | None]:
    """Why ``root``/``parts`` is not read if a symbolic link is on its way or in its
    place (``what`` it is, to move or copy in), else None; and its mode (None if it is
    not there). Only file metadata is read, never through a link."""
    place, mode = root, None
    for i, name in enumerate(parts):
        place = place / name
        try:
            mode = os.lstat(place).st_mode
        except OSError:
            return None, None
        if stat.S_ISLNK(mode):
            thing = "the folder" if i < len(parts) - 1 else what
            return (f"{safepath.masked('/'.join(parts[:i + 1]))} is a symbolic link, which "
                    f"recalld does not follow: move or copy {thing} into the workspace"), mode
    return None, mode


def _chunk_texts(state: IndexState) -> _ChunkTexts:
    """Per chunk: its text and whether it has a vector; and the ReMe-chunked count."""
    embedded = state.chunks.embeddings()
    adopted = sum(1 for key, _ in state.chunks.texts()
                  if state.chunks[key].metadata.get("chunker") == "reme")
    return {"notes": len(state.files), "adopted": adopted,
            "texts": [(text, key in embedded) for key, text in state.chunks.texts()]}


def _vectors(worker: VectorWorker | None,
             texts: list[tuple[str, bool]]) -> JsonObject:
    """Per chunk, where its vector comes from: ReMe, recalld before the workspace opened
    (its vector, or its texts in the cache), the provider since it opened (the backfill
    runs beside the report: what it paid for is counted so however far it got), or
    still to pay (``to_embed``: the texts to send, a long chunk's windows each once)."""
    if worker is None or not worker.enabled:
        reason = None if worker is None else worker.target.client.disabled_reason
        return {"enabled": False, "disabled_reason": reason or "no embedding model"}
    reme = worker.reme_hashes
    texts = [(text, has) for text, has in texts if not shows_no_word(text)]  # need none
    use_cache = worker.config.enable_cache
    # Read once: the backfill adds to it meanwhile, and may rebind it.
    paid = worker.calls.paid
    ours = [(text, has) for text, has in texts
            if not (text_hash(text) in reme or worker.reme_vector(text) is not None)]
    # Per chunk: its own key (its whole vector, as ReMe's are kept), its units (windows,
    # or itself) and their keys.
    keys = {text: (worker.cache_key(text), units, [worker.cache_key(u) for u in units])
            for text, _ in ours for units in (worker.fill.units(text),)}
    wanted = list(dict.fromkeys(k for text, has in ours if not has
                                for k in (keys[text][0], *keys[text][2])))
    hits = (worker.target.cache.get_many(wanted) if use_cache else [None] * len(wanted))
    there = {k for k, hit in zip(wanted, hits, strict=True) if hit is not None}

    def had(key: str) -> bool:  # paid for and not installed yet is had too (cache off)
        return key in there or key in paid

    embedded = since_open = cached = 0
    missing: list[str] = []
    for text, has in ours:
        own, units, unit_keys = keys[text]
        if not has and not (had(own) or all(had(k) for k in unit_keys)):
            missing.extend(u for u, k in zip(units, unit_keys, strict=True) if k not in there)
        elif own in paid or any(k in paid for k in unit_keys):
            since_open += 1
        elif has:
            embedded += 1
        else:
            cached += 1
    to_embed = len(dict.fromkeys(missing))
    batch = worker.target.client.max_batch_size
    return {
        "enabled": True, "space": worker.target.key, "reme_space": worker.reme.get("space"),
        "reused_from_reme": len(texts) - len(ours), "embedded_before": embedded,
        "embedded_since_open": since_open, "provider_texts_since_open": worker.provider_texts,
        "in_cache": cached, "to_embed": to_embed,
        "estimated_provider_calls": math.ceil(to_embed / batch), "batch_size": batch,
        "reme": worker.reme,
    }


def _dream(ws: Workspace) -> DreamReport:
    s = ws.settings
    catalog = load_catalog(catalog_path(ws.root, s.metadata_dir, "dream"))
    found = reme_dream.read_reme_dreamed(ws.root, s.metadata_dir, s.daily_dir, catalog)
    fresh = {rel for rel, _ in found.unchanged} if found is not None else set()
    already = sum(1 for rel, r in catalog.items()
                  if r.get("source") == "reme" and rel not in fresh)
    if found is None:
        return {"reme_catalog": False, "recognised": already}
    out: DreamReport = {"reme_catalog": True, "recognised": already + len(found.unchanged),
                        "changed_since": len(found.changed), "gone": len(found.gone)}
    if found.damaged is not None:
        out["damaged"] = found.damaged
    return out


def _settings(ws: Workspace, given: Mapping[str, object] | None) -> SettingsReport:
    """The fields given, as applied (secrets masked), and those ignored with the reason.

    A given field the workspace does not use (it was already open with other settings,
    which apply only when it is opened again) is listed in ``not_applied`` with the value
    in use, not as applied."""
    reasons = {**qwenpaw.IGNORED_WORKSPACE,
               **{f"embedding_model_config.{k}": v for k, v in qwenpaw.IGNORED_EMBEDDING.items()}}
    ignored = {name: reasons.get(name, qwenpaw.UNKNOWN_FIELD)
               for name in ws.settings.ignored_fields}
    applied: dict[str, object] = {}
    not_applied: dict[str, object] = {}
    if given:
        try:
            wanted = ws.settings.merged(given)
        except ConfigError:  # refused at the open already; nothing to compare with
            wanted = ws.settings
        part = (qwenpaw.as_qwenpaw_loads(qwenpaw.memory_part(given), ws.settings)[0]
                if qwenpaw.looks_like_agent_json(given) else given)
        taken = qwenpaw.classify(part).taken
        if taken.get("dream_cron") == "":  # QwenPaw's older way to turn the dream off
            taken.setdefault("dream_cron_enabled", False)
        for name, value in taken.items():
            current = getattr(ws.settings, name, value)
            if isinstance(value, Mapping) and hasattr(current, "__dataclass_fields__"):
                fields = [(f"{name}.{key}", key, getattr(current, key, None),
                           getattr(getattr(wanted, name), key, None)) for key in value]
            else:
                fields = [(name, name, current, getattr(wanted, name, value))]
            for dotted, key, in_use, asked in fields:
                (applied if in_use == asked else not_applied)[dotted] = shown_setting(key, in_use)
    out: SettingsReport = {"applied": applied, "ignored": ignored}
    if not_applied:
        out["not_applied"] = not_applied
    return out


__all__ = ["import_report"]
