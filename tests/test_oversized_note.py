"""A note too large to index whole is reported, never cut silently: a real daemon, a real
9 MiB note, health and index.verify before and after it shrinks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from waits import wait_value

from recalld.daemon.index.prepare import CUT_MARGIN_BYTES, MAX_NOTE_BYTES, prepare
from recalld.daemon.remote import chunks

pytestmark = pytest.mark.slow
NOTE = "memory/2026-02-02/dump.md"
KEY = "sk-proj-" + "Zq8Wx7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9F"


def _health(d: Any) -> dict[str, Any]:
    status = d.call("daemon.status", timeout=30.0)
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")
    return dict(ws["health"])


def _wait_health(d: Any, want: str) -> dict[str, Any]:
    def synced_health() -> dict[str, Any]:
        d.call("index.sync", {"agent_id": "w"}, timeout=60.0)
        return _health(d)
    return wait_value(synced_health, lambda health: health["state"] == want, f"health {want}")


def test_a_note_over_the_limit_is_reported_in_health_and_verify(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory" / "2026-02-02").mkdir(parents=True)
    line = "the quick brown fox jumps over the lazy dog again and again\n"
    head = "# Dump\nbeginning marker aardvark\n"
    tail = "\nfinal marker zymurgy\n"
    body = line * ((MAX_NOTE_BYTES + (1 << 20)) // len(line))
    # A key the limit cuts 20 characters in: masked up to the cut, not indexed in part.
    cut_at = MAX_NOTE_BYTES - len(head) - len("boundary kestrel ") - 20
    body = body[:cut_at] + "boundary kestrel " + KEY + body[cut_at:]
    (root / NOTE).write_text(head + body + tail)
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    health = _wait_health(d, "degraded")
    assert health["partly_indexed"] == 1 and health["partly_indexed_paths"] == [NOTE]
    assert any("8 MiB" in r for r in health["reasons"])
    verify = d.call("index.verify", {"agent_id": "w"}, timeout=120.0)
    assert verify["partly_indexed"] == {"count": 1, "paths": [NOTE]} and verify["ok"] is False
    # What is indexed is the head; the tail beyond the limit is not (and is reported).
    assert d.call("memory.search", {"agent_id": "w", "query": "aardvark"})["results"]
    assert not d.call("memory.search", {"agent_id": "w", "query": "zymurgy"})["results"]
    cut = d.call("memory.search", {"agent_id": "w", "query": "kestrel"})["results"]
    assert cut and KEY[:20] not in cut[0]["text"] and "[REDACTED]" in cut[0]["text"]
    # Restarted: the saved index says so (the note is loaded, not read again).
    assert d.stop() == 0
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    health = _wait_health(d, "degraded")
    assert health["partly_indexed_paths"] == [NOTE] and health["files_indexed"] == 1
    index = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")[
        "index"]
    startup = index["watcher"]["last_reconcile"]
    assert index["loaded_generation"] and startup["reason"] == "startup", index
    assert startup["found"] == {"added": 0, "changed": 0, "deleted": 0}, startup

    (root / NOTE).write_text(head + line * 10 + tail)
    health = _wait_health(d, "clean")
    assert health["partly_indexed"] == 0 and health["partly_indexed_paths"] == []
    verify = d.call("index.verify", {"agent_id": "w"}, timeout=120.0)
    assert verify["partly_indexed"] == {"count": 0, "paths": []}, verify
    assert d.call("memory.search", {"agent_id": "w", "query": "zymurgy"})["results"]


def test_the_commands_name_the_note_and_the_fix_that_helps(
        daemon_factory: Any, tmp_path: Path) -> None:
    # `recalld verify` said "DIFFERENCES FOUND" and nothing more; status and doctor told
    # to reindex, which indexes the note only up to the same limit again.
    from test_cli import recalld

    root = tmp_path / "ws"
    (root / "memory" / "2026-02-02").mkdir(parents=True)
    (root / NOTE).write_text("# Dump\n" + "a line of a pasted dump\n" * (
        (MAX_NOTE_BYTES + (1 << 20)) // 24))
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    _wait_health(d, "degraded")
    verify = recalld("verify", "--agent", "w", env=d.env, timeout=120)
    assert verify.returncode == 1 and verify.stdout.startswith("w: DIFFERENCES FOUND"), verify
    assert f"partly indexed (too large: only the beginning of each is searchable; split " \
           f"them): 1: {NOTE}\n" in verify.stdout, verify.stdout
    for args in (["status"], ["doctor"]):
        proc = recalld(*args, env=d.env)
        shown = proc.stdout
        assert f"index degraded: 1 note(s) over 8 MiB indexed only up to that size: {NOTE}" \
               in shown, (args, shown)
        fix = shown.split(f"up to that size: {NOTE}\n", 1)[1].splitlines()[0]
        assert "split the note(s) named" in fix and "reindex" not in fix, (args, fix)


def test_a_utf8_note_cut_inside_a_character_is_still_utf8(
        daemon_factory: Any, tmp_path: Path) -> None:
    # The read of a note over the limit ends inside a character of Chinese text: the cut
    # bytes were not UTF-8, so the note was called one "in an encoding recalld does not
    # recognise" (degraded, doctor FAIL) though it was UTF-8 throughout.
    root = tmp_path / "ws"
    (root / "memory" / "2026-02-02").mkdir(parents=True)
    line = "今天和团队讨论了季度预算，决定下周三提交报告。\n"
    data = ("# 会议记录\n" + line * ((MAX_NOTE_BYTES + (2 << 20)) // len(line.encode()))
            ).encode()
    read_to = MAX_NOTE_BYTES + CUT_MARGIN_BYTES
    while data[read_to] & 0xC0 != 0x80:  # the read ends inside a character
        data = b"x" + data
    (root / NOTE).write_bytes(data)
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    health = _wait_health(d, "degraded")
    assert health["partly_indexed_paths"] == [NOTE], health
    assert health["not_utf8"]["count"] == 0, health["not_utf8"]
    assert not any("encoding" in r for r in health["reasons"]), health["reasons"]
    hits = d.call("memory.search", {"agent_id": "w", "query": "季度预算"})["results"]
    assert hits and "\ufffd" not in hits[0]["text"]


def test_a_note_over_the_limit_is_chunked_for_the_server_as_the_index_chunks_it(
        tmp_path: Path) -> None:
    # A key the cut falls inside: the index masks it, reading past the cut; the rows an
    # uploader makes for searching in the server are made of the same text.
    key = "ghp_" + "Zq8xW2nR5tY7uP1oK3jH6gF9dS4aL0mC2vB7"
    line = "the kestrel hovers over the ridge\n"
    head = "# Ridge\n\n" + line * ((MAX_NOTE_BYTES - 200) // len(line))
    head += "\n" * (MAX_NOTE_BYTES - 16 - len(head))
    data = (head + "deploy key " + key + "\nand the rest of the day\n").encode()
    assert len(head) + len("deploy key ") < MAX_NOTE_BYTES < len(head) + 11 + len(key)
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "ridge.md").write_bytes(data)
    local = prepare(tmp_path, "memory/ridge.md", max_chars=1200, known_digest=None).chunks
    rows = chunks.chunk_rows("memory/ridge.md", data, max_chars=1200)
    assert local[-1].text.endswith("deploy key [REDACTED]"), local[-1].text[-80:]
    assert [r.text for r in rows] == [c.text for c in local]
    assert not any(key[:8] in r.text for r in rows)
