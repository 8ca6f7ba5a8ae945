"""What the shell commands (``relay agents``, ``send``, ``read``, ``tail``, ``thread``) share.

- Reaching relay: ``operator_view`` opens the read-only queries (``adapters.redis.operator_view``) on
  the Redis of ``--redis-url``; ``call_tool`` calls an agent tool through the running relay at
  ``--url`` with headers minted from ``--key-file``, so a person's call gets every check an agent's
  does.
- Showing it: ``ago``/``moment``/``brief`` (times relative and absolute), ``table`` (aligned columns)
  and the envelope renderers; agent-supplied text goes through ``broker.text`` (the one escaping rule).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.inspect import redacted
from adapters.redis.operator_view import RedisOperatorView
from adapters.redis.registry import is_retired
from broker.envelope import format_ms
from broker.errors import BackendUnavailable, InvalidArgument, RelayError, RelayNotRunning
from broker.front.paths import MCP_PATH
from broker.front.tokens import agent_headers
from broker.ports import StoredEnvelope
from broker.text import escaped
from relay.claude_code import relay_http
from relay.commands.signing import default_url, signing_key_file, signing_keys
from relay.running import running
from relay.settings import ShellSettings, store_named, store_url

if TYPE_CHECKING:
    from broker.agent_message import AgentMessageContract

TOKEN_TTL_SECONDS = 120
"""Lifetime of the tokens the shell mints for one command."""


@contextlib.asynccontextmanager
async def operator_view(
    settings: ShellSettings, command: str, *, agent: str | None = None
) -> AsyncIterator[RedisOperatorView]:
    """The read-only operator queries on the Redis ``relay serve`` uses; Redis trouble is one
    ``BackendUnavailable`` naming the (redacted) URL. With ``agent``, first the operator commands' one
    refusal (``relay inspect``'s) when Redis holds nothing of that agent (a retired agent's history
    stays readable)."""
    url = store_url(settings, command)
    view = RedisOperatorView(RedisConnection(RedisSettings(url=url)))
    await view.open()
    try:
        if agent is not None:
            (found,) = await view.inspector.inspect([agent])
            if not found.exists and not await is_retired(view.connection, agent):
                registered = len(await view.inspector.directory.agents())
                raise RelayError(unknown_agent(agent, registered, store_named(settings, redacted(url))))
        yield view
    except BackendUnavailable as exc:
        raise unreachable(url, exc, "read") from exc
    finally:
        await view.close()


@contextlib.asynccontextmanager
async def store_connection(url: str) -> AsyncIterator[RedisConnection]:
    """An open connection to the Redis ``relay serve`` uses, for the operator commands that write
    (``relay policy``, ``agents retire``, ``inbox purge``); Redis trouble as in ``operator_view``."""
    connection = RedisConnection(RedisSettings(url=url))
    try:
        await connection.open()
        yield connection
    except BackendUnavailable as exc:
        raise unreachable(url, exc, "reach") from exc
    finally:
        await connection.close()


def unreachable(url: str, exc: BackendUnavailable, doing: str) -> BackendUnavailable:
    """The one refusal of an operator command whose Redis does not answer: the (redacted) URL and
    what to check."""
    return BackendUnavailable(
        f"cannot {doing} Redis at {redacted(url)} ({exc.message}); is it running, and is it the one "
        "relay serve uses?"
    )


def call_tool(
    settings: ShellSettings,
    agent: str,
    session: str,
    tool: str,
    arguments: Mapping[str, Any],
    timeout: float = 15.0,
) -> dict[str, Any]:
    """Call ``tool`` as ``agent`` in ``session`` through the running relay; ``relay_http.Refused``
    when relay refuses the call, ``InvalidArgument`` when it refuses the key, ``RelayNotRunning`` when
    it cannot be reached."""
    keyring = signing_keys(settings)
    headers = agent_headers(keyring, agent, session, TOKEN_TTL_SECONDS)
    try:
        return relay_http.call_tool(base_url(settings) + MCP_PATH, headers, tool, arguments, timeout)
    except relay_http.Refused as exc:
        if exc.status == 401:
            raise InvalidArgument(
                "--key-file",
                "key_file.refused",
                f"relay at {base_url(settings)} refused tokens signed with {key_file(settings)}; pass "
                "the key file relay serve uses (--key-file or RELAY_KEY_FILE)",
            ) from None
        if exc.status != 200:
            raise RelayNotRunning(
                f"relay at {base_url(settings)}{MCP_PATH} answered HTTP {exc.status}; is --url (RELAY_URL) "
                "a relay serve?"
            ) from None
        raise
    except relay_http.Unavailable as exc:
        if settings.url is None:
            raise RelayNotRunning(
                f"relay is not running here: nothing answers at {base_url(settings)} ({exc}), and no relay "
                f"serve runs from the data dir {settings.data_dir.absolute()}; start it in this folder "
                "(`relay serve`), or pass --url (or set RELAY_URL) for a relay that runs elsewhere"
            ) from None
        raise RelayNotRunning(
            f"cannot reach relay at {base_url(settings)} ({exc}); is relay serve running there "
            "(--url or RELAY_URL)?"
        ) from None


def unknown_agent(agent: str, registered: int, store: str) -> str:
    """The one "not registered" refusal of the commands that read the store (inspect, dead-letters,
    show, read, tail)."""
    if registered == 0:
        return (
            f"agent {agent!r} is not registered at {store}, which holds no agent at all: is it the store "
            f"relay serve uses? (pass --data-dir or --redis-url to name that one)"
        )
    return (
        f"agent {agent!r} is not registered at {store} and has no inbox or dead letters; `relay inspect` "
        "lists the registered agents"
    )


def base_url(settings: ShellSettings) -> str:
    """``--url``, else the URL of the ``relay serve`` running from the data dir, else where ``relay
    serve`` started with this environment listens."""
    if settings.url is not None:
        return settings.url
    found = running(settings.data_dir.absolute())
    if found is not None and found.url is not None:
        return found.url
    return default_url().removesuffix(MCP_PATH)


def key_file(settings: ShellSettings) -> Path:
    """Where the shell finds relay's signing key: the one rule of every command (``signing_key_file``)."""
    return signing_key_file(settings)


def duration(seconds: float) -> str:
    """``4s``, ``3m 20s``, ``2h 5m``, ``3d 4h``."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def ago(ms: int | None, now_ms: int) -> str:
    """``3m 20s ago``; ``-`` for None."""
    return "-" if ms is None else f"{duration((now_ms - ms) / 1000)} ago"


def moment(ms: int | None, now_ms: int) -> str:
    """Relative and absolute: ``3m 20s ago (2026-12-01T23:01:02.345Z)``; ``-`` for None."""
    return "-" if ms is None else f"{ago(ms, now_ms)} ({format_ms(ms)})"


def brief(ms: int | None, now_ms: int) -> str:
    """Relative and absolute, short, for table cells: ``3m 20s ago 23:01:02Z`` (the date too when it
    is not today's, UTC); ``-`` for None."""
    if ms is None:
        return "-"
    text = format_ms(ms)
    absolute = text[11:19] + "Z" if text[:10] == format_ms(now_ms)[:10] else text[:16] + "Z"
    return f"{ago(ms, now_ms)} {absolute}"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Aligned columns (cells already escaped); numbers are right-aligned."""
    body = [list(r) for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    numeric = [all(r[i].isdigit() for r in body) and bool(body) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in body)])


def message_of(envelope: StoredEnvelope) -> dict[str, Any]:
    """The envelope's body as agents get it (``kind``, ``text``, ``in_reply_to``, ``reference``), or
    its raw fields when they are not a valid message (written by hand)."""
    codec = contract()
    try:
        return codec.to_json(codec.from_fields(envelope.fields))
    except (RelayError, ValueError, KeyError):
        return dict(envelope.fields)


def envelope_json(envelope: StoredEnvelope) -> dict[str, Any]:
    return {
        "id": envelope.envelope_id,
        "from": envelope.sender,
        "to": envelope.to,
        "tier": envelope.tier.label,
        "sent_at": format_ms(envelope.sent_at_ms),
        "deliveries": envelope.deliveries,
        "message": message_of(envelope),
    }


def envelope_text(envelope: StoredEnvelope, now_ms: int, *, indent: str = "") -> str:
    """An envelope as a few aligned lines: header, links, then its text with every line escaped."""
    from broker.agent_message import KIND_LABELS

    message = message_of(envelope)
    kind = message.get("kind")
    label = KIND_LABELS.get(kind, str(kind)) if isinstance(kind, int) else str(kind)
    head = (
        f"{envelope.envelope_id}  {escaped(envelope.sender)} -> {escaped(envelope.to)}  {escaped(label)}  "
        f"{moment(envelope.sent_at_ms, now_ms)}  tier {envelope.tier.label}  "
        f"deliveries {envelope.deliveries}"
    )
    lines = [indent + head]
    for name in ("in_reply_to", "reference"):
        if message.get(name):
            lines.append(f"{indent}  {name.replace('_', ' ')}: {escaped(str(message[name]))}")
    text = str(message.get("text", ""))
    lines += [f"{indent}  | {escaped(part)}" for part in text.split("\n")]
    return "\n".join(lines)


@functools.cache
def contract() -> AgentMessageContract:
    # imported on first use: the contract loads protovalidate (about half a second), which `relay
    # agents` and every other command that shows no message text should not pay for at start-up
    from broker.agent_message import AgentMessageContract

    return AgentMessageContract()


def out(text: str) -> None:
    """Print and flush (``relay tail`` output is read as it comes)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
