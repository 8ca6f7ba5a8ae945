"""What a per-agent credential costs: the exchange at ``POST /agent/token`` and the revocation check.

Called from ``bench/run.py`` (``credential_figures``); runnable alone too::

    python bench/credentials.py [--samples 300]

One ``relay serve`` worker on the bench's Redis. The bench issues a credential in the store (as
``relay credentials issue`` does), then, one request at a time on one kept-alive connection:

- ``token_exchange_ms_p50`` / ``_p99``: ``POST /agent/token`` answered (the store read, the secret's
  hash compared, a token signed, ``last_used_at`` written);
- ``call_credential_ms_p50`` and ``call_key_ms_p50``: a ``FetchAgentInbox`` call with a token exchanged
  for the credential (its revocation checked against the store at most every 5 s per worker) and with a
  token minted from the signing key, interleaved: what the revocation check adds to a call;
- ``hook_headers_ms_p50``: ``relay hook headers --credential-file`` as Claude Code runs it (a new
  process each time: interpreter start, the file read, the exchange).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx2

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from adapters.redis import RedisConnection, RedisSettings  # noqa: E402
from adapters.redis.credentials import RedisCredentials  # noqa: E402
from broker.credentials import new_credential  # noqa: E402
from broker.front.key_file import load_key_file  # noqa: E402
from broker.front.tokens import agent_headers, generate_key  # noqa: E402

MCP = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
HOOK_SAMPLES = 5
HOOK_COMMAND = (sys.executable, "-m", "relay", "hook", "headers", "--credential-file")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _serve(redis_url: str, key_file: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "relay", "serve", "--redis-url", redis_url, "--port", str(port)]
    cmd += ["--agent-mcp-key-file", str(key_file), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"relay serve exited with {proc.returncode}")
        if _ready(port):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("relay serve not ready after 60 s")


def _call_body(n: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {"name": "FetchAgentInbox", "arguments": {}},
    }


async def credential_figures(redis_url: str, *, samples: int = 300) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="relay-credentials-"))
    key_file = tmp / "relay.key"
    key_file.write_text(generate_key() + "\n")
    key_file.chmod(0o600)
    port = _free_port()
    proc = await asyncio.to_thread(_serve, redis_url, key_file, port)
    base = f"http://127.0.0.1:{port}"
    agent = f"bench-cred-{secrets.token_hex(3)}"
    connection = RedisConnection(RedisSettings(url=redis_url))
    try:
        record, text = new_credential(agent, now_ms=int(time.time() * 1000), label="bench")
        await RedisCredentials(connection).add(record)
        exchange_ms: list[float] = []
        async with httpx2.AsyncClient(base_url=base, timeout=30) as http:
            body = {"agent": agent, "session": "s1"}
            auth = {"authorization": f"Bearer {text}"}
            for _ in range(samples):
                started = time.perf_counter()
                answer = await http.post("/agent/token", json=body, headers=auth)
                exchange_ms.append((time.perf_counter() - started) * 1000)
                if answer.status_code != 200:
                    raise RuntimeError(f"exchange refused: {answer.text}")
            exchanged = answer.json()["headers"]
            minted = agent_headers(load_key_file(key_file), agent, "s1", 3600)
            register = {**_call_body(0)}
            register["params"] = {
                "name": "RegisterAgentAddress",
                "arguments": {"provider": "claudecode", "endpoint": "127.0.0.1:14111"},
            }
            await http.post("/mcp/agent", json=register, headers={**MCP, **exchanged})
            by_credential: list[float] = []
            by_key: list[float] = []
            for n in range(samples):
                for headers, into in ((exchanged, by_credential), (minted, by_key)):
                    started = time.perf_counter()
                    answer = await http.post("/mcp/agent", json=_call_body(n), headers={**MCP, **headers})
                    into.append((time.perf_counter() - started) * 1000)
                    if answer.status_code != 200 or answer.json()["result"].get("isError"):
                        raise RuntimeError(f"call refused: {answer.text}")
        credential_file = tmp / "credential"
        credential_file.write_text(
            json.dumps({"url": f"{base}/mcp/agent", "agent": agent, "credential": text})
        )
        credential_file.chmod(0o600)
        hook_ms: list[float] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        for _ in range(HOOK_SAMPLES):
            started = time.perf_counter()
            done = await asyncio.to_thread(
                subprocess.run,
                [*HOOK_COMMAND, str(credential_file), "--session", "s1"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                timeout=60,
                check=False,
            )
            hook_ms.append((time.perf_counter() - started) * 1000)
            if done.returncode != 0:
                raise RuntimeError(f"relay hook headers failed: {done.stderr!r}")
    finally:
        await connection.close()
        proc.terminate()
        proc.wait(30)
    figures = {
        "token_exchange_ms_p50": round(_percentile(exchange_ms, 50), 2),
        "token_exchange_ms_p99": round(_percentile(exchange_ms, 99), 2),
        "call_credential_ms_p50": round(_percentile(by_credential, 50), 2),
        "call_key_ms_p50": round(_percentile(by_key, 50), 2),
        "hook_headers_ms_p50": round(_percentile(hook_ms, 50)),
    }
    print(
        f"credentials: POST /agent/token p50 {figures['token_exchange_ms_p50']} ms, p99 "
        f"{figures['token_exchange_ms_p99']} ms ({samples} exchanges); FetchAgentInbox p50 "
        f"{figures['call_credential_ms_p50']} ms with an exchanged token, {figures['call_key_ms_p50']} ms "
        f"with a key-minted one; `relay hook headers` p50 {figures['hook_headers_ms_p50']} ms "
        f"({HOOK_SAMPLES} runs)",
        flush=True,
    )
    return figures


def main() -> int:
    from adapters.redis.embedded import EmbeddedRedis

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="relay-credentials-redis-"))
    server = EmbeddedRedis(tmp, appendfsync="everysec")
    server.start()
    try:
        print(json.dumps(asyncio.run(credential_figures(server.url, samples=args.samples))))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
