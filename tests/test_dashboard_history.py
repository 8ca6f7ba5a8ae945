"""The dashboard's history and search API (``/ui/api/history``, ``/ui/api/search``) and its thread view
after acknowledgement, over real HTTP (the app on uvicorn, memory backend): the filters of ``relay
history``/``relay search``, pages with cursors, refusals that name their field, and the same session
check as every other dashboard read. The pages in Chromium: tests/test_dashboard_history_browser.py."""

from __future__ import annotations

from typing import Any

import httpx2

from broker.addresses import ClaudeCodeAddress
from broker.agent_message import AgentMessageContract
from broker.relay import Relay
from tests.test_dashboard import dashboard_front, refused

CONTRACT = AgentMessageContract()


async def _send(
    relay: Relay[Any], sender: str, to: str, kind: str, text: str, reply: str | None = None
) -> str:
    body = CONTRACT.from_json({"kind": kind, "text": text, "in_reply_to": reply})
    return str((await relay.send(sender, to, body)).id)


async def _drain(relay: Relay[Any], agent: str) -> None:
    got = await relay.fetch(agent, 256)
    await relay.ack(agent, [e.id for e in got])


def ids(answer: httpx2.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [e["id"] for e in answer.json()["entries"]]


async def test_history_pages_filter_as_relay_history_does() -> None:
    async with dashboard_front() as (http, relay, _):
        await relay.register("carol", ClaudeCodeAddress.parse("127.0.0.1:14111"), "carol-1")
        ask = await _send(relay, "alice", "bob", "request", "Deploy the API please")
        aside = await _send(relay, "carol", "bob", "note", "lunch at noon")
        queued_before = await _send(relay, "alice", "bob", "note", "still queued")
        got = await relay.fetch("bob", 2)
        await relay.ack("bob", [e.id for e in got])  # ask and aside leave bob's inbox
        answer = await _send(relay, "bob", "alice", "reply", "api deployed", ask)
        await _drain(relay, "alice")

        history = await http.get("/ui/api/history", params={"agent": "bob"})
        assert ids(history) == [ask, aside] and history.json()["next"] is None
        first = history.json()["entries"][0]
        assert (first["from"], first["to"], first["kind"], first["outcome"]) == (
            "alice",
            "bob",
            "request",
            "acknowledged",
        )
        assert first["text"] == "Deploy the API please" and first["left_at"].endswith("Z")
        assert queued_before not in ids(history)  # still in the inbox: not history
        # with: the conversation both ways, mail from alice in bob's history and from bob in alice's
        # (in the order they left their inboxes; within one millisecond, by whose history holds them)
        conversation = await http.get("/ui/api/history", params={"agent": "bob", "with": "alice"})
        assert sorted(ids(conversation)) == sorted([ask, answer])
        assert ids(await http.get("/ui/api/history", params={"agent": "bob", "kind": "note"})) == [aside]
        assert ids(await http.get("/ui/api/history", params={"agent": "bob", "text": "API deploy"})) == [ask]
        assert ids(await http.get("/ui/api/history", params={"agent": "bob", "since": "1h"})) == [ask, aside]
        assert ids(await http.get("/ui/api/history", params={"agent": "bob", "until": "2000-01-01"})) == []
        assert ids(await http.get("/ui/api/history", params={"agent": "nobody"})) == []

        seen: list[str] = []
        page = await http.get("/ui/api/history", params={"agent": "bob", "limit": "1"})
        for _ in range(4):
            seen += ids(page)
            cursor = page.json()["next"]
            if cursor is None:
                break
            page = await http.get("/ui/api/history", params={"agent": "bob", "limit": "1", "after": cursor})
        assert seen == [ask, aside]

        for params, field in (
            ({"agent": "Bad Id"}, "agent"),
            ({}, "agent"),
            ({"agent": "bob", "with": "<b>x</b>"}, "with"),
            ({"agent": "bob", "kind": "gossip"}, "kind"),
            ({"agent": "bob", "text": "!!!"}, "text"),
            ({"agent": "bob", "since": "yesterday"}, "since"),
            ({"agent": "bob", "since": "1h", "until": "2h"}, "since"),
            ({"agent": "bob", "after": "nope"}, "after"),
            ({"agent": "bob", "limit": "0"}, "limit"),
            ({"agent": "bob", "limit": "9999"}, "limit"),
        ):
            error = refused(await http.get("/ui/api/history", params=params), 400, "invalid_argument")
            assert error["violations"][0]["field"] == field, (params, error)


async def test_search_finds_words_in_every_history_or_one() -> None:
    async with dashboard_front() as (http, relay, _):
        ask = await _send(relay, "alice", "bob", "request", "Deploy the API please")
        answer = await _send(relay, "bob", "alice", "reply", "deploy done", ask)
        other = await _send(relay, "alice", "bob", "note", "unrelated")
        await _drain(relay, "bob")
        await _drain(relay, "alice")
        everywhere = await http.get("/ui/api/search", params={"words": "DEPLOY"})
        order = ids(everywhere)  # by when each left its inbox (a tie: by whose history holds it)
        assert sorted(order) == sorted([ask, answer]) and everywhere.json()["words"] == ["deploy"]
        assert other not in ids(everywhere)
        assert ids(await http.get("/ui/api/search", params={"words": "deploy", "agent": "alice"})) == [answer]
        page = await http.get("/ui/api/search", params={"words": "deploy", "limit": "1"})
        assert ids(page) == order[:1] and page.json()["next"] is not None
        rest = await http.get(
            "/ui/api/search", params={"words": "deploy", "limit": "1", "after": page.json()["next"]}
        )
        assert ids(rest) == order[1:]
        for params, field in (
            ({}, "words"),
            ({"words": "?!"}, "words"),
            ({"words": "x", "agent": "A B"}, "agent"),
        ):
            error = refused(await http.get("/ui/api/search", params=params), 400, "invalid_argument")
            assert error["violations"][0]["field"] == field, (params, error)


async def test_a_thread_stays_whole_after_both_sides_acknowledged() -> None:
    async with dashboard_front() as (http, relay, state):
        ask = await _send(relay, "alice", "bob", "request", "Can you review PR 12?")
        await _drain(relay, "bob")
        answer = await _send(relay, "bob", "alice", "reply", "Yes, looking now.", ask)
        await _drain(relay, "alice")
        follow = await _send(relay, "alice", "bob", "note", "Thanks!", answer)
        await _drain(relay, "bob")
        assert all(not inbox.entries for inbox in state.inboxes.values())  # every envelope acknowledged
        for start in (ask, answer, follow):
            thread = (await http.get("/ui/api/thread", params={"id": start})).json()
            assert [(e["id"], e["depth"]) for e in thread["envelopes"]] == [
                (ask, 0),
                (answer, 1),
                (follow, 2),
            ]


async def test_history_and_search_need_a_session() -> None:
    async with dashboard_front() as (http, _, _):
        base = str(http.base_url).rstrip("/")
        async with httpx2.AsyncClient(base_url=base) as stranger:
            refused(await stranger.get("/ui/api/history", params={"agent": "bob"}), 401, "unauthenticated")
            refused(await stranger.get("/ui/api/search", params={"words": "x"}), 401, "unauthenticated")
        answer = await http.get("/ui/api/history", params={"agent": "bob"})
        assert answer.headers["cache-control"] == "no-store"
        assert "script-src 'self'" in answer.headers["content-security-policy"]
