"""Errors that cross the wire, one class per stable JSON-RPC code.

The daemon raises these from method handlers; the clients raise the same classes when
an error response arrives, so ``except UnknownWorkspace`` works on both sides. Codes are
stable and documented in docs/protocol.md; never renumber one.
"""

# Annotations are evaluated, not postponed: a TypedDict compiles each string
# annotation into a ForwardRef at import, which every client process would pay.
from collections.abc import Mapping
from typing import ClassVar, NotRequired, TypedDict

# JSON-RPC 2.0 standard codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Application codes (the implementation-defined range -32000..-32099).
UNKNOWN_WORKSPACE = -32001
ALREADY_RUNNING = -32002
PROVIDER_UNAVAILABLE = -32003
JOB_FAILED = -32004
PATH_OUTSIDE_WORKSPACE = -32005
REQUEST_TOO_LARGE = -32006
OVERLOADED = -32007
NOT_FOUND = -32008
SHUTTING_DOWN = -32009
NOT_ALLOWED = -32010
DISK_FULL = -32011
INVALID_BACKUP = -32012
FILE_SYSTEM_REFUSED = -32013


class ErrorObject(TypedDict):
    """The JSON-RPC ``error`` member of a response."""

    code: int
    message: str
    data: NotRequired[object]  # any JSON value: what the error is about


def error_object(code: int, message: str, data: object = None) -> ErrorObject:
    """The JSON-RPC ``error`` member: ``data`` only when there is some (not None)."""
    error: ErrorObject = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


class RecalldError(Exception):
    """Root of every recalld error a client can see."""

    code: ClassVar[int] = INTERNAL_ERROR

    def __init__(self, message: str, data: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_error(self) -> ErrorObject:
        """The JSON-RPC ``error`` member for this exception."""
        return error_object(self.code, self.message, self.data)


class DaemonNotRunning(RecalldError):
    """No daemon answers on the socket (client side only; never sent)."""


class ConnectionLost(RecalldError):
    """The connection closed before the answer arrived (client side only)."""


class EventsMissed(ConnectionLost):
    """``missed`` events the subscriber did not get, here in the order of events (client
    side only): they found the client's event buffer (``max_events``) full and were left
    out, or (``why`` says which) the daemon counted them where the subscription had a gap,
    after it was dropped for falling behind or its connection was lost, until it was made
    again. The connection and its subscription go on; a ConnectionLost, so that a
    subscriber that handles a gap in its events handles this one too."""

    def __init__(self, missed: int, why: str | None = None) -> None:
        super().__init__(
            f"{missed} event(s) left out: the client's event buffer was full (read events "
            "sooner, or make max_events larger)" if why is None
            else f"{missed} event(s) missed: {why}")
        self.missed = missed


class ParseError(RecalldError):
    code = PARSE_ERROR


class InvalidRequest(RecalldError):
    code = INVALID_REQUEST


class MethodNotFound(RecalldError):
    code = METHOD_NOT_FOUND


class InvalidParams(RecalldError):
    code = INVALID_PARAMS


#: The key of the ``data`` of an :class:`InvalidParams` refusing a name or an id that
#: redaction would mask where it is written: its value is the param refused.
LOOKS_LIKE_A_CREDENTIAL = "looks_like_a_credential"


def refused_as_credential(exc: BaseException) -> str | None:
    """The param ``exc`` refused as looking like a credential, or None for other errors."""
    data = exc.data if isinstance(exc, InvalidParams) else None
    param = data.get(LOOKS_LIKE_A_CREDENTIAL) if isinstance(data, Mapping) else None
    return param if isinstance(param, str) else None


class InternalError(RecalldError):
    code = INTERNAL_ERROR


class UnknownWorkspace(RecalldError):
    code = UNKNOWN_WORKSPACE


class AlreadyRunning(RecalldError):
    code = ALREADY_RUNNING


class ProviderUnavailable(RecalldError):
    code = PROVIDER_UNAVAILABLE


class JobFailed(RecalldError):
    code = JOB_FAILED


class PathOutsideWorkspace(InvalidParams):
    """A client-named path would leave the workspace (a kind of invalid params)."""

    code = PATH_OUTSIDE_WORKSPACE


class RequestTooLarge(RecalldError):
    code = REQUEST_TOO_LARGE


class Overloaded(RecalldError):
    code = OVERLOADED


class NotFound(RecalldError):
    code = NOT_FOUND


class ShuttingDown(RecalldError):
    code = SHUTTING_DOWN


class NotAllowed(RecalldError):
    code = NOT_ALLOWED


class DiskFull(RecalldError):
    """No space left (a full disk or an exhausted quota): nothing of the change was
    published; free space and retry."""

    code = DISK_FULL


class FileSystemRefused(RecalldError):
    """The file system refused a read or write: read-only (EROFS) or no permission
    (EACCES, EPERM); ``data`` holds ``errno`` and ``path`` (the name refused). Nothing
    of the change was published; remount read-write or fix the permissions, and retry."""

    code = FILE_SYSTEM_REFUSED


class InvalidBackup(RecalldError):
    """A backup archive is not a recalld backup or fails a check (corrupt, hostile
    member names, bad checksums, another format); nothing was changed. ``data`` holds
    ``file`` and ``reason``."""

    code = INVALID_BACKUP


_BY_CODE: dict[int, type[RecalldError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        UnknownWorkspace,
        AlreadyRunning,
        ProviderUnavailable,
        JobFailed,
        PathOutsideWorkspace,
        RequestTooLarge,
        Overloaded,
        NotFound,
        ShuttingDown,
        NotAllowed,
        DiskFull,
        InvalidBackup,
        FileSystemRefused,
    )
}

#: Every code with its short name, as documented in docs/protocol.md.
CODE_NAMES: dict[int, str] = {code: cls.__name__ for code, cls in _BY_CODE.items()}


def error_from_wire(error: Mapping[str, object]) -> RecalldError:
    """Build the typed exception for a JSON-RPC ``error`` member received from the daemon."""
    code = error.get("code")
    message = str(error.get("message", "error"))
    cls = _BY_CODE.get(code, RecalldError) if isinstance(code, int) else RecalldError
    exc = cls(message, error.get("data"))
    if cls is RecalldError and isinstance(code, int):
        exc.code = code  # type: ignore[misc]  # unknown future code: keep it visible
    return exc
