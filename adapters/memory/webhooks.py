"""``MemoryWebhooks``: webhook state in process memory, the reference semantics of ``broker.webhooks``'
``IWebhookTargets`` and ``IWebhookClaims`` (what a notification announces comes from
``MemoryNoticeStore``)."""

from __future__ import annotations

import time

from adapters.memory.state import MemoryState
from broker.envelope import now_ms
from broker.webhooks import WebhookTarget, is_webhook_endpoint


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
        return WebhookTarget(agent, current.session, current.endpoint, secret)

    async def agents(self) -> list[str]:
        return sorted(self.state.registrations)

    async def claim(self, agent: str, holder: str, seconds: float) -> bool:
        now = time.monotonic()
        current = self.state.webhook_claims.get(agent)
        if current is not None and current[1] > now:
            return False
        self.state.webhook_claims[agent] = (holder, now + seconds)
        return True

    async def release(self, agent: str, holder: str, answered: str | None = None) -> None:
        registration = self.state.registrations.get(agent)
        if answered is not None and registration is not None and registration.session == answered:
            self.state.seen[agent] = now_ms()
        current = self.state.webhook_claims.get(agent)
        if current is not None and current[0] == holder:
            del self.state.webhook_claims[agent]
