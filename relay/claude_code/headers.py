"""``relay hook headers --key-file``: the MCP ``headersHelper`` of a folder set up before per-agent
credentials (which read relay's signing key; ``relay.credential_file`` is what ``relay setup claude-code``
writes now), kept so that such folders work until ``relay setup claude-code`` is run there again.

Claude Code runs it at each connection to relay (and again when a call is refused with 401, then
retries once), so the token it mints only has to outlive one connection's quiet spells: the headers
are never stored, and a running session never holds an expired token for long.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers

HELPER_TTL_S: Final = 3600
"""Lifetime of the token minted for one connection (a refused call mints a new one)."""
WAITER_TTL_S: Final = 300
"""Lifetime of the token of one wait request (the waiter mints one per request)."""


def minted(key_file: Path, agent: str, session: str, ttl: int) -> dict[str, str]:
    """Fresh agent headers (``Authorization``, ``X-CSF-Agent-ID``, ``X-CSF-Session-ID``), the key file
    read again each time so a rotated key is picked up."""
    return agent_headers(load_key_file(key_file), agent, session, ttl)
