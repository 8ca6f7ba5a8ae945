"""Conformance of a webhook state backend (``broker.webhooks``: ``IWebhookTargets``, ``IWebhookClaims``,
and ``announce`` through the backend's ``INoticeStore``), run against a relay on the same store.

Subclass ``WebhookConformance`` and implement ``make_store``: a started relay (built with the notice
store), the backend's webhook state and that notice store, over one fresh store. Tests register agents
through the relay, so the registration rules (``https://`` remote endpoints get secrets) are the real
ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import pytest

from broker.addresses import ClaudeCodeAddress, RemoteAddress
from broker.envelope import now_ms
from broker.errors import SessionSuperseded
from broker.ports import INoticeStore
from broker.relay import Relay
from broker.testing.polling import eventually
from broker.webhooks import (
    SUMMARY_ENVELOPES,
    IWebhookClaims,
    IWebhookTargets,
    WebhookTarget,
    announce,
    new_secret,
)

HOOK = "https://agents.example.net/hook"


class WebhookState(IWebhookTargets, IWebhookClaims, Protocol):
    """One object implementing both ports (as both backends do)."""


class WebhookConformance(ABC):
    @abstractmethod
    def make_store(self) -> AbstractAsyncContextManager[tuple[Relay[Any], WebhookState, INoticeStore]]:
        """A started relay, webhook state and the relay's notice store, sharing one fresh, empty store."""

    @abstractmethod
    def body(self, n: int) -> Any:
        """A valid body of the relay's contract, distinct for each ``n``."""

    async def _setup(self, relay: Relay[Any], far: str = "far") -> None:
        await relay.register("near", ClaudeCodeAddress.parse("127.0.0.1:14111"), "s1")
        await relay.register(far, RemoteAddress.parse(HOOK), "s1")

    async def test_a_secret_is_kept_only_for_the_registration_it_was_issued_for(self) -> None:
        async with self.make_store() as (relay, state, _):
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
        async with self.make_store() as (relay, state, _):
            await self._setup(relay)
            await relay.register("plain", RemoteAddress.parse("agents.example.net:443"), "s1")
            await state.set_secret("plain", "s1", "agents.example.net:443", new_secret())
            assert await state.target("plain") is None
            assert await state.target("near") is None

    async def _target(self, state: WebhookState, agent: str = "far", session: str = "s1") -> WebhookTarget:
        assert await state.set_secret(agent, session, HOOK, new_secret())
        target = await state.target(agent)
        assert target is not None
        return target

    async def test_a_target_carries_its_registrations_session(self) -> None:
        async with self.make_store() as (relay, state, _):
            await self._setup(relay)
            assert (await self._target(state)).session == "s1"
            await relay.register("far", RemoteAddress.parse(HOOK), "s2")
            assert (await self._target(state, session="s2")).session == "s2"

    async def test_announce_lists_each_envelope_once_and_changes_no_delivery(self) -> None:
        async with self.make_store() as (relay, state, notices):
            await self._setup(relay)
            target = await self._target(state)
            empty = await announce(notices, target)
            assert (empty.count, empty.unacknowledged, empty.envelopes) == (0, 0, ())
            sent = [await relay.send("near", "far", self.body(n), session="s1") for n in range(7)]
            notice = await announce(notices, target)
            assert (notice.count, notice.unacknowledged, notice.reminder) == (7, 7, False)
            assert [e.envelope_id for e in notice.envelopes] == [e.id for e in sent[:SUMMARY_ENVELOPES]]
            first = notice.envelopes[0]
            assert first.sender == "near" and first.fields.get("kind") and first.sent_at_ms > 0
            again = await announce(notices, target)  # announced: not again, and no reminder ever
            assert (again.count, again.unacknowledged, again.envelopes) == (0, 7, ())
            newer = await relay.send("near", "far", self.body(8), session="s1")
            assert [e.envelope_id for e in (await announce(notices, target)).envelopes] == [newer.id]
            fetched = await relay.fetch("far", 16, session="s1")
            assert [e.deliveries for e in fetched] == [1] * 8  # delivery state untouched
            await relay.ack("far", [e.id for e in fetched], session="s1")
            assert (await announce(notices, target)).unacknowledged == 0

    async def test_webhooks_and_waits_share_one_cursor(self) -> None:
        """Whichever asks first announces an envelope; the other is not told it again."""
        async with self.make_store() as (relay, state, notices):
            await self._setup(relay)
            target = await self._target(state)
            one = await relay.send("near", "far", self.body(1), session="s1")
            assert [e.id for e in (await relay.wait_for_mail("far", "s1", 0)).envelopes] == [one.id]
            assert (await announce(notices, target)).count == 0
            two = await relay.send("near", "far", self.body(2), session="s1")
            assert [e.envelope_id for e in (await announce(notices, target)).envelopes] == [two.id]
            assert (await relay.wait_for_mail("far", "s1", 0)).count == 0

    async def test_a_new_session_is_announced_its_unacknowledged_mail_again(self) -> None:
        async with self.make_store() as (relay, state, notices):
            await self._setup(relay)
            old = await self._target(state)
            sent = await relay.send("near", "far", self.body(1), session="s1")
            assert (await announce(notices, old)).count == 1
            await relay.register("far", RemoteAddress.parse(HOOK), "s2")
            with pytest.raises(SessionSuperseded):
                await announce(notices, old)
            notice = await announce(notices, await self._target(state, session="s2"))
            assert [e.envelope_id for e in notice.envelopes] == [sent.id]

    async def test_a_claim_is_exclusive_until_released_or_lapsed(self) -> None:
        async with self.make_store() as (_, state, _):
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

    async def test_an_endpoint_that_took_a_notification_is_a_sign_of_life(self) -> None:
        async with self.make_store() as (relay, state, notices):
            await self._setup(relay)
            target = await self._target(state)

            async def seen() -> int:
                registration = await relay.registration("far")
                assert registration is not None and registration.last_seen_ms is not None
                return registration.last_seen_ms

            before = await seen()
            await eventually(lambda: now_ms() > before + 2, 5, "the clock moved on")
            await relay.send("near", "far", self.body(1), session="s1")
            assert (await announce(notices, target)).count == 1  # relay reading it is no sign
            assert await state.claim("far", "worker-1", 30)
            await state.release("far", "worker-1", answered="another-session")
            assert await seen() == before
            assert await state.claim("far", "worker-1", 30)
            await state.release("far", "worker-1", answered=target.session)
            assert await seen() > before
