"""The dashboard's history, search and thread pages in a real browser (headless Chromium driven by
Playwright, as tests/test_dashboard_browser.py) against a real ``relay serve`` child process on its own
Redis, after every envelope was acknowledged: the history of an agent a page at a time with cursor
links, its filters, the conversation with one agent, search, a thread that stays whole, and hostile
texts (in messages and in the filters) that render as text. ``RELAY_SCREENSHOTS=docs/screenshots``
refreshes the screenshots the docs show."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from adapters.redis.embedded import EmbeddedRedis
from broker.testing.polling import wait_until
from tests.processes import ServeProcess, dashboard_login_url, run_relay
from tests.support import redis_relays
from tests.test_dashboard_browser import (
    CHROMIUM,
    CONTRACT,
    DIALOGS,
    HOST,
    XSS_TEXT,
    assert_inert,
    playwright_api,
    shot,
)

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium); .ci/run installs it"
    ),
    pytest.mark.timeout(300),
]

PINGS = 55
PAGE = 50
"""The dashboard's history page (``HISTORY_PAGE``)."""


@dataclass
class Seeded:
    request: str
    reply: str
    follow_up: str
    xss: str


@dataclass
class Running:
    serve: ServeProcess
    key: Path
    seeded: Seeded


async def _seed(url: str) -> Seeded:
    """alice and bob talk (a three-message thread), mallory sends XSS to bob, carol sends bob PINGS
    notes; every envelope is acknowledged by its recipient, so all of it is history."""
    async with redis_relays(CONTRACT, url, 1, prefix="relay") as (relay,):
        for agent in ("alice", "bob", "carol", "mallory"):
            await relay.register(agent, HOST, f"{agent}-1")

        async def send(sender: str, to: str, kind: str, text: str, reply_to: str | None = None) -> str:
            body = CONTRACT.from_json({"kind": kind, "text": text, "in_reply_to": reply_to})
            sent = (await relay.send(sender, to, body)).id
            got = await relay.fetch(to, 16, session=f"{to}-1")
            assert [e.id for e in got] == [sent]
            assert await relay.ack(to, [sent], session=f"{to}-1")
            # histories merge by when each envelope left, and by holder within one millisecond: one
            # envelope a millisecond keeps the thread's order that of the conversation
            left = time.time_ns() // 1_000_000
            while time.time_ns() // 1_000_000 == left:
                await asyncio.sleep(0)
            return sent

        request = await send("alice", "bob", "request", "Can you review PR 12?")
        reply = await send("bob", "alice", "reply", "Yes, looking now.", request)
        follow_up = await send("alice", "bob", "note", "Thanks! CI is green too.", reply)
        xss = await send("mallory", "bob", "note", XSS_TEXT)
        for i in range(PINGS):
            await send("carol", "bob", "status", f"ping {i}")
    return Seeded(request, reply, follow_up, xss)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("dashboard-history")
    server = EmbeddedRedis()
    server.start()
    try:
        key = tmp / "relay.key"
        assert run_relay("keygen", key).returncode == 0
        seeded = asyncio.run(_seed(server.url))
        serve = ServeProcess(["--redis-url", server.url, "--agent-mcp-key-file", str(key)], tmp / "serve.log")
        serve.start()
        try:
            yield Running(serve, key, seeded)
        finally:
            serve.stop()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def page(running: Running) -> Iterator[Any]:
    """A signed-in page; any dialog (an alert from injected script) fails the test."""
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            tab = context.new_page()
            tab.on("dialog", lambda d: (DIALOGS.append(d.message), d.dismiss()))
            tab.goto(dashboard_login_url(running.serve.base, running.key))
            yield tab
            context.close()
        finally:
            browser.close()


def rows(page: Any) -> list[str]:
    listed: list[str] = page.eval_on_selector_all(
        "#history tbody tr", "nodes => nodes.map(n => n.dataset.envelope)"
    )
    return listed


def until_rows(page: Any, count: int) -> list[str]:
    page.wait_for_selector(f"#history tbody tr:nth-child({count})")
    listed = rows(page)
    assert len(listed) == count, listed
    return listed


def test_the_agents_list_leads_to_a_history_read_a_page_at_a_time(page: Any, running: Running) -> None:
    seeded = running.seeded
    page.wait_for_selector("tr[data-agent='bob']")
    page.click("tr[data-agent='bob'] a:text('history')")
    first = until_rows(page, PAGE)
    assert first[:3] == [seeded.request, seeded.follow_up, seeded.xss]  # oldest first
    row = page.locator(f"tr[data-envelope='{seeded.xss}']")
    assert row.locator("td.text").text_content() == XSS_TEXT  # hostile text stays text
    assert "acknowledged" in str(row.text_content())
    assert page.locator("#history script, #history img").count() == 0
    assert_inert(page)
    shot(page, "history")
    page.click("#next-page")
    rest = until_rows(page, 3 + PINGS - PAGE)
    assert not set(rest) & set(first)
    assert page.locator("#next-page").count() == 0 and "end of the listing" in page.text_content("#listing")
    page.click("a:text('First page')")
    assert until_rows(page, PAGE) == first


def test_the_history_filters_are_those_of_relay_history(page: Any, running: Running) -> None:
    seeded = running.seeded
    page.goto(page.url.split("#")[0] + "#/history/bob")
    until_rows(page, PAGE)
    page.fill("#filter-with", "alice")
    page.click("form.filters button[type='submit']")
    wait_until(lambda: "with alice" in str(page.text_content("h1")), 10, "the conversation with alice")
    # the conversation both ways: alice's mail in bob's history, bob's in alice's
    assert until_rows(page, 3) == [seeded.request, seeded.reply, seeded.follow_up]
    page.fill("#filter-with", "")
    page.select_option("#filter-kind", "note")
    page.fill("#filter-text", "CI green")
    page.click("form.filters button[type='submit']")
    # the follow-up is in the listing before too: wait for the listing the new filter gives
    wait_until(lambda: rows(page) == [seeded.follow_up], 10, "the notes with 'CI green'")
    hostile = '"><img src=x onerror="window.__xss=4"> green'
    page.fill("#filter-text", hostile)
    page.click("form.filters button[type='submit']")
    page.wait_for_selector("#listing p:text('Nothing on this page.')")
    assert page.input_value("#filter-text") == hostile
    assert page.locator("main img").count() == 0
    assert_inert(page)


def test_a_thread_stays_whole_after_both_sides_acknowledged(page: Any, running: Running) -> None:
    seeded = running.seeded
    page.goto(page.url.split("#")[0] + f"#/thread/{seeded.reply}")
    page.wait_for_selector(f"article[data-envelope='{seeded.follow_up}']")
    order = page.eval_on_selector_all("#thread article", "nodes => nodes.map(n => n.dataset.envelope)")
    assert order == [seeded.request, seeded.reply, seeded.follow_up]  # every envelope acknowledged
    page.click(f"article[data-envelope='{seeded.reply}'] a:text('conversation')")
    wait_until(lambda: str(page.text_content("h1")) == "History of alice with bob", 10, "the conversation")
    assert until_rows(page, 3) == [seeded.request, seeded.reply, seeded.follow_up]


def test_search_finds_words_in_every_history_and_hostile_words_stay_text(page: Any, running: Running) -> None:
    seeded = running.seeded
    page.click("nav a[data-page='search']")
    page.fill("#filter-words", "SCRIPT window")
    page.click("form.filters button[type='submit']")
    page.wait_for_selector(f"tr[data-envelope='{seeded.xss}']")
    assert rows(page) == [seeded.xss]
    assert page.locator("#history script, #history img").count() == 0
    shot(page, "search")
    page.fill("#filter-words", "review")
    page.fill("#filter-agent", "alice")
    page.click("form.filters button[type='submit']")
    page.wait_for_selector("#listing p:text('Nothing on this page.')")  # the request is in bob's history
    page.fill("#filter-agent", "")
    page.click("form.filters button[type='submit']")
    page.wait_for_selector(f"tr[data-envelope='{seeded.request}']")
    assert rows(page) == [seeded.request]
    hostile = '<img src=x onerror="window.__xss=5">'
    page.goto(page.url.split("#")[0] + "#/search?words=" + hostile.replace('"', "%22"))
    page.wait_for_selector("h1 span.mono")
    assert page.text_content("h1 span.mono") == hostile
    assert page.locator("main img").count() == 0
    assert_inert(page)
    page.fill("#filter-words", "!!!")
    page.click("form.filters button[type='submit']")
    page.wait_for_selector("#listing .notice.error")
    assert "words" in page.text_content("#listing .notice.error")


def test_history_and_search_need_the_dashboard_session(running: Running) -> None:
    with httpx2.Client(base_url=running.serve.base) as http:
        assert http.get("/ui/api/history", params={"agent": "bob"}).status_code == 401
        assert http.get("/ui/api/search", params={"words": "ping"}).status_code == 401
        assert http.get("/ui/", params={}).status_code == 401
