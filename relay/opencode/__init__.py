"""opencode (npm ``opencode-ai``) on the host tier: ``relay setup opencode`` (``setup``) writes the remote
MCP server and a project plugin (``plugin.js``) that mints its headers and wakes idle sessions."""
