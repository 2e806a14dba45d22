"""The argument parser of the ``recalld`` command line and of ``recalld serve``.

Every option or argument value is UTF-8 text that must not be empty, unless the option
declares a type of its own: an empty value (``--socket ""``, ``--undo "$RUN"`` with ``RUN`` unset)
is a variable that was not set far more often than a choice, and taken as "not given" it
would pick another default without a word (the default socket, and so another daemon's
memory; running a dream instead of undoing one). It is a usage error (exit status 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from recalld.ipc.agent_ids import workspace_id

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

#: What a value that is not UTF-8 is told (on one line: the usage says nothing of it).
NOT_UTF8 = "is not valid UTF-8 text"
#: What a number no request can carry is told (on one line too).
OUT_OF_RANGE = "numbers must lie within -2**63 to 2**63-1"


def refuse_not_taken(parser: argparse.ArgumentParser, ns: argparse.Namespace,
                     options: Iterable[str], command: str, why: str) -> None:
    """A usage error (exit status 2) naming the first of ``options`` (``--json``; each
    declared with ``default=argparse.SUPPRESS``, so only one given is in ``ns``) that
    ``command`` accepts with the others but has no use for: passed by, it would look
    taken while nothing changes."""
    for option in options:
        if option.lstrip("-").replace("-", "_") in vars(ns):
            parser.error(f"argument {option}: {command} does not take it ({why})")


def local_file(value: str) -> str:
    """``value`` unchanged, a file this process opens itself (``serve --log-file``,
    ``import-qwenpaw --agent-json``), whose name may be in any encoding; an empty one is
    refused (argparse makes it a usage error)."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def nonempty(value: str) -> str:
    """``value`` unchanged; an empty one, or one that is not UTF-8 (bytes of another
    encoding, which Python hands on as lone surrogates and no request can carry), is
    refused (argparse makes it a usage error naming the argument)."""
    local_file(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = value.encode("utf-8", "surrogateescape")
        shown = raw.decode("utf-8", "backslashreplace")
        byte = raw[len(value[:exc.start].encode())]
        raise argparse.ArgumentTypeError(
            f"{NOT_UTF8}: '{shown}' (byte 0x{byte:02x}); give it in UTF-8 (a "
            "file named in another encoding: rename it, e.g. convmv -f latin1 -t utf8)"
        ) from None
    return value


#: The whole numbers a request can carry (the wire's 64-bit integers, signed).
MIN_WHOLE, MAX_WHOLE = -(2**63), 2**63 - 1


def whole_number(value: str) -> int:
    """``value`` as an int (``-n``, ``--runs``, a line number); one that is not a whole
    number, or one no request can carry (past 64 bits), is refused here, naming the
    option, instead of by the wire with no word of which argument it was."""
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not MIN_WHOLE <= number <= MAX_WHOLE:
        shown = value if len(value) <= 24 else f"{value[:20]}...({len(value)} characters)"
        # Python refuses to read more than 4300 digits: those are a number too large.
        digits = value.strip().lstrip("+-").isdigit()
        if number is None and not digits:
            raise argparse.ArgumentTypeError(f"not a whole number: {shown!r}")
        raise argparse.ArgumentTypeError(f"too large: {shown!r} ({OUT_OF_RANGE})")
    return number


def count(value: str) -> int:
    """``value`` as a whole number of 1 or more (``-n``, ``--runs``): 0 or less is refused
    here, naming the option, rather than by the daemon naming its param."""
    number = whole_number(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def agent_name(value: str) -> str:
    """``value`` unchanged, if it names an agent (it makes a workspace id, as the
    middleware maps names); a name that makes none (empty, all dots: ``..``) is refused.
    A name of other characters alone makes one of its ``_`` (``!!!`` is ``_``), as in the
    middleware; the daemon refuses a second name that makes the same id."""
    try:
        workspace_id(nonempty(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose values without a declared type must not be empty; the
    subcommands' parsers it makes, and the argument groups of each, are the same."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The conversion argparse applies to a value of an action with no type: for every
        # action of this parser, its groups and the parents it copies actions from.
        self.register("type", None, nonempty)

    def error(self, message: str) -> NoReturn:
        """As argparse's (the usage, then the error; exit status 2), but one line for a
        value that is not UTF-8 or a number past 64 bits, which the usage does not explain."""
        if NOT_UTF8 in message or OUT_OF_RANGE in message:
            self.exit(2, f"recalld: {message}\n")
        super().error(message)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        """As argparse's, but a help or version text that stdout refuses (a full disk,
        ``> /dev/full``) is one line on stderr and exit status 1, not lost with status 0;
        a reader gone away (``| head -1``) still ends it quietly. What goes to stderr
        (usage errors) is passed over when refused, as argparse does: the exit status
        tells what failed."""
        out: TextIO = sys.stdout
        if not message or file is None or file is not out:
            super()._print_message(message, file)
            return
        try:
            out.write(message)
            out.flush()
        except BrokenPipeError:
            return
        except OSError as exc:
            super()._print_message(f"recalld: the text could not be written to standard "
                                   f"output ({exc})\n", sys.stderr)
            self.exit(1)

    def add_subparsers(self, **kwargs: Any) -> Any:
        """As argparse's; the words after the command go to the command's own parser
        (which checks its values) as they are, not through :func:`nonempty`."""
        action = super().add_subparsers(**kwargs)
        action.type = str
        return action
