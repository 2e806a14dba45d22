"""An edit of a note ReMe chunked costs the embedding of what it touched, not of the note."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import zstandard
from fakes.provider_server import FakeProvider, fake_vector
from reme_fixture_util import passage_texts
from waits import wait_for, wait_value

from recalld.daemon.index.embedcache import encode_f16
from recalld.daemon.index.reme_chunks import ReMeChunk, adopt_chunks, still_says

DIMS = 16
TITLE = "# Trip planning 2026"


def trip_note(legs: int) -> tuple[str, list[ReMeChunk]]:
    """A long note and the chunks ReMe 0.4.2 makes of it (10 KB chunks of two sections,
    each after the title as its breadcrumb), as its markdown chunker writes them."""
    lines = [TITLE, "", "Overview of the plans for the year.", ""]
    starts = []
    for k in range(legs):
        starts.append(len(lines))
        lines += [f"## Leg {k}", ""]
        for p in range(4):
            lines += [" ".join(f"Leg {k} paragraph {p} sentence {s} about the route through "
                               f"town {k} and the hotel {s}." for s in range(12)), ""]
        lines += [f"- stop {k}a: museum", f"- stop {k}b: lunch at noon", ""]
    starts.append(len(lines))
    chunks = []
    for k in range(0, legs, 2):
        first = 0 if k == 0 else starts[k]
        last = starts[k + 2] - 2
        body = "\n".join(lines[first:last + 1])
        chunks.append(ReMeChunk(first + 1, last + 1, body if k == 0 else f"{TITLE}\n\n{body}"))
    return "\n".join(lines), chunks


def write_reme_store(ws: Path, rel: str, chunks: list[ReMeChunk],
                     more: dict[str, list[ReMeChunk]] | None = None) -> None:
    """ReMe's chunk store of a note (and ``more``), each chunk with the fake's vector."""
    store = ws / "mem_metadata" / "file_store" / "file_chunks_default_v1.jsonl.zst"
    store.parent.mkdir(parents=True)
    lines = b"".join(orjson.dumps({
        "id": f"{i:064x}", "path": rel, "start_line": c.start_line, "end_line": c.end_line,
        "text": c.text, "metadata": {}, "scores": {},
        "_embedding_f16_b64": encode_f16(fake_vector(c.text, DIMS))}) + b"\n"
        for i, (rel, c) in enumerate(
            [(rel, c) for c in chunks]
            + [(r, c) for r, cs in (more or {}).items() for c in cs]))
    store.write_bytes(zstandard.ZstdCompressor().compress(lines))



@contextlib.contextmanager
def reme_reused(daemon_factory: Any, tmp_path: Path, rel: str, text: str,
                reme: list[ReMeChunk]) -> Iterator[tuple[Path, Any, FakeProvider]]:
    """``text`` at ``rel`` beside ReMe's chunks ``reme``, served by a daemon that reused
    every one of ReMe's vectors and sent no text to embed: (the workspace, the daemon,
    the provider); the daemon stops cleanly after."""
    ws = tmp_path / "ws"
    (ws / rel).parent.mkdir(parents=True)
    (ws / rel).write_text(text, "utf-8")
    write_reme_store(ws, rel, reme)
    with FakeProvider(dims=DIMS) as fake:
        d = open_daemon(daemon_factory, ws, fake)
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors(d),
                   lambda st: st["total"] == len(reme) and st["coverage"] == 1.0,
                   f"ReMe's {len(reme)} vector(s)")
        assert passage_texts(fake) == []
        yield ws, d, fake
        assert d.stop() == 0

def open_daemon(daemon_factory: Any, ws: Path, fake: FakeProvider) -> Any:
    return daemon_factory(
        f'[workspaces.w]\npath = "{ws}"\nembedding_model_config = {{backend = "openai", '
        f'base_url = "{fake.url}/v1", api_key = "k", model_name = "m", '
        f'dimensions = {DIMS}}}\n[daemon]\npersist_delay_s = 0.05\n')


def vectors(d: Any) -> dict[str, Any]:
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")
    out: dict[str, Any] = ws["index"]["vectors"]
    return out


def test_an_edited_sentence_costs_only_its_stretch(daemon_factory: Any, tmp_path: Path) -> None:
    rel = "memory/2026-07-02/trip.md"
    text, reme = trip_note(20)
    assert len(reme) == 10
    with reme_reused(daemon_factory, tmp_path, rel, text, reme) as (ws, d, fake):
        edited = text.replace("Leg 7 paragraph 2 sentence 5 about the route",
                              "Leg 7 paragraph 2 sentence 5 about the detour", 1)
        (ws / rel).write_text(edited, "utf-8")
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: passage_texts(fake), "the edit's passages")
        st = wait_value(lambda: vectors(d), lambda st: st["coverage"] == 1.0
                        and st["state"] in ("idle", "waiting"), "every vector")
        # Only the stretch of the chunk the edit fell in (legs 6 and 7) is chunked anew
        # and embedded; the other nine chunks keep ReMe's text and vector.
        sent = passage_texts(fake)
        assert sent and len(set(sent)) == len(sent)
        assert all("Leg 6" in t or "Leg 7" in t for t in sent)
        got = adopt_chunks(rel, edited, reme)
        assert got is not None
        own = [c.text for c in got if not c.metadata.get("chunker")]
        assert len(got) - len(own) == 9
        assert all("Leg 6" in t or "Leg 7" in t for t in own)
        assert st["total"] == len(got)
        res = d.call("memory.search", {"agent_id": "w", "query": "detour"})
        assert res["results"][0]["path"] == rel
        assert "detour" in res["results"][0]["text"]


def test_words_cut_at_either_end_of_a_chunk_are_an_edit() -> None:
    text, reme = trip_note(4)
    lines = text.split("\n")
    second = reme[1]
    first, last = second.start_line - 1, second.end_line - 1
    assert (lines[first], lines[last]) == ("## Leg 2", "- stop 3b: lunch at noon")
    for i, cut in ((last, "- stop 3b: lunch"), (first, "## 2")):
        edited = "\n".join([*lines[:i], cut, *lines[i + 1:]])
        got = adopt_chunks("trip.md", edited, reme)
        # ReMe's text of that chunk says what the note no longer does: it is not kept.
        assert got is not None and second.text not in [c.text for c in got], cut
        assert reme[0].text in [c.text for c in got]
        assert cut in "\n".join(c.text for c in got)


def test_a_chunk_longer_than_remes_vector_covers_is_chunked_anew(daemon_factory: Any,
                                                                 tmp_path: Path) -> None:
    # A pasted one-line note: ReMe keeps it as one chunk, and its vector covers the
    # first 8,192 characters only (max_input_length); a fact past them had no vector.
    big, small = "memory/2026-07-03/dump.md", "memory/2026-07-03/small.md"
    line = " ".join(f"record {i} of the export lists the shipment to depot {i}."
                    for i in range(400))
    text, reme = trip_note(4)
    ws = tmp_path / "ws"
    (ws / big).parent.mkdir(parents=True)
    (ws / big).write_text(line + "\n", "utf-8")
    (ws / small).write_text(text, "utf-8")
    assert len(line) > 2 * 8192
    write_reme_store(ws, small, reme, {big: [ReMeChunk(1, 1, line)]})
    with FakeProvider(dims=DIMS) as fake:
        d = open_daemon(daemon_factory, ws, fake)
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: passage_texts(fake), "the long note's passages")
        st = wait_value(lambda: vectors(d), lambda st: st["coverage"] == 1.0
                        and st["state"] in ("idle", "waiting"), "every vector")
        sent = passage_texts(fake)
        # The long line is recalld's chunks now, every part of it embedded; the other
        # note keeps ReMe's chunks and vectors.
        assert st["total"] > len(reme) + 1
        assert all("record" in t for t in sent)
        assert "depot 399." in " ".join(sent)
        assert not any(c.text in sent for c in reme)
        assert d.stop() == 0


def test_an_edit_of_symbols_alone_is_an_edit(daemon_factory: Any, tmp_path: Path) -> None:
    """ReMe's renderer keeps emoji, currency, arrows and CJK punctuation as written, so
    a note whose symbols changed since ReMe chunked it no longer says what ReMe's text
    says: its stretch is chunked anew (search, recall and the dream see what the note
    says now, not ReMe's former text)."""
    rel = "memory/2026-07-03/budget.md"
    old = ("# Budget review\n\nCloud budget: $1200 per month ✅ approved.\n\n"
           "Latency target → 200 ms, error rate ≤ 1%.\n\n合同：已签。\n")
    reme = [ReMeChunk(1, 7, old.rstrip("\n"))]
    assert adopt_chunks(rel, old, reme) is not None  # as ReMe read it: kept
    for was, now in (("$1200", "€1200"), ("✅", "❌"), ("→", "←"), ("≤", "≥"),
                     ("已签。", "已签？"), ("$1200", "1200"), ("1%", "1‰")):
        edited = old.replace(was, now, 1)
        got = adopt_chunks(rel, edited, reme)
        assert got is None or reme[0].text not in [c.text for c in got], now
        assert not still_says(rel, edited, reme), now
    ws = tmp_path / "ws"
    (ws / rel).parent.mkdir(parents=True)
    (ws / rel).write_text(old.replace("✅", "❌").replace("$1200", "€1200"), "utf-8")
    write_reme_store(ws, rel, reme)
    with FakeProvider(dims=DIMS) as fake:
        d = open_daemon(daemon_factory, ws, fake)
        d.call("index.sync", {"agent_id": "w"})
        res = d.call("memory.search", {"agent_id": "w", "query": "cloud budget approved"})
        text = res["results"][0]["text"]
        assert "❌" in text and "€1200" in text and "✅" not in text and "$" not in text
        wait_for(lambda: any("❌" in t for t in passage_texts(fake)), "the edit embedded")
        assert d.stop() == 0


def test_a_note_with_a_byte_order_mark_before_its_frontmatter_keeps_remes_chunk(
        daemon_factory: Any, tmp_path: Path) -> None:
    """ReMe 0.4.2 takes no frontmatter after a byte order mark: the block is body to it,
    its chunk starts on the fence and renders the block as a heading of the fence line
    (its text as ReMe wrote it, LF or CRLF note alike). That chunk's vector is reused; the
    frontmatter stays searchable; an edit of the body is embedded."""
    body = ("# Trip\n\nBike on Mondays and Thursdays, the train otherwise.\n\n## Notes\n\n"
            "The 7:42 is always late; take the 7:30 instead.\n")
    fm = "\ufeff---\nname: trip\ndescription: lisbon ferry\n---\n"
    reme_text = "## \ufeff---\n\n" + body.rstrip("\n")
    notes = {"memory/2026-07-04/lf.md": fm + body,
             "memory/2026-07-04/crlf.md": (fm + body).replace("\n", "\r\n")}
    reme = [ReMeChunk(1, 11, reme_text)]
    for rel, text in notes.items():
        assert still_says(rel, text, reme), rel
        assert not still_says(rel, text.replace("late", "early"), reme), rel
    ws = tmp_path / "ws"
    for rel, text in notes.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(text.encode("utf-8"))
    lf, crlf = notes
    write_reme_store(ws, lf, reme, {crlf: reme})
    with FakeProvider(dims=DIMS) as fake:
        d = open_daemon(daemon_factory, ws, fake)
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors(d), lambda st: st["total"] == 2 and st["coverage"] == 1.0,
                   "ReMe's two vectors")
        assert passage_texts(fake) == []
        res = d.call("memory.search", {"agent_id": "w", "query": "lisbon ferry"})
        assert {r["path"] for r in res["results"]} == {lf, crlf}
        (ws / lf).write_bytes((fm + body.replace("late", "early")).encode("utf-8"))
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: any("early" in t for t in passage_texts(fake)), "the edit embedded")
        res = d.call("memory.search", {"agent_id": "w", "query": "always early"})
        assert "early" in res["results"][0]["text"]
        assert d.stop() == 0


def test_character_references_are_read_as_remes_renderer_writes_them(
        daemon_factory: Any, tmp_path: Path) -> None:
    """ReMe's renderer writes a character reference as its character outside code
    (``&amp;`` as ``&``, ``&copy;`` as ``©``) and as written inside it: a note with
    them is as ReMe read it, its vector reused; changing one is an edit."""
    rel = "memory/2026-07-05/shop.md"
    text = ("# Shop &amp; co\n\nPrices &lt;net&gt;: 30 &#8364; &copy; ACME&nbsp;Ltd.\n\n"
            "Run `grep '&amp;' log` to check.\n")
    reme = [ReMeChunk(1, 5, "# Shop & co\n\nPrices <net>: 30 € © ACME\xa0Ltd.\n\n"
                            "Run `grep '&amp;' log` to check.")]
    assert still_says(rel, text, reme)
    for was, now in (("&copy;", "&reg;"), ("&#8364;", "&#36;"), ("&#8364;", "EUR")):
        assert not still_says(rel, text.replace(was, now, 1), reme), now
    with reme_reused(daemon_factory, tmp_path, rel, text, reme):
        pass  # ReMe's one vector reused, nothing embedded


def split_table() -> tuple[str, str, list[ReMeChunk]]:
    """A note with a table and ReMe 0.4.2's chunks of it, as it wrote them with 400-byte
    chunks: the table in three parts, each repeating the heading and the header rows,
    none holding the header's lines."""
    rel = "memory/2026-07-06/disks.md"
    rows = [f"| {i} | host-{i} | the disk on host-{i} is {i * 7 % 100} percent full |"
            for i in range(12)]
    text = ("# Disks\n\nHosts we watch.\n\n| id | host | note |\n|---|---|---|\n"
            + "\n".join(rows) + "\n\nAfter the table.\n")
    head = "| id | host | note |\n| --- | --- | --- |"
    reme = [ReMeChunk(1, 3, "# Disks\n\nHosts we watch."),
            *(ReMeChunk(7 + 4 * p, 10 + 4 * p, f"# Disks\n\n[Part {p + 1}/3]\n\n{head}\n"
                        + "\n".join(rows[4 * p:4 * p + 4])) for p in range(3)),
            ReMeChunk(20, 20, "# Disks\n\nAfter the table.")]
    return rel, text, reme


def test_the_header_rows_of_a_table_reme_split_are_not_paid_again(
        daemon_factory: Any, tmp_path: Path) -> None:
    rel, text, reme = split_table()
    got = adopt_chunks(rel, text, reme)
    assert got is not None and [c.text for c in got] == [c.text for c in reme]
    assert len(reme) == 5
    with reme_reused(daemon_factory, tmp_path, rel, text, reme) as (_, d, _fake):
        res = d.call("memory.search", {"agent_id": "w", "query": "host-9 disk"})
        assert "host-9 " in res["results"][0]["text"]


def test_a_heading_renamed_or_a_header_row_edited_is_an_edit_of_the_parts() -> None:
    """ReMe's parts of a table repeat the heading and the header rows above their own
    lines: renamed or edited since, the parts say what the note no longer does, and
    are chunked anew rather than served as ReMe wrote them."""
    rel, text, reme = split_table()
    for was, now in (("| note |", "| usage |"), ("# Disks", "# Storage")):
        got = adopt_chunks(rel, text.replace(was, now, 1), reme)
        assert got is None or not any(was in c.text for c in got), now
        assert not still_says(rel, text.replace(was, now, 1), reme), now

def test_a_note_reme_cut_by_bytes_keeps_its_chunk_when_it_ends_on_blank_lines(
        daemon_factory: Any, tmp_path: Path) -> None:
    """ReMe 0.4.2 cuts a note of more than 100 sections by bytes: under 10 KB it is one
    chunk, its text the note as written, its range ending on the note's blank last
    lines. Its vector is reused; an edit is embedded."""
    rel = "memory/2026-07-07/log.md"
    text = "# Log\n\n" + "".join(f"## Entry {i}\n\nEntry {i} passed on h{i}.\n\n"
                                 for i in range(101)) + "\n"
    n = len(text.split("\n")) - 1  # ReMe's last line: the one its last byte ends
    reme = [ReMeChunk(1, n, text)]
    assert still_says(rel, text, reme)
    assert not still_says(rel, text.replace("h77.", "h78."), reme)
    assert len(reme) == 1
    with reme_reused(daemon_factory, tmp_path, rel, text, reme) as (ws, d, fake):
        (ws / rel).write_text(text.replace("h77.", "h78."), "utf-8")
        d.call("index.sync", {"agent_id": "w"})
        wait_for(lambda: any("h78" in t for t in passage_texts(fake)), "the edit embedded")
