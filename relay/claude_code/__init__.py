"""relay's Claude Code integration: what ``relay setup claude-code`` writes into a project folder, and
the two commands Claude Code then runs there.

- ``setup``: writes the folder's ``.mcp.json`` entry and wake hooks (idempotent, merging).
- ``session``: which relay session a running Claude Code session is (derived from its process).
- ``headers``: the ``headersHelper`` command, fresh agent headers at each MCP connection.
- ``waiter``: the ``asyncRewake`` hook that blocks on relay's mail-pending wait and wakes the session.
- ``summary``: the text a woken session reads (agent-supplied text escaped and cut).
- ``relay_http``: the two HTTP calls the hooks make to relay (the wait, and registering the session).

None of it imports the command line; the CLI wires it.
"""
