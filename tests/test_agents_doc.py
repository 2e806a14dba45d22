"""docs/agents.md is tested against the code: its table of the MCP bridge's tools names
each tool the bridge offers with the arguments of its input schema."""

from __future__ import annotations

import re
from pathlib import Path

from recalld.ipc.mcp_tools import TOOLS

DOC = Path(__file__).resolve().parent.parent / "docs" / "agents.md"


def test_the_mcp_tool_table_is_the_bridges_tools() -> None:
    """Each row: the tool, then its arguments (``name?``: optional), as the schema has."""
    section = DOC.read_text(encoding="utf-8").split("\n## MCP\n", 1)[1].split("\n## ", 1)[0]
    documented = {}
    for name, arguments in re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, flags=re.M):
        words = re.findall(r"`(\w+\??)`", re.sub(r"\([^)]*\)", "", arguments))
        documented[name] = ({w for w in words if not w.endswith("?")},
                            {w.rstrip("?") for w in words if w.endswith("?")})
    schemas = {}
    for tool in TOOLS:
        required = set(tool.input_schema.get("required", []))
        schemas[tool.name] = (required, set(tool.input_schema["properties"]) - required)
    assert documented == schemas
