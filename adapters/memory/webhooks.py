"""``MemoryWebhooks``: webhook state in process memory, the reference semantics of ``broker.webhooks``'
``IWebhookTargets``, ``IPendingMail`` and ``IWebhookClaims``."""

from __future__ import annotations

import time

from adapters.memory.state import MemoryState
from broker.ids import encode_envelope_id
from broker.webhooks import (
    SUMMARY_ENVELOPES,
    PendingEnvelope,
    PendingMail,
    WebhookTarget,
    is_webhook_endpoint,
)


class MemoryWebhooks:
    def __init__(self, state: MemoryState) -> None:
        self.state = state

    async def set_secret(self, agent: str, session: str, endpoint: str, secret: str) -> bool:
        current = self.state.registrations.get(agent)
        if current is None or current.session != session or current.endpoint != endpoint:
            return False
        self.state.webhook_secrets[agent] = secret
        return True

    async def target(self, agent: str) -> WebhookTarget | None:
        current = self.state.registrations.get(agent)
        secret = self.state.webhook_secrets.get(agent)
        if current is None or not secret or not is_webhook_endpoint(current.provider, current.endpoint):
            return None
        return WebhookTarget(agent, current.endpoint, secret)

    async def agents(self) -> list[str]:
        return sorted(self.state.registrations)

    async def pending_for(self, agent: str) -> PendingMail:
        inbox = self.state.inboxes.get(agent)
        entries = list(inbox.entries.values()) if inbox is not None else []
        cursor = self.state.webhook_cursors.get(agent, (0, 0))
        new = [e for e in entries if e.position > cursor]
        listed = tuple(
            PendingEnvelope(
                encode_envelope_id(*e.position, e.nonce), e.sender, e.fields.get("kind", ""), e.sent_at_ms
            )
            for e in new[:SUMMARY_ENVELOPES]
        )
        newest = f"{new[-1].position[0]}-{new[-1].position[1]}" if new else None
        return PendingMail(agent, len(entries), listed, newest)

    async def announced(self, agent: str, cursor: str) -> None:
        ms, _, seq = cursor.partition("-")
        self.state.webhook_cursors[agent] = (int(ms), int(seq))

    async def claim(self, agent: str, holder: str, seconds: float) -> bool:
        now = time.monotonic()
        current = self.state.webhook_claims.get(agent)
        if current is not None and current[1] > now:
            return False
        self.state.webhook_claims[agent] = (holder, now + seconds)
        return True

    async def release(self, agent: str, holder: str) -> None:
        current = self.state.webhook_claims.get(agent)
        if current is not None and current[0] == holder:
            del self.state.webhook_claims[agent]
