"""The dashboard without a browser: its tokens (``broker.front.ui.access``), its JSON API's answers to
hostile input over real HTTP (the app on uvicorn, memory backend), and ``relay dashboard-url``.
The browser tests are in tests/test_dashboard_browser.py."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from adapters.memory import MemoryInboxStore, MemoryPolicyStore, MemoryRegistry, MemoryState
from adapters.memory.delivery import MemoryDeliveryQueue
from adapters.memory.operator_view import MemoryOperatorView
from adapters.memory.spent import MemorySpentTokens
from broker.addresses import HUMAN_SESSION, ClaudeCodeAddress, HumanAddress
from broker.agent_message import AgentMessageContract
from broker.front.app import create_app
from broker.front.tokens import AuthError, KeyRing, agent_headers
from broker.front.ui.access import SESSION_TTL, AccessDenied, OperatorAccess
from broker.front.ui.api import Dashboard
from broker.front.ui.snapshot import Overview
from broker.front.ui.traffic import Traffic
from broker.policy import REGISTERED, ContactPolicy, listing
from broker.relay import Relay
from tests.front_support import serve_app
from tests.processes import run_relay

CONTRACT = AgentMessageContract()


def ring() -> KeyRing:
    return KeyRing([secrets.token_bytes(32)])


def operator_access(keyring: KeyRing) -> OperatorAccess:
    return OperatorAccess(keyring, MemorySpentTokens())


# -- tokens ---------------------------------------------------------------------------------------


async def test_a_login_token_works_once_and_gives_a_session() -> None:
    access = operator_access(ring())
    token = access.mint_login()
    cookie, session = await access.login(token)
    assert access.session(cookie).sid == session.sid
    assert access.check_csrf(session, access.csrf(session))
    assert not access.check_csrf(session, None) and not access.check_csrf(session, "x" * 43)
    with pytest.raises(AccessDenied, match="used already"):
        await access.login(token)


async def test_tokens_of_one_kind_never_pass_as_another() -> None:
    keys = ring()
    access = operator_access(keys)
    login = access.mint_login()
    with pytest.raises(AccessDenied):
        access.session(login)  # a login token is no session
    cookie, _ = await access.login(login)
    with pytest.raises(AccessDenied):
        await access.login(cookie)  # a session is no login token
    agent_token = agent_headers(keys, "alice", "s1")["Authorization"].removeprefix("Bearer ")
    for token in (agent_token, "ui1." + agent_token.removeprefix("v1."), "", "ui1.x.y.z"):
        with pytest.raises(AccessDenied):
            await access.login(token)
        with pytest.raises(AccessDenied):
            access.session(token)
    # and a dashboard token is no agent token, even with the agent headers it does not name
    with pytest.raises(AuthError):
        keys.verify(cookie, "alice", "s1")
    with pytest.raises(AccessDenied, match="does not verify"):
        access.session(cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB"))


async def test_expiry_and_another_relays_key() -> None:
    access = operator_access(ring())
    token = access.mint_login(ttl=10, now=1_000_000)
    with pytest.raises(AccessDenied, match="expired"):
        await access.login(token, now=1_000_010)
    cookie, _ = await access.login(access.mint_login())
    with pytest.raises(AccessDenied, match="expired"):
        access.session(cookie, now=time.time() + SESSION_TTL + 1)
    with pytest.raises(AccessDenied, match="does not hold"):
        operator_access(ring()).session(cookie)
    with pytest.raises(ValueError, match="1 to"):
        access.mint_login(ttl=0)


async def test_a_rotated_key_file_keeps_sessions_signed_by_the_old_key() -> None:
    old = secrets.token_bytes(32)
    access = operator_access(KeyRing([old]))
    cookie, _ = await access.login(access.mint_login())
    access.use(KeyRing([secrets.token_bytes(32), old]))
    access.session(cookie)
    access.use(KeyRing([secrets.token_bytes(32)]))
    with pytest.raises(AccessDenied):
        access.session(cookie)


# -- the JSON API over HTTP -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def dashboard_front() -> AsyncIterator[tuple[httpx2.AsyncClient, Relay[Any], MemoryState]]:
    """A signed-in client of the dashboard of a memory-backed relay (alice and bob registered)."""
    state = MemoryState()
    relay = Relay(CONTRACT, MemoryInboxStore(state), MemoryRegistry(state))
    view = MemoryOperatorView(state)
    access = operator_access(ring())
    dashboard = Dashboard(
        relay=relay,
        view=view,
        dead=MemoryDeliveryQueue(state),
        access=access,
        human=lambda _: HumanAddress.parse("dashboard"),
        traffic=Traffic(relay.metrics),
        overview=Overview(view, max_age=0, policies=MemoryPolicyStore(state)),
    )
    async with relay:
        for agent in ("alice", "bob"):
            await relay.register(agent, ClaudeCodeAddress.parse("127.0.0.1:14111"), f"{agent}-1")
        async with (
            serve_app(create_app(relay, keyring=None, dashboard=dashboard)) as base,
            httpx2.AsyncClient(base_url=base, timeout=30) as http,
        ):
            assert (await http.get(f"/ui/login?token={access.mint_login()}")).status_code == 303
            csrf = (await http.get("/ui/api/session")).json()["csrf"]
            http.headers.update({"x-relay-csrf": csrf, "origin": base})
            yield http, relay, state


def refused(response: httpx2.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


async def test_a_refused_send_stores_and_registers_nothing() -> None:
    async with dashboard_front() as (http, relay, state):
        error = refused(
            await http.post("/ui/api/send", json={"from": "dana", "to": "bob", "kind": "nope", "text": "x"}),
            400,
            "contract_violation",
        )
        assert error["violations"][0]["field"] == "kind"
        refused(
            await http.post(
                "/ui/api/send", json={"from": "dana", "to": "nobody", "text": "x", "kind": "note"}
            ),
            404,
            "unknown_recipient",
        )
        error = refused(
            await http.post("/ui/api/send", json={"from": 'x"><b>', "to": "bob", "text": "x"}),
            400,
            "invalid_argument",
        )
        assert error["violations"][0]["field"] == "from"
        error = refused(
            await http.post("/ui/api/send", json={"from": "alice", "to": "bob", "kind": "note", "text": "x"}),
            400,
            "invalid_argument",
        )
        assert error["violations"][0]["rule"] == "from.person"  # a person never speaks as an agent
        refused(await http.post("/ui/api/send", content=b"not json"), 400, "invalid_argument")
        refused(await http.post("/ui/api/send", content=b"[1]"), 400, "invalid_argument")
        huge = await http.post("/ui/api/send", content=b"x" * (300 * 1024))
        assert huge.status_code == 413 and "Traceback" not in huge.text
        assert await relay.registration("dana") is None
        assert all(not inbox.entries for inbox in state.inboxes.values())
        sent = (
            await http.post("/ui/api/send", json={"from": "dana", "to": "bob", "kind": "note", "text": "hi"})
        ).json()
        assert sent["registered_sender"] is True
        registration = await relay.registration("dana")
        assert registration is not None and registration.provider == "human"
        assert registration.session == HUMAN_SESSION  # the session `relay send` sends from too
        again = (
            await http.post("/ui/api/send", json={"from": "dana", "to": "bob", "kind": "note", "text": "2"})
        ).json()
        assert again["registered_sender"] is False


async def test_reads_check_their_arguments_and_hand_nothing_out() -> None:
    async with dashboard_front() as (http, relay, _):
        await relay.send("alice", "bob", CONTRACT.from_json({"kind": "note", "text": "one"}))
        refused(await http.get("/ui/api/inbox", params={"agent": "Bad Id"}), 400, "invalid_argument")
        refused(
            await http.get("/ui/api/inbox", params={"agent": "bob", "limit": "0"}), 400, "invalid_argument"
        )
        refused(
            await http.get("/ui/api/inbox", params={"agent": "bob", "after": "x"}), 400, "invalid_argument"
        )
        refused(await http.get("/ui/api/thread", params={"id": "env_x"}), 400, "invalid_argument")
        for limit in ("-1", "\u00b2", "9" * 5000, "1e3"):
            refused(await http.get("/ui/api/agents", params={"limit": limit}), 400, "invalid_argument")
        refused(
            await http.post("/ui/api/requeue", json={"agent": "bob", "ids": ["x"]}), 400, "invalid_argument"
        )
        inbox = (await http.get("/ui/api/inbox", params={"agent": "bob"})).json()
        assert [e["text"] for e in inbox["envelopes"]] == ["one"]
        assert inbox["envelopes"][0]["deliveries"] == 0
        fetched = await relay.fetch("bob")
        assert fetched[0].deliveries == 1  # the dashboard's read was not a delivery
        agents = (await http.get("/ui/api/agents", params={"sort": "depth", "order": "desc"})).json()
        assert [a["agent"] for a in agents["agents"]] == ["bob", "alice"]
        assert agents["agents"][0]["pending"] == 1


async def test_no_session_no_csrf_no_entry() -> None:
    async with dashboard_front() as (http, _, _):
        base = str(http.base_url).rstrip("/")
        async with httpx2.AsyncClient(base_url=base) as stranger:
            page = await stranger.get("/ui/")
            assert page.status_code == 401 and "relay dashboard-url" in page.text
            refused(await stranger.get("/ui/api/agents"), 401, "unauthenticated")
            refused(await stranger.post("/ui/api/send", json={}), 401, "unauthenticated")
        cookie = http.cookies.get("relay_ui")
        assert cookie
        async with httpx2.AsyncClient(base_url=base, cookies={"relay_ui": cookie}) as forger:
            body = {"from": "dana", "to": "bob", "text": "forged"}
            refused(await forger.post("/ui/api/send", json=body, headers={"origin": base}), 403, "csrf")
            refused(await forger.post("/ui/api/send", json=body), 403, "cross_origin")
        assert (await http.get("/ui", follow_redirects=False)).headers["location"] == "/ui/"


def test_dashboard_url_refuses_what_cannot_work(tmp_path: Any) -> None:
    key = tmp_path / "relay.key"
    assert run_relay("keygen", key).returncode == 0
    ok = run_relay("dashboard-url", "--key-file", key, "--url", "http://localhost:9")
    assert ok.returncode == 0 and ok.stdout.startswith("http://localhost:9/ui/login?token=ui1.")
    remote = run_relay("dashboard-url", "--key-file", key, "--url", "http://10.1.2.3:8080")
    assert remote.returncode == 2 and "loopback" in remote.stderr
    missing = run_relay("dashboard-url", "--key-file", tmp_path / "none.key")
    assert missing.returncode == 2 and "use the key relay serve signs with" in missing.stderr
    ttl = run_relay("dashboard-url", "--key-file", key, "--ttl", "99999")
    assert ttl.returncode == 2 and "1..3600" in ttl.stderr


async def test_the_dashboard_is_served_on_a_loopback_listener_with_a_key_only(tmp_path: Any) -> None:
    from relay import serve
    from relay.settings import ServeSettings

    state = MemoryState()
    relay = Relay(CONTRACT, MemoryInboxStore(state), MemoryRegistry(state))
    keys = ring()
    connection: Any = None  # not reached when the dashboard is not served
    assert serve._dashboard(ServeSettings(host="0.0.0.0"), relay, connection, keys) is None
    assert serve._dashboard(ServeSettings(host="192.168.1.10"), relay, connection, keys) is None
    assert serve._dashboard(ServeSettings(uds=tmp_path / "s.sock"), relay, connection, keys) is None
    assert serve._dashboard(ServeSettings(), relay, connection, None) is None
    async with relay:
        base_app = create_app(relay, keyring=None)
        async with serve_app(base_app) as base, httpx2.AsyncClient(base_url=base) as http:
            assert (await http.get("/ui/")).status_code == 404


async def test_the_agents_page_shows_each_policy_and_a_refused_send_says_why() -> None:
    async with dashboard_front() as (http, relay, state):
        await MemoryPolicyStore(state).set("bob", listing(["alice"]))
        await MemoryPolicyStore(state).set("alice", ContactPolicy(REGISTERED))
        rows = {a["agent"]: a for a in (await http.get("/ui/api/agents")).json()["agents"]}
        assert (rows["alice"]["policy"], rows["bob"]["policy"]) == ("registered", "list (1)")
        error = refused(
            await http.post("/ui/api/send", json={"from": "dana", "to": "bob", "kind": "note", "text": "x"}),
            403,
            "not_accepted",
        )
        assert error["field"] == "to" and "relay policy set bob" in error["message"]
        assert all(not inbox.entries for inbox in state.inboxes.values())
        assert await relay.registration("dana") is None  # a refused first send registers nobody
        counted = relay.metrics.registry.get_sample_value
        assert counted("csf_relay_sends_not_accepted_total", {"tier": "host"}) == 1
        ordered = (await http.get("/ui/api/agents", params={"sort": "policy"})).json()["agents"]
        assert [a["policy"] for a in ordered] == ["list (1)", "registered"]


async def test_the_agents_page_says_whether_each_session_is_live_or_gone() -> None:
    async with dashboard_front() as (http, relay, _):
        assert await relay.leave("bob", "bob-1")
        rows = {a["agent"]: a for a in (await http.get("/ui/api/agents")).json()["agents"]}
        assert (rows["alice"]["presence"], rows["bob"]["presence"]) == ("live", "gone")
        assert rows["bob"]["last_seen"] is not None  # how long ago it was last seen, all the same
