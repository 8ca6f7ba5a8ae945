"""``SearchAgentMessages``: an agent's own mail that left its recipient's inbox, sent and received
(``broker.history.agent_mail`` over the front's ``IOperatorView``; docs/history.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mcp.types import CallToolResult

from broker import schemas
from broker.agent_message import AgentMessage
from broker.envelope import format_ms, parse_ms
from broker.errors import InvalidArgument, UnregisteredAgent
from broker.front.tokens import AgentIdentity
from broker.front.tools import RelayTool, _string, tool_result
from broker.history import agent_mail, mail_cursor, words
from broker.ids import check_agent_id, is_envelope_id
from broker.ports import Archived, HistoryQuery, IOperatorView
from broker.relay import Relay


class SearchAgentMessages(RelayTool):
    """The caller's own mail that left its recipient's inbox: what it received (its history) and what
    it sent (its recipients' histories, read only for what it sent), never anyone else's."""

    name = "SearchAgentMessages"
    description = (
        "Search mail you sent or received that was acknowledged, dead-lettered or expired (kept for the "
        "history retention, 30 days by default): query = words the text must all hold (any case), with = "
        "only mail exchanged with that agent, since/until = when it left the inbox (RFC 3339), thread = "
        f"only that envelope's thread. Oldest first, up to limit (1-{schemas.MAX_SEARCH_RESULTS}, default "
        f"{schemas.DEFAULT_SEARCH_RESULTS}); when `next` is in the result, call again with cursor = next."
    )
    input_schema = schemas.SEARCH_ARGUMENTS
    output_schema = schemas.MAIL

    def __init__(self, relay: Relay[AgentMessage], view: IOperatorView) -> None:
        super().__init__(relay)
        self.view = view

    async def run(self, who: AgentIdentity, arguments: Mapping[str, Any]) -> CallToolResult:
        limit = arguments.get("limit", schemas.DEFAULT_SEARCH_RESULTS)
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= schemas.MAX_SEARCH_RESULTS
        ):
            raise InvalidArgument(
                "limit", "limit.range", f"must be an integer from 1 to {schemas.MAX_SEARCH_RESULTS}"
            )
        text = arguments.get("query")
        found_words: tuple[str, ...] = ()
        if text is not None:
            text = _string(arguments, "query")
            found_words = words(text[: schemas.MAX_SEARCH_QUERY])
            if not found_words:
                raise InvalidArgument(
                    "query", "query.words", "holds no word to look for (letters, digits or _)"
                )
        peer = arguments.get("with")
        if peer is not None:
            check_agent_id(peer, "with")
        since, until = _moment(arguments, "since"), _moment(arguments, "until")
        thread = arguments.get("thread")
        if thread is not None and not (isinstance(thread, str) and is_envelope_id(thread)):
            raise InvalidArgument("thread", "envelope_id", "must be an envelope id (env_ and 26 characters)")
        cursor = arguments.get("cursor")
        if cursor is not None:
            try:
                mail_cursor(_string(arguments, "cursor"))
            except ValueError as exc:
                raise InvalidArgument("cursor", "cursor", str(exc)) from None
        me = await self.relay.registration(who.agent)  # registered, from its current session
        if me is None:
            raise UnregisteredAgent(who.agent)
        me.check_session(who.session)
        others = [peer] if peer is not None else await self._everyone()
        query = HistoryQuery(since_ms=since, until_ms=until, sender=peer, words=found_words)
        mail = await agent_mail(self.view, who.agent, others, query, limit, cursor)
        entries = mail.entries
        if thread is not None:
            linked = {e.envelope_id for e in await self.view.thread(thread)}
            entries = [e for e in entries if e.envelope.envelope_id in linked]
        data: dict[str, Any] = {"messages": [self._message(e) for e in entries]}
        if mail.next is not None:
            data["next"] = mail.next
        return tool_result(data)

    async def _everyone(self) -> list[str]:
        """Every registered agent id (the histories the caller's sent mail may be in)."""
        found: list[str] = []
        after = None
        for _ in range(MAX_SEARCH_DIRECTORY // DIRECTORY_PAGE):
            page = await self.relay.registrations(DIRECTORY_PAGE, after)
            found += [r.agent for r in page]
            if len(page) < DIRECTORY_PAGE:
                break
            after = page[-1].agent
        return found

    def _message(self, entry: Archived) -> dict[str, Any]:
        envelope = entry.envelope
        body = self.relay.contract.from_fields(envelope.fields)
        return {
            "id": envelope.envelope_id,
            "from": envelope.sender,
            "to": envelope.to,
            "message": self.relay.contract.to_json(body),
            "sent_at": format_ms(envelope.sent_at_ms),
            "outcome": entry.outcome,
            "left_at": format_ms(entry.archived_at_ms),
        }


DIRECTORY_PAGE: Final = 1000
MAX_SEARCH_DIRECTORY: Final = 100_000
"""Registered agents one ``SearchAgentMessages`` call looks at most (whose histories it reads)."""


def _moment(arguments: Mapping[str, Any], name: str) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    text = _string(arguments, name)
    try:
        return parse_ms(text)
    except ValueError:
        raise InvalidArgument(name, "time", "must be RFC 3339 UTC, e.g. 2026-12-01T09:00:00.000Z") from None
