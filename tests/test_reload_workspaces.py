"""The workspaces a configuration reload opens, stops and no longer names: a bad place
fails that one workspace (as at the start), nested workspaces no longer shared with each
other stop, and one that never opened is not shown as failing once the file stops naming
it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hooks import start_hook
from test_cli import recalld
from test_warm_start import _open_writer
from waits import wait_for, wait_value

from recalld.ipc.errors import InvalidParams, NotAllowed, UnknownWorkspace

if TYPE_CHECKING:
    from conftest import DaemonFactory, DaemonHandle


def _reload(d: DaemonHandle, text: str) -> None:
    done = d.log().count("configuration reloaded")
    d.config_path.write_text(text, encoding="utf-8")
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.log().count("configuration reloaded") > done, "the reload")


def _listed(d: DaemonHandle) -> dict[str, dict[str, object]]:
    return {w["agent_id"]: w for w in d.call("workspace.list")["workspaces"]}


def _link_loop(tmp_path: Path) -> Path:
    """A path whose symbolic links lead to each other: no folder at all."""
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    return tmp_path / "loop-a" / "notes"


def test_a_workspace_path_in_a_link_loop_fails_that_workspace_only(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # At the start, at a reload and in workspace.open alike: the daemon serves the
    # others and says why this one is not open, as for a file where its folder goes.
    looped = _link_loop(tmp_path)
    d = daemon_factory(f'[workspaces.looped]\npath = "{looped}"\n')
    listed = _listed(d)
    assert listed["default"]["state"] == "ready"
    assert listed["looped"]["state"] == "failed"
    assert "Too many levels of symbolic links" in str(listed["looped"]["error"])
    with pytest.raises(InvalidParams, match="Too many levels of symbolic links"):
        d.call("workspace.open", {"agent_id": "other", "path": str(looped)})
    _reload(d, f'[workspaces.looped]\npath = "{looped}"\n'
               f'[workspaces.again]\npath = "{tmp_path / "loop-b" / "x"}"\n')
    again = _listed(d)["again"]
    assert again["state"] == "failed", again
    assert "Too many levels of symbolic links" in str(again["error"])
    assert d.call("daemon.ping")["pong"] is True
    assert d.stop() == 0


def test_a_reload_that_no_longer_names_a_workspace_that_did_not_open_drops_it(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Refused (a file where its folder goes) it was never recorded: once the file names
    # it no more nothing opens it, and status would otherwise report it failing until a
    # restart. One still named stays failed; a recorded one stays listed.
    afile = tmp_path / "notes-file"
    afile.write_text("not a folder\n", encoding="utf-8")
    text = (f'[workspaces.gone]\npath = "{afile}"\n'
            f'[workspaces.kept]\npath = "{afile}"\n')
    d = daemon_factory(text)
    d.call("workspace.open", {"agent_id": "adhoc", "path": str(tmp_path / "adhoc")})
    assert {a: w["state"] for a, w in _listed(d).items()} == {
        "adhoc": "ready", "default": "ready", "gone": "failed", "kept": "failed"}
    _reload(d, f'[workspaces.kept]\npath = "{afile}"\n'
               f'[workspaces.late]\npath = "{tmp_path / "late-file"}"\n')
    # A workspace refused by this reload is shown, one it no longer names is not.
    listed = _listed(d)
    assert "gone" not in listed, listed
    assert listed["kept"]["state"] == "failed"
    assert listed["adhoc"]["state"] == "ready"
    assert listed["late"]["state"] == "ready"
    status = d.call("daemon.status")
    assert "gone" not in {w["agent_id"] for w in status["workspaces"]}
    assert ("workspace(s) gone, which did not open and which neither the configuration "
            "nor the record names, are no longer shown") in d.log(), d.log()
    assert d.stop() == 0


def test_a_reload_that_no_longer_names_an_open_workspace_says_so(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Taken out of the file, it stays open and recorded at its folder: the log and the
    # status say that, not that its settings or path changed (its folder did not).
    place = tmp_path / "ops-place"
    d = daemon_factory(f'[workspaces."ops.team-2"]\npath = "{place}"\n'
                       'dream_cron = "0 4 * * *"\n[workspaces.stays]\n')
    _reload(d, "[workspaces.stays]\n")
    log = d.log()
    assert ("reload: the configuration no longer names open workspace(s) ops.team-2; each "
            "stays open as it was opened and, recorded, opens again in its folder") in log, log
    assert "changed the settings or path" not in log, log
    listed = _listed(d)["ops.team-2"]
    assert listed["state"] == "ready" and listed["path"] == str(place.resolve())
    assert listed.get("waiting_for_reopen") == ["dream_cron"], listed
    # Followed, the status note reopens it in its folder, with the defaults.
    d.call("workspace.close", {"agent_id": "ops.team-2"})
    assert d.call("workspace.open", {"agent_id": "ops.team-2"})["path"] == str(place.resolve())
    assert d.stop() == 0


def test_a_reload_that_stops_sharing_nested_workspaces_stops_both(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # One workspace may lie in another only while each is shared with the other's
    # agent: the outer one's index holds the inner one's notes. Taken back by a reload,
    # the sharing must not go on in the outer one's own search and reads; a start would
    # refuse both, so the reload stops both and says why.
    outer, inner = tmp_path / "outer", tmp_path / "outer" / "memory" / "inner"
    nested = (f'[workspaces.outer]\npath = "{outer}"\nshared_with = ["inner"]\n'
              f'[workspaces.inner]\npath = "{inner}"\n')
    d = daemon_factory(nested + 'shared_with = ["outer"]\n')
    note = d.call("memory.add_note", {"agent_id": "inner", "content": "the narwhal plan"})
    found = d.call("memory.search", {"agent_id": "outer", "query": "narwhal", "sync": True})
    assert [r["path"] for r in found["results"]] == [f"memory/inner/{note['path']}"]
    _reload(d, nested)
    listed = _listed(d)
    for agent_id in ("outer", "inner"):
        assert listed[agent_id]["state"] == "failed", listed[agent_id]
        assert "shares them so no more" in str(listed[agent_id]["error"]), listed[agent_id]
    with pytest.raises(UnknownWorkspace):
        d.call("memory.search", {"agent_id": "outer", "query": "narwhal"})
    with pytest.raises(UnknownWorkspace):
        d.call("memory.read", {"agent_id": "outer", "path": found["results"][0]["path"]})
    with pytest.raises(UnknownWorkspace):
        d.call("memory.add_note", {"agent_id": "inner", "content": "after the reload"})
    assert listed["default"]["state"] == "ready"
    # Shared again, each opens again as the message says, in either order.
    _reload(d, nested + 'shared_with = ["outer"]\n')
    for agent_id in ("outer", "inner"):
        assert d.call("workspace.open", {"agent_id": agent_id})["state"] == "ready"
    found = d.call("memory.search", {"agent_id": "outer", "query": "narwhal", "sync": True})
    assert [r["path"] for r in found["results"]] == [f"memory/inner/{note['path']}"]
    assert d.stop() == 0


def test_a_workspace_opening_while_a_reload_revokes_its_sharing_opens_with_the_new_file(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # An open that read the configuration before a reload and registers its workspace
    # after it: the reload gave the open workspaces their new sharing, not this one, so
    # it opened shared as the old file said, until its next open. It is held in its
    # folder check (in a thread) while the reload runs.
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    held = start_hook(
        tmp_path,
        "import os",
        "from recalld.daemon import registry",
        "check = registry.check_root",
        "def held(root):",
        "    if root.name == 'held':",
        "        open(os.environ['HOLD'], 'rb').read()",
        "    return check(root)",
        "registry.check_root = held")
    d = daemon_factory('[workspace_defaults]\nshared_with = ["reader"]\n', **held,
                       HOLD=str(fifo))
    with d.connect() as conn:
        conn.request("workspace.open", {"agent_id": "held", "path": str(tmp_path / "held")})
        writer = wait_for(lambda: _open_writer(fifo), "the open checks its folder")
        try:
            _reload(d, "")
        finally:
            os.close(writer)
        assert conn.recv_response()["result"]["state"] == "ready"
    with pytest.raises(NotAllowed):
        d.call("memory.search", {"agent_id": "reader", "query": "x", "agents": ["held"]})
    assert d.stop() == 0


def test_a_reload_opens_again_a_configured_workspace_that_failed_while_open(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # It served, then failed (a link took its folder's place, found at a use); once the
    # folder is back, a reload opens it again as a start would, its notes with it.
    home = tmp_path / "keeper"
    (home / "memory").mkdir(parents=True)
    (home / "memory" / "kept.md").write_text("the wombatfig recipe\n", encoding="utf-8")
    text = f'[workspaces.keeper]\npath = "{home}"\n'
    d = daemon_factory(text)
    d.call("index.sync", {"agent_id": "keeper"})
    home.rename(tmp_path / "keeper.real")
    (tmp_path / "elsewhere").mkdir()
    home.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnknownWorkspace, match="now leads to"):
        d.call("memory.search", {"agent_id": "keeper", "query": "wombatfig"})
    assert _listed(d)["keeper"]["state"] == "failed"
    home.unlink()
    (tmp_path / "keeper.real").rename(home)
    _reload(d, text)
    wait_for(lambda: _listed(d)["keeper"]["state"] == "ready", "keeper opens again")
    d.call("index.sync", {"agent_id": "keeper"})
    hits = d.call("memory.search", {"agent_id": "keeper", "query": "wombatfig"})["results"]
    assert [h["path"] for h in hits] == ["memory/kept.md"], hits
    assert d.stop() == 0


def test_a_closed_workspace_the_file_moves_says_where_its_notes_stay(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Its path changed in the file while it was closed (by mistake, say): the reload opens
    # it at the new, empty folder, and says that the old one's files are not served.
    first, second = tmp_path / "notes-here", tmp_path / "typo" / "notes-there"
    d = daemon_factory(f'[workspaces.mover]\npath = "{first}"\n')
    d.call("memory.add_note", {"agent_id": "mover", "content": "the okapi lantern"})
    d.call("workspace.close", {"agent_id": "mover"})
    _reload(d, f'[workspaces.mover]\npath = "{second}"\n')
    mover = wait_value(lambda: _listed(d)["mover"], lambda w: w["state"] == "ready",
                       "mover opens at its new place")
    assert mover["path"] == str(second), mover
    shown = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "mover")
    assert shown["left_behind"] == str(first), shown
    assert f"no longer serves {first}" in d.log()
    status = recalld("status", env=d.env).stdout
    said = next(line for line in status.splitlines() if "are not served" in line)
    assert "[WARN]" in said and str(first) in said, status
    # One opened where it was recorded says nothing of the kind.
    d.call("workspace.close", {"agent_id": "mover"})
    _reload(d, f'[workspaces.mover]\npath = "{second}"\n')
    shown = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "mover")
    assert shown["state"] == "ready" and "left_behind" not in shown, shown
    assert d.stop() == 0


def test_status_lists_the_settings_that_wait_for_a_reopen(daemon_factory: DaemonFactory,
                                                         tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"

    def text(place: Path, cron: str) -> str:
        return f'[workspaces.w]\npath = "{place}"\ndream_cron = "{cron}"\n'

    def waiting() -> object:
        shown = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")
        return shown.get("waiting_for_reopen")

    d = daemon_factory(text(here, "0 23 * * *"))
    assert waiting() is None
    _reload(d, text(there, "15 4 * * 1"))
    assert waiting() == ["dream_cron", "path"]
    said = next(line for line in recalld("status", env=d.env).stdout.splitlines()
                if "changed in the config file" in line)
    assert "[note] dream_cron, path changed" in said, said
    # Changed back, nothing waits; changed again, the next open takes it.
    _reload(d, text(here, "0 23 * * *"))
    assert waiting() is None
    _reload(d, text(here, "15 4 * * 1"))
    assert waiting() == ["dream_cron"]
    d.call("workspace.close", {"agent_id": "w"})
    opened = d.call("workspace.open", {"agent_id": "w"})
    assert opened["settings"]["dream_cron"] == "15 4 * * 1"
    assert waiting() is None
    assert d.stop() == 0


def test_status_lists_the_daemon_settings_a_workspace_takes_when_it_opens(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # chunk_max_chars, reconcile_interval_s, ... are [daemon] settings each workspace
    # takes when it opens: a reload that changes them leaves the open ones as they were,
    # and says so under each as it does for the workspace's own settings.
    place = tmp_path / "w"

    def text(daemon: str) -> str:
        return f'[daemon]\n{daemon}\n[workspaces.w]\npath = "{place}"\n'

    def waiting(agent_id: str) -> object:
        shown = next(w for w in d.call("daemon.status")["workspaces"]
                     if w["agent_id"] == agent_id)
        return shown.get("waiting_for_reopen")

    d = daemon_factory(text("chunk_max_chars = 1800"))
    _reload(d, text("chunk_max_chars = 900\nreconcile_interval_s = 45"))
    assert waiting("w") == ["reconcile_interval_s", "chunk_max_chars"]
    said = next(line for line in recalld("status", env=d.env).stdout.splitlines()
                if "changed in the config file" in line)
    assert "reconcile_interval_s, chunk_max_chars changed" in said, said
    # One opened since takes them; the others wait until they are opened again.
    d.call("workspace.open", {"agent_id": "late", "path": str(tmp_path / "late")})
    assert waiting("late") is None
    d.call("workspace.close", {"agent_id": "w"})
    d.call("workspace.open", {"agent_id": "w"})
    _reload(d, text("chunk_max_chars = 900\nreconcile_interval_s = 45"))
    assert waiting("w") is None and waiting("late") is None
    # Put back as the workspace was opened with, nothing waits.
    _reload(d, text("chunk_max_chars = 900\nreconcile_interval_s = 60"))
    assert waiting("w") == ["reconcile_interval_s"]
    _reload(d, text("chunk_max_chars = 900\nreconcile_interval_s = 45"))
    assert waiting("w") is None
    assert d.stop() == 0


def test_a_reload_naming_an_open_workspace_elsewhere_says_it_moves_when_reopened(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Opened at a folder of its own, then named by the file at another: it opens there
    # at the next start, leaving what it writes meanwhile behind, but status showed no
    # path waiting for a reopen. Named at its own folder (through a link), nothing waits
    # and the log tells of no change.
    own, other = tmp_path / "own", tmp_path / "other"
    (tmp_path / "link").symlink_to(tmp_path)
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "w", "path": str(own)})

    def waiting() -> object:
        shown = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")
        return shown.get("waiting_for_reopen")

    d.config_path.parent.mkdir(parents=True, exist_ok=True)
    _reload(d, f'[workspaces.w]\npath = "{other}"\n')
    assert waiting() == ["path"]
    assert "the configuration changed the settings or path of open workspace(s) w" in d.log()
    _reload(d, f'[workspaces.w]\npath = "{tmp_path / "link" / "own"}"\n')
    assert waiting() is None
    assert d.log().count("changed the settings or path of open workspace(s) w") == 1
    assert d.stop() == 0
