"""``SearchAgentMessages``: an agent's own mail that left its recipient's inbox, sent and received
(``broker.mail_search`` over the front's ``IOperatorView``; docs/history.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.types import CallToolResult

from broker import mail_search, schemas
from broker.agent_message import AgentMessage
from broker.front.tokens import AgentIdentity
from broker.front.tools import RelayTool, tool_result
from broker.ports import IOperatorView
from broker.relay import Relay


class SearchAgentMessages(RelayTool):
    """The caller's own mail that left its recipient's inbox: what it received (its history) and what
    it sent (its recipients' histories, read only for what it sent), never anyone else's."""

    name = "SearchAgentMessages"
    description = mail_search.DESCRIPTION
    input_schema = schemas.SEARCH_ARGUMENTS
    output_schema = schemas.MAIL

    def __init__(self, relay: Relay[AgentMessage], view: IOperatorView) -> None:
        super().__init__(relay)
        self.view = view

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        found = await mail_search.search(self.relay, self.view, who.agent, who.session, arguments)
        return tool_result(found)
