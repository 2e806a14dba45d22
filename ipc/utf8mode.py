"""Python's UTF-8 mode for recalld's processes, whatever the locale.

recalld keeps its notes, paths and messages in UTF-8. Under a locale whose encoding is
not UTF-8 (``LANG=en_US.ISO-8859-1``, or ``LC_ALL=C`` with ``PYTHONUTF8=0
PYTHONCOERCECLOCALE=0``) Python reads file names in that encoding, and every note whose
name holds a letter beyond ASCII would be passed by as "not UTF-8". The ``recalld``
command and the daemon therefore start again, once and as the same process (``exec``:
same pid, same descriptors, so a systemd socket or a caller's pipes are kept), with
``-X utf8`` before they read anything; the processes they start inherit the mode. What
they show keeps the locale's encoding (``PYTHONIOENCODING``, unless set, names it): a
Latin-1 terminal still gets Latin-1, and what it cannot show is escaped as before.
"""

from __future__ import annotations

import locale
import os
import sys


def utf8_mode_argv() -> list[str] | None:
    """The command line that runs this program again in UTF-8 mode, or None when file
    names are read as UTF-8 already (or the interpreter cannot be found again)."""
    if sys.flags.utf8_mode or sys.getfilesystemencoding().lower() in ("utf-8", "utf8"):
        return None
    if not sys.executable or len(sys.orig_argv) < 2:
        return None
    return [sys.executable, "-X", "utf8", *sys.orig_argv[1:]]


def run_in_utf8_mode() -> None:
    """Replace this process by itself in UTF-8 mode when it is not (a process's entry
    point only, before it reads its arguments or writes a byte)."""
    argv = utf8_mode_argv()
    if argv is not None:
        env = dict(os.environ)
        env.setdefault("PYTHONIOENCODING", locale.getencoding())
        try:
            os.execve(argv[0], argv, env)  # noqa: S606 - this interpreter, its own arguments
        except OSError:
            pass  # no interpreter to start again: carry on, names beyond ASCII passed by
