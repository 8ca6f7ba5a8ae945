"""Wire the operator dashboard (``broker.front.ui``) onto a running relay's Redis backend."""

from __future__ import annotations

from adapters.redis import RedisConnection
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.operator_view import RedisOperatorView
from adapters.redis.policy import RedisPolicyStore
from adapters.redis.spent import RedisSpentTokens
from broker.addresses import Address, HumanAddress
from broker.agent_message import AgentMessage
from broker.front.tokens import KeyRing
from broker.front.ui.access import OperatorAccess
from broker.front.ui.api import Dashboard
from broker.front.ui.snapshot import Overview
from broker.front.ui.traffic import Traffic
from broker.relay import Relay

HUMAN_ENDPOINT = "dashboard"
"""The endpoint label of a person registered by their first send from the dashboard."""


def human_address(_agent: str) -> Address:
    return HumanAddress.parse(HUMAN_ENDPOINT)


def build(relay: Relay[AgentMessage], connection: RedisConnection, keyring: KeyRing) -> Dashboard:
    """The dashboard of ``relay``, reading the Redis behind ``connection`` (the relay's own: no
    connection of its own, whatever the number of viewers)."""
    view = RedisOperatorView(connection)
    return Dashboard(
        relay=relay,
        view=view,
        dead=RedisDeliveryQueue(connection),
        access=OperatorAccess(keyring, RedisSpentTokens(connection)),
        human=human_address,
        traffic=Traffic(relay.metrics),
        overview=Overview(view, policies=RedisPolicyStore(connection)),
    )
