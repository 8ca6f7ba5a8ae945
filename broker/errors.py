"""One error hierarchy for relay.

Every refusal is a ``RelayError`` subclass with a stable ``code``; ``error_body`` is the one JSON form
every front answers with (MCP tool results, Workbench tools). Adapters translate storage exceptions at
their edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: ``field`` is a dotted path ('' for message-level rules)."""

    field: str
    rule: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "rule": self.rule, "message": self.message}


def json_type(value: object) -> str:
    """How an error message names the JSON type of a refused value ("must be a string, not an array")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class RelayError(Exception):
    """Base of every refusal relay makes on purpose.

    ``retryable`` tells a client whether the same request may succeed later unchanged.
    """

    code: str = "relay_error"
    retryable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def details(self) -> dict[str, object]:
        return {}


class InvalidArgument(RelayError):
    """An argument (agent id, session id, limit, envelope id, ...) breaks a documented rule."""

    code = "invalid_argument"

    def __init__(self, field: str, rule: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.violation = Violation(field, rule, message)

    def details(self) -> dict[str, object]:
        return {"violations": [self.violation.as_dict()]}


class InvalidAddress(InvalidArgument):
    """An address that its provider's type refuses (wrong shape, wrong tier, unknown provider)."""

    code = "invalid_address"


class ContractViolation(RelayError):
    """A message body that the relay's contract refuses; carries every violation."""

    code = "contract_violation"

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations = tuple(violations)
        listed = "; ".join(f"{v.field or '<message>'}: {v.message} [{v.rule}]" for v in self.violations)
        super().__init__(f"message refused by the contract: {listed}")

    def details(self) -> dict[str, object]:
        return {"violations": [v.as_dict() for v in self.violations]}


class UnknownRecipient(RelayError):
    """The recipient has no registration: nothing is stored, no inbox is created."""

    code = "unknown_recipient"

    def __init__(self, agent: str) -> None:
        super().__init__(f"recipient {agent!r} is not registered; ask it to call RegisterAgentAddress first")
        self.agent = agent

    def details(self) -> dict[str, object]:
        return {"agent": self.agent}


class UnregisteredAgent(RelayError):
    """The calling agent (sender, fetcher, acknowledger) has no registration."""

    code = "unregistered_agent"

    def __init__(self, agent: str) -> None:
        super().__init__(f"agent {agent!r} is not registered; register an address first")
        self.agent = agent

    def details(self) -> dict[str, object]:
        return {"agent": self.agent}


class SessionSuperseded(RelayError):
    """The caller's session was replaced by a newer registration of the same agent."""

    code = "session_superseded"

    def __init__(self, agent: str, session: str) -> None:
        super().__init__(
            f"session {session!r} of agent {agent!r} was superseded by a newer session's registration, "
            f"which now receives {agent!r}'s mail; this session can no longer send, fetch or acknowledge"
        )
        self.agent = agent
        self.session = session

    def details(self) -> dict[str, object]:
        return {"agent": self.agent, "session": self.session}


class SessionNotRegistered(RelayError):
    """The caller's session never registered; another session of the same agent holds the registration."""

    code = "session_not_registered"

    def __init__(self, agent: str, session: str) -> None:
        super().__init__(
            f"session {session!r} of agent {agent!r} has not registered yet; call RegisterAgentAddress "
            "from this session first (it then receives the agent's mail)"
        )
        self.agent = agent
        self.session = session

    def details(self) -> dict[str, object]:
        return {"agent": self.agent, "session": self.session}


class AgentRetired(RelayError):
    """An operator retired the agent (``relay agents retire``): its registration ended, and the sessions
    it had then can no longer register, send, fetch or acknowledge. A new session may register the id
    again (a fresh registration)."""

    code = "agent_retired"

    def __init__(self, agent: str) -> None:
        super().__init__(
            f"agent {agent!r} was retired by an operator (`relay agents retire`): its registration ended "
            "and this session can no longer register, send, fetch or acknowledge; start a new session to "
            "register the id again, or ask the operator"
        )
        self.agent = agent

    def details(self) -> dict[str, object]:
        return {"agent": self.agent}


class NotAccepted(RelayError):
    """The recipient's contact policy does not accept messages from this sender (docs/policy.md);
    nothing was stored and the sender's rate token was not spent. ``tier`` is the send's (the widest
    of both registrations), for the per-tier count."""

    code = "not_accepted"

    def __init__(self, agent: str, sender: str, accept_from: str, tier: str) -> None:
        super().__init__(
            f"to: {agent!r} does not accept messages from {sender!r} (its contact policy accepts "
            f"{_WHOM.get(accept_from, accept_from)}); nothing was sent. Ask {agent!r}'s operator to run "
            f"`relay policy set {agent} --accept-from ...` to let {sender!r} in, or reach {agent!r} "
            "another way"
        )
        self.agent = agent
        self.sender = sender
        self.accept_from = accept_from
        self.tier = tier

    def details(self) -> dict[str, object]:
        return {"agent": self.agent, "field": "to", "accept_from": self.accept_from}


_WHOM = {"registered": "registered senders only", "list": "the agents its list names only"}


class InboxFull(RelayError):
    """The recipient's inbox holds its cap of unacknowledged envelopes; nothing was stored."""

    code = "inbox_full"
    retryable = True

    def __init__(self, agent: str, cap: int, depth: int) -> None:
        super().__init__(
            f"inbox of {agent!r} is full: it holds {depth} unacknowledged envelopes and the cap in force is "
            f"{cap}; retry after it acknowledges"
        )
        self.agent = agent
        self.cap = cap
        self.depth = depth

    def details(self) -> dict[str, object]:
        return {"agent": self.agent, "cap": self.cap, "depth": self.depth}


class IdempotencyConflict(RelayError):
    """The idempotency key was used, within the dedup window, for a different request; nothing was
    stored."""

    code = "idempotency_conflict"

    def __init__(self, agent: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} of agent {agent!r} was already used for a different message "
            "(recipient, message or ttl_ms); use a new key for a new message"
        )
        self.agent = agent
        self.key = key

    def details(self) -> dict[str, object]:
        return {"agent": self.agent, "field": "idempotency_key"}


class RateLimited(RelayError):
    """The sender exceeded its send rate; retry after ``retry_after`` seconds."""

    code = "rate_limited"
    retryable = True

    def __init__(self, agent: str, retry_after: float) -> None:
        super().__init__(f"agent {agent!r} is sending too fast; retry after {retry_after:.3f} s")
        self.agent = agent
        self.retry_after = retry_after

    def details(self) -> dict[str, object]:
        return {"agent": self.agent, "retry_after": self.retry_after}


class TooManyFailures(RelayError):
    """Too many wrong credentials from one client for one credential id (``POST /agent/token``);
    nothing is checked until ``retry_after`` seconds have passed."""

    code = "too_many_failures"
    retryable = True

    def __init__(self, retry_after: float, limit: int, window: float) -> None:
        super().__init__(
            f"{limit} wrong credentials from this client within {window:g} s; nothing is checked for "
            f"{retry_after:.0f} s: retry then with the credential file's credential"
        )
        self.retry_after = retry_after

    def details(self) -> dict[str, object]:
        return {"retry_after": self.retry_after}


class TooManyWaits(RelayError):
    """The agent already has its cap of parked long-polls on this worker (or the worker has its total
    cap): this one is answered at once. Retry after one of the parked polls returns."""

    code = "too_many_waits"
    retryable = True

    def __init__(self, agent: str, cap: int, *, per_agent: bool = True) -> None:
        whose = f"agent {agent!r} already has" if per_agent else "this relay worker already holds"
        scope = "per agent" if per_agent else "in total"
        super().__init__(
            f"{whose} {cap} parked long-polls (FetchAgentInbox with wait_ms; at most {cap} {scope}); "
            "retry without wait_ms, or after a parked poll returns"
        )
        self.agent = agent
        self.cap = cap

    def details(self) -> dict[str, object]:
        return {"agent": self.agent, "cap": self.cap}


class BackendUnavailable(RelayError):
    """The store could not be reached, did not answer in time, or is failing over. Retry.

    Every write is made of atomic scripts, so nothing is ever half-written. When the store could not be
    reached nothing was written; when it did not answer in time (or replicas did not confirm a write
    within the timeout), the write may still have landed.
    """

    code = "backend_unavailable"
    retryable = True

    def __init__(self, message: str = "the message store is unavailable; retry shortly") -> None:
        super().__init__(message)


class BackendRefused(RelayError):
    """The store answered but refused the operation for a reason a retry does not fix (a missing ACL
    permission, a key of the wrong type, a script error): an operator must act. Nothing was written."""

    code = "backend_refused"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)


class RelayNotRunning(RelayError):
    """An operation was attempted on a relay that is not started (or already stopped)."""

    code = "relay_not_running"
    retryable = True


class InternalError(RelayError):
    """A failure relay did not anticipate; the details are in the relay's log, not in the answer."""

    code = "internal_error"
    retryable = True

    def __init__(
        self, message: str = "the relay failed unexpectedly; retry, and report it if it persists"
    ) -> None:
        super().__init__(message)


def error_body(error: RelayError) -> dict[str, object]:
    """The JSON every front answers a refusal with: ``{"error": {"code", "message", "retryable", ...}}``
    plus the error's details (violations, agent, cap, ...)."""
    return {
        "error": {
            "code": error.code,
            "message": error.message,
            "retryable": error.retryable,
            **error.details(),
        }
    }
