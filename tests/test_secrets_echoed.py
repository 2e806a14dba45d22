"""What a caller sent comes back masked where the daemon keeps it masked: the ``query``
of ``memory.recall`` and ``memory.select`` (the index and the chat model see it so), and
a path named in an error of ``memory.read`` (search and status show such a note's path
masked), what any error quotes of the caller's text (ids, names, paths, also in full-width
forms cut by a zero-width space) and the ids and paths answers send back, from a real
daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recalld.ipc.errors import InvalidParams, NotFound, RecalldError

TOKEN = "ghp_" + "Qz8Lm2Rt5Vx9Bn3Kc7Hw1Jd4Fg6Ps0Ya2Ue5"
PASSWORD = "Tr0ub4dor&3"


def test_queries_and_paths_sent_back_are_masked(daemon_factory: Any) -> None:
    d = daemon_factory()
    ws = Path(d.call("workspace.open", {"agent_id": "coder"})["path"])
    d.call("memory.add_note", {"agent_id": "coder", "content": "the heron fishes at dawn"})
    asked = f"where does the heron fish? my token is {TOKEN} and the password is {PASSWORD}"
    for params in ({"query": asked},
                   {"messages": [{"role": "user", "content": [{"type": "text",
                                                                 "text": asked}]}]}):
        got = d.call("memory.recall", {"agent_id": "coder", **params})
        assert TOKEN not in got["query"] and PASSWORD not in got["query"], got["query"]
        assert got["query"].startswith("where does the heron fish?")
        assert "[REDACTED]" in got["query"]
        assert got["items"] and "heron" in got["items"][0]["text"]
    chosen = d.call("memory.select", {"agent_id": "coder", "query": asked})
    assert TOKEN not in chosen["query"] and PASSWORD not in chosen["query"], chosen

    for path in (f"memory/{TOKEN}.md", f"memory/{TOKEN}/note.md", f"pw={PASSWORD}.md"):
        with pytest.raises(NotFound) as missing:
            d.call("memory.read", {"agent_id": "coder", "path": path})
        assert TOKEN not in str(missing.value) and PASSWORD not in str(missing.value)
        assert "[REDACTED]" in str(missing.value)
    (ws / "memory" / TOKEN).mkdir(parents=True)
    with pytest.raises(InvalidParams, match="not a regular file") as folder:
        d.call("memory.read", {"agent_id": "coder", "path": f"memory/{TOKEN}"})
    assert TOKEN not in str(folder.value)
    with pytest.raises(NotFound, match=r"memory/plain-name\.md"):  # other names stay named
        d.call("memory.read", {"agent_id": "coder", "path": "memory/plain-name.md"})


def _full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def test_every_error_and_echoing_answer_masks_what_the_caller_sent(daemon_factory: Any,
                                                                     tmp_path: Path) -> None:
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "coder"})
    # The same key as sent: plain, in full-width forms cut by a zero-width space.
    for key in (TOKEN, _full_width(TOKEN[:6]) + "\u200b" + _full_width(TOKEN[6:])):
        tail = key[-8:]
        refused = [
            ("jobs.get", {"agent_id": "coder", "job_id": key}),
            ("jobs.cancel", {"agent_id": "coder", "job_id": key}),
            ("jobs.get", {"agent_id": "coder", "job_id": "x", "as_agent": key}),
            ("jobs.submit", {"agent_id": "coder", "kind": key}),
            ("memory.search", {"agent_id": "coder", "query": "x", key: 1}),
            ("memory.search", {"agent_id": key, "query": "x"}),
            (key, {}),
            ("backup.verify", {"file": str(tmp_path / f"{key}.zip")}),
            ("backup.restore", {"file": str(tmp_path / f"{key}.zip"), "dry_run": True}),
            # A message long enough to be cut, the key where the cut falls.
            ("backup.verify", {"file": str(tmp_path / ("n" * 990 + "-" + key + ".zip"))}),
        ]
        for method, params in refused:
            with pytest.raises(RecalldError) as err:  # any refusal: its text
                d.call(method, params)
            shown = f"{err.value} {err.value.data}"
            assert key not in shown and tail not in shown and key[:8] not in shown, shown
            # (An agent id in full-width forms is refused without being quoted.)
            assert "[REDACTED]" in shown or "agent_id must be" in shown, (method, shown)
        acked = d.call("inbox.ack", {"agent_id": "coder", "ids": [key, "plain-id"]})
        assert acked["unknown"] == ["[REDACTED]", "plain-id"]

    out = tmp_path / f"bk-{TOKEN}.zip"
    made = d.call("backup.create", {"agents": ["coder"], "out": str(out)})
    assert made["file"] == str(tmp_path / "bk-[REDACTED].zip")
    for method, params in (("backup.verify", {"file": str(out)}),
                           ("backup.restore", {"file": str(out), "dry_run": True})):
        answer = d.call(method, params)
        assert answer["file"] == str(tmp_path / "bk-[REDACTED].zip"), (method, answer)
        assert TOKEN not in str(answer)
    plain = tmp_path / "plain.zip"
    assert d.call("backup.create", {"agents": ["coder"], "out": str(plain)})["file"] \
        == str(plain)
    assert d.call("backup.verify", {"file": str(plain)})["file"] == str(plain)
    _restore_of_a_masked_path(d, out)
    with pytest.raises(NotFound, match=r"no job 'a1b2c3d4e5f60718' in workspace 'coder'"):
        d.call("jobs.get", {"agent_id": "coder", "job_id": "a1b2c3d4e5f60718"})


def test_files_a_restore_would_remove_are_listed_as_status_shows_them(
        daemon_factory: Any) -> None:
    # A dry run listed the notes it would remove by their names as they are: one named by a
    # key (which search, status and backup.create show masked) came back whole.
    d = daemon_factory()
    ws = Path(d.call("workspace.open", {"agent_id": "coder"})["path"])
    d.call("memory.add_note", {"agent_id": "coder", "content": "the heron fishes at dawn"})
    archive = d.call("backup.create", {"agents": ["coder"]})["file"]
    for rel in (f"memory/2026-07-23/{TOKEN}.md", f"memory/{TOKEN}/x.md",
                "memory/2026-07-23/plain.md"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("gone after the restore\n", encoding="utf-8")
    plan = d.call("backup.restore", {"file": archive, "dry_run": True})["plans"][0]
    assert plan["remove"] == 3 and TOKEN not in str(plan), plan
    assert sorted(plan["removes"]) == ["memory/2026-07-23/[REDACTED].md",
                                       "memory/2026-07-23/plain.md",
                                       "memory/[REDACTED]/x.md"]


def _restore_of_a_masked_path(d: Any, out: Path) -> None:
    """Every answer that carries a backup's path shows it as ``backup.create`` does: the
    restore's rollback point (``backup.list``, ``backup.rollback``), and the archives of
    the backups folder the caller named; the rollback point on disk holds no key."""
    shown = str(out.parent / "bk-[REDACTED].zip")
    assert TOKEN not in str(d.call("backup.restore", {"file": str(out)}))
    folder = Path(d.call("backup.list")["dir"])
    (folder / f"copy-{TOKEN}.zip").write_bytes(out.read_bytes())
    listed = d.call("backup.list")
    assert listed["rollback"]["restored_from"] == shown
    copy = next(b for b in listed["backups"] if b["name"].startswith("copy-"))
    assert copy["name"] == "copy-[REDACTED].zip" and copy["agents"] == ["coder"], copy
    assert copy["file"] == str(folder / "copy-[REDACTED].zip")
    assert TOKEN not in str(listed), listed
    assert TOKEN not in (folder / "rollback.json").read_text()
    rolled = d.call("backup.rollback")
    assert rolled["rolled_back"]["restored_from"] == shown
    assert TOKEN not in str(rolled), rolled
    # The archive is still found by the name the caller gave it.
    assert d.call("backup.verify", {"file": f"copy-{TOKEN}.zip"})["ok"] is True
