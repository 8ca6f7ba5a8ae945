"""Every Redis key name relay uses, built in one place (see docs/redis-layout.md).

Agent ids are checked against ``broker.ids.AGENT_ID_PATTERN`` before they reach this module, so a key
can never be injected. The ``{agent}`` hash tag keeps an agent's keys in one cluster slot, and every
script touches the keys of one agent only (the directory of every agent, on a slot of its own, is
written by plain commands beside the register and retire scripts).
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "relay"
"""The consumer group of every inbox stream."""

DEFAULT_PREFIX = "relay"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    def registration(self, agent: str) -> str:
        """Hash: provider, endpoint, tier, session, registered_at, updated_at; webhook_secret when a
        webhook endpoint's secret was issued for this registration."""
        return f"{self.prefix}:agent:{{{agent}}}"

    def retired(self, agent: str) -> str:
        """Hash: ``agent``'s retirement (``relay agents retire``, ``lua/retire.lua``): ``at`` (ms of
        Redis TIME) and ``sessions`` (the sessions it had then, space-separated), refused with
        ``RELAY_RETIRED``; deleted when a new session registers the id again."""
        return f"{self.prefix}:retired:{{{agent}}}"

    def inbox(self, agent: str) -> str:
        """Stream of unacknowledged envelopes, consumer group ``GROUP``."""
        return f"{self.prefix}:inbox:{{{agent}}}"

    def dead_letters(self, agent: str) -> str:
        """Stream of envelopes that failed delivery too often."""
        return f"{self.prefix}:dead:{{{agent}}}"

    def history(self, agent: str) -> str:
        """Stream of what left ``agent``'s inbox (acknowledged, dead-lettered, expired): the entry's
        fields and entry_id, attempts, outcome, reason; its ids are the time each left. Trimmed by time
        (``MINID``) to the history retention; it has no consumer group."""
        return f"{self.prefix}:history:{{{agent}}}"

    def history_positions(self, agent: str) -> str:
        """Hash: inbox entry id -> history id of each envelope in ``agent``'s history (written and
        trimmed with it), or ``=<entry id> <nonce>`` of the inbox entry a requeued dead letter became;
        a thread read finds an archived envelope from its id through it."""
        return f"{self.prefix}:history-at:{{{agent}}}"

    def replies(self, agent: str, day: int) -> str:
        """Hash: envelope id -> the ids of the replies to it that ``agent`` received (space-separated),
        of envelopes sent on ``day`` (days since the epoch of the replied-to envelope's id), written by
        ``send_append.lua``; expires the history retention after the day ends."""
        return f"{self.prefix}:replies:{{{agent}}}:{day}"

    def rate(self, agent: str) -> str:
        """String: the sender's rate-limit state."""
        return f"{self.prefix}:rate:{{{agent}}}"

    def webhook_claim(self, agent: str) -> str:
        """String (with expiry): the worker notifying ``agent`` now."""
        return f"{self.prefix}:webhook-claim:{{{agent}}}"

    def notice(self, agent: str) -> str:
        """Hash: the agent's mail-pending cursor: ``session``, ``cursor`` (newest entry id announced),
        ``at`` (Redis time in ms of the last notice). Webhook notifications and ``POST /agent/wait`` both
        move it."""
        return f"{self.prefix}:notice:{{{agent}}}"

    def idempotency_claim(self, sender: str, key: str) -> str:
        """String on the sender's slot: the hash of the request first sent with idempotency ``key``
        (``broker.ids.IDEMPOTENCY_KEY_PATTERN`` keeps it out of the hash tag); expires after the window."""
        return f"{self.prefix}:claim:{{{sender}}}:{key}"

    def idempotency_record(self, to: str, sender: str, key: str) -> str:
        """String on the recipient's slot: hash, entry id, nonce, sent_at and tier of the envelope
        ``sender`` sent with ``key``; expires after the window."""
        return f"{self.prefix}:idem:{{{to}}}:{sender}:{key}"

    def sent_index(self, sender: str, day: int) -> str:
        """Hash: nonce -> "<recipient> <sent_at ms>" of what ``sender`` sent on ``day`` (days since the
        epoch, UTC); expires the status retention after the day ends."""
        return f"{self.prefix}:sent:{{{sender}}}:{day}"

    def outcomes(self, agent: str, day: int) -> str:
        """Hash: nonce -> "<entry id> <attempts> <how>" of envelopes that left ``agent``'s inbox on
        ``day`` (days since the epoch, UTC; acknowledged, dead-lettered, expired or requeued), for their
        senders' status; expires the status retention after the day ends."""
        return f"{self.prefix}:outcome:{{{agent}}}:{day}"

    def delivery_counts(self, agent: str) -> str:
        """Hash: envelopes of ``agent``'s inbox dead-lettered at fetch, by reason (``expired``,
        ``max_deliveries``); read by ``relay inspect`` and the gauges."""
        return f"{self.prefix}:counts:{{{agent}}}"

    def policy(self, agent: str) -> str:
        """Hash on the recipient's slot: its contact policy (``broker.policy``), absent for ``open``.
        ``=accept_from`` is ``registered`` or ``list``; ``=listed`` the number of ids of a list, and
        each listed agent id is a field (value ``1``). An agent id never starts with ``=``, so the two
        never collide. ``send_append.lua`` reads it atomically with the append."""
        return f"{self.prefix}:policy:{{{agent}}}"

    def spent_token(self, digest: str) -> str:
        """String (with expiry): a single-use token (a dashboard login URL) was spent; ``digest`` is the
        hex SHA-256 of the token's id."""
        return f"{self.prefix}:spent:{digest}"

    def credentials(self, agent: str) -> str:
        """Hash on the agent's slot: credential id -> JSON of its record (agent, label, audience,
        secret_hash, created_at_ms, expires_at_ms; never the secret), ``<id>:used`` -> last exchange
        (ms) and ``<id>:revoked`` -> when it was revoked (ms; written once, with HSETNX)."""
        return f"{self.prefix}:credentials:{{{agent}}}"

    def credential_owner(self, credential_id: str) -> str:
        """String: the agent of a credential id (``broker.credentials.ID_PATTERN`` keeps it plain), so
        an exchange finds the record from the id alone."""
        return f"{self.prefix}:credential:{credential_id}"

    def credential_agents(self) -> str:
        """Set: the agents that were ever issued a credential (``relay credentials list`` walks it)."""
        return f"{self.prefix}:credential-agents"

    def credential_events(self) -> str:
        """Hash: event (issued, exchanged, revoked, refused) -> count, across every worker and command
        (``csf_relay_credentials_total``)."""
        return f"{self.prefix}:credential-events"

    def wake_channel(self) -> str:
        """Pub/sub channel: the send, requeue and register scripts publish the agent id here."""
        return f"{self.prefix}:wake"

    def directory(self) -> str:
        """Sorted set (every score 0, so ordered by id) of the registered agent ids, paged with
        ``ZRANGEBYLEX``: a superset of the registrations, kept by ordering, never inside a script (it
        is on a slot of its own), filtered on read (``adapters/redis/directory.py``)."""
        return f"{self.prefix}:directory"

    def directory_built(self) -> str:
        """String: ms (of the builder's clock) at which ``directory`` was built from the registration
        hashes of a store written before it; until it exists the directory is a scan of those
        (``adapters/redis/directory_scan.py``)."""
        return f"{self.prefix}:directory-built"

    def registrations(self) -> str:
        """A SCAN pattern matching every registration hash: the directory of a store written before
        its index, and what the index is built from (``adapters/redis/directory_scan.py``)."""
        return f"{_glob_escape(self.prefix)}:agent:{{*}}"

    def agent_of(self, registration_key: str) -> str | None:
        """The agent id in a registration key, or None when it is not one."""
        head = f"{self.prefix}:agent:{{"
        if registration_key.startswith(head) and registration_key.endswith("}"):
            return registration_key[len(head) : -1]
        return None

    def legacy_agents(self) -> str:
        """Set of every registered agent id, kept by relay's earlier layout; ``relay migrate`` removes
        it (see docs/redis-layout.md)."""
        return f"{self.prefix}:agents"

    def pattern(self) -> str:
        """A SCAN pattern matching every relay key."""
        return f"{_glob_escape(self.prefix)}:*"


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
