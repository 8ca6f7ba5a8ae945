"""The HTTP front of relay: the authenticated agent MCP endpoint and what it needs."""
