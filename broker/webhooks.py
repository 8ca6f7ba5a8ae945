"""Webhook notifications for remote agents: who gets one, what it says, and the ports behind it.

A ``remote`` agent registered with an ``https://`` endpoint gets a signing secret with each
registration (``whsec_`` + base64 of ``SECRET_BYTES`` random bytes, the Standard Webhooks format). When
mail arrives for it, relay POSTs a thin JSON summary to that endpoint, signed per Standard Webhooks. The
notification only says that mail is waiting: the agent still fetches and acknowledges over MCP, and
the inbox stays the truth. What a notification announces comes from the agent's mail-pending notice
store (``broker.ports.INoticeStore``, see ``announce``): one cursor per agent for webhooks and
``POST /agent/wait`` alike, so each envelope is announced once, by whichever asks first. Mail that
arrives while a notification is in flight rides on the next one. The dispatcher
(``adapters.webhooks``) drives these ports.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any, Final, Protocol

from broker.addresses import RemoteAddress
from broker.envelope import format_ms
from broker.ports import INoticeStore, Notice

SECRET_PREFIX: Final = "whsec_"  # noqa: S105 - a format tag, not a secret
SECRET_BYTES: Final = 32
SUMMARY_ENVELOPES: Final = 5
"""Envelopes a notification lists at most (the oldest it announces; ``pending`` counts the whole inbox)."""
EVENT_TYPE: Final = "relay.inbox.pending"


def new_secret() -> str:
    """A fresh webhook signing secret."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def is_webhook_endpoint(provider: str, endpoint: str) -> bool:
    """True for the registrations that get notifications: ``remote`` with an ``https://`` URL."""
    return provider == RemoteAddress.provider and endpoint.startswith("https://")


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """Where an agent's notifications go, the secret they are signed with, and the session of the
    registration both belong to (the notice cursor they move is that session's)."""

    agent: str
    session: str
    endpoint: str
    secret: str


async def announce(notices: INoticeStore, target: WebhookTarget) -> Notice:
    """Announce, now, what ``target``'s agent was not told about: the envelopes after its notice
    cursor (``count`` of them, the oldest ``SUMMARY_ENVELOPES`` listed), the cursor moving past them.

    A notice read that never parks and never reminds: ``count`` 0 means nothing new. The cursor moves
    as the notice is read, before any notification is posted, so a notification that is then dropped
    leaves its envelopes announced (a hint may be lost; the inbox keeps the mail). Raises what
    ``INoticeStore.wait`` raises; ``SessionSuperseded`` or ``UnregisteredAgent`` when the registration
    changed since ``target`` was read.
    """
    return await notices.wait(
        target.agent, target.session, seconds=0, remind_after=0, listed=SUMMARY_ENVELOPES, seen=False
    )


class IWebhookTargets(Protocol):
    """Webhook secrets, kept with the registration they were issued for.

    ``set_secret`` stores ``secret`` only while ``agent`` is still registered in ``session`` at
    ``endpoint`` (True), so a registration made meanwhile is never given another's secret; every
    registration drops the secret of the previous one. ``target`` is the session, endpoint and secret
    of the current registration when it is a webhook endpoint with a secret, else None. ``agents``
    lists every registered agent (to look at each after wake-ups may have been missed).
    """

    async def agents(self) -> list[str]: ...

    async def set_secret(self, agent: str, session: str, endpoint: str, secret: str) -> bool: ...

    async def target(self, agent: str) -> WebhookTarget | None: ...


class IWebhookClaims(Protocol):
    """One notifier per agent across workers: ``claim`` is True for exactly one holder at a time,
    until it ``release``\\ s or ``seconds`` pass (a crashed worker's claim lapses). ``release`` with
    ``answered`` (the session of a target whose endpoint took the notification) records a sign of
    life: the agent's last seen moves when that session is still registered (``broker.presence``)."""

    async def claim(self, agent: str, holder: str, seconds: float) -> bool: ...

    async def release(self, agent: str, holder: str, answered: str | None = None) -> None: ...


def summary(agent: str, notice: Notice, now_ms: int) -> dict[str, Any]:
    """The JSON body of a notification (Standard Webhooks' ``type`` / ``timestamp`` / ``data``):
    ``pending`` counts every unacknowledged envelope, ``envelopes`` the oldest announced ones."""
    return {
        "type": EVENT_TYPE,
        "timestamp": format_ms(now_ms),
        "data": {
            "agent": agent,
            "pending": notice.unacknowledged,
            "envelopes": [
                {
                    "id": e.envelope_id,
                    "from": e.sender,
                    "kind": e.fields.get("kind", ""),
                    "sent_at": format_ms(e.sent_at_ms),
                }
                for e in notice.envelopes
            ],
        },
    }
