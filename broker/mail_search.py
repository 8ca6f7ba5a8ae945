"""An agent's search of its own mail (``SearchAgentMessages`` over MCP, ``search_agent_messages`` in a
Workbench session): the one reading of the arguments, check of the caller and shape of the result.

What is read is ``broker.history.agent_mail`` over an ``IOperatorView`` (docs/history.md): mail the
agent received (its history) and sent (its recipients' histories, only what it sent), never anyone
else's. The caller is the agent a front or a session is bound to; its session is checked as for
``ListAgents`` (a superseded or unknown session is refused before anything is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from broker import schemas
from broker.agent_message import AgentMessage
from broker.envelope import format_ms, parse_ms
from broker.errors import InvalidArgument, UnregisteredAgent, json_type
from broker.history import agent_mail, mail_cursor, words
from broker.ids import check_agent_id, is_envelope_id
from broker.ports import Archived, HistoryQuery, IOperatorView
from broker.relay import Relay

DIRECTORY_PAGE: Final = 1000
MAX_SEARCH_DIRECTORY: Final = 100_000
"""Registered agents one search looks at most (whose histories it reads)."""

ALLOWED: Final = frozenset(schemas.SEARCH_ARGUMENTS["properties"])

DESCRIPTION: Final = (
    "Search mail you sent or received that was acknowledged, dead-lettered or expired (kept for the "
    "history retention, 30 days by default): query = words the text must all hold (any case), with = "
    "only mail exchanged with that agent, since/until = when it left the inbox (RFC 3339), thread = "
    f"only that envelope's thread. Oldest first, up to limit (1-{schemas.MAX_SEARCH_RESULTS}, default "
    f"{schemas.DEFAULT_SEARCH_RESULTS}); when `next` is in the result, call again with cursor = next."
)


def accepted(tool: str, arguments: object) -> Mapping[str, Any]:
    """``arguments`` as ``search`` reads them: a JSON object of ``SEARCH_ARGUMENTS``'s names only (an
    unknown one is refused, before any value is looked at), a ``null`` being absent and ``1.0`` where
    an integer goes ``1``. (The MCP front does the same through its ``AgentTool``.)"""
    if not isinstance(arguments, Mapping):
        raise InvalidArgument("arguments", "type", f"must be a JSON object, not {json_type(arguments)}")
    for name in arguments:
        if name not in ALLOWED:
            shown = str(name)[:64]
            raise InvalidArgument(shown, "unknown_field", f"unknown argument; {tool} takes {sorted(ALLOWED)}")
    present = {k: v for k, v in arguments.items() if v is not None}
    found: Mapping[str, Any] = schemas.integral(schemas.SEARCH_ARGUMENTS, present)
    return found


async def search(
    relay: Relay[AgentMessage],
    view: IOperatorView,
    agent: str,
    session: str,
    arguments: Mapping[str, Any],
) -> dict[str, Any]:
    """The result of ``agent``'s search (``schemas.MAIL``) from ``session``: every argument is checked
    first (a refusal names its field), then the caller's registration and session."""
    limit = arguments.get("limit", schemas.DEFAULT_SEARCH_RESULTS)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= schemas.MAX_SEARCH_RESULTS:
        raise InvalidArgument(
            "limit", "limit.range", f"must be an integer from 1 to {schemas.MAX_SEARCH_RESULTS}"
        )
    found_words: tuple[str, ...] = ()
    if arguments.get("query") is not None:
        found_words = words(_string(arguments, "query")[: schemas.MAX_SEARCH_QUERY])
        if not found_words:
            raise InvalidArgument("query", "query.words", "holds no word to look for (letters, digits or _)")
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
    me = await relay.registration(agent)  # registered, from its current session
    if me is None:
        raise UnregisteredAgent(agent)
    me.check_session(session)
    others = [peer] if peer is not None else await everyone(relay)
    query = HistoryQuery(since_ms=since, until_ms=until, sender=peer, words=found_words)
    mail = await agent_mail(view, agent, others, query, limit, cursor)
    entries = mail.entries
    if thread is not None:
        linked = {e.envelope_id for e in await view.thread(thread)}
        entries = [e for e in entries if e.envelope.envelope_id in linked]
    data: dict[str, Any] = {"messages": [_message(relay, e) for e in entries]}
    if mail.next is not None:
        data["next"] = mail.next
    return data


async def everyone(relay: Relay[AgentMessage]) -> list[str]:
    """Every registered agent id (the histories the caller's sent mail may be in)."""
    found: list[str] = []
    after = None
    for _ in range(MAX_SEARCH_DIRECTORY // DIRECTORY_PAGE):
        page = await relay.registrations(DIRECTORY_PAGE, after)
        found += [r.agent for r in page]
        if len(page) < DIRECTORY_PAGE:
            break
        after = page[-1].agent
    return found


def _message(relay: Relay[AgentMessage], entry: Archived) -> dict[str, Any]:
    envelope = entry.envelope
    body = relay.contract.from_fields(envelope.fields)
    return {
        "id": envelope.envelope_id,
        "from": envelope.sender,
        "to": envelope.to,
        "message": relay.contract.to_json(body),
        "sent_at": format_ms(envelope.sent_at_ms),
        "outcome": entry.outcome,
        "left_at": format_ms(entry.archived_at_ms),
    }


def _string(arguments: Mapping[str, Any], name: str) -> str:
    value = arguments[name]
    if not isinstance(value, str):
        raise InvalidArgument(name, "type", f"must be a string, not {json_type(value)}")
    return value


def _moment(arguments: Mapping[str, Any], name: str) -> int | None:
    if arguments.get(name) is None:
        return None
    try:
        return parse_ms(_string(arguments, name))
    except ValueError:
        raise InvalidArgument(name, "time", "must be RFC 3339 UTC, e.g. 2026-12-01T09:00:00.000Z") from None
