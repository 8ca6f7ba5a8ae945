"""Where the HTTP front serves what, for the front and for its clients. A module without framework
imports: ``relay hook`` (run by Claude Code at every connection and turn) reads it and must start fast."""

from __future__ import annotations

from typing import Final

MCP_PATH: Final = "/mcp/agent"
"""Where the agent MCP endpoint is served."""
WAIT_PATH: Final = "/agent/wait"
"""Where the mail-pending wait is served (``POST``, agent headers, ``{"timeout_ms": N}``)."""
LEAVE_PATH: Final = "/agent/leave"
"""Where a session says it ended (``POST``, agent headers, ``{}``): its presence is ``gone``."""
TOKEN_PATH: Final = "/agent/token"  # noqa: S105 - a path, not a secret
"""Where a per-agent credential is exchanged for a short-lived token (``POST``, ``Authorization: Bearer
<credential>``, ``{"agent": ID, "session": SID}``)."""
UI_PATH: Final = "/ui"
"""Where the operator dashboard is served (on a loopback listener only)."""
