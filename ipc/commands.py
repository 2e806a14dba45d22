"""Agent ids in the command lines ``recalld status``, ``doctor`` and the CLI's errors
suggest: an id may begin with ``-`` (``-weird`` is a valid agent id), which argparse
would take for an option, so such an id is written ``--agent=-weird`` as an option's
value and ``-- -weird`` as an operand (after the command's options). No I/O.
"""

from __future__ import annotations


def agent_option(agent: str) -> str:
    """``--agent AGENT`` for a suggested command line."""
    return f"--agent={agent}" if agent.startswith("-") else f"--agent {agent}"


def agent_operand(agent: str) -> str:
    """AGENT as the last operand of a suggested command line."""
    return f"-- {agent}" if agent.startswith("-") else agent
