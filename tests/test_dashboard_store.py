"""The dashboard of ``relay serve`` workers on one Redis, over plain HTTP: what Compose stores, and
that a login URL works once across workers and restarts (its spent id is kept in Redis)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import redis

from adapters.redis.embedded import EmbeddedRedis
from adapters.redis.keys import Keys
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from tests.front_support import key_file
from tests.processes import REGISTER, ServeProcess, dashboard_login_url, ok, serve_processes

KEYS = Keys()


@dataclass
class Workers:
    client: redis.Redis
    key: Path
    a: ServeProcess
    b: ServeProcess

    def login_token(self) -> str:
        return dashboard_login_url(self.a.base, self.key).partition("token=")[2]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    tmp = tmp_path_factory.mktemp("dashboard-store")
    server = EmbeddedRedis()
    server.start()
    try:
        key = key_file(tmp)
        with serve_processes(tmp, 2, "--redis-url", server.url, "--agent-mcp-key-file", str(key)) as (a, b):
            client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=5)
            yield Workers(client, key, a, b)
            client.close()
    finally:
        server.stop()


def login(http: httpx2.Client, token: str) -> httpx2.Response:
    return http.get("/ui/login", params={"token": token}, follow_redirects=False)


@contextlib.contextmanager
def signed_in(worker: ServeProcess, token: str) -> Iterator[httpx2.Client]:
    with worker.client() as http:
        assert login(http, token).status_code == 303
        csrf = http.get("/ui/api/session").json()["csrf"]
        http.headers.update({"x-relay-csrf": csrf, "origin": worker.base})
        yield http


async def test_compose_stores_one_envelope_sent_from_the_persons_session(workers: Workers) -> None:
    bob = agent_headers(load_key_file(workers.key), "bob", "bob-1")
    async with httpx2.AsyncClient(timeout=30) as mcp:
        await ok(mcp, workers.a.url, bob, "RegisterAgentAddress", REGISTER)
    with signed_in(workers.a, workers.login_token()) as http:
        sent = http.post("/ui/api/send", json={"from": "dana", "to": "bob", "kind": "note", "text": "once"})
        assert sent.status_code == 200, sent.text
    assert workers.client.xlen(KEYS.inbox("bob")) == 1
    assert workers.client.hget(KEYS.registration("dana"), "session") == "shell"


def test_a_login_url_works_once_on_every_worker_and_after_a_restart(workers: Workers) -> None:
    token = workers.login_token()
    with workers.a.client() as a, workers.b.client() as b:
        assert login(a, token).status_code == 303
        refused = login(b, token)
        assert refused.status_code == 401 and "used already" in refused.text
        assert login(b, workers.login_token()).status_code == 303  # a new URL works there
    workers.a.stop()
    workers.a.start()
    with workers.a.client() as a:
        refused = login(a, token)
        assert refused.status_code == 401 and "used already" in refused.text
