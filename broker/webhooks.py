"""Webhook notifications for remote agents: who gets one, what it says, and the ports behind it.

A ``remote`` agent registered with an ``https://`` endpoint gets a signing secret with each
registration (``whsec_`` + base64 of ``SECRET_BYTES`` random bytes, the Standard Webhooks format). When
mail arrives for it, relay POSTs a thin JSON summary to that endpoint, signed per Standard Webhooks. The
notification only says that mail is waiting: the agent still fetches and acknowledges over MCP, and
the inbox stays the truth. Each envelope is announced once; mail that arrives while a notification is
in flight rides on the next one. The dispatcher (``adapters.webhooks``) drives these ports.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any, Final, Protocol

from broker.addresses import RemoteAddress
from broker.envelope import format_ms

SECRET_PREFIX: Final = "whsec_"  # noqa: S105 - a format tag, not a secret
SECRET_BYTES: Final = 32
SUMMARY_ENVELOPES: Final = 5
"""Envelopes a notification lists at most (the newest unannounced ones are counted in ``pending``)."""
EVENT_TYPE: Final = "relay.inbox.pending"


def new_secret() -> str:
    """A fresh webhook signing secret."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def is_webhook_endpoint(provider: str, endpoint: str) -> bool:
    """True for the registrations that get notifications: ``remote`` with an ``https://`` URL."""
    return provider == RemoteAddress.provider and endpoint.startswith("https://")


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """Where an agent's notifications go and the secret they are signed with."""

    agent: str
    endpoint: str
    secret: str


@dataclass(frozen=True, slots=True)
class PendingEnvelope:
    """One envelope as a notification names it (never its text)."""

    id: str
    sender: str
    kind: str
    sent_at_ms: int


@dataclass(frozen=True, slots=True)
class PendingMail:
    """What an agent has not been told about yet.

    ``pending`` counts every unacknowledged envelope; ``envelopes`` are the first unannounced ones (at
    most ``SUMMARY_ENVELOPES``); ``cursor`` marks the newest unannounced envelope (None: nothing new), to
    be handed back to ``announced``.
    """

    agent: str
    pending: int
    envelopes: tuple[PendingEnvelope, ...]
    cursor: str | None


class IPendingMail(Protocol):
    """Mail an agent has not been told about, read without touching delivery state.

    ``pending_for`` never changes anything: the same call answers the same until ``announced`` moves the
    agent's cursor, or mail arrives or is acknowledged. ``announced(agent, cursor)`` records that every
    envelope up to ``cursor`` (from ``pending_for``) was announced; a later ``pending_for`` lists only
    newer ones. Raises ``BackendUnavailable`` when the store does not answer. The dispatcher reads
    ``pending_for`` only while it holds the agent's claim and calls ``announced`` right after
    delivering, so a store whose read also announces (moves the cursor itself, ``announced`` then
    doing nothing) serves it too.
    """

    async def pending_for(self, agent: str) -> PendingMail: ...

    async def announced(self, agent: str, cursor: str) -> None: ...


class IWebhookTargets(Protocol):
    """Webhook secrets, kept with the registration they were issued for.

    ``set_secret`` stores ``secret`` only while ``agent`` is still registered in ``session`` at
    ``endpoint`` (True), so a registration made meanwhile is never given another's secret; every
    registration drops the secret of the previous one. ``target`` is the endpoint and secret of the
    current registration when it is a webhook endpoint with a secret, else None. ``agents`` lists every
    registered agent (to look at each after wake-ups may have been missed).
    """

    async def agents(self) -> list[str]: ...

    async def set_secret(self, agent: str, session: str, endpoint: str, secret: str) -> bool: ...

    async def target(self, agent: str) -> WebhookTarget | None: ...


class IWebhookClaims(Protocol):
    """One notifier per agent across workers: ``claim`` is True for exactly one holder at a time,
    until it ``release``\\ s or ``seconds`` pass (a crashed worker's claim lapses)."""

    async def claim(self, agent: str, holder: str, seconds: float) -> bool: ...

    async def release(self, agent: str, holder: str) -> None: ...


def summary(mail: PendingMail, now_ms: int) -> dict[str, Any]:
    """The JSON body of a notification (Standard Webhooks' ``type`` / ``timestamp`` / ``data``)."""
    return {
        "type": EVENT_TYPE,
        "timestamp": format_ms(now_ms),
        "data": {
            "agent": mail.agent,
            "pending": mail.pending,
            "envelopes": [
                {"id": e.id, "from": e.sender, "kind": e.kind, "sent_at": format_ms(e.sent_at_ms)}
                for e in mail.envelopes
            ],
        },
    }
