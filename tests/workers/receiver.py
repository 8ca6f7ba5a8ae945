"""A receive loop in its own process, for the SIGKILL test (tests/test_messenger.py).

Usage: python tests/workers/receiver.py REDIS_URL PREFIX AGENT

Serves AGENT's inbox with a handler that prints ``holding <envelope id> <attempt>`` (flushed) and then
blocks forever, mid-delivery, until the parent kills the process.
"""

from __future__ import annotations

import asyncio
import sys

from adapters.redis import RedisConnection, RedisInboxStore, RedisRegistry, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from broker.delivery import DeliverySettings
from broker.envelope import Envelope
from broker.messenger import Messenger
from broker.relay import Relay
from tests.support import Text, TextContract


async def main(url: str, prefix: str, agent: str) -> None:
    connection = RedisConnection(RedisSettings(url=url, prefix=prefix))
    relay = Relay(TextContract(), RedisInboxStore(connection), RedisRegistry(connection))
    settings = DeliverySettings(visibility=60.0, poll=0.5)
    async with relay, Messenger(relay, RedisDeliveryQueue(connection), settings) as messenger:

        async def hold(envelope: Envelope[Text]) -> None:
            print(f"holding {envelope.id} {envelope.deliveries}", flush=True)
            await asyncio.Event().wait()

        await messenger.serve(agent, hold)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
