"""``relay hook headers``: the MCP ``headersHelper`` of a set-up folder.

Claude Code runs it at each connection to relay (and again when a call is refused with 401, then
retries once), so the token it mints only has to outlive one connection's quiet spells: the headers
are never stored, and a running session never holds an expired token for long.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from relay.claude_code.session import ClaudeProcess

HELPER_TTL_S: Final = 3600
"""Lifetime of the token minted for one connection (a refused call mints a new one)."""
WAITER_TTL_S: Final = 300
"""Lifetime of the token of one wait request (the waiter mints one per request)."""


def minted(key_file: Path, agent: str, session: str, ttl: int) -> dict[str, str]:
    """Fresh agent headers (``Authorization``, ``X-CSF-Agent-ID``, ``X-CSF-Session-ID``), the key file
    read again each time so a rotated key is picked up."""
    return agent_headers(load_key_file(key_file), agent, session, ttl)


def for_claude(key_file: Path, agent: str, claude_pid: int, ttl: int = HELPER_TTL_S) -> dict[str, str]:
    """The headers of the Claude Code session whose process is ``claude_pid``."""
    return minted(key_file, agent, ClaudeProcess.of(claude_pid).session_id, ttl)
