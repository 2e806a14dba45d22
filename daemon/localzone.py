"""The process's local time zone as a tzinfo with its DST rules, read the way the C
library reads it, so that cron times and the days of daily notes (``date.today()``,
``datetime.fromtimestamp``, which go through the C library) name the same zone.

``TZ`` as the C library (glibc) takes it: unset, ``/etc/localtime``; empty, UTC; a zone
name (``Asia/Kolkata``, ``:Europe/Berlin``); a zone file's path (``:/usr/share/zoneinfo/
Asia/Kathmandu``); or a POSIX rule (``IST-5:30``, ``<+0545>-5:45``,
``CET-1CEST,M3.5.0,M10.5.0/3``). A value none of these reads is the C library's own
offset of the moment, fixed (UTC for a name no zone has, as the C library takes it).
"""

from __future__ import annotations

import io
import os
import struct
import time
from datetime import UTC, timedelta, timezone, tzinfo


def local_zone() -> tzinfo:
    """The system's zone with its DST rules (see the module docstring)."""
    # zoneinfo (and the sysconfig it reads its paths from) waits for the first schedule.
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if "TZ" not in os.environ:
        return _etc_localtime()
    name = os.environ["TZ"].removeprefix(":")
    if not name:
        return UTC
    if name.startswith("/"):
        try:
            with open(name, "rb") as f:
                return ZoneInfo.from_file(f, key=name)
        except (OSError, ValueError):
            return _libc_offset()
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pass
    try:
        return ZoneInfo.from_file(io.BytesIO(_tzif_of_rule(name)), key=name)
    except (ValueError, UnicodeError):
        return _libc_offset()


def _etc_localtime() -> tzinfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        target = ""
    if "zoneinfo/" in target:
        try:
            return ZoneInfo(target.split("zoneinfo/", 1)[1])
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    try:
        with open("/etc/localtime", "rb") as f:
            return ZoneInfo.from_file(f, key="localtime")
    except (OSError, ValueError):
        return UTC


def _libc_offset() -> tzinfo:
    """The C library's offset from UTC now, as a fixed zone."""
    now = time.localtime()
    offset = timedelta(seconds=now.tm_gmtoff)
    return UTC if not offset else timezone(offset, now.tm_zone)


def _tzif_of_rule(rule: str) -> bytes:
    """A TZif (RFC 8536) version 2 file with no transitions whose footer is ``rule``, a
    POSIX TZ string: zoneinfo reads the rule from it (it takes no rule directly)."""
    if "\n" in rule or not rule.isascii():
        raise ValueError("not a POSIX TZ rule")
    # One local time type (UTC, "UTC\0"), no transitions, leap seconds or indicators.
    header = b"TZif2" + bytes(15) + struct.pack(">6l", 0, 0, 0, 0, 1, 4)
    data = struct.pack(">lBB", 0, 0, 0) + b"UTC\0"
    return header + data + header + data + b"\n" + rule.encode() + b"\n"
