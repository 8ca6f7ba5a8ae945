"""The network tier's figures for ``bench/run.py``: webhook latency and MCP over TLS.

One ``relay serve`` with both listeners (loopback HTTP and the network listener over HTTPS, a
``trustme`` certificate) on the bench's Redis, and in the bench process an HTTPS webhook receiver on
loopback (``--webhook-allow-private``) that verifies every notification with ``standardwebhooks``.

- ``webhook_p99_ms``: 100 remote agents registered at the receiver; a host agent sends to them at 20
  envelopes/s offered, open loop (each send starts on its schedule, round robin over the agents,
  ``rounds`` x 100 sends); per envelope, the time from its scheduled start to the verified
  notification naming it. ``webhook_saturated_p99_ms``: the same with 8 senders back to back
  (``rounds`` passes over all agents), the send rate as high as the machine gives.
- ``webhook_step_<step>_ms``: the notifier's steps one at a time (target, claim, announce, release, a
  signed POST), p50: what folding its Redis round trips could save.
- ``mcp_tls_ratio``: MCP tool calls per second (8 concurrent JSON-RPC clients, each a cycle of
  ``SendAgentMessage`` to itself, ``FetchAgentInbox``, ``AcknowledgeAgentInbox``) over the network
  listener's TLS, divided by the same on the plain loopback listener; interleaved rounds, medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import trustme
import uvicorn
from standardwebhooks import Webhook

from broker.front.key_file import load_key_file
from broker.front.tokens import NETWORK_AUDIENCE, agent_headers
from broker.testing.polling import eventually

ROOT = Path(__file__).resolve().parents[1]
AGENTS = 100
CONCURRENCY = 8
RATE = 20
"""Envelopes per second offered to the remote agents in ``webhook_p99_ms``'s phase."""
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2025-11-25",
}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class _Receiver:
    def __init__(self) -> None:
        self.secrets: dict[str, str] = {}
        self.arrived: dict[str, float] = {}
        self.failures = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        now = time.perf_counter()
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        try:
            agent = json.loads(body)["data"]["agent"]
            data = Webhook(self.secrets[agent]).verify(body, headers)
            for envelope in data["data"]["envelopes"]:
                self.arrived.setdefault(envelope["id"], now)
        except Exception:
            self.failures += 1
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def _serving(app: Any, port: int, cert: Path, key: Path) -> AsyncIterator[None]:
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, ssl_certfile=str(cert), ssl_keyfile=str(key),
        log_config=None, access_log=False, lifespan="off",
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            raise RuntimeError("the webhook receiver did not start")
        await asyncio.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        server.force_exit = True
        await task


def _start(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, cwd=ROOT)


async def _call(http: httpx2.AsyncClient, url: str, headers: dict[str, str], name: str, args: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}
    reply = await http.post(url, content=json.dumps(body), headers={**HEADERS, **headers})
    result = reply.json()["result"]
    if result.get("isError"):
        raise RuntimeError(f"{name} failed: {result}")
    return result["structuredContent"]


async def network_phases(redis_url: str, tmp: Path, rounds: int, duration: float) -> dict[str, Any]:
    """Run both phases against a fresh ``relay serve``; returns the figures."""
    ca = trustme.CA()
    issued = ca.issue_cert("localhost", "127.0.0.1")
    cert, key, ca_file = tmp / "net-cert.pem", tmp / "net-key.pem", tmp / "net-ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    key_file = tmp / "relay.key"
    if not key_file.exists():
        from broker.front.tokens import generate_key

        key_file.write_text(generate_key() + "\n")
        key_file.chmod(0o600)
    port, network_port = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "relay", "serve", "--redis-url", redis_url, "--port", str(port)]
    cmd += ["--agent-mcp-key-file", str(key_file), "--log-level", "warning", "--network-host", "127.0.0.1"]
    cmd += ["--network-port", str(network_port), "--tls-cert", str(cert), "--tls-key", str(key)]
    cmd += ["--webhook-allow-private", "--webhook-ca-file", str(ca_file)]
    proc = _start(cmd)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    keyring = load_key_file(key_file)
    plain_url = f"http://127.0.0.1:{port}/mcp/agent"
    tls_url = f"https://127.0.0.1:{network_port}/mcp/agent"
    limits = httpx2.Limits(max_connections=CONCURRENCY * 2)
    try:
        async with (
            httpx2.AsyncClient(timeout=30, limits=limits) as plain,
            httpx2.AsyncClient(timeout=30, verify=context, limits=limits) as tls,
        ):
            for _ in range(600):
                with contextlib.suppress(httpx2.HTTPError):
                    if (await plain.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                        with contextlib.suppress(httpx2.HTTPError):
                            await tls.get(f"https://127.0.0.1:{network_port}/healthz")
                            break
                await asyncio.sleep(0.05)
            figures = await _webhooks(redis_url, keyring, plain, plain_url, tls, tls_url, cert, key, rounds)
            figures.update(await _tls_ratio(keyring, plain, plain_url, tls, tls_url, rounds, duration))
            return figures
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _webhooks(
    redis_url: str,
    keyring: Any,
    plain: Any,
    plain_url: str,
    tls: Any,
    tls_url: str,
    cert: Path,
    key: Path,
    rounds: int,
) -> dict[str, Any]:
    receiver, port = _Receiver(), _free_port()
    hook = f"https://127.0.0.1:{port}/hook"
    run = f"{time.time_ns() % 10**9}"
    agents = [f"wh{run}-{i}" for i in range(AGENTS)]
    async with _serving(receiver, port, cert, key):
        for agent in agents:
            headers = agent_headers(keyring, agent, "s1", 3600, audience=NETWORK_AUDIENCE)
            address = {"provider": "remote", "endpoint": hook}
            reg = await _call(tls, tls_url, headers, "RegisterAgentAddress", address)
            receiver.secrets[agent] = reg["webhook_secret"]
        sender = agent_headers(keyring, f"whsend{run}", "s1", 3600)
        register = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
        await _call(plain, plain_url, sender, "RegisterAgentAddress", register)
        paced = await _paced(plain, plain_url, sender, agents, receiver, rounds * AGENTS)
        saturated = await _saturated(plain, plain_url, sender, agents, receiver, rounds)
        steps = await _notifier_steps(redis_url, agents[0], tls, hook)
    figures = {f"webhook_{k}": v for k, v in paced.items()}
    figures |= {f"webhook_saturated_{k}": v for k, v in saturated.items() if k != "after_send_p99_ms"}
    figures["webhook_missing"] = figures.pop("webhook_missing") + figures.pop("webhook_saturated_missing")
    return figures | steps


STEP_SAMPLES = 200


async def _notifier_steps(redis_url: str, agent: str, http: Any, hook: str) -> dict[str, Any]:
    """What each step of one notification takes, one at a time from the bench process on the same
    Redis as ``relay serve`` (its default prefix): the notifier's three Redis calls around the
    announcement (``target``, ``claim``, ``release``), the announcement (a notice read with nothing
    new), and, after them (the receiver shares the bench's event loop), a signed POST to the receiver
    on the kept-alive HTTPS connection; p50 in ms."""
    from adapters.redis import RedisConnection, RedisSettings
    from adapters.redis.notice import RedisNoticeStore
    from adapters.redis.webhooks import RedisWebhooks
    from broker.webhooks import announce

    connection = RedisConnection(RedisSettings(url=redis_url))
    await connection.open()
    try:
        webhooks, notices = RedisWebhooks(connection), RedisNoticeStore(connection)
        target = await webhooks.target(agent)
        assert target is not None
        timings: dict[str, list[float]] = {k: [] for k in ("target", "claim", "announce", "release", "post")}
        body = json.dumps({"type": "bench", "data": {"agent": agent, "envelopes": []}})
        signer = Webhook(target.secret)
        for _ in range(STEP_SAMPLES):
            t0 = time.perf_counter()
            await webhooks.target(agent)
            t1 = time.perf_counter()
            assert await webhooks.claim(agent, "bench", 60)
            t2 = time.perf_counter()
            await announce(notices, target)
            t3 = time.perf_counter()
            await webhooks.release(agent, "bench")
            t4 = time.perf_counter()
            stamp = datetime.now(UTC)
            headers = {"webhook-id": "msg_bench", "webhook-timestamp": str(int(stamp.timestamp()))}
            headers["webhook-signature"] = signer.sign("msg_bench", stamp, body)
            t5 = time.perf_counter()
            await http.post(hook, content=body.encode(), headers=headers)
            t6 = time.perf_counter()
            marks = {"target": (t0, t1), "claim": (t1, t2), "announce": (t2, t3), "release": (t3, t4)}
            for name, (a, b) in (marks | {"post": (t5, t6)}).items():
                timings[name].append((b - a) * 1000)
    finally:
        await connection.close()
    p50 = {name: _percentile(values, 0.5) for name, values in timings.items()}
    print(
        "webhook notifier steps, p50 ms, one at a time: "
        + ", ".join(f"{name} {value:.2f}" for name, value in p50.items())
        + f"; Redis round trips around the announcement {p50['target'] + p50['claim'] + p50['release']:.2f}",
        flush=True,
    )
    return {f"webhook_step_{name}_ms": round(value, 2) for name, value in p50.items()}


async def _paced(
    http: Any, url: str, sender: dict[str, str], agents: list[str], receiver: _Receiver, count: int
) -> dict[str, Any]:
    """``count`` sends offered at ``RATE`` per second, open loop (each starts on its schedule, whether
    or not the ones before it were answered), round robin over ``agents``; latency from the schedule."""
    started: dict[str, float] = {}
    answered: dict[str, float] = {}
    t0 = time.perf_counter() + 0.05

    async def one(agent: str, scheduled: float) -> None:
        message = {"to": agent, "message": {"kind": 1, "text": "ping"}}
        sent = await _call(http, url, sender, "SendAgentMessage", message)
        started[sent["id"]], answered[sent["id"]] = scheduled, time.perf_counter()

    tasks = []
    for k in range(count):
        scheduled = t0 + k / RATE
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        tasks.append(asyncio.create_task(one(agents[k % len(agents)], scheduled)))
    await asyncio.gather(*tasks)
    return await _latencies(f"{RATE} envelopes/s offered (open loop)", started, answered, receiver)


async def _saturated(
    http: Any, url: str, sender: dict[str, str], agents: list[str], receiver: _Receiver, rounds: int
) -> dict[str, Any]:
    """``CONCURRENCY`` senders back to back (``rounds`` passes over ``agents``): as fast as it goes."""
    started: dict[str, float] = {}
    answered: dict[str, float] = {}
    queue: asyncio.Queue[str] = asyncio.Queue()
    for _ in range(rounds):
        for agent in agents:
            queue.put_nowait(agent)

    async def sending() -> None:
        while not queue.empty():
            agent = queue.get_nowait()
            began = time.perf_counter()
            message = {"to": agent, "message": {"kind": 1, "text": "ping"}}
            sent = await _call(http, url, sender, "SendAgentMessage", message)
            started[sent["id"]], answered[sent["id"]] = began, time.perf_counter()

    began = time.perf_counter()
    await asyncio.gather(*(sending() for _ in range(CONCURRENCY)))
    rate = len(started) / (time.perf_counter() - began)
    return await _latencies(f"saturated, {CONCURRENCY} senders, {rate:.0f}/s", started, answered, receiver)


async def _latencies(
    what: str, started: dict[str, float], answered: dict[str, float], receiver: _Receiver
) -> dict[str, Any]:
    with contextlib.suppress(AssertionError):  # what never arrives is reported as missing
        await eventually(lambda: started.keys() <= receiver.arrived.keys(), 30, "notifications")
    latencies = [(receiver.arrived[i] - t) * 1000 for i, t in started.items() if i in receiver.arrived]
    after = [(receiver.arrived[i] - t) * 1000 for i, t in answered.items() if i in receiver.arrived]
    sends = [(answered[i] - t) * 1000 for i, t in started.items()]
    print(
        f"webhooks, {what}: {len(started)} sends to {AGENTS} remote agents, {len(latencies)} announced in a "
        f"verified notification; send -> notification p50 {_percentile(latencies, 0.5):.1f} ms, p99 "
        f"{_percentile(latencies, 0.99):.1f} ms (the send call itself p50 {_percentile(sends, 0.5):.1f} ms; "
        f"from its answer to the notification p50 {_percentile(after, 0.5):.1f} ms, p99 "
        f"{_percentile(after, 0.99):.1f} ms); {receiver.failures} failed verification",
        flush=True,
    )
    return {
        "p50_ms": round(_percentile(latencies, 0.5), 1),
        "p99_ms": round(_percentile(latencies, 0.99), 1),
        "after_send_p99_ms": round(_percentile(after, 0.99), 1),
        "missing": len(started) - len(latencies),
    }


async def _tls_ratio(
    keyring: Any, plain: Any, plain_url: str, tls: Any, tls_url: str, rounds: int, duration: float
) -> dict[str, Any]:
    run = f"{time.time_ns() % 10**9}"

    async def setup(network: bool) -> list[dict[str, str]]:
        found = []
        for k in range(CONCURRENCY):
            agent = f"{'tls' if network else 'plain'}{run}-{k}"
            if network:
                headers = agent_headers(keyring, agent, "s1", 3600, audience=NETWORK_AUDIENCE)
                address = {"provider": "remote", "endpoint": "agents.example.net:443"}
                await _call(tls, tls_url, headers, "RegisterAgentAddress", address)
            else:
                headers = agent_headers(keyring, agent, "s1", 3600)
                address = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}
                await _call(plain, plain_url, headers, "RegisterAgentAddress", address)
            found.append(headers)
        return found

    async def phase(http: Any, url: str, agents: list[dict[str, str]]) -> float:
        calls = 0
        end = time.perf_counter() + duration

        async def loop(headers: dict[str, str]) -> None:
            nonlocal calls
            me = headers["X-CSF-Agent-ID"]
            while time.perf_counter() < end:
                message = {"to": me, "message": {"kind": 1, "text": "x"}}
                await _call(http, url, headers, "SendAgentMessage", message)
                got = await _call(http, url, headers, "FetchAgentInbox", {"limit": 16})
                ids = [e["id"] for e in got["envelopes"]]
                await _call(http, url, headers, "AcknowledgeAgentInbox", {"ids": ids})
                calls += 3

        began = time.perf_counter()
        await asyncio.gather(*(loop(h) for h in agents))
        return calls / (time.perf_counter() - began)

    plain_agents, tls_agents = await setup(False), await setup(True)
    plain_rates, tls_rates = [], []
    for _ in range(rounds):
        plain_rates.append(await phase(plain, plain_url, plain_agents))
        tls_rates.append(await phase(tls, tls_url, tls_agents))
    plain_rate, tls_rate = statistics.median(plain_rates), statistics.median(tls_rates)
    print(
        f"MCP over TLS (network listener): {tls_rate:.0f} calls/s vs plain loopback {plain_rate:.0f} "
        f"calls/s, {CONCURRENCY} clients, ratio {tls_rate / plain_rate:.2f}",
        flush=True,
    )
    return {
        "mcp_tls_calls_per_s": round(tls_rate),
        "mcp_plain_calls_per_s": round(plain_rate),
        "mcp_tls_ratio": round(tls_rate / plain_rate, 2),
    }
