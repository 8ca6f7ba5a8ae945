"""Webhook notifications against a real Redis and a real HTTPS receiver on loopback: Standard Webhooks
signatures, coalescing, retries, several workers, one announce cursor shared with mail-pending waits,
slow and dead endpoints, and the SSRF guard."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis, RedisCluster

from adapters.redis import RedisConnection, RedisInboxStore, RedisNoticeStore, RedisRegistry, RedisSettings
from adapters.redis.webhooks import RedisWebhooks
from adapters.webhooks.dispatcher import WebhookDispatcher
from adapters.webhooks.transport import BlockedAddress, webhook_client
from broker.addresses import ClaudeCodeAddress, RemoteAddress
from broker.agent_message import AgentMessage, AgentMessageContract
from broker.relay import Relay
from broker.testing.polling import eventually
from broker.webhooks import new_secret
from tests.support import unique_prefix
from tests.tls_support import Certificates, certificates, receiver

pytestmark = pytest.mark.asyncio


@dataclass
class Worker:
    connection: RedisConnection
    relay: Relay[AgentMessage]
    webhooks: RedisWebhooks
    dispatcher: WebhookDispatcher
    metrics: CollectorRegistry

    def outcome(self, name: str) -> float:
        return self.metrics.get_sample_value("csf_relay_webhooks_total", {"outcome": name}) or 0.0

    async def remote(self, agent: str, url: str) -> str:
        """Register ``agent`` at ``url`` and issue its secret, as the network listener does."""
        await self.relay.register(agent, RemoteAddress.parse(url), "s1")
        secret = new_secret()
        assert await self.webhooks.set_secret(agent, "s1", url, secret)
        return secret

    async def send(self, sender: str, to: str, text: str = "hello") -> str:
        body = self.relay.contract.from_json({"kind": 1, "text": text})
        return (await self.relay.send(sender, to, body, session="s1")).id

    async def all_announced(self, agent: str) -> bool:
        """True when the agent's notice cursor is at its newest envelope (read without moving it)."""
        keys = self.connection.keys

        async def run(client: Redis | RedisCluster) -> bool:
            cursor = await client.hget(keys.notice(agent), "cursor")
            newest = await client.xrevrange(keys.inbox(agent), count=1)
            return not newest or newest[0][0] == cursor

        return await self.connection.call(run, idempotent=True)


async def settled(group: list[Worker], agent: str) -> bool:
    """Every worker idle and all of ``agent``'s mail announced."""
    return all(w.dispatcher.in_flight() == 0 for w in group) and await group[0].all_announced(agent)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return certificates(tmp_path_factory.mktemp("tls"))


@contextlib.asynccontextmanager
async def workers(
    redis_url: str,
    certs: Certificates,
    count: int = 1,
    *,
    retry_for: float = 5.0,
    allow_private: bool = True,
    prefix: str | None = None,
) -> AsyncIterator[list[Worker]]:
    prefix = prefix or unique_prefix()
    made: list[Worker] = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(count):
            connection = RedisConnection(RedisSettings(url=redis_url, prefix=prefix))
            metrics = CollectorRegistry()
            inbox, registry = RedisInboxStore(connection), RedisRegistry(connection)
            notices = RedisNoticeStore(connection)
            relay = Relay(AgentMessageContract(), inbox, registry, metrics=metrics, notices=notices)
            await stack.enter_async_context(relay)
            webhooks = RedisWebhooks(connection)
            client = webhook_client(allow_private=allow_private, ca_file=certs.ca_file)
            dispatcher = WebhookDispatcher(webhooks, notices, webhooks, client, metrics, retry_for=retry_for)
            stack.push_async_callback(dispatcher.close)
            connection.wakeups.watch(dispatcher.notify, dispatcher.look_at_all)
            made.append(Worker(connection, relay, webhooks, dispatcher, metrics))
        await eventually(lambda: all(w.connection.wakeups.subscribed for w in made), 10, "subscribed")
        await made[0].relay.register("sender", ClaudeCodeAddress.parse("127.0.0.1:14111"), "s1")
        yield made


async def test_a_notification_is_signed_and_summarises_the_mail(redis_url: str, certs: Certificates) -> None:
    async with receiver(certs) as hook, workers(redis_url, certs) as (worker,):
        secret = await worker.remote("far", hook.url)
        sent = await worker.send("sender", "far")
        await eventually(lambda: len(hook.deliveries) == 1, 10, "a notification")
        data = hook.deliveries[0].verified(secret)
        assert data["type"] == "relay.inbox.pending"
        assert data["data"]["agent"] == "far"
        assert data["data"]["pending"] == 1
        [listed] = data["data"]["envelopes"]
        assert listed["id"] == sent and listed["from"] == "sender" and listed["kind"] == "note"
        assert "text" not in listed  # notify only: the text is fetched over MCP
        await eventually(lambda: worker.outcome("delivered") == 1, 10, "counted once answered")
        # a wrong secret does not verify
        with pytest.raises(Exception, match="signature"):
            hook.deliveries[0].verified(new_secret())
        # the inbox stays the truth: the envelope is still there to fetch
        assert [e.id for e in await worker.relay.fetch("far", session="s1")] == [sent]


async def test_mail_waiting_when_a_worker_starts_is_announced(redis_url: str, certs: Certificates) -> None:
    """Wake-ups published while no worker listened are not lost: a subscribing worker looks at every
    registered agent."""
    prefix = unique_prefix()
    async with receiver(certs) as hook:
        async with workers(redis_url, certs, prefix=prefix) as (first,):
            secret = await first.remote("far", hook.url)
            await first.dispatcher.close()  # nobody notifies now: the mail below only waits
            sent = await first.send("sender", "far")
        assert hook.deliveries == []
        async with workers(redis_url, certs, prefix=prefix):
            await eventually(lambda: len(hook.deliveries) == 1, 10, "announced by the new worker")
        assert [e["id"] for e in hook.deliveries[0].verified(secret)["data"]["envelopes"]] == [sent]


async def test_mail_arriving_while_one_is_in_flight_rides_on_the_next(
    redis_url: str, certs: Certificates
) -> None:
    async with receiver(certs) as hook, workers(redis_url, certs) as (worker,):
        secret = await worker.remote("far", hook.url)
        hook.gate = asyncio.Event()
        first = await worker.send("sender", "far", "one")
        await eventually(lambda: len(hook.deliveries) == 1, 10, "the first notification, held")
        later = [await worker.send("sender", "far", f"n{i}") for i in range(3)]
        hook.gate.set()
        await eventually(lambda: len(hook.deliveries) == 2, 10, "one more notification")
        assert [e["id"] for e in hook.deliveries[0].verified(secret)["data"]["envelopes"]] == [first]
        second = hook.deliveries[1].verified(secret)["data"]
        assert [e["id"] for e in second["envelopes"]] == later
        assert second["pending"] == 4


async def test_several_workers_send_one_notification_for_one_mail(
    redis_url: str, certs: Certificates
) -> None:
    async with receiver(certs) as hook, workers(redis_url, certs, count=3) as group:
        secret = await group[0].remote("far", hook.url)
        sent = await group[1].send("sender", "far")
        await eventually(lambda: len(hook.deliveries) == 1, 10, "a notification")

        await eventually(lambda: settled(group, "far"), 10, "every worker idle, everything announced")
        assert len(hook.deliveries) == 1  # every worker heard the wake-up; one notified
        assert [e["id"] for e in hook.deliveries[0].verified(secret)["data"]["envelopes"]] == [sent]


async def test_several_workers_announce_each_envelope_at_most_once(
    redis_url: str, certs: Certificates
) -> None:
    """A burst is coalesced: a notification lists the first unannounced envelopes (at most 5) and
    counts them all, and later ones list only newer envelopes."""
    async with receiver(certs) as hook, workers(redis_url, certs, count=3) as group:
        secret = await group[0].remote("far", hook.url)
        sent = [await group[i % 3].send("sender", "far", f"m{i}") for i in range(12)]

        await eventually(lambda: settled(group, "far"), 15, "every worker idle, everything announced")
        notes = [d.verified(secret)["data"] for d in hook.deliveries]
        listed = [e["id"] for note in notes for e in note["envelopes"]]
        assert len(listed) == len(set(listed)) and listed == sorted(listed, key=sent.index)
        assert listed[0] == sent[0] and 1 <= len(notes) <= 12
        assert max(note["pending"] for note in notes) == 12


async def test_a_webhook_and_a_wait_announce_each_envelope_once(redis_url: str, certs: Certificates) -> None:
    """One cursor: an envelope the agent's own mail-pending wait announced is not in a notification."""
    async with receiver(certs) as hook, workers(redis_url, certs) as (worker,):
        secret = await worker.remote("far", hook.url)
        hook.gate = asyncio.Event()
        first = await worker.send("sender", "far", "one")
        await eventually(lambda: len(hook.deliveries) == 1, 10, "the first notification, held")
        assert (await worker.relay.wait_for_mail("far", "s1", 0)).count == 0  # the webhook told it
        second = await worker.send("sender", "far", "two")
        waited = await worker.relay.wait_for_mail("far", "s1", 0)
        assert [e.id for e in waited.envelopes] == [second]
        hook.gate.set()
        await eventually(lambda: settled([worker], "far"), 10, "idle, everything announced")
        assert [e["id"] for e in hook.deliveries[0].verified(secret)["data"]["envelopes"]] == [first]
        assert len(hook.deliveries) == 1  # the second was announced by the wait, not again


async def test_a_dropped_notification_leaves_its_envelopes_announced(
    redis_url: str, certs: Certificates
) -> None:
    """A notification is a hint: once dropped it is not sent again, and the next one counts the mail."""
    async with receiver(certs) as hook, workers(redis_url, certs, retry_for=0.5) as (worker,):
        secret = await worker.remote("far", hook.url)
        hook.statuses = [503] * 1000
        first = await worker.send("sender", "far", "one")
        await eventually(lambda: worker.outcome("dropped") == 1, 15, "dropped")
        hook.statuses = []
        second = await worker.send("sender", "far", "two")
        await eventually(lambda: worker.outcome("delivered") == 1, 10, "the next one delivered")
        data = hook.deliveries[-1].verified(secret)["data"]
        assert [e["id"] for e in data["envelopes"]] == [second] and data["pending"] == 2
        assert [e.id for e in await worker.relay.fetch("far", session="s1")] == [first, second]


async def test_5xx_is_retried_with_the_same_id_then_delivered(redis_url: str, certs: Certificates) -> None:
    async with receiver(certs) as hook, workers(redis_url, certs) as (worker,):
        secret = await worker.remote("far", hook.url)
        hook.statuses = [503, 500]
        await worker.send("sender", "far")
        await eventually(lambda: len(hook.deliveries) == 3, 15, "two retries")
        assert len({d.headers["webhook-id"] for d in hook.deliveries}) == 1
        for delivery in hook.deliveries:
            delivery.verified(secret)
        await eventually(lambda: worker.outcome("delivered") == 1, 10, "delivered")
        assert worker.outcome("retried") == 2


async def test_an_endpoint_that_keeps_failing_is_dropped_and_counted(
    redis_url: str, certs: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    async with receiver(certs) as hook, workers(redis_url, certs, retry_for=0.5) as (worker,):
        await worker.remote("far", hook.url)
        hook.statuses = [503] * 1000
        await worker.send("sender", "far")
        await eventually(lambda: worker.outcome("dropped") == 1, 15, "dropped")
        assert "webhook dropped" in caplog.text
        assert "Traceback" not in caplog.text


async def test_a_redirect_is_not_followed(redis_url: str, certs: Certificates) -> None:
    async with receiver(certs) as hook, receiver(certs) as elsewhere, workers(redis_url, certs) as (w,):
        await w.remote("far", hook.url)
        hook.statuses, hook.location = [302], elsewhere.url
        await w.send("sender", "far")
        await eventually(lambda: w.outcome("refused") == 1, 10, "refused")
        assert len(hook.deliveries) == 1 and elsewhere.deliveries == []


async def test_dead_and_slow_endpoints_do_not_hold_up_sends_or_other_agents(
    redis_url: str, certs: Certificates
) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"https://127.0.0.1:{closed.getsockname()[1]}/hook"
    async with receiver(certs) as slow, receiver(certs) as fine, workers(redis_url, certs) as (worker,):
        await worker.remote("dead", dead)
        await worker.remote("slow", slow.url)
        secret = await worker.remote("fine", fine.url)
        slow.gate = asyncio.Event()  # holds every notification until the end of the test
        await worker.send("sender", "slow")
        await eventually(lambda: len(slow.deliveries) == 1, 10, "the slow endpoint holding one")
        for i in range(50):
            await worker.send("sender", "dead", f"d{i}")
            await worker.send("sender", "slow", f"s{i}")
        await worker.send("sender", "fine")
        await eventually(lambda: len(fine.deliveries) == 1, 10, "the healthy agent notified")
        assert fine.deliveries[0].verified(secret)["data"]["pending"] == 1
        assert len(slow.deliveries) == 1  # still the one in flight: the rest wait for it, coalesced


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:{port}/hook",
        "https://10.0.0.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://localhost:{port}/hook",
        "https://[::1]:{port}/hook",
        "https://[::ffff:127.0.0.1]:{port}/hook",
    ],
)
async def test_ssrf_guard_refuses_non_public_addresses(url: str, certs: Certificates) -> None:
    async with receiver(certs) as hook:
        port = hook.url.split(":")[2].split("/")[0]
        async with webhook_client(ca_file=certs.ca_file) as client:
            with pytest.raises(BlockedAddress, match="not a public address"):
                await client.post(url.format(port=port), content=b"{}")
        assert hook.deliveries == []


async def test_the_dispatcher_counts_a_blocked_endpoint_as_refused(
    redis_url: str, certs: Certificates
) -> None:
    async with receiver(certs) as hook, workers(redis_url, certs, allow_private=False) as (worker,):
        await worker.remote("far", hook.url)
        await worker.send("sender", "far")
        await eventually(lambda: worker.outcome("refused") == 1, 10, "refused")
        assert hook.deliveries == []


async def test_certificates_are_verified(redis_url: str, tmp_path: Path, certs: Certificates) -> None:
    """A receiver whose certificate the client's CA did not sign is not delivered to."""
    other = certificates(tmp_path)
    async with receiver(other) as hook:
        async with webhook_client(allow_private=True, ca_file=certs.ca_file) as client:
            with pytest.raises(httpx2.ConnectError):
                await client.post(hook.url, content=b"{}")
        assert hook.deliveries == []
