"""``SearchAgentMessages`` over MCP (the official client) against a real front and Redis: the caller's
own mail, sent and received, after it left the recipient's inbox, and nothing of anyone else's."""

from __future__ import annotations

from typing import Any

from tests.front_support import data, error, running_front

REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}


def note(text: str, **more: Any) -> dict[str, Any]:
    return {"kind": "note", "text": text, **more}


async def _drain(client: Any) -> None:
    got = data(await client.call_tool("FetchAgentInbox", {"limit": 256}))["envelopes"]
    if got:
        data(await client.call_tool("AcknowledgeAgentInbox", {"ids": [e["id"] for e in got]}))


async def test_an_agent_finds_its_own_mail_both_ways_and_nothing_else(redis_url: str) -> None:
    async with (
        running_front(redis_url) as front,
        front.client("alice", "a-1") as alice,
        front.client("bob", "b-1") as bob,
        front.client("carol", "c-1") as carol,
    ):
        for client in (alice, bob, carol):
            data(await client.call_tool("RegisterAgentAddress", REGISTER))

        async def send(client: Any, to: str, message: dict[str, Any]) -> str:
            return str(data(await client.call_tool("SendAgentMessage", {"to": to, "message": message}))["id"])

        ask = await send(alice, "bob", note("Deploy the API please"))
        answer = await send(bob, "alice", {"kind": "reply", "text": "api deployed", "in_reply_to": ask})
        aside = await send(carol, "bob", note("deploy the api secretly"))
        queued = await send(alice, "bob", note("deploy again?"))  # not acknowledged: not history
        await _drain(bob)
        await _drain(alice)

        async def search(client: Any, **arguments: Any) -> dict[str, Any]:
            return data(await client.call_tool("SearchAgentMessages", arguments))

        mine = await search(alice)  # in the order they left their inboxes
        order = [m["id"] for m in mine["messages"]]  # by when each left its inbox (a tie: by holder)
        assert sorted(order) == sorted([ask, queued, answer]) and order.index(ask) < order.index(queued)
        assert aside not in [m["id"] for m in mine["messages"]]
        first = next(m for m in mine["messages"] if m["id"] == ask)
        assert (first["from"], first["to"], first["outcome"]) == ("alice", "bob", "acknowledged")
        assert first["message"] == {"kind": 1, "text": "Deploy the API please"}
        words = await search(alice, query="API DEPLOY")
        assert [m["id"] for m in words["messages"]] == [ask]
        assert [m["id"] for m in (await search(alice, query="deployed"))["messages"]] == [answer]
        thread = [m["id"] for m in (await search(alice, thread=answer))["messages"]]
        assert thread == [i for i in order if i in (ask, answer)]
        assert (await search(alice, **{"with": "carol"}))["messages"] == []
        # carol sees her own letter to bob, never alice's
        assert [m["id"] for m in (await search(carol, query="deploy"))["messages"]] == [aside]
        # another agent's mail is not even counted: more of it changes nothing alice sees
        before = await search(alice, query="deploy")
        for n in range(30):
            await send(carol, "bob", note(f"deploy {n}"))
        await _drain(bob)
        assert await search(alice, query="deploy") == before
        await send(alice, "bob", note("deploy after"))  # queued: not in the history yet
        assert await search(alice, query="deploy") == before

        # paged: one at a time, each page after the last one's cursor
        seen: list[str] = []
        page = await search(alice, limit=1)
        for _ in range(5):
            seen += [m["id"] for m in page["messages"]]
            if "next" not in page:
                break
            page = await search(alice, limit=1, cursor=page["next"])
        assert seen == order


async def test_search_refuses_what_it_cannot_read(redis_url: str) -> None:
    async with running_front(redis_url) as front, front.client("dora", "d-1") as dora:
        unregistered = error(await dora.call_tool("SearchAgentMessages", {}))
        assert unregistered["code"] == "unregistered_agent"
        data(await dora.call_tool("RegisterAgentAddress", REGISTER))
        for arguments, field in (
            ({"query": "!!!"}, "query"),
            ({"since": "yesterday"}, "since"),
            ({"cursor": "nope"}, "cursor"),
            ({"limit": 0}, "limit"),
            ({"thread": "env_x"}, "thread"),
            ({"with": "Not An Id"}, "with"),
            ({"other": 1}, "other"),
        ):
            refused = error(await dora.call_tool("SearchAgentMessages", arguments))
            assert refused["code"] == "invalid_argument", (arguments, refused)
            assert refused["violations"][0]["field"] == field, (arguments, refused)
