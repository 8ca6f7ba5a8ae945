"""What a Redis failure means for the caller: the one translation from redis-py exceptions to relay's
errors (``broker.errors``), so that a store that is fine is never blamed and a refusal that a retry
cannot fix is never called retryable.

Script refusals (``RELAY_*`` error replies) are translated here too, by one table (``REFUSALS``): a
store passes what it knows of the call (``Refused``: which agent, session, recipient, key).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.redis.pipeline import ReplicasBehind
from broker.errors import (
    AgentRetired,
    BackendRefused,
    BackendUnavailable,
    IdempotencyConflict,
    InboxFull,
    NotAccepted,
    RateLimited,
    RelayError,
    SessionNotRegistered,
    SessionSuperseded,
    UnknownRecipient,
    UnregisteredAgent,
)


@dataclass(frozen=True, slots=True)
class Refused:
    """Who a script call was for: what its refusals name (``to`` defaults to ``agent``)."""

    agent: str
    session: str | None = None
    to: str | None = None
    key: str | None = None


REFUSALS: Final[dict[str, Callable[[Refused, list[str]], RelayError]]] = {
    "RELAY_UNREGISTERED": lambda who, _: UnregisteredAgent(who.agent),
    "RELAY_SUPERSEDED": lambda who, _: SessionSuperseded(who.agent, who.session or ""),
    "RELAY_SESSION_UNREGISTERED": lambda who, _: SessionNotRegistered(who.agent, who.session or ""),
    "RELAY_RETIRED": lambda who, _: AgentRetired(who.agent),
    "RELAY_IDEMPOTENCY_CONFLICT": lambda who, _: IdempotencyConflict(who.agent, who.key or ""),
    "RELAY_UNKNOWN_RECIPIENT": lambda who, _: UnknownRecipient(who.to or who.agent),
    "RELAY_NOT_ACCEPTED": lambda who, n: NotAccepted(who.to or who.agent, who.agent, n[1], n[0]),
    "RELAY_INBOX_FULL": lambda who, n: InboxFull(who.to or who.agent, int(n[0]), int(n[1])),
    "RELAY_RATE_LIMITED": lambda who, n: RateLimited(who.agent, int(n[0]) / 1000),
}
"""Every error reply code of relay's scripts (``lua/*.lua`` headers list which script answers which),
with its parameters (``RELAY_NOT_ACCEPTED <tier> <accept_from>``, ``RELAY_INBOX_FULL <cap> <depth>``,
``RELAY_RATE_LIMITED <retry ms>``) and the
relay error it means."""

_SCRIPT_NOISE = re.compile(
    r"\s*(script: \w+, on @user_(?:script|function):\d+\.|@?user_script:\d+:\s*-?"
    r"|Error running script \(call to f_\w+\):|\b[0-9a-f]{40}\b)"
)
"""Where a script failed (SHA, function name, line): meaningless to a caller, and differently spelled by
each Redis version (7: ``script: SHA, on @user_script:N.``, or for a function ``script: NAME, on
@user_function:N.``; 6: ``Error running script (call to f_SHA): @user_script:N: -ERR ...``)."""
_OUT_OF_MEMORY = "OOM command not allowed"
_TOO_OLD = "unknown command 'fcall'"
"""What a server older than Redis 7.0 answers relay's script calls."""

STORE_FAILURES = (RedisError, RedisClusterException, OSError)
"""What a call to Redis may raise besides a reply: redis-py's errors, its cluster client's own
(``SlotNotCoveredError`` is not a ``RedisError``) and the socket's; ``store_error`` translates each."""

_NOT_READY: tuple[tuple[type[BaseException], str, str], ...] = (
    (TryAgainError, "TRYAGAIN", "a slot is being moved between nodes"),
    (MasterDownError, "MASTERDOWN", "a replica lost the link to its master"),
    (ClusterDownError, "CLUSTERDOWN", "the cluster is down: a hash slot is not served"),
    (SlotNotCoveredError, "CLUSTERDOWN", "no node serves the key's hash slot"),
    (MovedError, "MOVED", "the cluster kept redirecting the call while slots move"),
    (AskError, "ASK", "the cluster kept redirecting the call while a slot moves"),
    (ReadOnlyError, "READONLY", "the node is a read-only replica: a failover is under way"),
    (BusyLoadingError, "LOADING", "the server is loading its data set"),
    (ClusterError, "TTL exhausted", "the cluster kept redirecting the call"),
)
"""Refusals after which the server ran nothing and that pass by themselves (a failover, a slot moving,
a restart): the condition's name as Redis spells it, and what it means. redis-py drops the name from the
message (``TRYAGAIN Multiple keys ...`` becomes "Multiple keys ..."), so it is named by class; subclasses
come before their bases."""


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is one of ``REFUSALS`` (a script said no, nothing was written)."""
    return isinstance(exc, ResponseError) and str(exc).split(" ", 1)[0] in REFUSALS


def refusal(exc: ResponseError, who: Refused) -> RelayError:
    """The relay error of a script's refusal (``is_refusal``), naming ``who``."""
    code, *params = str(exc).split()
    make = REFUSALS.get(code)
    if make is None:
        return store_error(exc)
    try:
        return make(who, params)
    except (IndexError, ValueError):  # a code without its parameters: a script out of step with relay
        return BackendRefused(f"the message store refused the operation ({_clean(exc)})")


def store_error(exc: BaseException) -> RelayError:
    """The relay error for a Redis failure that is not a script refusal."""
    if isinstance(exc, ReplicasBehind):
        return BackendUnavailable(
            f"the message store did not confirm the write on enough replicas ({exc}); retry shortly "
            "(a retried send can arrive twice)"
        )
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return BackendUnavailable(
            f"the message store did not answer in time ({exc}); the operation may have landed; retry "
            "shortly (a retried send can arrive twice)"
        )
    for kind, condition, meaning in _NOT_READY:
        if isinstance(exc, kind):
            return BackendUnavailable(
                f"the message store is not ready ({condition}: {meaning}); nothing was written; retry shortly"
            )
    if isinstance(exc, RedisConnectionError | OSError):
        return BackendUnavailable(f"the message store is unavailable ({type(exc).__name__}); retry shortly")
    if isinstance(exc, OutOfMemoryError) or _OUT_OF_MEMORY in str(exc):
        return BackendUnavailable(
            "the message store is out of memory (maxmemory reached); nothing was written; retry after "
            "inboxes are drained"
        )
    if isinstance(exc, NoPermissionError) or str(exc).startswith("NOPERM"):
        detail = _clean(exc).removeprefix("NOPERM ")
        return BackendRefused(
            f"the message store refused relay's Redis user (NOPERM {detail}); an operator must grant it "
            "the commands and keys relay uses (docs/operations.md)"
        )
    if isinstance(exc, ResponseError) and _TOO_OLD in str(exc).lower():
        return BackendRefused(
            f"the message store does not run Redis Functions ({_clean(exc)}); relay needs Redis 7.0 or "
            "later, or Valkey 7.2 or later"
        )
    if isinstance(exc, ResponseError):
        return BackendRefused(
            f"the message store refused the operation ({_clean(exc)}); retrying will not help, see the "
            "relay's log"
        )
    if isinstance(exc, RedisError | RedisClusterException):  # unreadable replies and the like
        return BackendUnavailable(f"the message store failed ({type(exc).__name__}); retry shortly")
    raise exc


def _clean(exc: BaseException) -> str:
    """The error reply without script SHA and line numbers, on one line, at most 200 characters."""
    text = _SCRIPT_NOISE.sub(" ", " ".join(str(exc).split())).strip()
    return text[:200] or type(exc).__name__
