"""Notes named by a credential, from outside: a real daemon, notes dropped in by hand
whose file or folder name is a token. Their paths are shown masked (folder and suffix
kept) in every hit, link, neighbour, recall label and status line; status and the log
say how many there are and where, never the token."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from test_cli import recalld
from waits import wait_value

from recalld.daemon.memory.redact import find_spans
from recalld.daemon.memory.secret_names import could_hold, mask_path
from recalld.ipc.errors import InvalidParams

sys.path.insert(0, str(Path(__file__).parent / "bench"))
from redact_corpus import generate

GITHUB = "ghp_Zr4Tq9Lm2Xw7Ks3Vn8Bp1Dh6Fy0Jc5Ga2Ue9"
AWS = "AKIAJ7QX2M4RZ9WL3KTB"
GITLAB = "glpat-" + "xR7-kq2_Vm9wLz4TnB8c"
JWT = ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI5ODc2NTQzMjEwIn0."
       "Qm7XbWk2sPz9RfT4nLc8VyH1dJ6gA3eK0uO5iM2wS7E")
TOKENS = (GITHUB, AWS, GITLAB, JWT, GITHUB[4:20])
DAY = "memory/2026-11-02"


def _health(d: Any) -> dict[str, Any]:
    status = d.call("daemon.status", timeout=30.0)
    return dict(next(w for w in status["workspaces"] if w["agent_id"] == "w")["health"])


def _leaks(value: object) -> list[str]:
    return [t[:10] for t in TOKENS if t in str(value)]


@pytest.mark.parametrize("folder", ["", "memory/", f"{DAY}/"])
@pytest.mark.parametrize("suffix", ["", ".md", ".jsonl"])
def test_the_gate_passes_every_name_the_rules_mask(folder: str, suffix: str) -> None:
    """Every secret of the redaction corpus that a file name can hold, as a file name:
    where the rules mask it, the gate lets it through and the path shown hides it."""
    kinds: set[str] = set()
    for item in generate(seed=11, per_kind=4):
        for name in (item.secret, f"deploy-{item.secret}", f"{item.secret}_old"):
            if "/" in name or "\n" in name or "\x00" in name:
                continue  # no file name holds it
            name += suffix
            if not find_spans(name):
                continue
            kinds.add(item.kind)
            assert could_hold(name), (item.kind, name)
            shown = mask_path(folder + name)
            assert item.secret not in shown and "[REDACTED]" in shown, (item.kind, shown)
            assert shown.startswith(folder) and shown.endswith(suffix), (item.kind, shown)
    assert len(kinds) >= 25, sorted(kinds)


def test_notes_named_by_a_credential_are_shown_masked(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    day = root / DAY
    day.mkdir(parents=True)
    (day / f"{GITHUB}.md").write_text("# deploy\nThe quokka deploy hook.\n[[plain]]\n")
    (day / f"{AWS}.md").write_text("# aws\nThe quokka backup account.\n")
    (day / f"key-{GITLAB}.md").write_text("# gitlab\nThe quokka runner.\n")
    (root / "memory" / JWT).mkdir()
    (root / "memory" / JWT / "session.md").write_text("# jwt\nThe quokka login.\n")
    (day / "plain.md").write_text("# plain\nThe pangolin rota.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})

    found = d.call("memory.search", {"agent_id": "w", "query": "quokka"})
    paths = {r["path"] for r in found["results"]}
    assert paths == {f"{DAY}/[REDACTED].md", f"{DAY}/key-[REDACTED].md",
                     "memory/[REDACTED]/session.md"}, paths
    assert len(found["results"]) == 4 and _leaks(found) == [], _leaks(found)
    # The neighbour a masked hit links to names it masked, and so do the links.
    assert [(e["path"], e["via"]) for e in found["expanded"]] == [
        (f"{DAY}/plain.md", f"{DAY}/[REDACTED].md")]
    plain = d.call("memory.search", {"agent_id": "w", "query": "pangolin"})
    assert plain["results"][0]["links"] == [f"{DAY}/[REDACTED].md"]
    assert plain["expanded"][0]["path"] == f"{DAY}/[REDACTED].md"
    assert _leaks(plain) == []

    # A note shown masked is read by the name it is shown by; two shown alike are not.
    read = d.call("memory.read", {"agent_id": "w", "path": "memory/[REDACTED]/session.md"})
    assert read["text"] == "# jwt\nThe quokka login.\n"
    assert read["path"] == "memory/[REDACTED]/session.md" and _leaks(read) == []
    read = d.call("memory.read", {"agent_id": "w", "path": f"{DAY}/key-[REDACTED].md"})
    assert "quokka runner" in read["text"]
    with pytest.raises(InvalidParams, match=r"2 notes are shown as .*rename them") as refused:
        d.call("memory.read", {"agent_id": "w", "path": f"{DAY}/[REDACTED].md"})
    assert _leaks(str(refused.value)) == []

    recall = d.call("memory.recall", {"agent_id": "w", "query": "quokka pangolin"})
    assert "[REDACTED].md" in str(recall) and _leaks(recall) == []

    # Status counts them and names their folders (masked themselves), never the tokens.
    health = wait_value(lambda: _health(d), lambda h: h["secret_named"] == 4, "counted")
    assert health["secret_named_folders"] == [DAY, "memory/[REDACTED]"]
    assert any("named by what looks like a credential" in r for r in health["reasons"])
    assert _leaks(d.call("daemon.status")) == []
    assert "named by what looks like a credential" in d.log() and _leaks(d.log()) == []

    # Renamed, the note is shown by its name and no longer counted.
    (day / f"{AWS}.md").rename(day / "aws-backup.md")
    d.call("index.sync", {"agent_id": "w"})
    found = d.call("memory.search", {"agent_id": "w", "query": "backup account"})
    assert found["results"][0]["path"] == f"{DAY}/aws-backup.md"
    assert _health(d)["secret_named"] == 3

    # A warm start keeps them masked (the index saved which paths are so named).
    d.stop()
    d2 = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    found = d2.call("memory.search", {"agent_id": "w", "query": "quokka"})
    assert {r["path"] for r in found["results"]} == {
        f"{DAY}/[REDACTED].md", f"{DAY}/key-[REDACTED].md", "memory/[REDACTED]/session.md",
        f"{DAY}/aws-backup.md"}
    assert _leaks(found) == [] and _health(d2)["secret_named"] == 3


def test_a_note_named_by_a_credential_is_told_of_once(
        daemon_factory: Any, tmp_path: Path) -> None:
    """The log says a note is named by a credential when it is first indexed, not again
    at each of its edits; another such note is told of in its turn."""
    root = tmp_path / "ws"
    day = root / DAY
    day.mkdir(parents=True)
    note = day / f"release-{GITLAB}.md"
    note.write_text("# release\nThe wombat runner.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})
    notice = "named by what looks like a credential"
    assert d.log().count(notice) == 1

    for n in range(3):
        with note.open("a") as f:
            f.write(f"Edit {n}: the wombat runner moved.\n")
        d.call("index.sync", {"agent_id": "w"})
        found = d.call("memory.search", {"agent_id": "w", "query": f"edit {n} wombat"})
        assert any(f"Edit {n}" in r["text"] for r in found["results"]), found
    assert d.log().count(notice) == 1

    (day / f"{AWS}.md").write_text("# aws\nThe wombat account.\n")
    d.call("index.sync", {"agent_id": "w"})
    assert d.log().count(notice) == 2 and _leaks(d.log()) == []


def test_a_resource_skipped_for_its_name_is_listed_masked(
        daemon_factory: Any, tmp_path: Path) -> None:
    """A resource file named by a credential gets no note; status lists it as skipped,
    by its masked name."""
    root = tmp_path / "ws"
    (root / "resource" / JWT).mkdir(parents=True)
    (root / "resource" / f"deploy-{GITHUB}.txt").write_text("The quokka hook.\n")
    (root / "resource" / JWT / "login.txt").write_text("The quokka login.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')

    def resource() -> dict[str, Any]:
        status = d.call("daemon.status", timeout=30.0)
        return dict(next(w for w in status["workspaces"] if w["agent_id"] == "w")["resource"])

    shown = wait_value(resource, lambda r: len(r["skipped"]) == 2, "both skipped")
    assert {s["path"] for s in shown["skipped"]} == {
        "resource/[REDACTED]/login.txt", "resource/deploy-[REDACTED].txt"}
    assert all("looks like a credential" in s["reason"] for s in shown["skipped"])
    assert _leaks(d.call("daemon.status")) == [] and _leaks(d.log()) == []


def test_memory_list_shows_notes_named_by_a_credential_masked(
        daemon_factory: Any, tmp_path: Path) -> None:
    """memory.list (and the MCP bridge's resources, which it lists) showed the token of
    a note's name to the owner and to agents it shares with; it shows the path search
    shows, by which the note is read."""
    root = tmp_path / "ws"
    (root / DAY).mkdir(parents=True)
    (root / DAY / f"{GITHUB}.md").write_text("# deploy\nThe quokka deploy hook.\n")
    (root / "memory" / JWT).mkdir()
    (root / "memory" / JWT / "session.md").write_text("# jwt\nThe quokka login.\n")
    (root / DAY / "plain.md").write_text("# plain\nThe pangolin rota.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nshared_with = ["reader"]\n')
    d.call("index.sync", {"agent_id": "w"})
    for who in ({}, {"as_agent": "reader"}):
        listed = d.call("memory.list", {"agent_id": "w", **who})
        paths = [f["path"] for f in listed["files"]]
        assert paths == [f"{DAY}/[REDACTED].md", f"{DAY}/plain.md",
                         "memory/[REDACTED]/session.md"], paths
        assert _leaks(listed) == []
        read = d.call("memory.read", {"agent_id": "w", "path": paths[-1], **who})
        assert "quokka login" in read["text"] and _leaks(read) == []


def test_a_note_passed_by_for_its_name_encoding_is_named_masked(
        daemon_factory: Any, tmp_path: Path) -> None:
    """A note whose name is not UTF-8 is passed by, with a warning in the log and an
    example in status; both named the token of its name or of its folder."""
    root = tmp_path / "ws"
    (root / DAY).mkdir(parents=True)
    (root / "memory" / AWS).mkdir()
    for name in (f"{DAY}/{GITHUB}-", f"memory/{AWS}/caf"):
        with open(os.fsencode(root / name) + b"\xe9.md", "wb") as fh:
            fh.write(b"# odd\nThe quokka note named in Latin-1.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})

    def misnamed() -> dict[str, Any]:
        status = d.call("daemon.status", timeout=30.0)
        ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")
        return dict(ws["index"]["watcher"]["misnamed"])

    shown = wait_value(misnamed, lambda m: m["notes"] == 2, "both passed by")
    assert shown["example"] == f"{DAY}/[REDACTED]-\\xe9.md", shown
    assert d.log().count("its name is not valid UTF-8") == 2
    assert "memory/[REDACTED]/caf\\xe9.md" in d.log()
    assert _leaks(d.call("daemon.status")) == [] and _leaks(d.log()) == [], _leaks(d.log())
    # memory.list passes them by as the index does: it failed whole (an answer not JSON).
    (root / DAY / "plain.md").write_text("# plain\n", encoding="utf-8")
    listed = d.call("memory.list", {"agent_id": "w"})
    assert [f["path"] for f in listed["files"]] == [f"{DAY}/plain.md"], listed


def test_a_path_shown_masked_filters_by_that_name(
        daemon_factory: Any, tmp_path: Path) -> None:
    """A folder or note shown masked (``memory/[REDACTED]``) named nothing as a search's
    ``path_prefix`` or a ``memory.list`` prefix: both compared it with the real names
    only. It filters by the folders and notes it is shown for, as their real names do."""
    root = tmp_path / "ws"
    for rel, text in ((f"memory/{JWT}/login.md", "The heron login.\n"),
                      (f"memory/{AWS}/keys.md", "The heron keys.\n"),
                      (f"{DAY}/{GITLAB}.md", "The heron runner.\n"),
                      (f"{DAY}/plain.md", "The heron rota.\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# note\n{text}")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})

    def searched(*prefixes: str) -> list[str]:
        found = d.call("memory.search", {"agent_id": "w", "query": "heron",
                                         "filters": {"path_prefix": list(prefixes)}})
        assert _leaks(found) == [], _leaks(found)
        return sorted(r["path"] for r in found["results"])

    both = ["memory/[REDACTED]/keys.md", "memory/[REDACTED]/login.md"]
    assert searched("memory/[REDACTED]") == both
    assert searched(f"memory/{JWT}") == both[1:]
    assert searched(f"{DAY}/[REDACTED].md", "memory/[REDACTED]/login.md") == [
        f"{DAY}/[REDACTED].md", both[1]]
    assert searched("memory/[REDACTED]/nothing.md") == []

    def listed(prefix: str) -> list[str]:
        files = d.call("memory.list", {"agent_id": "w", "prefix": prefix})["files"]
        assert _leaks(files) == [], _leaks(files)
        return [f["path"] for f in files]

    assert listed("memory/[REDACTED]") == both
    assert listed("memory/[REDACTED]/") == both
    assert listed("./memory/[REDACTED]/l") == both[1:]
    assert listed(f"memory/{AWS}") == both[:1]
    assert listed(f"{DAY}/[REDACTED]") == [f"{DAY}/[REDACTED].md"]


@pytest.mark.parametrize("turns_wait", [False, True])
def test_status_asks_to_rename_a_note_named_by_a_credential(
        daemon_factory: Any, tmp_path: Path, turns_wait: bool) -> None:
    """``recalld status`` shows the notes named by a credential, with the fix that ends
    it (renaming them), whether the index is clean or turns wait for a chat model: never
    hidden behind an OK, nor told to wait for it to pass."""
    root = tmp_path / "ws"
    day = root / DAY
    day.mkdir(parents=True)
    (day / f"release-{GITLAB}.md").write_text("# release\nThe wombat runner.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})
    if turns_wait:
        d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
            {"role": "user", "content": "the wombat runner moved"}]})
    wait_value(lambda: _health(d), lambda h: h["secret_named"] == 1
               and h["state"] == ("pending" if turns_wait else "clean"), "counted")

    proc = recalld("status", env=d.env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"[note] 1 note(s) named by what looks like a credential, shown masked (in {DAY})"\
        in out, out
    assert "fix: rename the note(s)" in out and "catches up by itself" not in out, out
    assert "clean: 1 file(s), 1 chunk(s) indexed" in out, out
    assert _leaks(out) == []


def test_files_a_backup_passes_by_are_named_masked(daemon_factory: Any, tmp_path: Path) -> None:
    # A link, a hidden file and a FIFO named by a token are left out of the archive and
    # named in its result, as status names such notes: folder and suffix kept.
    root = tmp_path / "ws"
    day = root / DAY
    day.mkdir(parents=True)
    (day / f".{GITHUB}.md").write_text("hidden\n", encoding="utf-8")
    (day / "plain.md").write_text("# plain\nwords\n", encoding="utf-8")
    os.symlink("plain.md", day / f"link-{GITLAB}.md")
    os.mkfifo(day / f"fifo-{AWS}.md")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    made = d.call("backup.create", {"agents": ["w"]})
    assert made["symlinks"] == {"w": [f"{DAY}/link-[REDACTED].md"]}, made
    assert made["special"] == {"w": [f"{DAY}/fifo-[REDACTED].md"]}, made
    assert made["hidden"] == {"w": [f"{DAY}/.[REDACTED].md"]}, made
    assert _leaks(made) == []


@pytest.mark.slow
def test_index_verify_names_notes_named_by_a_credential_masked(
        daemon_factory: Any, tmp_path: Path) -> None:
    """index.verify listed the notes it found wrong by their real names, a token in the
    name and all, where status lists the same notes masked; it names them as status."""
    from recalld.daemon.index.prepare import MAX_NOTE_BYTES

    root = tmp_path / "ws"
    (root / "memory" / AWS).mkdir(parents=True)
    line = "the quokka keeps its long diary line after line after line\n"
    big = "# diary\n" + line * ((MAX_NOTE_BYTES + (1 << 20)) // len(line))
    (root / "memory" / AWS / f"diary-{GITLAB}.md").write_text(big)
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nshared_with = ["reader"]\n')
    wait_value(lambda: _health(d), lambda h: h["partly_indexed"] == 1, "partly indexed")
    verify = d.call("index.verify", {"agent_id": "w"}, timeout=120.0)
    assert verify["partly_indexed"] == {
        "count": 1, "paths": ["memory/[REDACTED]/diary-[REDACTED].md"]}, verify
    assert _health(d)["partly_indexed_paths"] == verify["partly_indexed"]["paths"]
    assert _leaks(verify) == [], _leaks(verify)
    cli = recalld("verify", "--agent", "w", env=d.env, timeout=120)
    assert "diary-[REDACTED].md" in cli.stdout and _leaks(cli.stdout + cli.stderr) == []
