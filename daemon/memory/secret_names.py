"""File names that hold a credential, and how such paths are shown.

A note dropped into a workspace by hand may be named by a token (``ghp_….md``, an AWS
key id, a JSON Web Token). Its text is indexed masked, as every note's is, but its path is
shown in every hit, link, recall label and status line. Each component of such a path is
shown as redaction masks a value in text, its folder and its suffix kept
(``memory/2026-11-02/[REDACTED].md``).

Whether a path is so named is decided once, when its file is prepared for the index
(``prepare.py``, in the worker processes of a cold build too), and kept with the file
(``FileInfo.secret_name``, ``IndexState.secret_named``); a path shown masked is read
back by looking for it on disk (:func:`shown_to_real`), not in the index. Most names
hold nothing a rule could find, and the full rules cost tens of microseconds a name:
:func:`could_hold` turns away, in about a microsecond, every name the rules would pass
by themselves
(``redact.find_spans`` runs a token rule only inside a run of at least
``secret_rules.MIN_RUN_CHARS`` token characters where one of the token rules' patterns
matches, and every other rule only where one of its hints occurs): it can never pass by a
name the rules would mask. Components repeat (``memory``, ``2026-11-02``): each one's
answer is kept in a bounded cache.

The redaction rules are imported on the first name looked at: showing a path that is not
so named (:func:`shown_path`) needs none of them.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Final

from recalld.daemon.store import confine

#: What redaction puts in place of a secret, in text and in names (``redact.MASK``).
MASK: Final = "[REDACTED]"
#: A suffix kept as it is (``.md``, ``.jsonl``): a file's kind, never part of a secret
#: (unless the rules mask it with the rest, then it goes too).
_SUFFIX: Final = re.compile(r"\.[A-Za-z0-9]{1,8}\Z")


@functools.cache
def _hints() -> re.Pattern[str] | None:
    """The hints of the rules that are not token rules, as one pattern; None if one such
    rule runs without a hint (then every name needs the full rules)."""
    from recalld.daemon.memory.secret_rules import RULES

    words: set[str] = set()
    for rule in RULES:
        if rule.find is not None and rule.token:
            continue
        if not rule.hints:
            return None
        words.update(rule.hints)
    return re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))


def could_hold(name: str) -> bool:
    """Could the redaction rules find anything in ``name``? False only when they cannot."""
    from recalld.daemon.memory.secret_forms import as_ascii
    from recalld.daemon.memory.secret_reading import token_reading

    # Read as the rules read it: as it is, and as it reads inside its tokens (without
    # what shows nothing there, with the escapes there spelling their characters).
    name = as_ascii(name)
    if _could_hold(name):
        return True
    reading = token_reading(name)
    return reading is not None and _could_hold(reading.text)


def _could_hold(name: str) -> bool:
    from recalld.daemon.memory.secret_rules import rules_token_prefilter, token_runs

    runs = token_runs(name)
    if runs:
        tokens = rules_token_prefilter()
        if tokens is None or any(tokens.search(name, a, b) for a, b in runs):
            return True
    hints = _hints()
    return hints is None or hints.search(name.lower()) is not None


@functools.lru_cache(maxsize=16384)
def mask_name(name: str) -> str:
    """One path component (a folder's or a file's name) with what redaction would mask in
    it masked; its suffix kept unless a masked part runs into it."""
    if not could_hold(name):
        return name
    from recalld.daemon.memory.redact import find_spans

    suffix = _SUFFIX.search(name)
    cut = suffix.start() if suffix is not None and suffix.start() else len(name)
    # Read without its suffix, and whole: a rule may want the token to end the text, or
    # take a dotted token's last part for a suffix. The suffix stays unless the name is
    # masked only when read whole.
    spans = find_spans(name)
    if cut < len(name):
        stem = find_spans(name[:cut])
        spans = stem + [(s, min(e, cut)) for s, e in spans] if stem else spans
    if not spans:
        return name
    parts: list[str] = []
    pos = 0
    for start, end in sorted(spans):
        if end <= pos:
            continue
        if start >= pos:
            parts += [name[pos:start], MASK]
        pos = end
    return "".join(parts) + name[pos:]


def mask_path(path: str) -> str:
    """``path`` (relative, ``/``-separated) with every component masked as
    :func:`mask_name` masks it."""
    return "/".join(mask_name(part) for part in path.split("/"))


def named_by_secret(path: str) -> bool:
    """Does a component of ``path`` hold what redaction would mask?"""
    return mask_path(path) != path


def shown_path(path: str, named: Collection[str]) -> str:
    """``path`` as it is shown: masked when it is one of ``named`` (the paths found
    :func:`named_by_secret`)."""
    return mask_path(path) if path in named else path


def shown_to_real(root: Path, shown: str) -> str:
    """The path of the file under ``root`` that is shown as ``shown`` (as ``memory.list``,
    a hit, a link, a status line or an error gave it: each name masked as
    :func:`mask_name` masks it), so a note shown masked is read by the name it is shown
    by. Looked for on disk, each masked name among its folder's entries, so a note the
    index has not reached yet (just written, a first build under way) is found as well;
    ``shown`` itself when no file is shown so. ValueError when several are (their names
    differ only in what is masked). Blocking: it lists folders."""
    found = [""]
    for part in shown.split("/"):
        if MASK not in part:
            found = [f"{prefix}{part}" for prefix in found]
        else:
            found = [f"{prefix}{name}" for prefix in found
                     for name in _entries(root / prefix) if mask_name(name) == part]
        found = [f"{path}/" for path in found]
    if len(found) > 1:
        raise ValueError(f"{len(found)} notes are shown as {shown}; rename them (their "
                         "names hold what looks like a credential)")
    return found[0][:-1] if found else shown


def real_prefixes(prefixes: Iterable[str], named: Collection[str]) -> tuple[str, ...]:
    """Path filters (a folder or a note each, ``/``-separated) with each one that is shown
    masked replaced by the folders or notes of ``named`` (the paths found
    :func:`named_by_secret`) it is shown for; one that names none stays as it is."""
    out: list[str] = []
    for prefix in prefixes:
        depth = prefix.count("/") + 1
        found = sorted({"/".join(path.split("/")[:depth]) for path in named}
                       if MASK in prefix else ())
        out += [real for real in found if mask_path(real) == prefix] or [prefix]
    return tuple(out)


def _entries(folder: Path) -> list[str]:
    """The names in ``folder``, listed as the workspace's own reads list (no link followed
    below a guarded workspace); none if it cannot be listed (absent, not a folder)."""
    try:
        return confine.listdir(folder)
    except OSError:  # WritesElsewhere among them
        return []


def secret_named_folders(paths: Iterable[str]) -> list[str]:
    """The folders (themselves shown masked) of ``paths``, paths named by a secret."""
    return sorted({mask_path(posixpath.dirname(p)) or "." for p in paths})


def secret_notice(paths: Collection[str]) -> str:
    """What the log and status say of ``paths``, notes named by a secret."""
    folders = secret_named_folders(paths)
    more = f" and {len(folders) - 3} more" if len(folders) > 3 else ""
    return (f"{len(paths)} note(s) named by what looks like a credential, shown masked "
            f"(in {', '.join(folders[:3])}{more}); rename them")


__all__ = ["could_hold", "mask_name", "mask_path", "named_by_secret",
           "real_prefixes", "secret_named_folders", "secret_notice", "shown_path",
           "shown_to_real"]
