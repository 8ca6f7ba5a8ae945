"""Conformance of a webhook state backend (``broker.webhooks``: ``IWebhookTargets``, ``IPendingMail``,
``IWebhookClaims``), run against a relay on the same store.

Subclass ``WebhookConformance`` and implement ``make_store``: a started relay and the backend's webhook
state over one fresh store. Tests register agents through the relay, so the registration rules
(``https://`` remote endpoints get secrets) are the real ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from broker.addresses import ClaudeCodeAddress, RemoteAddress
from broker.relay import Relay
from broker.testing.polling import eventually
from broker.webhooks import (
    SUMMARY_ENVELOPES,
    IPendingMail,
    IWebhookClaims,
    IWebhookTargets,
    new_secret,
)

HOOK = "https://agents.example.net/hook"


class WebhookState(IWebhookTargets, IPendingMail, IWebhookClaims, Protocol):
    """One object implementing the three ports (as both backends do)."""


class WebhookConformance(ABC):
    @abstractmethod
    def make_store(self) -> AbstractAsyncContextManager[tuple[Relay[Any], WebhookState]]:
        """A started relay and webhook state sharing one fresh, empty store."""

    @abstractmethod
    def body(self, n: int) -> Any:
        """A valid body of the relay's contract, distinct for each ``n``."""

    async def _setup(self, relay: Relay[Any], far: str = "far") -> None:
        await relay.register("near", ClaudeCodeAddress.parse("127.0.0.1:14111"), "s1")
        await relay.register(far, RemoteAddress.parse(HOOK), "s1")

    async def test_a_secret_is_kept_only_for_the_registration_it_was_issued_for(self) -> None:
        async with self.make_store() as (relay, state):
            await self._setup(relay)
            secret = new_secret()
            assert not await state.set_secret("far", "other-session", HOOK, secret)
            assert not await state.set_secret("far", "s1", "https://elsewhere.example.net/", secret)
            assert await state.target("far") is None
            assert await state.set_secret("far", "s1", HOOK, secret)
            target = await state.target("far")
            assert target is not None and (target.endpoint, target.secret) == (HOOK, secret)
            await relay.register("far", RemoteAddress.parse(HOOK), "s1")  # every registration drops it
            assert await state.target("far") is None
            assert not await state.set_secret("nobody", "s1", HOOK, secret)
            assert {"near", "far"} <= set(await state.agents())

    async def test_only_https_remote_registrations_are_targets(self) -> None:
        async with self.make_store() as (relay, state):
            await self._setup(relay)
            await relay.register("plain", RemoteAddress.parse("agents.example.net:443"), "s1")
            await state.set_secret("plain", "s1", "agents.example.net:443", new_secret())
            assert await state.target("plain") is None
            assert await state.target("near") is None

    async def test_pending_lists_unannounced_mail_oldest_first_and_changes_nothing(self) -> None:
        async with self.make_store() as (relay, state):
            await self._setup(relay)
            empty = await state.pending_for("far")
            assert (empty.pending, empty.envelopes, empty.cursor) == (0, (), None)
            sent = [await relay.send("near", "far", self.body(n), session="s1") for n in range(7)]
            mail = await state.pending_for("far")
            assert mail.agent == "far" and mail.pending == 7 and mail.cursor is not None
            assert [e.id for e in mail.envelopes] == [e.id for e in sent[:SUMMARY_ENVELOPES]]
            first = mail.envelopes[0]
            assert first.sender == "near" and first.kind and first.sent_at_ms > 0
            assert await state.pending_for("far") == mail  # reading changes nothing
            fetched = await relay.fetch("far", 16, session="s1")
            assert [e.deliveries for e in fetched] == [1] * 7  # delivery state untouched

    async def test_announced_mail_is_not_listed_again(self) -> None:
        async with self.make_store() as (relay, state):
            await self._setup(relay)
            await relay.send("near", "far", self.body(1), session="s1")
            mail = await state.pending_for("far")
            assert mail.cursor is not None
            await state.announced("far", mail.cursor)
            after = await state.pending_for("far")
            assert (after.pending, after.envelopes, after.cursor) == (1, (), None)
            newer = await relay.send("near", "far", self.body(2), session="s1")
            again = await state.pending_for("far")
            assert again.pending == 2 and [e.id for e in again.envelopes] == [newer.id]
            await relay.ack("far", [e.id for e in await relay.fetch("far", 16, session="s1")], session="s1")
            assert (await state.pending_for("far")).pending == 0

    async def test_a_claim_is_exclusive_until_released_or_lapsed(self) -> None:
        async with self.make_store() as (_, state):
            assert await state.claim("far", "worker-1", 30)
            assert not await state.claim("far", "worker-2", 30)
            await state.release("far", "worker-2")  # not its claim: nothing changes
            assert not await state.claim("far", "worker-2", 30)
            assert await state.claim("other", "worker-2", 30)  # claims are per agent
            await state.release("far", "worker-1")
            assert await state.claim("far", "worker-2", 0.05)

            async def lapsed() -> bool:
                return await state.claim("far", "worker-3", 30)

            await eventually(lapsed, 5, "the claim lapsed")
