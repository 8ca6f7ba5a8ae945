"""The redis-py internals relay's script calls rely on, named in one place.

The auto-pipelined client (``pipeline.py``, ``routing.py``) drives redis-py below its public command
API: it writes packed commands on a connection and reads the replies itself, keeps its own pools of
connections (redis-py's async cluster pool raises when all are busy instead of waiting), and asks the
``RedisCluster`` topology which node serves a slot. Those are redis-py internals, not its documented
API; they are used only through the functions here, so an upgrade of redis-py is checked in one module
(and pyproject.toml pins redis-py to the minor release the tests run).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from redis.asyncio import ConnectionPool, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError

Connection = AbstractConnection


class Server(NamedTuple):
    """One server of a cluster as redis-py knows it: its name and how to open a connection to it."""

    name: str
    connection_class: type[AbstractConnection]
    connection_kwargs: dict[str, Any]


# -- one connection ---------------------------------------------------------------------------------


async def ready(connection: Connection) -> None:
    """Connect ``connection``, or reconnect it when its server closed it (a restart) or it has unread
    bytes."""
    if not connection.is_connected:
        await connection.connect()  # type: ignore[no-untyped-call]
    elif await _stale(connection):
        await connection.disconnect(nowait=True)
        await connection.connect()  # type: ignore[no-untyped-call]


async def _stale(connection: Connection) -> bool:
    try:
        return bool(await connection.can_read())
    except RedisConnectionError:
        return True


# write and read hand back redis-py's own awaitables rather than wrapping them in a coroutine of their
# own: every script reply passes through read, and a coroutine frame more is half a microsecond each


def write(connection: Connection, payload: bytes) -> Awaitable[None]:
    """Send already packed RESP (``check_health``: an idle connection is PINGed first)."""
    return connection.send_packed_command(payload, check_health=True)


def read(connection: Connection) -> Awaitable[Any]:
    """The next reply; an error reply raises its ``ResponseError``."""
    return connection.read_response()


async def discard(connection: Connection) -> None:
    await connection.disconnect(nowait=True)


# -- one Redis --------------------------------------------------------------------------------------


def connection_factory(pool: ConnectionPool) -> tuple[str, Callable[[], Connection]]:
    """The server a pool's URL names, and how to open a new connection to it outside the pool."""
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        name = f"unix:{kwargs['path']}"
    else:
        name = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    return name, pool.make_connection


# -- a cluster's topology ---------------------------------------------------------------------------


def slot_owner(client: RedisCluster, key: str) -> Server:
    """The master serving ``key``'s hash slot in the topology redis-py holds."""
    return _server(client.nodes_manager.get_node_from_slot(key_slot(key.encode())))


def server_at(client: RedisCluster, host: str, port: int) -> Server:
    """The server at ``host:port`` (an ``ASK`` target), known to the topology or not yet."""
    manager = client.nodes_manager
    server = manager.get_node(host=host, port=port)
    if server is not None:
        return _server(server)
    any_server = next(iter(manager.nodes_cache.values()))
    kwargs = {**any_server.connection_kwargs, "host": host, "port": port}
    return Server(f"{host}:{port}", any_server.connection_class, kwargs)


def primaries(client: RedisCluster) -> list[Server]:
    return [_server(node) for node in client.get_primaries()]


async def follow_moved(client: RedisCluster, error: MovedError) -> None:
    """Record a ``MOVED`` reply's new slot owner in the topology."""
    await client.nodes_manager.move_slot(error)


async def reload_topology(client: RedisCluster) -> None:
    await client.nodes_manager.initialize()


def _server(node: Any) -> Server:
    return Server(node.name, node.connection_class, node.connection_kwargs)
