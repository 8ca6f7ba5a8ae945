"""The dashboard at scale: 1,000 registered agents and 100,000 queued envelopes.

    python bench/dashboard.py               # 1,000 agents, 100,000 envelopes
    python bench/dashboard.py --agents 200 --envelopes 20000

Starts its own Redis-protocol server and a ``relay serve`` child process, fills the store through the
relay's own send (envelopes spread over the agents, skewed so that some inboxes are deep), signs in
with ``relay dashboard-url``, and times over HTTP (median of ``--rounds``):

- ``/ui/api/agents``: the first read (the overview of every agent, one read-only script call each,
  no envelope read) and a cached one (the shared snapshot), sorted by oldest age, one page of 100 rows;
- ``/ui/api/inbox`` of the deepest agent: one page of 50 envelopes;
- ``/ui/api/thread`` of one envelope (the walk of the replies index, docs/history.md);
- ``/ui/api/history`` of the agent with the longest history (``--archived``: the share of each inbox
  acknowledged, so kept in the history): one page of 50, and with a word no text holds (the walk
  reads the page plus ``HISTORY_SCAN`` entries, then answers a cursor); ``/ui/api/search`` for such a
  word in every agent's history (each read that far: the costliest page) and in one agent's;
- with ``--browser`` and Chromium installed: the agents page in headless Chromium, signed in, from a
  reload to the table drawn, and a click on a column header until the re-sorted table is drawn.

Numbers depend on the machine and its load; the last line holds them as key=value pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapters.redis.embedded import EmbeddedRedis  # noqa: E402
from broker.addresses import ClaudeCodeAddress  # noqa: E402
from broker.agent_message import AgentMessageContract  # noqa: E402
from tests.processes import ServeProcess, run_relay  # noqa: E402
from tests.support import redis_relays  # noqa: E402

CONTRACT = AgentMessageContract()
TEXT = "x" * 200


async def fill(url: str, agents: int, envelopes: int, archived: float) -> None:
    async with redis_relays(CONTRACT, url, 1, prefix="relay") as (relay,):
        host = ClaudeCodeAddress.parse("127.0.0.1:14111")
        names = [f"agent-{i:04d}" for i in range(agents)]
        for start in range(0, agents, 200):
            await asyncio.gather(*(relay.register(a, host, f"{a}-s") for a in names[start : start + 200]))
        body = CONTRACT.from_json({"kind": "note", "text": TEXT})
        # skewed: agent i gets a share proportional to 1/(1 + i % 50), so a few inboxes are deep
        weights = [1 / (1 + i % 50) for i in range(agents)]
        total = sum(weights)
        plan = [
            name for name, w in zip(names, weights, strict=True) for _ in range(round(envelopes * w / total))
        ]
        for start in range(0, len(plan), 500):
            await asyncio.gather(*(relay.send(names[0], to, body) for to in plan[start : start + 500]))

        async def archive(agent: str, count: int) -> None:
            while count > 0:  # bounded: each round acknowledges at least one envelope or stops
                got = await relay.fetch(agent, min(count, 256), session=f"{agent}-s")
                if not got:
                    return
                await relay.ack(agent, [e.id for e in got], session=f"{agent}-s")
                count -= len(got)

        share = {name: round(plan.count(name) * archived) for name in names} if archived else {}
        for start in range(0, agents, 50):
            await asyncio.gather(*(archive(a, share[a]) for a in names[start : start + 50] if share.get(a)))


def timed(call: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--envelopes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--archived", type=float, default=0.5, help="share of each inbox acknowledged")
    parser.add_argument("--browser", action="store_true", help="also time the page in headless Chromium")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="relay-dashboard-bench-"))
    server = EmbeddedRedis()
    server.start()
    try:
        began = time.perf_counter()
        asyncio.run(fill(server.url, args.agents, args.envelopes, args.archived))
        print(
            f"filled {args.agents} agents, ~{args.envelopes} envelopes in {time.perf_counter() - began:.1f} s"
        )
        key = tmp / "relay.key"
        run_relay("keygen", key)
        serve = ServeProcess(["--redis-url", server.url, "--agent-mcp-key-file", str(key)], tmp / "serve.log")
        serve.start()
        try:
            figures = measure(serve, key, args)
        finally:
            serve.stop()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("relay-dashboard-bench " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


def login(serve: ServeProcess, key: Path) -> str:
    return run_relay("dashboard-url", "--url", serve.base, "--key-file", key).stdout.strip()


def measure(serve: ServeProcess, key: Path, args: argparse.Namespace) -> dict[str, str]:
    figures: dict[str, str] = {"agents": str(args.agents), "envelopes": str(args.envelopes)}
    with httpx2.Client(base_url=serve.base, timeout=120) as http:
        assert http.get(login(serve, key), follow_redirects=True).status_code == 200
        params = {"sort": "oldest", "order": "desc", "limit": "100"}
        began = time.perf_counter()
        first = http.get("/ui/api/agents", params=params)
        figures["agents_first_ms"] = f"{(time.perf_counter() - began) * 1000:.0f}"
        data = first.json()
        figures["agents_page_bytes"] = str(len(first.content))
        figures["queued_total"] = str(data["totals"]["depth"])
        # cached: a second viewer within the snapshot's second
        figures["agents_cached_ms"] = (
            f"{timed(lambda: http.get('/ui/api/agents', params=params), args.rounds):.1f}"
        )

        # fresh: wait out the snapshot each time (what a poll every 2 s costs the store)
        def fresh() -> None:
            time.sleep(1.1)
            http.get("/ui/api/agents", params={"sort": "depth", "order": "desc", "limit": "100"})

        figures["agents_fresh_ms"] = f"{timed(fresh, args.rounds) - 1100:.0f}"
        deepest = max(data["agents"], key=lambda a: a["depth"])["agent"]
        figures["inbox_page_ms"] = (
            f"{timed(lambda: http.get('/ui/api/inbox', params={'agent': deepest}), args.rounds):.1f}"
        )
        some = http.get("/ui/api/inbox", params={"agent": deepest}).json()["envelopes"][0]["id"]
        # a thread: the walk of the replies index, then kept for 10 s
        figures["thread_first_ms"] = (
            f"{timed(lambda: http.get('/ui/api/thread', params={'id': some}), 1):.0f}"
        )
        figures["thread_kept_ms"] = f"{timed(lambda: http.get('/ui/api/thread', params={'id': some}), 3):.1f}"
        figures.update(histories(http, deepest, args.rounds))
    if args.browser:
        figures.update(browser(serve, key))
    return figures


def histories(http: httpx2.Client, agent: str, rounds: int) -> dict[str, str]:
    """The history and search pages' API: ``agent``'s history (the longest: the deepest inbox had the
    largest share archived), plain and with a word no text holds, and search for that word."""

    def get(path: str, **params: str) -> None:
        answer = http.get(path, params=params)
        assert answer.status_code == 200, answer.text

    rows = http.get("/ui/api/history", params={"agent": agent, "limit": "200"}).json()["entries"]
    asks = {
        "history_page_ms": ("/ui/api/history", {"agent": agent}),
        "history_text_miss_ms": ("/ui/api/history", {"agent": agent, "text": "nothing"}),
        "search_agent_miss_ms": ("/ui/api/search", {"agent": agent, "words": "nothing"}),
        "search_all_miss_ms": ("/ui/api/search", {"words": "nothing"}),
    }
    figures = {"history_entries_page": str(len(rows))}
    for name, (path, params) in asks.items():
        figures[name] = f"{timed(lambda path=path, params=params: get(path, **params), rounds):.1f}"
    return figures


def browser(serve: ServeProcess, key: Path) -> dict[str, str]:
    chromium = shutil.which("chromium")
    if chromium is None:
        return {"browser": "skipped(no-chromium)"}
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = launched.new_page()
        page.goto(login(serve, key))
        page.wait_for_selector("#agents tbody tr", timeout=120_000)
        began = time.perf_counter()  # a signed-in load of the page, browser warm
        page.reload()
        page.wait_for_selector("#agents tbody tr", timeout=120_000)
        loaded = (time.perf_counter() - began) * 1000
        began = time.perf_counter()
        page.click("th[data-sort='agent']")
        # the header's mark and the rows change in the same task, after the answer arrived
        page.wait_for_selector("th[data-sort='agent'].sorted-asc", timeout=120_000)
        resorted = (time.perf_counter() - began) * 1000
        rows = page.locator("#agents tbody tr").count()
        launched.close()
    return {"page_load_ms": f"{loaded:.0f}", "page_sort_ms": f"{resorted:.0f}", "page_rows": str(rows)}


if __name__ == "__main__":
    raise SystemExit(main())
