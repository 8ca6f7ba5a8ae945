"""Redis client candidates side by side, in one run on one machine (docs/performance.md).

    python bench/clients.py            # one Redis, then a local 3-master cluster (about 2 minutes)

Per message, every candidate runs relay's own four script calls with relay's keys and arguments
(``send_check`` on the sender's slot, ``send_append``, ``fetch`` and ``ack`` on the recipient's), one
message at a time, at concurrency 1 and 16 (each concurrent loop its own sender/recipient pair). The
baseline is raw redis-py's ``XADD`` -> ``XREADGROUP`` -> ``XACK`` on the same server. Candidates:

- ``redis-py``: ``Redis``/``RedisCluster.fcall``, one command per call (its pools, its routing);
- ``relay``: relay's stack (redis-py connections and topology, auto-pipelined per node:
  ``adapters/redis/pipeline.py``);
- ``glide``: ``valkey-glide`` ``GlideClient``/``GlideClusterClient.invoke_script``;
- ``coredis``: ``coredis`` ``Redis``/``RedisCluster.fcall``.

glide and coredis are not relay dependencies: install them to measure them (``pip install
valkey-glide coredis``); a missing one is reported as such. The last line starts with ``clients-bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis, RedisCluster

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from adapters.redis import RedisConnection, RedisSettings  # noqa: E402
from adapters.redis.embedded import EmbeddedRedis  # noqa: E402
from adapters.redis.inbox import DAY_MS, retained_until  # noqa: E402
from adapters.redis.keys import GROUP, Keys  # noqa: E402
from adapters.redis.protocol import SendAppended, SendChecked, send_call, with_tier  # noqa: E402
from adapters.redis.protocol_inbox import Fetch, HistoryRule, ack_call, fetch_call  # noqa: E402
from adapters.redis.protocol_operator import register_call  # noqa: E402
from adapters.redis.scripts import Script, Scripts  # noqa: E402
from broker.addresses import ClaudeCodeAddress  # noqa: E402
from broker.envelope import now_ms  # noqa: E402
from broker.ids import new_nonce  # noqa: E402
from broker.ports import SendOptions  # noqa: E402
from tests.cluster_support import LocalCluster  # noqa: E402

Run = Callable[[Script, list[str], list[str | int]], Awaitable[Any]]
TEXT = "x" * 300
BODY = {"kind": "note", "text": TEXT}


async def cpu_of(urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        client = Redis.from_url(url, decode_responses=True)
        info = await client.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        await client.aclose()
    return total


async def measure(
    loop: Callable[[int, float], Awaitable[int]], concurrency: int, seconds: float, urls: list[str]
) -> tuple[float, float, float]:
    """(msgs/s, client CPU µs/msg, Redis CPU µs/msg, all masters) of ``loop`` run ``concurrency`` times."""
    redis0, cpu0 = await cpu_of(urls), time.process_time()
    start = time.perf_counter()
    counts = await asyncio.gather(*(loop(k, start + seconds) for k in range(concurrency)))
    elapsed = time.perf_counter() - start
    n = max(1, sum(counts))
    return n / elapsed, (time.process_time() - cpu0) / n * 1e6, (await cpu_of(urls) - redis0) / n * 1e6


async def raw(
    url: str, cluster: bool, concurrency: int, seconds: float, urls: list[str]
) -> tuple[float, float, float]:
    client: Redis | RedisCluster = (
        RedisCluster.from_url(url, decode_responses=True)
        if cluster
        else Redis.from_url(url, decode_responses=True)
    )
    tag = secrets.token_hex(3)
    keys = [f"raw:{tag}:inbox:{{agent{k}}}" for k in range(concurrency)]
    for key in keys:
        await client.xgroup_create(key, GROUP, id="0", mkstream=True)

    async def loop(k: int, deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            await client.xadd(keys[k], {"body": TEXT})
            reply = await client.xreadgroup(GROUP, f"agent{k}", {keys[k]: ">"}, count=1)
            entries = reply[keys[k]][0] if isinstance(reply, dict) else reply[0][1]
            await client.xack(keys[k], GROUP, entries[0][0])
            n += 1
        return n

    try:
        return await measure(loop, concurrency, seconds, urls)
    finally:
        await client.delete(*keys)
        await client.aclose()


async def scripted(
    run: Run, scripts: Scripts, concurrency: int, seconds: float, urls: list[str]
) -> tuple[float, float, float]:
    keys = Keys(f"cb{secrets.token_hex(3)}")
    settings = RedisSettings(url=urls[0], prefix=keys.prefix)  # relay serve's defaults
    address = ClaudeCodeAddress.parse("127.0.0.1:1")
    for k in range(concurrency):
        for agent in (f"s{k}", f"r{k}"):
            call = register_call(keys, agent, address, "s", now=now_ms())
            await run(scripts.register, call.keys, call.args)

    async def loop(k: int, deadline: float) -> int:
        """relay's own calls for one message, built by its codecs (adapters/redis/protocol*.py)."""
        sender, to = f"s{k}", f"r{k}"
        n = 0
        while time.perf_counter() < deadline:
            now = now_ms()
            day = now // DAY_MS
            until = retained_until(day, settings.status_retention_ms)
            send = send_call(
                keys,
                settings,
                sender,
                to,
                BODY,
                sent_at_ms=now,
                session="s",
                options=SendOptions(),
                nonce=new_nonce(),
                day=day,
                index_until=until,
            )
            checked = SendChecked.read(await run(scripts.send_check, send.check.keys, send.check.args))
            append = with_tier(send.append, checked.tier, checked.provider)
            appended = SendAppended.read(await run(scripts.send_append, append.keys, append.args))
            outcomes = keys.outcomes(to, day)
            keep = HistoryRule.of(settings)
            fetch = fetch_call(
                keys, to, "s", 1, now=now, max_deliveries=0, outcomes=outcomes, until=until, keep=keep
            )
            Fetch.read(await run(scripts.fetch, fetch.keys, fetch.args))
            entry = (appended.stream_id, appended.nonce)
            ack = ack_call(keys, to, "s", [entry], outcomes=outcomes, until=until, keep=keep)
            await run(scripts.ack, ack.keys, ack.args)
            n += 1
        return n

    return await measure(loop, concurrency, seconds, urls)


@contextlib.asynccontextmanager
async def candidate(name: str, url: str, cluster: bool, scripts: Scripts) -> AsyncIterator[Run | str]:
    """``run(script, keys, args)`` for a candidate, or why it cannot run."""
    library = scripts.library
    if name == "relay":
        connection = RedisConnection(RedisSettings(url=url))
        await connection.open()

        async def via_relay(script: Script, keys: list[str], args: list[str | int]) -> Any:
            return await connection.script(script, keys, args, idempotent=False)

        try:
            yield via_relay
        finally:
            await connection.close()
    elif name == "redis-py":
        client: Redis | RedisCluster = (
            RedisCluster.from_url(url, decode_responses=True)
            if cluster
            else Redis.from_url(url, decode_responses=True)
        )
        if isinstance(client, RedisCluster):
            await client.initialize()
            for node in client.get_primaries():
                await node.execute_command("FUNCTION", "LOAD", "REPLACE", library.source)
        else:
            await client.function_load(library.source, replace=True)

        async def via_redis_py(script: Script, keys: list[str], args: list[str | int]) -> Any:
            return await client.fcall(script.function, len(keys), *keys, *args)  # type: ignore[misc]

        try:
            yield via_redis_py
        finally:
            await client.aclose()
    elif name == "glide":
        try:
            import glide
        except ImportError:
            yield "not installed (pip install valkey-glide)"
            return
        host, port = url.removeprefix("redis://").split("/")[0].split(":")
        address = [glide.NodeAddress(host, int(port))]
        gclient: Any = await (
            glide.GlideClusterClient.create(glide.GlideClusterClientConfiguration(address))
            if cluster
            else glide.GlideClient.create(glide.GlideClientConfiguration(address))
        )
        await gclient.function_load(library.source, replace=True)

        async def via_glide(script: Script, keys: list[str], args: list[str | int]) -> Any:
            return _decoded(await gclient.fcall(script.function, keys, [str(a) for a in args]))

        try:
            yield via_glide
        finally:
            await gclient.close()
    elif name == "coredis":
        try:
            import coredis
        except ImportError:
            yield "not installed (pip install coredis)"
            return
        host, port = url.removeprefix("redis://").split("/")[0].split(":")
        cclient: Any = (
            coredis.RedisCluster(host, int(port), decode_responses=True)
            if cluster
            else coredis.Redis(host, int(port), decode_responses=True)
        )
        async with cclient:
            await cclient.function_load(library.source, replace=True)

            async def via_coredis(script: Script, keys: list[str], args: list[str | int]) -> Any:
                return await cclient.fcall(script.function, keys, args)

            yield via_coredis


def _decoded(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


def row(label: str, c: int, what: str, rate: float, cpu: float, redis_cpu: float) -> str:
    return (
        f"{label} c{c:<2} {what:<34} {rate:8.0f} msg/s  client {cpu:4.0f} µs/msg  "
        f"redis {redis_cpu:4.0f} µs/msg"
    )


async def main(args: argparse.Namespace) -> int:
    scripts = Scripts()
    figures: dict[str, float] = {}
    setups: list[tuple[str, bool]] = [("single", False)] + ([] if args.skip_cluster else [("cluster", True)])
    for label, cluster in setups:
        if cluster:
            local = LocalCluster(masters=3, replicas=0)
            local.start()
            url, urls, stop = local.url, local.urls, local.stop
        else:
            server = EmbeddedRedis()
            server.start()
            url, urls, stop = server.url, [server.url], server.stop
        try:
            print(f"# {label}: {url}", flush=True)
            for c in (1, 16):
                base, base_cpu, base_redis = await raw(url, cluster, c, args.seconds, urls)
                print(
                    row(label, c, "raw redis-py XADD/XREADGROUP/XACK", base, base_cpu, base_redis), flush=True
                )
                for name in ("redis-py", "relay", "glide", "coredis"):
                    async with candidate(name, url, cluster, scripts) as run:
                        if isinstance(run, str):
                            print(f"{label} c{c:<2} {name:<9} {run}", flush=True)
                            continue
                        rate, cpu, redis_cpu = await scripted(run, scripts, c, args.seconds, urls)
                    figures[f"{label}_c{c}_{name}_ratio"] = round(rate / base, 2)
                    what = f"{name:<9} relay's 4 scripts"
                    print(row(label, c, what, rate, cpu, redis_cpu) + f"  x{rate / base:.2f} raw", flush=True)
        finally:
            stop()
    print("clients-bench " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement (default 3)")
    parser.add_argument("--skip-cluster", action="store_true", help="only the single Redis")
    import uvloop

    sys.exit(uvloop.run(main(parser.parse_args())))
