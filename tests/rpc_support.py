"""The real app for synchronous tests: ``ThreadedFront`` runs ``running_front`` on its own event loop in
a thread, and plain JSON-RPC helpers post to it and check that every answer is clean (the hostile-input
and property tests use them with synchronous clients and hypothesis).
"""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from typing import Any

import httpx2

from broker.front.tokens import KeyRing
from tests.front_support import Front, running_front
from tests.processes import MCP_HEADERS, REGISTER
from tests.support import unique_prefix

CLEAN_STATUSES = frozenset({200, 202, 400, 401, 403, 404, 405, 406, 409, 413, 415, 421, 422, 429})

HOSTILE_IDS = [
    "a:b",
    "relay:inbox:{bob}",
    "*",
    "bob*",
    "{bob}",
    "}{",
    "bob alice",
    " bob",
    "bob\n",
    "bob\r\nX-Injected: 1",
    "bob\x00",
    "ålice",
    "\u0431\u043e\u0431",
    "😀",
    "BOB",
    "-bob",
    ".",
    "",
    "a" * 65,
    "a" * 100_000,
    "env_*",
    "env_0000000000000000000000000*",
    "env_{0000000000000000000000000}",
    "env_ 000000000000000000000000",
    "env_00000000000000000000000000\n",
    "env_ÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅÅ",
    "env_0000000000000000000000000i",
]


class ThreadedFront:
    """``running_front`` on its own event loop in a daemon thread, for synchronous tests."""

    def __init__(self, redis_url: str, *, prefix: str | None = None, max_body_bytes: int = 262144) -> None:
        self.redis_url = redis_url
        self.prefix = prefix or unique_prefix()
        self.max_body_bytes = max_body_bytes
        self._front: Front | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="threaded-front", daemon=True)

    @property
    def front(self) -> Front:
        assert self._front is not None
        return self._front

    @property
    def url(self) -> str:
        return self.front.url

    @property
    def base(self) -> str:
        return self.front.base

    @property
    def keyring(self) -> KeyRing:
        return self.front.keyring

    def headers(self, agent: str, session: str) -> dict[str, str]:
        return {**MCP_HEADERS, **self.front.headers(agent, session)}

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by __enter__
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with running_front(
            self.redis_url, prefix=self.prefix, max_body_bytes=self.max_body_bytes
        ) as front:
            self._front = front
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ThreadedFront:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the threaded front did not start within 30 s")
        if self._error is not None:
            raise RuntimeError("the threaded front failed to start") from self._error
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._thread.is_alive():  # a daemon thread: it ends with the test run; say so, do not fail
            warnings.warn("the threaded front did not stop within 30 s", RuntimeWarning, stacklevel=2)


def clean(response: httpx2.Response) -> dict[str, Any] | None:
    """Assert ``response`` is a clean answer; return its JSON body (None when it has none)."""
    text = response.text
    assert response.status_code in CLEAN_STATUSES, (response.status_code, text[:500])
    assert "Traceback" not in text and 'File "' not in text, text[:2000]
    if not response.content:
        return None
    kind = response.headers.get("content-type", "")
    if not kind.startswith("application/json"):
        # The SDK answers a few transport refusals (content type, DNS rebinding) in plain text.
        assert response.status_code in (400, 403, 406, 413, 415, 421), (response.status_code, text[:500])
        return None
    body = json.loads(text)
    assert isinstance(body, dict) and body.get("jsonrpc") == "2.0", text[:500]
    assert ("result" in body) != ("error" in body), text[:500]
    if "error" in body:
        assert isinstance(body["error"].get("code"), int) and isinstance(body["error"].get("message"), str)
    return body


def tool_outcome(body: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """``("ok", structured)`` for a successful tool result, ``("refused", error)`` for a tool error,
    ``("rpc", {})`` for anything else (JSON-RPC error, non-tool result, no body)."""
    if body is None or "result" not in body or "content" not in body["result"]:
        return "rpc", {}
    result = body["result"]
    if not result.get("isError"):
        return "ok", dict(result.get("structuredContent") or {})
    text = result["content"][0]["text"]
    error = json.loads(text)["error"]  # every refusal is structured, argument checks included
    assert isinstance(error["code"], str) and isinstance(error["retryable"], bool), text
    return "refused", dict(error)


def rpc(method: str, params: Any = None, ident: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
    if params is not None:
        body["params"] = params
    return body


def call(name: str, arguments: Any) -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": arguments})


def encode(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")


def register(http: httpx2.Client, threaded: ThreadedFront, agent: str, session: str) -> dict[str, str]:
    headers = threaded.headers(agent, session)
    body = clean(
        http.post(threaded.url, content=encode(call("RegisterAgentAddress", REGISTER)), headers=headers)
    )
    assert tool_outcome(body)[0] == "ok", body
    return headers
