"""File operations for models: confinement, write policy, atomic writes, daily notes, tools."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import orjson
import pytest
import trio

from recalld.daemon.config import WorkspaceSettings
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.memory.fileops import FileOps, WriteConflict, WritePolicy
from recalld.daemon.memory.slugs import slug
from recalld.daemon.store.fsio import TEMP_RE
from recalld.ipc.errors import InvalidParams, NotAllowed, NotFound, PathOutsideWorkspace

DAY = "2026-07-23"


def make_ops(root: Path, session_id: str | None = "s1") -> tuple[FileOps, list[int]]:
    synced: list[int] = []

    async def sync() -> None:
        synced.append(1)

    settings = WorkspaceSettings()
    ops = FileOps(root, settings, WritePolicy.for_model(settings), sync=sync,
                  session_id=session_id, today=lambda: dt.date(2026, 7, 23))
    return ops, synced


def no_temp_files(root: Path) -> bool:
    return not [p for p in root.rglob("*") if TEMP_RE.match(p.name)]


async def test_write_read_edit_and_sync(tmp_path: Path) -> None:
    ops, synced = make_ops(tmp_path)
    res = await ops.write("memory/2026-07-23/a.md", "one\ntwo\nthree\n")
    assert res.created and res.changed and synced == [1]
    got = await ops.read("memory/2026-07-23/a.md", 2, 3)
    assert got.text == "two\nthree\n" and got.total_lines == 3
    same = await ops.write("memory/2026-07-23/a.md", "one\ntwo\nthree\n")
    assert not same.changed and len(ops.changes) == 1
    await ops.edit("memory/2026-07-23/a.md", "two", "TWO")
    assert (tmp_path / "memory/2026-07-23/a.md").read_text() == "one\nTWO\nthree\n"
    assert ops.changes[-1].before == "one\ntwo\nthree\n"
    await ops.write("digest/wiki/x.md", "x x\n")
    with pytest.raises(InvalidParams, match="2 times"):
        await ops.edit("digest/wiki/x.md", "x", "y")
    with pytest.raises(InvalidParams, match="0 times"):
        await ops.edit("digest/wiki/x.md", "zzz", "y")
    with pytest.raises(NotFound):
        await ops.edit("digest/wiki/missing.md", "a", "b")
    assert no_temp_files(tmp_path)


async def test_confinement_and_policy(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    os.symlink(outside, root / "memory" / "link")
    (outside / "t.md").write_text("secret\n")
    os.symlink(outside / "t.md", root / "memory" / "file-link.md")
    ops, _ = make_ops(root)
    for bad in ("/etc/passwd.md", "memory/../../x.md", "memory/a\x00.md"):
        with pytest.raises(PathOutsideWorkspace):
            await ops.write(bad, "x")
    with pytest.raises(PathOutsideWorkspace):
        await ops.write("memory/link/t.md", "overwrite")
    with pytest.raises(PathOutsideWorkspace):
        await ops.write("memory/file-link.md", "overwrite")
    with pytest.raises(PathOutsideWorkspace):
        await ops.read("memory/link/t.md")
    assert (outside / "t.md").read_text() == "secret\n"
    for denied in ("mem_metadata/x.md", "mem_session/dialog/s.md", "resource/r.md", "x.md",
                   "memory/a.txt", "memory"):
        with pytest.raises((NotAllowed, InvalidParams)):
            await ops.write(denied, "x")
    with pytest.raises(InvalidParams):
        await ops.write("memory/.hidden.md", "x")
    assert not (root / "mem_metadata").exists() and not (root / "x.md").exists()
    # A daemon-side policy may write other files.
    internal = FileOps(root, ops.settings, WritePolicy(("mem_metadata",), None))
    await internal.write("mem_metadata/dream/log.json", "{}")
    assert (root / "mem_metadata/dream/log.json").read_text() == "{}"


async def test_daily_write_never_overwrites_another_session(tmp_path: Path) -> None:
    ops, _ = make_ops(tmp_path)
    a = await ops.daily_write("s1", "Commute Plans!", "I bike.", DAY, "how I commute")
    assert a.path == f"memory/{DAY}/commute-plans.md" and a.created
    b = await ops.daily_write("s2", "commute-plans", "I drive.", DAY)
    assert b.path == f"memory/{DAY}/commute-plans-2.md"
    c = await ops.daily_write("s3", "commute plans", "I walk.", DAY)
    assert c.path == f"memory/{DAY}/commute-plans-3.md"
    own = await ops.daily_write("s2", "commute-plans", "I drive a lot.", DAY)
    assert own.path == b.path and not own.created and own.changed
    # A hand-written note (no session) is never taken over either.
    (tmp_path / f"memory/{DAY}/diary.md").write_text("my own words\n")
    d = await ops.daily_write("s1", "diary", "model text", DAY)
    assert d.path == f"memory/{DAY}/diary-2.md"
    assert (tmp_path / f"memory/{DAY}/diary.md").read_text() == "my own words\n"
    first = (tmp_path / a.path).read_text()
    fields, body_start = parse_frontmatter(first)
    assert fields == {"name": "commute-plans", "description": "how I commute",
                      "session_id": "s1",
                      "source_conversation": "[[mem_session/dialog/s1.jsonl]]"}
    assert first.split("\n")[body_start:] == ["I bike.", ""]
    assert "I drive a lot." in (tmp_path / b.path).read_text()
    # The update kept the earlier description; frontmatter given in content is merged.
    again = await ops.daily_write("s1", "commute-plans",
                                  "---\ntags: [travel]\nsession_id: forged\n---\nBike.", DAY)
    fields2, _ = parse_frontmatter((tmp_path / again.path).read_text())
    assert fields2["session_id"] == "s1" and fields2["tags"] == ["travel"]
    assert fields2["description"] == "how I commute"
    assert await ops.session_notes("s2", DAY) == [b.path]
    assert await ops.session_notes("nobody", DAY) == []
    with pytest.raises(InvalidParams):
        await ops.daily_write("s1", "x", "y", "2026-13-01")


async def test_concurrent_daily_writes_pick_distinct_names(tmp_path: Path) -> None:
    ops, _ = make_ops(tmp_path)
    paths: list[str] = []

    async def one(sid: str) -> None:
        paths.append((await ops.daily_write(sid, "same", f"from {sid}", DAY)).path)

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(one, f"s{i}")
    assert len(set(paths)) == 6
    owners = {parse_frontmatter((tmp_path / p).read_text())[0]["session_id"] for p in paths}
    assert owners == {f"s{i}" for i in range(6)}


async def test_frontmatter_update(tmp_path: Path) -> None:
    ops, _ = make_ops(tmp_path)
    rel = "digest/personal/food.md"
    await ops.write(rel, "---\nname: food\n# keep me\ntags: [a]\n---\nRamen.\n")
    await ops.frontmatter_update(rel, {"tags": ["a", "b"], "name": None, "level": 2})
    text = (tmp_path / rel).read_text()
    fields, _ = parse_frontmatter(text)
    assert fields == {"tags": ["a", "b"], "level": 2}
    assert "# keep me" in text and text.endswith("Ramen.\n")


async def test_tools_schemas_and_dispatch(tmp_path: Path) -> None:
    ops, _ = make_ops(tmp_path, session_id="s9")
    tools = ops.tools()
    names = [t["function"]["name"] for t in tools]
    assert names == ["read", "write", "edit", "frontmatter_update", "daily_write"]
    for t in tools:
        assert t["type"] == "function"
        params = t["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    assert [t["function"]["name"] for t in ops.tools(["read"])] == ["read"]
    with pytest.raises(ValueError, match="unknown tools"):
        ops.tools(["rm"])

    out = orjson.loads(await ops.call_tool("daily_write", {"name": "n", "content": "hello"}))
    assert out["ok"] and out["path"] == f"memory/{DAY}/n.md" and out["created"]
    assert parse_frontmatter((tmp_path / out["path"]).read_text())[0]["session_id"] == "s9"
    read = await ops.call_tool("read", {"path": out["path"], "start_line": 1, "end_line": 2})
    assert read.startswith(f"{out['path']} lines 1-2 of ")
    # Every failure is text for the model, never an exception.
    for name, args in [
        ("write", {"path": "../x.md", "content": "x"}),
        ("write", {"path": "mem_metadata/x.md", "content": "x"}),
        ("write", {"path": "memory/x.md"}),
        ("edit", {"path": out["path"], "old": "nothere", "new": "x"}),
        ("read", {"path": "memory/missing.md"}),
        ("read", {"path": out["path"], "start_line": "1"}),
        ("frontmatter_update", {"path": out["path"], "changes": "x"}),
        ("rm", {"path": out["path"]}),
    ]:
        answer = await ops.call_tool(name, args)
        assert answer.startswith("error:"), (name, answer)
    unbound, _ = make_ops(tmp_path / "other", session_id=None)
    assert (await unbound.call_tool("daily_write", {"name": "n", "content": "c"})).startswith(
        "error:")


def test_slug() -> None:
    assert slug("Trip to Rome.md") == "trip-to-rome"
    assert slug("../../etc/passwd") == "etc-passwd"
    assert slug("   ") == "note"
    assert slug("index") == "index-note"
    assert slug("周末 计划") == "周末-计划"
    assert len(slug("x" * 300)) == 80


async def test_cancelled_write_leaves_old_file(tmp_path: Path) -> None:
    ops, _ = make_ops(tmp_path)
    rel = "memory/2026-07-23/c.md"
    await ops.write(rel, "old\n")
    for _ in range(20):
        with trio.move_on_after(0):
            await ops.write(rel, "new\n" * 1000)
    text = (tmp_path / rel).read_text()
    assert text in ("old\n", "new\n" * 1000)
    assert no_temp_files(tmp_path)


async def test_replace_writes_only_over_what_was_read(tmp_path: Path) -> None:
    # A writer that read a node and made its new text from it (the dream) must not
    # overwrite what someone wrote since: it gets WriteConflict and reads again.
    ops, _ = make_ops(tmp_path)
    node = tmp_path / "digest/wiki/tent.md"
    with pytest.raises(WriteConflict):
        await ops.replace("digest/wiki/tent.md", "# Tent\n", "# Tent\n- blue\n")
    assert not node.exists()
    await ops.replace("digest/wiki/tent.md", None, "# Tent\n- blue\n")
    node.write_text("# Tent\n- blue\n- a person's line\n")
    with pytest.raises(WriteConflict):
        await ops.replace("digest/wiki/tent.md", "# Tent\n- blue\n", "# Tent\n- green\n")
    assert node.read_text() == "# Tent\n- blue\n- a person's line\n"
    done = await ops.replace("digest/wiki/tent.md", "# Tent\n- blue\n- a person's line\n",
                             "# Tent\n- green\n- a person's line\n")
    assert done.changed and node.read_text() == "# Tent\n- green\n- a person's line\n"
    with pytest.raises(WriteConflict):  # it was removed meanwhile
        node.unlink()
        await ops.replace("digest/wiki/tent.md", done.text, "# Tent\n")
    assert not node.exists() and no_temp_files(tmp_path)


async def test_notes_in_another_encoding_are_never_rewritten(tmp_path: Path) -> None:
    ops, _ = make_ops(tmp_path, session_id="s1")
    folder = tmp_path / "memory" / DAY
    folder.mkdir(parents=True)
    # A person's notes saved as GBK and as Latin-1: one is even this session's note.
    gbk = "---\nsession_id: s1\n---\n- 喜欢喝乌龙茶\n- 周末去爬山\n".encode("gbk")
    latin = "- café au lait à 8h\n- Ærø in May\n".encode("latin-1")
    (folder / "tea.md").write_bytes(gbk)
    (folder / "cafe.md").write_bytes(latin)
    for rel in (f"memory/{DAY}/tea.md", f"memory/{DAY}/cafe.md"):
        for attempt in (ops.edit(rel, "-", "*"),
                        ops.frontmatter_update(rel, {"topic": "drinks"})):
            with pytest.raises(InvalidParams, match="not UTF-8 text"):
                await attempt
    # Read, both read as written (notetext.py); one in an encoding not recognised is
    # refused (its text would be U+FFFD).
    assert (await ops.read(f"memory/{DAY}/tea.md")).text.endswith("- 周末去爬山\n")
    (folder / "chai.md").write_bytes("- пьёт чай с лимоном\n".encode("cp1251"))
    with pytest.raises(InvalidParams, match="not UTF-8 text"):
        await ops.read(f"memory/{DAY}/chai.md")
    assert (await ops.read(f"memory/{DAY}/cafe.md")).text.startswith("- café au lait")
    said = await ops.call_tool("edit", {"path": f"memory/{DAY}/cafe.md", "old": "-",
                                        "new": "*"})
    assert said.startswith("error:") and "not UTF-8" in said
    # The session's note is not found in it, and a daily_write goes to another name.
    assert await ops.session_notes("s1", DAY) == []
    res = await ops.daily_write("s1", "tea", "- likes green tea\n", DAY)
    assert res.path == f"memory/{DAY}/tea-2.md" and res.created
    assert await ops.session_notes("s1", DAY) == [res.path]
    assert (folder / "tea.md").read_bytes() == gbk
    assert (folder / "cafe.md").read_bytes() == latin
    # A UTF-8 note whose text holds U+FFFD itself is a note like any other.
    await ops.write(f"memory/{DAY}/odd.md", "- the byte \ufffd was lost\n")
    await ops.edit(f"memory/{DAY}/odd.md", "lost", "kept")
    assert (await ops.read(f"memory/{DAY}/odd.md")).text == "- the byte \ufffd was kept\n"


async def test_session_notes_list_a_note_then_its_continuations_in_order(
        tmp_path: Path) -> None:
    ops, _ = make_ops(tmp_path)
    for name in ("log-10", "log", "log-2", "other"):
        await ops.daily_write("s1", name, f"- note {name}\n", DAY)
    await ops.daily_write("s2", "log-3", "- another session's\n", DAY)
    assert await ops.session_notes("s1", DAY) == [
        f"memory/{DAY}/{n}.md" for n in ("log", "log-2", "log-10", "other")]


async def test_a_name_in_another_unicode_form_names_the_file_on_disk(tmp_path: Path) -> None:
    # A model (or an agent) names notes composed (NFC); a workspace from macOS holds them
    # decomposed (NFD). Every operation wrote or looked for a second name beside the file.
    import unicodedata

    def nfd(text: str) -> str:
        return unicodedata.normalize("NFD", text)

    ops, _ = make_ops(tmp_path)
    node = nfd("digest/wiki/Réunions/café.md")
    (tmp_path / node).parent.mkdir(parents=True)
    (tmp_path / node).write_text("---\nname: cafe\n---\nOld text.\n")
    typed = "digest/wiki/Réunions/café.md"  # composed
    assert (await ops.read(typed)).text.endswith("Old text.\n")
    assert not (await ops.write(typed, "---\nname: cafe\n---\nNew text.\n")).created
    await ops.edit(typed, "New", "Newer")
    await ops.frontmatter_update(typed, {"description": "coffee"})
    assert "Newer text." in (tmp_path / node).read_text()
    assert "description: coffee" in (tmp_path / node).read_text()
    assert [c.path for c in ops.changes] == [node] * 3
    assert os.listdir(tmp_path / "digest/wiki") == [nfd("Réunions")]
    assert os.listdir(tmp_path / nfd("digest/wiki/Réunions")) == [nfd("café.md")]
    # A session's own daily note named decomposed on disk is continued, not doubled.
    day = tmp_path / "memory" / DAY
    first = await ops.daily_write("s1", nfd("Crème"), "one\n")
    assert not (await ops.daily_write("s1", "Crème", "two\n")).created
    assert os.listdir(day) == [os.path.basename(first.path)]
    await ops.remove(typed, (tmp_path / node).read_text())
    assert os.listdir(tmp_path / nfd("digest/wiki/Réunions")) == []
