"""The dashboard in a real browser: headless Chromium driven by Playwright, against a real ``relay
serve`` child process on its own Redis, with the recipient of a dashboard send fetching over MCP with
the official ``mcp`` client. With ``RELAY_SCREENSHOTS=docs/screenshots`` the run refreshes the
screenshot of each page that the docs show (otherwise they go to a temporary folder).

Skipped, with the reason, where Chromium (Debian's ``chromium`` package; ``.ci/run`` installs it) or
Playwright is missing.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis

from adapters.redis import RedisConnection, RedisPolicyStore, RedisSettings
from adapters.redis.delivery import RedisDeliveryQueue
from adapters.redis.embedded import EmbeddedRedis
from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessageContract
from broker.envelope import now_ms
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.limits import MIN_TTL_MS
from broker.policy import listing
from broker.testing.base import Limits
from broker.testing.polling import wait_until
from tests.processes import ServeProcess, dashboard_login_url, run_relay
from tests.support import redis_relays

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium); .ci/run installs it"
    ),
    pytest.mark.timeout(300),
]

SHOTS = Path(os.environ.get("RELAY_SCREENSHOTS") or tempfile.mkdtemp(prefix="relay-screenshots-"))
DIALOGS: list[str] = []
"""Messages of every dialog any page opened (an alert from injected script); must stay empty."""
XSS_TEXT = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
BACKLOG = 120
CONTRACT = AgentMessageContract()
HOST = ClaudeCodeAddress.parse("127.0.0.1:14111")


@dataclass
class Seeded:
    request: str
    reply: str
    follow_up: str
    xss: str
    dead: str
    expired: str
    overdelivered: str


@dataclass
class Running:
    serve: ServeProcess
    key: Path
    redis_url: str
    seeded: Seeded

    def login_url(self) -> str:
        return dashboard_login_url(self.serve.base, self.key)


async def _seed(url: str) -> Seeded:
    """alice and bob talk (a three-message thread), builder has a backlog (and accepts alice and carol
    only), mallory sends XSS to bob, and worker has one dead letter."""
    async with redis_relays(CONTRACT, url, 1, prefix="relay") as (relay,):
        for agent in ("alice", "bob", "builder", "carol", "mallory", "worker"):
            await relay.register(agent, HOST, f"{agent}-1")

        async def send(sender: str, to: str, kind: str, text: str, reply_to: str | None = None) -> str:
            body = CONTRACT.from_json({"kind": kind, "text": text, "in_reply_to": reply_to})
            return (await relay.send(sender, to, body)).id

        request = await send("alice", "bob", "request", "Can you review PR 12?")
        reply = await send("bob", "alice", "reply", "Yes, looking now.", request)
        follow_up = await send("alice", "bob", "note", "Thanks! CI is green too.", reply)
        for i in range(BACKLOG):
            await send("alice", "builder", "request", f"build job {i}")
        xss = await send("mallory", "bob", "note", XSS_TEXT)
        doomed = await send("carol", "worker", "request", "this one fails delivery")
    connection = RedisConnection(RedisSettings(url=url))
    await RedisPolicyStore(connection).set("builder", listing(["alice", "carol"]))
    queue = RedisDeliveryQueue(connection)
    await queue.open()
    try:
        claimed = await queue.claim("worker", "worker-1", 1, visibility=60)
        assert [e.envelope_id for e in claimed] == [doomed]
        assert await queue.dead_letter(
            "worker", doomed, "handler raised RuntimeError 3 times", consumer="worker-1"
        )
    finally:
        await queue.close()
    expired, overdelivered = await _seed_dead_letters(url)
    return Seeded(request, reply, follow_up, xss, doomed, expired, overdelivered)


async def _seed_dead_letters(url: str) -> tuple[str, str]:
    """expiring's one envelope expires unread; flaky's is handed out more than once (the limit here)."""
    clock = [now_ms()]
    limits = Limits(max_deliveries=1, clock=lambda: clock[0])
    async with redis_relays(CONTRACT, url, 1, limits, prefix="relay") as (relay,):
        for agent in ("expiring", "flaky"):
            await relay.register(agent, HOST, f"{agent}-1")
        body = CONTRACT.from_json({"kind": "note", "text": "nobody acknowledges this"})
        expired = (await relay.send("carol", "expiring", body, ttl_ms=MIN_TTL_MS)).id
        overdelivered = (await relay.send("carol", "flaky", body)).id
        assert [e.id for e in await relay.fetch("flaky", session="flaky-1")] == [overdelivered]
        clock[0] += 2 * MIN_TTL_MS
        assert await relay.fetch("flaky", session="flaky-1") == []
        assert await relay.fetch("expiring", session="expiring-1") == []
    return expired, overdelivered


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("dashboard")
    server = EmbeddedRedis()
    server.start()
    try:
        key = tmp / "relay.key"
        assert run_relay("keygen", key).returncode == 0
        seeded = asyncio.run(_seed(server.url))
        serve = ServeProcess(["--redis-url", server.url, "--agent-mcp-key-file", str(key)], tmp / "serve.log")
        serve.start()
        try:
            yield Running(serve, key, server.url, seeded)
        finally:
            serve.stop()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(running: Running) -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def page(browser: Any, running: Running) -> Iterator[Any]:
    """A signed-in page; any dialog (an alert from injected script) fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    tab.on("dialog", lambda d: (DIALOGS.append(d.message), d.dismiss()))
    tab.goto(running.login_url())
    yield tab
    context.close()


def assert_inert(page: Any) -> None:
    """No injected script ran: no dialog opened, and the marker the hostile texts set is unset."""
    assert DIALOGS == []
    assert page.evaluate("window.__xss") is None


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def test_a_stranger_is_refused(browser: Any, running: Running) -> None:
    context = browser.new_context()
    tab = context.new_page()
    response = tab.goto(f"{running.serve.base}/ui/")
    assert response.status == 401
    assert "relay dashboard-url" in tab.text_content("body")
    shot(tab, "signed-out")
    response = tab.goto(f"{running.serve.base}/ui/login?token=ui1.not.a.token")
    assert response.status == 401
    assert "not a dashboard token" in tab.text_content("body")
    # an agent token is no dashboard token
    agent_token = agent_headers(load_key_file(running.key), "alice", "alice-1")["Authorization"][7:]
    response = tab.goto(f"{running.serve.base}/ui/login?token={agent_token}")
    assert response.status == 401
    with httpx2.Client(base_url=running.serve.base) as http:
        assert http.get("/ui/api/agents").status_code == 401
        assert http.get("/ui/api/agents", headers={"cookie": f"relay_ui={agent_token}"}).status_code == 401
        login_token = running.login_url().split("token=", 1)[1]
        # a login token is not a session, and a spent login token does not log in again
        assert http.get("/ui/api/agents", headers={"cookie": f"relay_ui={login_token}"}).status_code == 401
        assert http.get(f"/ui/login?token={login_token}").status_code == 303
        assert http.get(f"/ui/login?token={login_token}").status_code == 401
        # a rebinding name is refused
        assert http.get("/ui/", headers={"host": "evil.example"}).status_code == 421
    context.close()


def test_login_drops_the_token_and_sets_a_strict_cookie(page: Any, running: Running) -> None:
    assert page.url == f"{running.serve.base}/ui/"
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["relay_ui"]["httpOnly"] is True
    assert cookies["relay_ui"]["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""


def test_agents_overview_shows_backlog_and_sorts(page: Any) -> None:
    page.wait_for_selector("tr[data-agent='builder']")
    depth = page.locator("tr[data-agent='builder'] td[data-col='depth']")
    assert depth.text_content() == str(BACKLOG)
    assert "warn" in (depth.get_attribute("class") or "")
    # each agent's contact policy (docs/policy.md): builder takes mail from alice and carol only
    assert page.text_content("tr[data-agent='builder'] td[data-col='policy']") == "list (2)"
    assert page.text_content("tr[data-agent='alice'] td[data-col='policy']") == "open"
    # presence (docs/shell.md): every agent of this page registered or called just now
    assert str(page.text_content("tr[data-agent='builder'] td[data-col='presence']")).startswith("live, ")

    # (wait_for_function evaluates a string, which the page's CSP forbids: poll from here instead)
    def first() -> str:
        return str(page.get_attribute("#agents tbody tr", "data-agent"))

    page.click("th[data-sort='depth']")
    wait_until(lambda: first() == "builder", 10, "builder first (deepest inbox)")
    page.click("th[data-sort='depth']")
    wait_until(lambda: first() != "builder", 10, "builder no longer first (ascending)")
    page.click("th[data-sort='depth']")
    wait_until(lambda: first() == "builder", 10, "builder first again")
    shot(page, "agents")


def test_inbox_is_read_only_and_xss_renders_as_text(page: Any, running: Running) -> None:
    page.click("tr[data-agent='bob'] a")
    row = page.wait_for_selector(f"tr[data-envelope='{running.seeded.xss}']")
    assert XSS_TEXT in row.text_content()
    assert page.locator("#inbox script, #inbox img").count() == 0
    assert_inert(page)
    shot(page, "inbox")
    client = redis.Redis.from_url(running.redis_url, decode_responses=True)
    try:  # nothing was handed out by looking
        assert client.xpending("relay:inbox:{bob}", "relay")["pending"] == 0
    finally:
        client.close()


def test_thread_follows_in_reply_to(page: Any, running: Running) -> None:
    seeded = running.seeded
    page.click(f"tr[data-envelope='{seeded.follow_up}'] td a")
    page.wait_for_selector(f"article[data-envelope='{seeded.request}']")
    order = page.eval_on_selector_all("#thread article", "nodes => nodes.map(n => n.dataset.envelope)")
    assert order == [seeded.request, seeded.reply, seeded.follow_up]  # each followed by its answer
    assert page.locator(f"article.focus[data-envelope='{seeded.follow_up}']").count() == 1
    shot(page, "thread")


def test_dead_letters_say_why_they_are_there_and_one_is_requeued(page: Any, running: Running) -> None:
    page.click("nav a[data-page='dead']")
    seeded = running.seeded
    for envelope in (seeded.dead, seeded.expired, seeded.overdelivered):
        page.wait_for_selector(f"tr[data-envelope='{envelope}']")

    def why(envelope: str) -> str:
        return str(page.text_content(f"tr[data-envelope='{envelope}'] td.why"))

    assert why(seeded.expired).startswith("expired: its time to live ran out")
    assert why(seeded.overdelivered) == "too many deliveries: handed out once and never acknowledged"
    assert why(seeded.dead) == "given up by its consumer: handler raised RuntimeError 3 times"
    shot(page, "dead-letters")
    page.check(f"tr[data-envelope='{running.seeded.dead}'] input[type='checkbox']")
    page.click("section[data-agent='worker'] button:text('Requeue selected')")
    page.wait_for_selector(".notice.ok")
    assert "requeued 1 dead letter" in page.text_content(".notice.ok")
    client = redis.Redis.from_url(running.redis_url, decode_responses=True)
    try:
        assert client.xlen("relay:dead:{worker}") == 0
        texts = [fields.get("text") for _, fields in client.xrange("relay:inbox:{worker}")]
        assert "this one fails delivery" in texts
    finally:
        client.close()


def test_compose_sends_as_a_person_and_the_agent_fetches_it_over_mcp(page: Any, running: Running) -> None:
    page.click("nav a[data-page='compose']")
    page.fill("#compose-from", "ops-dana")
    page.fill("#compose-to", "carol")
    page.select_option("#compose-kind", "request")
    page.fill("#compose-text", "Please restart the nightly job.")
    page.click("form.compose button[type='submit']")
    page.wait_for_selector("#compose-result .notice.ok")
    notice = page.text_content("#compose-result .notice.ok")
    assert "now registered as a person" in notice
    shot(page, "compose")
    sent_id = notice.split()[1]
    # in a thread of its own: Playwright's sync API keeps an event loop on this one
    with ThreadPoolExecutor(1) as pool:
        fetched = pool.submit(asyncio.run, _fetch_over_mcp(running, "carol")).result(60)
    # one Send, one envelope (carol's inbox was empty)
    assert [(e["id"], e["from"]) for e in fetched["envelopes"]] == [(sent_id, "ops-dana")], fetched
    client = redis.Redis.from_url(running.redis_url, decode_responses=True)
    try:
        assert client.xlen("relay:inbox:{carol}") == 1
        assert client.hget("relay:agent:{ops-dana}", "provider") == "human"
    finally:
        client.close()


async def _fetch_over_mcp(running: Running, agent: str) -> dict[str, Any]:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = agent_headers(load_key_file(running.key), agent, f"{agent}-1")
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(running.serve.url, http_client=http)) as client,
    ):
        result = await client.call_tool("FetchAgentInbox", {"limit": 16})
        assert not result.is_error, result.content
        assert isinstance(result.structured_content, dict)
        return result.structured_content


def test_a_hostile_agent_id_renders_as_text(page: Any) -> None:
    hostile = '"><img src=x onerror="window.__xss=3">'
    page.fill("#compose-from", hostile)
    page.fill("#compose-text", "hello")
    page.click("form.compose button[type='submit']")
    page.wait_for_selector("#compose-result .notice.error")
    banner = str(page.text_content("#compose-result .notice.error"))
    assert banner.startswith("invalid_argument: from: ")
    assert banner.count("from:") == 1, banner  # the message once, not again as its violation
    page.goto(page.url.split("#")[0] + "#/agent/" + hostile.replace('"', "%22"))
    page.wait_for_selector("h1 span.mono")
    assert page.text_content("h1 span.mono") == hostile
    assert page.locator("main img").count() == 0
    assert_inert(page)


def test_state_changes_need_the_csrf_token_and_same_origin(page: Any, running: Running) -> None:
    base = running.serve.base
    body = {"from": "ops-dana", "to": "carol", "kind": "note", "text": "forged"}
    no_token = page.request.post(f"{base}/ui/api/send", data=body, headers={"origin": base})
    assert no_token.status == 403 and no_token.json()["error"]["code"] == "csrf"
    csrf = page.request.get(f"{base}/ui/api/session").json()["csrf"]
    foreign = page.request.post(
        f"{base}/ui/api/send", data=body, headers={"origin": "http://evil.example", "x-relay-csrf": csrf}
    )
    assert foreign.status == 403 and "Origin" in foreign.text()  # the front's Host/Origin check
    requeue = page.request.post(f"{base}/ui/api/requeue", data={"agent": "bob"}, headers={"origin": base})
    assert requeue.status == 403


def test_traffic_page_draws_per_tier_rates(page: Any) -> None:
    page.click("nav a[data-page='traffic']")
    page.wait_for_selector("#traffic-totals tbody tr")
    rows = page.eval_on_selector_all(
        "#traffic-totals tbody tr", "rows => rows.map(r => [...r.children].map(c => c.textContent))"
    )
    assert [r[0] for r in rows] == ["in_process", "host", "network"]
    assert float(rows[1][1]) >= 1  # the dashboard's send, counted by this process
    wait_until(lambda: page.locator("svg polyline").count() == 3, 10, "the chart")
    ticks = page.eval_on_selector_all(
        "svg text.tick", "nodes => nodes.map(n => [n.textContent, Number(n.dataset.atMs)])"
    )
    assert 2 <= len(ticks) <= 5, ticks  # a time axis: clock times, in order, of the span drawn
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", text) for text, _ in ticks), ticks
    assert [at for _, at in ticks] == sorted(at for _, at in ticks)
    assert page.text_content("svg text.axis-label") == "time (UTC)"
    shot(page, "traffic")


def test_headers_forbid_framing_and_inline_script(running: Running) -> None:
    with httpx2.Client(base_url=running.serve.base) as http:
        response = http.get("/ui/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert response.headers["x-frame-options"] == "DENY"


def test_log_out_ends_the_session(page: Any, running: Running) -> None:
    page.click("#logout")
    page.wait_for_selector("main.denied")
    assert "relay dashboard-url" in page.text_content("main.denied")
    assert "relay_ui" not in {c["name"] for c in page.context.cookies()}
