"""The two calls Claude Code's hooks make to relay over HTTP (stdlib only: a hook starts fast).

- ``wait``: ``POST {base}/agent/wait`` with the agent headers and ``{"timeout_ms": N}``. relay answers
  when the agent has envelopes it was not yet told about (or a reminder falls due), or when the
  timeout passes, with ``{"count", "unacknowledged", "reminder", "envelopes": [{"id", "from", "kind",
  "preview", "sent_at"}, ...]}`` (``count`` 0 on timeout). It never acknowledges or counts a delivery.
- ``leave``: ``POST {base}/agent/leave`` with the agent headers: the session ended (the Claude Code
  process exited), so ``ListAgents`` and ``relay agents`` say ``gone`` at once.
- ``register``: the ``RegisterAgentAddress`` MCP tool as one stateless ``tools/call`` POST, so a new
  Claude Code session becomes the agent's current session before its model calls anything.
- ``call_tool``: any agent tool the same way (the shell's ``relay send`` and ``relay read --ack``).
- ``exchange``: ``POST {base}/agent/token`` with a per-agent credential, for the short-lived token and
  the three headers (``broker.front.token_route``); a refusal names relay's ``cause`` (``revoked``,
  ``wrong_agent``, ...) and message.

Outcomes are three: an answer; ``Refused`` (relay said no for good: 4xx, a tool error; the caller stops
quietly); ``Unavailable`` (relay down, slow, 5xx or a garbled answer; the caller retries later).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker.front.paths import LEAVE_PATH, WAIT_PATH

__all__ = [
    "LEAVE_PATH",
    "WAIT_PATH",
    "Pending",
    "Refused",
    "Unavailable",
    "exchange",
    "leave",
    "register",
    "wait",
]
MAX_ANSWER_BYTES: Final = 1024 * 1024
_MCP_HEADERS: Final = {
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer (a refusal), never followed: the request carries a bearer token."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# no redirects, and no proxy from the environment: the token goes to the URL setup wrote, nowhere else
_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects)


class Refused(Exception):
    """relay refused the call for good (wrong credentials, superseded session, bad request)."""

    def __init__(self, status: int, code: str, message: str = "") -> None:
        super().__init__(message or f"relay refused the call: HTTP {status} {code}".strip())
        self.status = status
        self.code = code
        self.message = message


class Unavailable(Exception):
    """relay could not answer now (down, too slow, 5xx, or an answer that is not what it sends)."""


@dataclass(frozen=True, slots=True)
class Pending:
    """The wait's answer: ``count`` envelopes announced (0: the timeout passed), and the whole answer
    (``envelopes``, the first few; ``unacknowledged``; ``reminder``)."""

    count: int
    answer: dict[str, Any]


def _post(
    url: str, headers: Mapping[str, str], body: Mapping[str, Any], timeout: float, *, detailed: bool = False
) -> Any:
    request = urllib.request.Request(  # noqa: S310 - the URL was checked to be http(s) by the CLI
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            raw = response.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code in (408, 429):
            raise Unavailable(f"relay answered HTTP {exc.code}") from None
        if detailed:
            raise _detailed(exc) from None
        raise Refused(exc.code, _error_code(exc)) from None
    except (OSError, ValueError) as exc:  # connection refused or reset, timeouts, bad status lines
        raise Unavailable(f"relay did not answer: {exc}") from None
    if len(raw) > MAX_ANSWER_BYTES:
        raise Unavailable("relay's answer is larger than any it sends")
    try:
        return json.loads(raw)
    except ValueError:
        raise Unavailable("relay's answer is not JSON") from None


def _error_code(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(64 * 1024))
    except (OSError, ValueError):
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if code is None and isinstance(error, dict):
        code = error.get("message")
    return code if isinstance(code, str) and code.isidentifier() else ""


def _detailed(exc: urllib.error.HTTPError) -> Refused:
    """The refusal of a route answering ``broker.errors.error_body``: its ``cause`` (else ``code``) and
    message."""
    try:
        body = json.loads(exc.read(64 * 1024))
    except (OSError, ValueError):
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return Refused(exc.code, "", f"relay refused: HTTP {exc.code}")
    code = error.get("cause") or error.get("code")
    message = error.get("message")
    return Refused(
        exc.code,
        code if isinstance(code, str) and code.isidentifier() else "",
        message if isinstance(message, str) else f"relay refused: HTTP {exc.code}",
    )


def exchange(
    url: str, credential: str, agent: str, session: str, timeout: float = 8.0, *, ttl: int | None = None
) -> dict[str, Any]:
    """Exchange ``credential`` at ``url`` (``.../agent/token``) for ``agent`` in ``session`` (a token
    of at most ``ttl`` seconds, when given): relay's answer, ``{"token", "expires_at", "expires_in",
    "headers"}``."""
    headers = {"authorization": f"Bearer {credential}"}
    body: dict[str, Any] = {"agent": agent, "session": session}
    if ttl is not None:
        body["ttl_seconds"] = ttl
    answer = _post(url, headers, body, timeout, detailed=True)
    fields = answer.get("headers") if isinstance(answer, dict) else None
    if (
        not isinstance(fields, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
        or not isinstance(answer.get("expires_in"), int)
    ):
        raise Unavailable("relay's token answer has no headers")
    return dict(answer)


def wait(url: str, headers: Mapping[str, str], timeout_ms: int) -> Pending:
    """One mail-pending wait of at most ``timeout_ms`` (the HTTP timeout allows 15 s more)."""
    answer = _post(url, headers, {"timeout_ms": timeout_ms}, timeout_ms / 1000 + 15)
    count = answer.get("count") if isinstance(answer, dict) else None
    envelopes = answer.get("envelopes", []) if isinstance(answer, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or count < 0 or not isinstance(envelopes, list):
        raise Unavailable("relay's wait answer has no count and envelopes")
    return Pending(count, answer)


def leave(url: str, headers: Mapping[str, str], timeout: float = 2.0) -> bool:
    """Say the session ended (``POST`` to relay's ``LEAVE_PATH`` at ``url``); whether relay noted it
    (False: another session holds the registration)."""
    answer = _post(url, headers, {}, timeout)
    return isinstance(answer, dict) and answer.get("ended") is True


def call_tool(
    url: str, headers: Mapping[str, str], name: str, arguments: Mapping[str, Any], timeout: float = 15.0
) -> dict[str, Any]:
    """One stateless ``tools/call`` of tool ``name``; its structured result ({} without one). A tool
    error is ``Unavailable`` when relay says it is retryable, else ``Refused`` with relay's code and
    message."""
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    answer = _post(url, {**_MCP_HEADERS, **headers}, call, timeout)
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, dict):
        raise Unavailable("relay's tools/call answer has no result")
    if result.get("isError"):
        try:
            error = json.loads(result["content"][0]["text"])["error"]
        except (KeyError, IndexError, TypeError, ValueError):
            raise Refused(200, "tool_error") from None
        message = str(error.get("message", "")) if isinstance(error, dict) else ""
        if isinstance(error, dict) and error.get("retryable") is True:
            raise Unavailable(f"relay could not do it now: {error.get('code')}: {message}")
        code = error.get("code") if isinstance(error, dict) else None
        raise Refused(200, code if isinstance(code, str) and code.isidentifier() else "tool_error", message)
    data = result.get("structuredContent")
    return data if isinstance(data, dict) else {}


def register(url: str, headers: Mapping[str, str], endpoint: str, timeout: float = 15.0) -> None:
    """Register the agent's current session at ``endpoint`` (a host-tier ``claudecode`` address)."""
    call_tool(url, headers, "RegisterAgentAddress", {"provider": "claudecode", "endpoint": endpoint}, timeout)
