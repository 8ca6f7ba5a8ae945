"""The Lua scripts, loaded from ``lua/*.lua`` (each file's header documents its KEYS and ARGV)."""

from __future__ import annotations

from importlib.resources import files

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

SCRIPT_NAMES = ("register", "send", "fetch", "ack")


def read_script(name: str) -> str:
    return (files("adapters.redis") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


class Scripts:
    """Script objects bound to one client; they reload themselves after a Redis restart (NOSCRIPT)."""

    def __init__(self, client: Redis) -> None:
        self.register: AsyncScript = client.register_script(read_script("register"))
        self.send: AsyncScript = client.register_script(read_script("send"))
        self.fetch: AsyncScript = client.register_script(read_script("fetch"))
        self.ack: AsyncScript = client.register_script(read_script("ack"))
