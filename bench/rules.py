"""Redis CPU per message with every delivery rule on, and what each rule costs (``bench/run.py``).

The core loop of ``bench/run.py`` (``send`` -> ``fetch`` -> ``ack``, one message at a time, 16 pairs
of agents) runs with every rule on at ``relay serve``'s defaults (an idempotency key on every send,
status, history, the poison limit; every envelope carries a ``ttl_ms``, so expiry is exercised), then
with one rule turned off in the bench's own settings, never in the product's defaults; variants
interleave in every round, in one window. A rule's cost is the median over rounds of (all rules on)
minus (that rule off), in Redis CPU µs per message. A contact policy is the other way round: every
recipient accepting a list of 1,000 ids that names its sender, minus none set.

The wake-up (the ``PUBLISH`` at the end of ``send_append.lua``) has no setting: it is measured in
isolation by ``bench/costs.py``'s ``publish_cost``, ``send_append.lua`` with and without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from statistics import median
from typing import Any

from broker.limits import DEFAULT_MAX_DELIVERIES

CONCURRENCY = 16
TTL_MS = 3_600_000
ON: dict[str, Any] = {"max_deliveries": DEFAULT_MAX_DELIVERIES}
VARIANTS: dict[str, dict[str, Any]] = {
    # name -> core_bench keyword arguments
    "all": {"settings": ON, "ttl_ms": TTL_MS},
    "status": {"settings": {**ON, "status_retention_ms": 0}, "ttl_ms": TTL_MS},
    "idempotency": {"settings": ON, "ttl_ms": TTL_MS, "idempotency": False},
    "expiry": {"settings": ON},
    "history": {"settings": {**ON, "history_retention_ms": 0}, "ttl_ms": TTL_MS},
    "poison_limit": {"settings": {**ON, "max_deliveries": 0}, "ttl_ms": TTL_MS},
    "contact_policy": {"settings": ON, "ttl_ms": TTL_MS, "policy": True},
}
WAKE_CALLS = 5000


async def rule_costs(
    core_bench: Callable[..., Awaitable[Any]],
    url: str,
    rounds: int,
    duration: float,
    monitor: Any,
) -> tuple[dict[str, Any], list[Any]]:
    """The figures (``redis_us_per_msg``, ``rule_<name>_redis_us``) and every round's result."""
    per: dict[str, list[float]] = {name: [] for name in VARIANTS}
    scripts: dict[str, list[float]] = {name: [] for name in VARIANTS}
    results: list[Any] = []
    for _ in range(rounds):
        for name, kwargs in VARIANTS.items():
            r = await core_bench(
                "redis", False, url, CONCURRENCY, duration, monitor, label=f"rules {name}", **kwargs
            )
            results.append(r)
            per[name].append(r.redis_cpu / r.messages * 1e6 if r.messages else float("nan"))
            scripts[name].append(r.redis_command_us / r.messages if r.messages else float("nan"))
    from costs import publish_cost  # bench/costs.py: bench/ is on the path

    with_pub, without = await publish_cost(url, [url], WAKE_CALLS)
    figures: dict[str, Any] = {
        "redis_us_per_msg": round(median(per["all"]), 1),
        "redis_script_us_per_msg": round(median(scripts["all"]), 1),
    }
    print(
        f"Redis CPU per message, one at a time c{CONCURRENCY}, every rule on: "
        f"{figures['redis_us_per_msg']} µs "
        f"(rounds: {', '.join(f'{v:.1f}' for v in per['all'])}), of which running scripts "
        f"{figures['redis_script_us_per_msg']} µs (INFO commandstats: FCALL)",
        flush=True,
    )
    for name in VARIANTS:
        if name == "all":
            continue
        sign = -1 if name == "contact_policy" else 1  # a policy is set in its variant, not unset
        cpu = [sign * (a - v) for a, v in zip(per["all"], per[name], strict=True)]
        work = [sign * (a - v) for a, v in zip(scripts["all"], scripts[name], strict=True)]
        figures[f"rule_{name}_redis_us"] = round(median(cpu), 1)
        figures[f"rule_{name}_script_us"] = round(median(work), 1)
        rows = ", ".join(f"{w:.1f}/{c:.1f}" for w, c in zip(work, cpu, strict=True))
        print(f"  rule {name:<15} {median(work):6.1f} µs of scripts per message, {median(cpu):6.1f} µs "
              f"Redis CPU (per round: {rows})", flush=True)  # fmt: skip
    figures["rule_wake_redis_us"] = round(with_pub - without, 1)
    print(f"  rule {'wake-up':<15} {with_pub - without:6.1f} µs per send (send_append.lua in isolation, "
          f"{WAKE_CALLS} calls with PUBLISH and without)", flush=True)  # fmt: skip
    return figures, results
