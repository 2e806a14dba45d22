"""The one table from daemon error families to wire errors, and ``map_exceptions``.

Every recalld error derives from :class:`recalld.ipc.errors.RecalldError`. The wire
family (one class per JSON-RPC code) lives in :mod:`recalld.ipc.errors`; the storage
family (:mod:`recalld.daemon.store.errors`) and the provider family
(:mod:`recalld.daemon.providers.errors`) are domain errors that know nothing of codes.
They become wire errors here, once, where a daemon error leaves for a client: the RPC
dispatch (:func:`map_exceptions` around every handler) and the job records
(:func:`wire_error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from recalld.daemon.providers.errors import ProviderError
from recalld.daemon.store import errors as store
from recalld.ipc.errors import (
    DiskFull,
    FileSystemRefused,
    InternalError,
    NotFound,
    PathOutsideWorkspace,
    ProviderUnavailable,
    RecalldError,
)

#: Domain family -> the wire error a client sees. The first matching row wins.
WIRE_ERRORS: Mapping[type[RecalldError], type[RecalldError]] = {
    store.DiskFull: DiskFull,
    store.FileSystemRefused: FileSystemRefused,
    store.LinkOnTheWay: PathOutsideWorkspace,
    store.WorkspaceMissing: NotFound,
    store.StorageError: InternalError,
    ProviderError: ProviderUnavailable,
}


def wire_error(exc: RecalldError) -> RecalldError:
    """The wire error for ``exc``: ``exc`` itself when it already is one."""
    for family, wire in WIRE_ERRORS.items():
        if isinstance(exc, family):
            return wire(exc.message, exc.data)
    return exc


class _WireErrors:
    """The context manager :func:`map_exceptions` returns (stateless: one is shared)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, RecalldError):
            mapped = wire_error(exc)
            if mapped is not exc:
                raise mapped from exc


_WIRE_ERRORS = _WireErrors()


def map_exceptions() -> _WireErrors:
    """``with map_exceptions():`` re-raises a domain error of the table as its wire error
    (the cause kept). Not a generator context manager: it wraps every RPC call, and
    entering and leaving a generator costs several times more."""
    return _WIRE_ERRORS


def client_error(exc: BaseException) -> RecalldError | None:
    """The client-visible error in ``exc``, also inside a group of exactly one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, RecalldError) else None


def remade_error(exc: BaseException, message: str) -> RecalldError | None:
    """The wire error of ``exc``'s client-visible error (:func:`client_error`), made
    again with ``message`` (its data kept); None when it has none."""
    inner = client_error(exc)
    if inner is None:
        return None
    wire = wire_error(inner)
    return type(wire)(message, wire.data)
