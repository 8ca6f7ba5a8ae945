"""``WebhookDispatcher``: tells remote agents, by signed webhook, that mail is waiting.

``notify(agent)`` is called for every wake-up (an append to the agent's inbox, on any worker) and
returns at once: sends never wait for a notification. Per agent, at most one notification is in flight
in this process (one task; a wake-up meanwhile marks the agent to be looked at again) and across
workers (``IWebhookClaims``): only the claim holder announces (``broker.webhooks.announce``: a notice
read that moves the agent's mail-pending cursor, the one ``POST /agent/wait`` moves too) and posts
what it announced. A worker that heard a wake-up and found the claim taken tries again (backing off,
up to a second apart) until it holds the claim and looks, so mail that arrived during a notification
rides on the next one instead of being lost or announced twice. Agents never wait for each other:
each has its own task. ``look_at_all`` covers wake-ups that were missed (the subscription was just
made, or made again): every registered agent is looked at once.

An attempt that times out, cannot connect or gets 429/5xx is retried with exponential backoff and full
jitter for ``retry_for`` seconds; then the notification is dropped (logged, counted). Its envelopes
stay announced (the cursor moved when they were read): they stay in the inbox, and the next
notification counts them in ``pending``. A 2xx answer is delivered; any other answer (a redirect
included: they are not followed) and an endpoint refused by the SSRF guard drop at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from datetime import UTC, datetime
from typing import Final, Literal

import httpx2
from prometheus_client import CollectorRegistry, Counter
from standardwebhooks import Webhook

from adapters.webhooks.transport import ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, BlockedAddress
from broker.envelope import now_ms
from broker.errors import AgentRetired, RelayError, SessionSuperseded, UnregisteredAgent
from broker.ports import NOTICE_MAX_COUNT, INoticeStore, Notice
from broker.text import failure, shown
from broker.webhooks import IWebhookClaims, IWebhookTargets, WebhookTarget, announce, summary

log = logging.getLogger("relay.webhooks")

Outcome = Literal["delivered", "retried", "dropped", "refused"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("delivered", "retried", "dropped", "refused")
RETRY_FOR_SECONDS: Final = 60.0
FIRST_BACKOFF_SECONDS: Final = 0.25
MAX_BACKOFF_SECONDS: Final = 10.0
USER_AGENT: Final = "relay-webhooks/1"
CLAIM_RETRY_SECONDS: Final = 0.05
MAX_CLAIM_RETRY_SECONDS: Final = 1.0
ATTEMPT_SECONDS: Final = CONNECT_TIMEOUT + ATTEMPT_TIMEOUT
"""The longest one attempt may take, from connecting to the answer's status line."""


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        counter = Counter(
            "csf_relay_webhooks",
            "Webhook notification attempts by outcome: delivered, retried (a failed attempt that will be "
            "retried), dropped (gave up after retrying), refused (blocked address or a non-retryable "
            "answer).",
            ["outcome"],
            registry=registry,
        )
        self.outcomes = {outcome: counter.labels(outcome=outcome) for outcome in OUTCOMES}

    def count(self, outcome: Outcome) -> None:
        self.outcomes[outcome].inc()


class WebhookDispatcher:
    def __init__(
        self,
        targets: IWebhookTargets,
        notices: INoticeStore,
        claims: IWebhookClaims,
        client: httpx2.AsyncClient,
        metrics: CollectorRegistry,
        *,
        retry_for: float = RETRY_FOR_SECONDS,
    ) -> None:
        self.targets = targets
        self.notices = notices
        self.claims = claims
        self.client = client
        self.metrics = WebhookMetrics(metrics)
        self.retry_for = retry_for
        # A claim outlives the longest notification (its retries) so that no other worker posts
        # meanwhile, and lapses soon after it when a worker dies holding it.
        self.claim_seconds = retry_for + ATTEMPT_SECONDS + 30.0
        self._holder = secrets.token_hex(8)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._sweep: asyncio.Task[None] | None = None
        self._closed = False

    def notify(self, agent: str) -> None:
        """Something may have arrived for ``agent``: look, and notify it if it has a webhook."""
        if self._closed:
            return
        if agent in self._tasks:
            self._again.add(agent)
            return
        task = asyncio.get_running_loop().create_task(self._run(agent), name=f"webhook {agent}")
        self._tasks[agent] = task

    def look_at_all(self) -> None:
        """Wake-ups may have been missed (the subscription was just made, or made again): look at
        every registered agent once."""
        if self._closed or self._sweep is not None:
            return
        self._sweep = asyncio.get_running_loop().create_task(self._look_at_all(), name="webhook sweep")

    async def _look_at_all(self) -> None:
        try:
            for agent in await self.targets.agents():
                self.notify(agent)
        except RelayError as exc:
            log.warning("webhooks: registered agents not listed (%s); they are looked at on new mail", exc)
        finally:
            self._sweep = None

    def in_flight(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Stop: notifications in flight are cancelled (their claims lapse), the client closed."""
        self._closed = True
        tasks = [*self._tasks.values(), *([self._sweep] if self._sweep is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()

    async def _run(self, agent: str) -> None:
        try:
            while True:
                self._again.discard(agent)
                await self._notify_while_new(agent)
                if agent not in self._again:
                    return
        except RelayError as exc:
            log.warning("webhook for %s not sent: %s", agent, exc, extra={"agent": agent})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one line, never a traceback: the next wake-up looks again
            log.error("webhook dispatch failed unexpectedly: %s", failure(exc), extra={"agent": agent})
        finally:
            self._tasks.pop(agent, None)
            self._again.discard(agent)

    async def _notify_while_new(self, agent: str) -> None:
        wait = CLAIM_RETRY_SECONDS
        while (target := await self.targets.target(agent)) is not None:
            if not await self.claims.claim(agent, self._holder, self.claim_seconds):
                # Another worker is notifying, maybe about older mail only: look once it is done.
                await asyncio.sleep(random.uniform(wait / 2, wait))
                wait = min(wait * 2, MAX_CLAIM_RETRY_SECONDS)
                continue
            delivered = False
            try:
                notice = await announce(self.notices, target)
                delivered = notice.count > 0 and await self._deliver(target, notice)
            except (SessionSuperseded, UnregisteredAgent, AgentRetired):
                # Registered again (or gone) since the target was read: a new session's registration
                # is a wake-up of its own, which looks at the agent again.
                return
            finally:
                # an endpoint that took the notification is a sign of life (presence)
                await self.claims.release(agent, self._holder, target.session if delivered else None)
            # A notice announces NOTICE_MAX_COUNT envelopes at most: more are announced by the next.
            if not (delivered and notice.count >= NOTICE_MAX_COUNT):
                return

    async def _deliver(self, target: WebhookTarget, notice: Notice) -> bool:
        """Post ``notice``, retrying; True when the endpoint took it."""
        body = json.dumps(summary(target.agent, notice, now_ms()), separators=(",", ":"), ensure_ascii=False)
        # One id for every attempt of this notification, new for each notification: receivers
        # deduplicate retries by it.
        message_id = f"msg_{secrets.token_hex(12)}"
        signer = Webhook(target.secret)
        deadline = time.monotonic() + self.retry_for
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            stamp = datetime.now(UTC)
            headers = {
                "content-type": "application/json",
                "user-agent": USER_AGENT,
                "webhook-id": message_id,
                "webhook-timestamp": str(int(stamp.timestamp())),
                "webhook-signature": signer.sign(message_id, stamp, body),
            }
            why = await self._attempt(target, headers, body)
            if why is None:
                self.metrics.count("delivered")
                return True
            if why.startswith("refused:"):
                self.metrics.count("refused")
                log.warning("webhook refused, not retried: %s", why[8:], extra={"agent": target.agent})
                return False
            delay = random.uniform(0, backoff)  # full jitter
            if time.monotonic() + delay > deadline:
                self.metrics.count("dropped")
                log.warning(
                    "webhook dropped after retrying for %.0f s: %s",
                    self.retry_for,
                    why,
                    extra={"agent": target.agent},
                )
                return False
            self.metrics.count("retried")
            await asyncio.sleep(delay)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    async def _attempt(self, target: WebhookTarget, headers: dict[str, str], body: str) -> str | None:
        """None when delivered; else why not, ``refused:`` first when retrying cannot help."""
        try:
            # The whole attempt is bounded (an endpoint dripping bytes cannot hold it), and the answer's
            # body is never read: only its status counts.
            async with (
                asyncio.timeout(ATTEMPT_SECONDS),
                self.client.stream("POST", target.endpoint, content=body.encode(), headers=headers) as reply,
            ):
                status = reply.status_code
        except BlockedAddress as exc:
            return f"refused:{exc}"
        except httpx2.InvalidURL as exc:  # stored before registration refused such URLs
            return f"refused:the endpoint is not a URL the client can use ({shown(str(exc))})"
        except (httpx2.TimeoutException, TimeoutError):
            return "timed out"
        except httpx2.TransportError as exc:
            return f"{type(exc).__name__}: {exc}"
        if 200 <= status < 300:
            return None
        if status == 429 or status >= 500:
            return f"answered {status}"
        if 300 <= status < 400:
            return f"refused:answered {status} (redirects are not followed)"
        return f"refused:answered {status}"
