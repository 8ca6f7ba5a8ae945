"""Where the HTTP front serves what, for the front and for its clients. A module without framework
imports: ``relay hook`` (run by Claude Code at every connection and turn) reads it and must start fast."""

from __future__ import annotations

from typing import Final

MCP_PATH: Final = "/mcp/agent"
"""Where the agent MCP endpoint is served."""
WAIT_PATH: Final = "/agent/wait"
"""Where the mail-pending wait is served (``POST``, agent headers, ``{"timeout_ms": N}``)."""
UI_PATH: Final = "/ui"
"""Where the operator dashboard is served (on a loopback listener only)."""
