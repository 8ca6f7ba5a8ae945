"""The relay's limits and defaults, and the checks that apply them: one definition each.

The JSON schemas (``broker.schemas``), the settings of ``relay serve`` and both backends read them
from here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from broker.errors import InvalidArgument
from broker.ids import is_envelope_id

MAX_FETCH_LIMIT = 256
"""Envelopes one fetch returns at most."""
DEFAULT_FETCH_LIMIT = 16
"""Envelopes one fetch returns at most when the caller names no limit."""
MAX_ACK_IDS = 1024
"""Envelope ids one acknowledgement takes at most."""
MAX_WAIT_SECONDS = 25.0
"""The longest a blocking fetch waits unless a relay is built with another ``max_wait``."""
MAX_NOTICE_WAIT_SECONDS = 300.0
"""The longest a mail-pending wait (``wait_for_mail``) parks."""
DEFAULT_REMIND_AFTER_SECONDS = 3600.0
"""Unacknowledged mail is announced again at most this often unless a relay is built otherwise."""
NOTICE_LISTED = 5
"""Envelopes a notice lists at most (its ``count`` says how many it announces)."""
MIN_TTL_MS = 1000
"""The shortest ``ttl_ms`` of a send."""
MAX_TTL_MS = 30 * 24 * 3600 * 1000
"""The longest ``ttl_ms`` of a send unless a relay is built with another ``max_ttl_ms``."""
DEFAULT_MAX_DELIVERIES = 10
"""Hand-outs of an unacknowledged envelope before fetch dead-letters it (``relay serve``'s default)."""
DEFAULT_IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000
"""How long a sender's idempotency key is remembered."""
DEFAULT_STATUS_RETENTION_MS = 7 * 24 * 3600 * 1000
"""How long a sender can learn what became of an envelope."""
DEFAULT_HISTORY_RETENTION_MS = 30 * 24 * 3600 * 1000
"""How long an envelope that left its inbox (acknowledged, dead-lettered, expired) stays in its
recipient's history (``IOperatorView.history``); 0 keeps none."""
MAX_HISTORY_RETENTION_MS = 3650 * 24 * 3600 * 1000
"""The longest history retention a relay takes (ten years)."""
HISTORY_SCAN = 1000
"""History entries one ``IOperatorView.history`` call reads at most beyond the page it returns: a
query matching little answers a short page and a cursor instead of reading a whole history."""
MAX_STATUS_IDS = 256
"""Envelope ids one status request takes at most."""
REQUEUE_LINEAGE = 8
"""Earlier ids a requeued envelope remembers, newest first: its sender's status and threads follow it
through that many requeues."""
MAX_POLICY_AGENTS = 1000
"""Agent ids a contact policy's list names at most (``broker.policy``): the check on every send is one
hash lookup whatever the size, but the list is stored, shown and audited whole."""
PURGE_BATCH = 1000
"""Envelopes one purge script call drops at most (``IInboxStore.purge`` calls again until the inbox is
empty): a purge of a big inbox never holds Redis for long."""
SWEEP_BATCH = 256
"""The oldest envelopes of each inbox one background sweep looks at."""
SWEEP_PAGE = 1000
"""Registrations a sweep reads at a time while it walks every agent."""
SWEEP_MAX_PAGES = 10_000
"""Pages one sweep walks at most (ten million agents): the walk ends even if the directory keeps growing."""


def check_fetch_limit(limit: object) -> int:
    """``limit`` if it is a whole number from 1 to ``MAX_FETCH_LIMIT``, else ``InvalidArgument``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_FETCH_LIMIT:
        raise InvalidArgument("limit", "limit.range", f"must be an integer from 1 to {MAX_FETCH_LIMIT}")
    return limit


def check_envelope_ids(ids: object, most: int, *, least: int = 0, returned_by: str) -> Sequence[str]:
    """``ids`` if it is a list of ``least`` to ``most`` envelope ids, else ``InvalidArgument`` naming
    the first wrong one (ids are passed exactly as ``returned_by`` returned them)."""
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise InvalidArgument("ids", "ids.type", "must be a list of envelope ids")
    if len(ids) > most and not least:
        raise InvalidArgument("ids", "ids.max_items", f"at most {most} ids per call")
    if least and not least <= len(ids) <= most:
        raise InvalidArgument("ids", "ids.size", f"must hold {least} to {most} envelope ids")
    for i, envelope_id in enumerate(ids):
        if not is_envelope_id(envelope_id):
            raise InvalidArgument(
                f"ids[{i}]",
                "envelope_id.pattern",
                f"{envelope_id!r:.80} is not an envelope id (env_ followed by 26 base32 characters); "
                f"pass ids exactly as {returned_by} returned them",
            )
    return ids


def check_ttl(ttl_ms: object, max_ttl_ms: int = MAX_TTL_MS) -> int:
    """``ttl_ms`` if it is a whole number of milliseconds from ``MIN_TTL_MS`` to ``max_ttl_ms``."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or not MIN_TTL_MS <= ttl_ms <= max_ttl_ms:
        raise InvalidArgument(
            "ttl_ms",
            "ttl_ms.range",
            f"must be a whole number of milliseconds from {MIN_TTL_MS} to {max_ttl_ms}",
        )
    return ttl_ms


def request_hash(to: str, fields: Mapping[str, str], ttl_ms: int | None) -> str:
    """What makes two sends with one idempotency key the same request: recipient, body fields, ttl."""
    digest = hashlib.blake2b(digest_size=12)
    for part in (to, str(ttl_ms), *sorted(f"{k}={v}" for k, v in fields.items())):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(4, "big") + data)
    return digest.hexdigest()
