"""Agents opening their workspaces at the same moment, one folder inside the other's or
the same folder in two spellings.

Each open checks its folder against the other workspaces and then registers it; the
check ran before a wait (the daemon-folder check, in a thread) and the registration
after it, so two opens at once each passed their check before the other registered:
an isolated agent's workspace opened inside another's, whose index then took in its
notes. Now exactly one of them opens. The same for one folder still to be made, named
composed by one agent and decomposed by the other. Real daemon, real socket, concurrent
clients.
"""

from __future__ import annotations

import os
import shutil
import threading
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle

from recalld.ipc import errors

ROUNDS = 4


def _open_at_once(daemon: DaemonHandle, places: dict[str, Path]) -> dict[str, Any]:
    """Every agent's ``workspace.open`` at its place, all sent at the same moment: the
    answer, or the InvalidParams refusal."""
    answers: dict[str, Any] = {}
    start = threading.Barrier(len(places))

    def open_one(agent: str, path: Path) -> None:
        start.wait()
        try:
            answers[agent] = daemon.call("workspace.open",
                                         {"agent_id": agent, "path": str(path)})
        except errors.InvalidParams as exc:
            answers[agent] = exc

    threads = [threading.Thread(target=open_one, args=item) for item in places.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_nested_folders_opened_at_once_never_both_open(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    daemon = daemon_factory()
    for n in range(ROUNDS):
        outer = tmp_path / f"w{n}"
        # The outer agent's notes folder holds the inner agent's workspace.
        places = {f"outer{n}": outer, f"inner{n}": outer / "memory" / "inner",
                  f"deeper{n}": outer / "memory" / "inner" / "memory" / "deeper"}
        answers = _open_at_once(daemon, places)
        opened = sorted(a for a, answer in answers.items() if isinstance(answer, dict))
        assert len(opened) == 1, (n, opened, answers)
        refused = [answer for answer in answers.values()
                   if isinstance(answer, errors.InvalidParams)]
        assert len(refused) == len(places) - 1
        assert all("workspace of agent" in e.message for e in refused), refused
        daemon.call("workspace.close", {"agent_id": opened[0], "forget": True})


def _forms(name: str) -> tuple[str, str]:
    return unicodedata.normalize("NFC", name), unicodedata.normalize("NFD", name)


def test_one_new_folder_named_in_two_forms_at_once_is_one_workspace(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A folder still to be made, typed composed by one agent and decomposed by another:
    # each open found no folder in the other's form, so both opened, each making its own
    # folder, the two names alike but for Unicode normalisation.
    daemon = daemon_factory()
    for n in range(ROUNDS):
        composed, decomposed = _forms(f"Zoë-Ångström{n}")
        places = {f"nfc{n}": tmp_path / f"r{n}" / composed,
                  f"nfd{n}": tmp_path / f"r{n}" / decomposed}
        answers = _open_at_once(daemon, places)
        opened = sorted(a for a, answer in answers.items() if isinstance(answer, dict))
        assert len(opened) == 1, (n, answers)
        assert os.listdir(tmp_path / f"r{n}") == [composed]
        assert answers[opened[0]]["path"] == str(tmp_path / f"r{n}" / composed)


def test_a_recorded_folder_that_is_missing_is_not_taken_in_its_other_form(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The folder of a closed workspace is missing (a disk not mounted): another agent
    # naming it decomposed got a second folder beside where it comes back, composed.
    composed, decomposed = _forms("Müller")
    places = tmp_path / "places"
    daemon.call("workspace.open", {"agent_id": "first", "path": str(places / composed)})
    daemon.call("workspace.close", {"agent_id": "first"})
    shutil.rmtree(places / composed)
    with pytest.raises(errors.InvalidParams, match="first"):
        daemon.call("workspace.open", {"agent_id": "second", "path": str(places / decomposed)})
    assert not os.listdir(places)
