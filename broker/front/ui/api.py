"""The dashboard's JSON API under ``/ui/api``: read-only views of the store, requeue and send.

Reads go through the operator view (``IOperatorView``: nothing handed out, no delivery counted) and
the delivery queue's dead letters; a send goes through ``Relay.send`` with every check an agent's send
gets. Refusals are ``{"error": {...}}`` (``broker.errors.error_body``) with the status of ``STATUS``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker.addresses import HUMAN_SESSION, Address
from broker.agent_message import AgentMessage
from broker.delivery import DeadLetter
from broker.envelope import format_ms, widest
from broker.errors import (
    InternalError,
    InvalidArgument,
    NotAccepted,
    RelayError,
    UnknownRecipient,
    error_body,
)
from broker.front.ui.access import OperatorAccess, Session
from broker.front.ui.snapshot import Overview
from broker.front.ui.traffic import Traffic
from broker.ids import check_agent_id, check_session_id, is_envelope_id
from broker.limits import MAX_ACK_IDS
from broker.ports import IOperatorView, Registration, StoredEnvelope
from broker.relay import Relay
from broker.text import failure
from broker.threads import IN_REPLY_TO

log = logging.getLogger("relay.dashboard")

INBOX_PAGE: Final = 50
MAX_INBOX_PAGE: Final = 200
THREAD_LIMIT: Final = 500
THREAD_KEEP_SECONDS: Final = 10.0
DEAD_LETTERS_SHOWN: Final = 100
DEAD_AGENTS_SHOWN: Final = 50
MAX_BODY_BYTES: Final = 256 * 1024
STATUS: Final[dict[str, int]] = {
    "invalid_argument": 400,
    "invalid_address": 400,
    "contract_violation": 400,
    "unknown_recipient": 404,
    "not_accepted": 403,
    "unregistered_agent": 409,
    "session_superseded": 409,
    "inbox_full": 429,
    "rate_limited": 429,
    "backend_unavailable": 503,
    "relay_not_running": 503,
}


class DeadLetters(Protocol):
    """What the dashboard needs of ``broker.delivery.IDeliveryQueue``."""

    async def dead_letters(self, agent: str, limit: int = 100) -> list[DeadLetter]: ...

    async def dead_letter_count(self, agent: str) -> int: ...

    async def requeue(self, agent: str, ids: Sequence[str] | None = None) -> list[str]: ...


@dataclass(slots=True)
class Dashboard:
    """What the dashboard runs on. ``human`` builds the address a person's id is registered with."""

    relay: Relay[AgentMessage]
    view: IOperatorView
    dead: DeadLetters
    access: OperatorAccess
    human: Callable[[str], Address]
    traffic: Traffic
    overview: Overview


@dataclass(frozen=True, slots=True)
class Caller:
    session: Session
    csrf: str


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> Response:
        body = {"error": {"code": self.code, "message": self.message, "retryable": False}}
        return JSONResponse(body, status_code=self.status, headers={"cache-control": "no-store"})


Handler = Callable[[Request, Caller], Awaitable[object]]


def json_endpoint(
    session_of: Callable[[Request], Caller], handler: Handler
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` as a route's endpoint: the caller's session checked first, its answer as JSON, a
    refusal as ``{"error": ...}`` with its status, anything unexpected one log line and a retryable
    answer (no traceback)."""

    async def run(request: Request) -> Response:
        try:
            caller = session_of(request)
            data = await handler(request, caller)
        except Refused as exc:
            return exc.response()
        except RelayError as exc:
            return _error(exc)
        except Exception as exc:  # one line in the log, a retryable answer, no traceback
            log.error("dashboard %s failed: %s", request.url.path, failure(exc))
            return _error(InternalError())
        return JSONResponse(data, headers={"cache-control": "no-store"})

    return run


def routes(dashboard: Dashboard, session_of: Callable[[Request], Caller]) -> list[Route]:
    def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        return json_endpoint(session_of, handler)

    views = _Views(dashboard)
    return [
        Route("/api/session", endpoint(views.session), methods=["GET"]),
        Route("/api/agents", endpoint(views.agents), methods=["GET"]),
        Route("/api/inbox", endpoint(views.inbox), methods=["GET"]),
        Route("/api/thread", endpoint(views.thread), methods=["GET"]),
        Route("/api/dead-letters", endpoint(views.dead_letters), methods=["GET"]),
        Route("/api/requeue", endpoint(views.requeue), methods=["POST"]),
        Route("/api/send", endpoint(views.send), methods=["POST"]),
        Route("/api/traffic", endpoint(views.traffic), methods=["GET"]),
    ]


def _error(error: RelayError) -> Response:
    status = STATUS.get(error.code, 500 if isinstance(error, InternalError) else 409)
    return JSONResponse(error_body(error), status_code=status, headers={"cache-control": "no-store"})


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or not low <= int(text) <= high:
        raise InvalidArgument(name, f"{name}.range", f"must be a whole number from {low} to {high}")
    return int(text)


def _envelope(stored: StoredEnvelope) -> dict[str, object]:
    fields = stored.fields
    return {
        "id": stored.envelope_id,
        "from": stored.sender,
        "to": stored.to,
        "tier": stored.tier.label,
        "sent_at": format_ms(stored.sent_at_ms),
        "sent_at_ms": stored.sent_at_ms,
        "deliveries": stored.deliveries,
        "kind": fields.get("kind"),
        "text": fields.get("text"),
        "in_reply_to": fields.get("in_reply_to"),
        "reference": fields.get("reference"),
    }


def _dead_letter(letter: DeadLetter) -> dict[str, object]:
    return {
        "id": letter.envelope_id,
        "from": letter.sender,
        "to": letter.to,
        "tier": letter.tier.label,
        "sent_at": format_ms(letter.sent_at_ms),
        "attempts": letter.attempts,
        "reason": letter.reason,
        "why": why_dead(letter),
        "dead_at": format_ms(letter.dead_at_ms),
        "kind": letter.fields.get("kind"),
        "text": letter.fields.get("text"),
    }


def why_dead(letter: DeadLetter) -> str:
    """Why ``letter`` is a dead letter, in words: the relay's two reasons, or its consumer's."""
    if letter.reason == "expired":
        return "expired: its time to live ran out before it was acknowledged"
    if letter.reason == "max_deliveries":
        times = "once" if letter.attempts == 1 else f"{letter.attempts} times"
        return f"too many deliveries: handed out {times} and never acknowledged"
    return f"given up by its consumer: {letter.reason}"


def _tree(envelopes: list[StoredEnvelope]) -> list[tuple[StoredEnvelope, int]]:
    """A thread in reply order: each envelope followed by its answers (depth-first, siblings in the
    order the operator view gave them: time accepted), with its depth below the first stored one."""
    ids = {e.envelope_id for e in envelopes}
    answers: dict[str | None, list[StoredEnvelope]] = {}
    for e in envelopes:
        parent = e.fields.get(IN_REPLY_TO)
        answers.setdefault(parent if parent in ids else None, []).append(e)
    ordered: list[tuple[StoredEnvelope, int]] = []
    todo = [(e, 0) for e in reversed(answers.get(None, []))]
    while todo:
        current, depth = todo.pop()
        ordered.append((current, depth))
        todo.extend((e, depth + 1) for e in reversed(answers.get(current.envelope_id, [])))
    return ordered


async def _json_object(request: Request) -> dict[str, object]:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise InvalidArgument("body", "body.max_bytes", f"at most {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(body)
    except ValueError:
        raise InvalidArgument("body", "body.json", "send a JSON object") from None
    if not isinstance(data, dict):
        raise InvalidArgument("body", "body.json", "send a JSON object")
    return data


class _Views:
    def __init__(self, dashboard: Dashboard) -> None:
        self.d = dashboard
        self._thread_lock = asyncio.Lock()
        self._threads: dict[str, tuple[float, list[dict[str, object]]]] = {}

    async def session(self, request: Request, caller: Caller) -> object:
        return {"csrf": caller.csrf, "expires_at": caller.session.expires_at}

    async def agents(self, request: Request, caller: Caller) -> object:
        sort = request.query_params.get("sort", "agent")
        order = request.query_params.get("order", "asc")
        prefix = request.query_params.get("q", "")[:64]
        return await self.d.overview.page(
            sort,
            order == "desc",
            _int(request, "offset", 0, 0, 1_000_000),
            _int(request, "limit", 100, 1, 500),
            prefix,
        )

    async def inbox(self, request: Request, caller: Caller) -> object:
        agent = check_agent_id(request.query_params.get("agent"), "agent")
        after = request.query_params.get("after") or None
        if after is not None and not is_envelope_id(after):
            raise InvalidArgument("after", "envelope_id.pattern", "must be an envelope id from this page")
        limit = _int(request, "limit", INBOX_PAGE, 1, MAX_INBOX_PAGE)
        envelopes = await self.d.view.unacknowledged(agent, limit=limit, after=after)
        return {
            "agent": agent,
            "overview": await self.d.overview.agent(agent),
            "envelopes": [_envelope(e) for e in envelopes],
            "more": len(envelopes) == limit,
        }

    async def thread(self, request: Request, caller: Caller) -> object:
        envelope_id = request.query_params.get("id", "")
        if not is_envelope_id(envelope_id):
            raise InvalidArgument(
                "id", "envelope_id.pattern", "must be an envelope id (env_ + 26 characters)"
            )
        # One thread read at a time in this process (a store without the replies index falls back to
        # reading every envelope), its answer kept THREAD_KEEP_SECONDS for every viewer of that thread.
        async with self._thread_lock:
            now = time.monotonic()
            self._threads = {k: v for k, v in self._threads.items() if now - v[0] < THREAD_KEEP_SECONDS}
            kept = self._threads.get(envelope_id)
            if kept is None:
                found = await self.d.view.thread(envelope_id, limit=THREAD_LIMIT)
                kept = (time.monotonic(), [{**_envelope(e), "depth": d} for e, d in _tree(found)])
                self._threads[envelope_id] = kept
        return {"id": envelope_id, "envelopes": kept[1]}

    async def dead_letters(self, request: Request, caller: Caller) -> object:
        wanted = request.query_params.get("agent")
        if wanted:
            agents = [check_agent_id(wanted, "agent")]
        else:
            snap = await self.d.overview.snapshot()
            worst = sorted(
                (r for r in snap.rows if int(str(r["dead"])) > 0), key=lambda r: -int(str(r["dead"]))
            )
            agents = [str(r["agent"]) for r in worst[:DEAD_AGENTS_SHOWN]]
        groups = []
        for agent in agents:
            letters = await self.d.dead.dead_letters(agent, DEAD_LETTERS_SHOWN)
            total = await self.d.dead.dead_letter_count(agent)
            groups.append({"agent": agent, "total": total, "letters": [_dead_letter(x) for x in letters]})
        return {"groups": groups}

    async def requeue(self, request: Request, caller: Caller) -> object:
        data = await _json_object(request)
        agent = check_agent_id(data.get("agent"), "agent")
        ids = data.get("ids")
        if ids is not None:
            if not isinstance(ids, list) or len(ids) > MAX_ACK_IDS:
                raise InvalidArgument(
                    "ids", "ids.type", f"a list of at most {MAX_ACK_IDS} envelope ids, or null"
                )
            for i, envelope_id in enumerate(ids):
                if not is_envelope_id(envelope_id):
                    raise InvalidArgument(f"ids[{i}]", "envelope_id.pattern", "not an envelope id")
        requeued = await self.d.dead.requeue(agent, ids)
        self.d.overview.forget()
        return {"agent": agent, "requeued": requeued}

    async def send(self, request: Request, caller: Caller) -> object:
        data = await _json_object(request)
        sender = check_agent_id(data.get("from"), "from")
        to = check_agent_id(data.get("to"), "to")
        message = {k: data[k] for k in ("kind", "text", "in_reply_to", "reference") if k in data}
        relay = self.d.relay
        for optional in ("in_reply_to", "reference"):
            if message.get(optional) == "":
                message[optional] = None  # an empty form field means "none"
        body = relay.contract.from_json(message)
        relay.contract.validate(body)
        recipient = await relay.registration(to)
        if recipient is None:
            raise UnknownRecipient(to)
        registered, session = False, HUMAN_SESSION
        current = await relay.registration(sender)
        if current is None:
            # A person's first send: their id becomes a human-provider agent so agents can answer it,
            # unless the recipient's policy refuses them (then nobody is registered; every later send
            # is checked atomically with its append)
            address = self.d.human(sender)
            await self._accepted(sender, address.provider, to, recipient)
            await relay.register(sender, address, check_session_id(HUMAN_SESSION))
            registered = True
        elif current.provider != self.d.human(sender).provider:
            raise InvalidArgument(
                "from",
                "from.person",
                f"{sender!r} is an agent's id (provider {current.provider}); send under your own id",
            )
        else:
            session = current.session
        envelope = await relay.send(sender, to, body, session=session)
        self.d.overview.forget()
        return {
            "id": envelope.id,
            "from": sender,
            "to": to,
            "tier": envelope.tier.label,
            "sent_at": format_ms(envelope.sent_at_ms),
            "registered_sender": registered,
        }

    async def _accepted(self, sender: str, provider: str, to: str, recipient: Registration) -> None:
        """Refuse (``NotAccepted``, counted like the relay's) a sender ``to``'s policy does not accept."""
        policies = self.d.overview.policies
        if policies is None:
            return
        policy = await policies.get(to)
        if not policy.accepts(sender, provider):
            tier = widest(self.d.human(sender).tier, recipient.tier).label
            metrics = self.d.relay.metrics
            metrics.refused.labels(code=NotAccepted.code).inc()
            metrics.not_accepted.labels(tier=tier).inc()
            raise NotAccepted(to, sender, policy.accept_from, tier)

    async def traffic(self, request: Request, caller: Caller) -> object:
        return self.d.traffic.series()
