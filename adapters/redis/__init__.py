"""The Redis backend: durable inboxes (streams + consumer groups) and registrations (hashes)."""

from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.inbox import RedisInboxStore
from adapters.redis.keys import GROUP, Keys
from adapters.redis.notice import RedisNoticeStore
from adapters.redis.policy import RedisPolicyStore
from adapters.redis.registry import RedisRegistry

__all__ = [
    "GROUP",
    "Keys",
    "RedisConnection",
    "RedisInboxStore",
    "RedisNoticeStore",
    "RedisPolicyStore",
    "RedisRegistry",
    "RedisSettings",
]
