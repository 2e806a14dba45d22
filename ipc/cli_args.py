"""The argument parser of the ``recalld`` command line and of ``recalld serve``.

Every option or argument value is text that must not be empty, unless the option declares
a type of its own: an empty value (``--socket ""``, ``--undo "$RUN"`` with ``RUN`` unset)
is a variable that was not set far more often than a choice, and taken as "not given" it
would pick another default without a word (the default socket, and so another daemon's
memory; running a dream instead of undoing one). It is a usage error (exit status 2).
"""

from __future__ import annotations

import argparse
from typing import Any

from recalld.ipc.agent_ids import workspace_id


def nonempty(value: str) -> str:
    """``value`` unchanged; an empty one is refused (argparse makes it a usage error)."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def agent_name(value: str) -> str:
    """``value`` unchanged, if it names an agent (it makes a workspace id, as the
    middleware maps names); a name that makes none (``..``, ``!!!``) is refused."""
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

    def add_subparsers(self, **kwargs: Any) -> Any:
        """As argparse's; the words after the command go to the command's own parser
        (which checks its values) as they are, not through :func:`nonempty`."""
        action = super().add_subparsers(**kwargs)
        action.type = str
        return action
