"""One note per name on the server, whatever the Unicode form each host spells it in.

A macOS host, or a folder synced from one, often spells a file name decomposed (NFD,
``nai\u0308ve.md``), a Linux host composed (NFC, ``naïve.md``); the two are one note. The
server keys a note's row by the spelling it already holds for the name (the one as
given, else its NFC, else its NFD form), and a new note by the spelling it first reaches
the server in (:func:`server_path`): a host with no copy writes it as its writer spelt
it, and the server names it as the writer's own index does. Each host applies a row to
the file its own disk spells (:func:`spelt_rows`, :func:`recalld.daemon.spelling.on_disk`).
A workspace that holds rows of one name in two forms (shared before this rule) keeps them
as two notes: each is found by its exact spelling first.
"""

from __future__ import annotations

import itertools
import unicodedata
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from recalld.daemon.spelling import on_disk, spelled
from recalld.ipc.errors import RecalldError

if TYPE_CHECKING:
    from recalld.daemon.remote.db import Conn, Row

__all__ = ["forms_of", "here", "renamed", "server_path", "spellings", "spelt_rows", "twins"]

#: At most this many names of a path with other forms are spelt each way by
#: :func:`spellings` (2 ** it spellings); a deeper one gets :func:`forms_of`'s.
_SPELT_NAMES_MAX = 6


def forms_of(path: str) -> list[str]:
    """``path`` as given, then its NFC and NFD forms (each once)."""
    out = [path]
    for form in ("NFC", "NFD"):
        other = unicodedata.normalize(form, path)
        if other not in out:
            out.append(other)
    return out


def spellings(path: str) -> list[str]:
    """``path`` as given, then each other spelling with every folder's name and the file
    name in its own form, NFC or NFD (each once): a sync tool respells one folder's name
    whole and leaves the rest as it was, as the disk then spells it
    (:func:`recalld.daemon.spelling.on_disk` matches name by name)."""
    names = [forms_of(name) for name in path.split("/")]
    if sum(len(forms) > 1 for forms in names) > _SPELT_NAMES_MAX:
        return forms_of(path)
    return list(dict.fromkeys("/".join(spelt) for spelt in itertools.product(*names)))


def server_path(conn: Conn, workspace_id: int, path: str) -> str:
    """The server's key of the note a host names ``path``: the first of its forms
    (as given, NFC, NFD) that has a row, else ``path`` as given (a new note keeps the
    spelling it first reaches the server in). A path that has one form only (ASCII, most
    scripts) costs no query."""
    forms = forms_of(path)
    if len(forms) == 1:
        return path
    found = {str(r[0]) for r in conn.execute(
        "SELECT path FROM recalld_files WHERE workspace_id = %s AND path = ANY(%s)",
        (workspace_id, forms)).fetchall()}
    return next((p for p in forms if p in found), path)


def twins(conn: Conn, workspace_id: int, paths: list[str]) -> set[str]:
    """Of ``paths`` (rows of the feed), those whose name the server holds in more than
    one form (shared before one row per name): each is its own note, at its own
    spelling. No query when no path has another form."""
    forms = {p: forms_of(p) for p in paths if len(forms_of(p)) > 1}
    if not forms:
        return set()
    held = {str(r[0]) for r in conn.execute(
        "SELECT path FROM recalld_files WHERE workspace_id = %s AND path = ANY(%s)",
        (workspace_id, sorted({f for fs in forms.values() for f in fs}))).fetchall()}
    return {p for p, fs in forms.items() if len(held.intersection(fs)) > 1}


def renamed(root: Path, paths: list[str]) -> dict[str, str]:
    """Of ``paths`` (notes found gone), those whose name the disk now spells in another
    Unicode form (a rename between forms, as a sync tool makes), to that spelling
    (blocking)."""
    out: dict[str, str] = {}
    for path in paths:
        if len(forms_of(path)) > 1:
            try:
                other = on_disk(root, path)
            except RecalldError:  # several forms: none of them is this note's for sure
                continue
            if other != path:
                out[path] = other
    return out


def spelt_rows(root: Path, rows: list[Row], failed: dict[str, Exception],
               exact: set[str]) -> list[Row]:
    """``rows`` of the server, each with the path this host's disk spells it (blocking),
    but those in ``exact`` (:func:`twins`) as the row spells them: one whose name the
    disk holds in several forms, none as the row spells it, keeps the row's path, its
    error in ``failed`` (not to be written)."""
    out: list[Row] = []
    for row in rows:
        try:
            path = (row.path if row.path.isascii() or row.path in exact
                    else on_disk(root, row.path))
        except RecalldError as exc:
            failed[row.path] = exc
            path = row.path
        out.append(row if path == row.path else replace(row, path=path))
    return out


async def here(root: Path, path: str) -> str:
    """``path``, a name the server gave (a conflict copy's), as this host's disk spells
    its folders (a folder respelt since the change it answers was made), so that writing
    it makes no second folder alike but for the form; as given where the disk holds
    several names alike."""
    try:
        return await spelled(root, path)
    except RecalldError:
        return path
