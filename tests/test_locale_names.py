"""Notes named beyond ASCII under a locale whose encoding is not UTF-8, seen from outside:
a daemon and a ``recalld`` command started with ``LC_ALL=C``, Python's UTF-8 mode and
its C locale coercion both turned off, still read every name as the UTF-8 it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import DaemonFactory

from recalld.ipc.client import Client

SCRIPT = Path(sys.executable).parent / "recalld"
#: Python reads file names in ASCII here, unless it runs in UTF-8 mode.
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
NOTES = {  # name: a word only it holds
    "memory/café.md": "espresso",
    "memory/Zürich/Straßen.md": "tramway",
    "memory/日記.md": "lantern",
    "memory/Ελληνικά.md": "olive",
}


def test_names_beyond_ascii_are_served_under_an_ascii_locale(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name, word in NOTES.items():
        note = data / "workspaces" / "default" / name
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"# {note.stem}\n\nthe {word} is here\n", encoding="utf-8")
    # A fresh interpreter, as the command line starts one (a fork would keep the mode
    # of the process it was forked from).
    daemon = daemon_factory(RECALLD_DATA_DIR=str(data),
                            launcher=(sys.executable, "-m", "recalld.daemon.main"),
                            **ASCII_LOCALE)
    with Client(daemon.socket_path) as c:
        for name, word in NOTES.items():
            hits = c.search("default", word, sync=True).results
            assert [h.path for h in hits] == [name], word
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    shown = subprocess.run([*cmd, "read", "--agent", "default", "memory/café.md"],
                           env=daemon.env, capture_output=True, timeout=120,
                           stdin=subprocess.DEVNULL, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "the espresso is here" in shown.stdout.decode("utf-8")
    assert "not valid UTF-8" not in daemon.log()
