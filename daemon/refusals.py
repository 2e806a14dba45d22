"""Why a configured or recorded workspace was refused before it opened, by cause.

Each cause has its own fix: a refused folder wants a folder of its own, a missing one
wants to be put back, settings that no longer fit want others, a second replica of one
shared workspace under one host wants a host of its own. ``daemon.status`` says the
cause (``refused_for``) so that what ``recalld status`` advises follows it. The errors
are InvalidParams (``-32602``) on the wire, as every refusal of a place or settings is.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from recalld.ipc.errors import InvalidParams

RefusedFor = Literal["place", "missing", "settings", "replica"]


class Refused(InvalidParams):
    """A workspace's place or settings refused, for the cause ``refused_for``."""

    refused_for: ClassVar[RefusedFor] = "place"


class FolderGone(Refused):
    """The folder of a workspace served before is missing or empty."""

    refused_for = "missing"


class SettingsRefused(Refused):
    """Its settings (given or recorded over the config file's) are refused."""

    refused_for = "settings"


class ReplicaTaken(Refused):
    """Its ``remote`` names a shared workspace another workspace replicates under the
    same host."""

    refused_for = "replica"


def refused_for(exc: BaseException) -> RefusedFor:
    """The cause of the refusal ``exc``: its folder (``place``) unless it says another."""
    return exc.refused_for if isinstance(exc, Refused) else "place"
