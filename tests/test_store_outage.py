"""``relay serve --redis-url`` to a store that is down: one clear line at start-up, one when it answers,
and the first request after a store restart succeeds."""

from __future__ import annotations

from pathlib import Path

from adapters.redis.embedded import EmbeddedRedis
from broker.front.key_file import load_key_file
from broker.front.tokens import agent_headers
from broker.testing.polling import wait_until
from tests.front_support import free_port, key_file
from tests.processes import REGISTER, ServeProcess, ok_sync

DOWN = "does not answer"
BACK = "answers again"


def test_a_store_down_at_start_up_is_logged_and_its_return_too(tmp_path: Path) -> None:
    port = free_port()
    key = key_file(tmp_path)
    headers = agent_headers(load_key_file(key), "alice", "a-1")
    serve = ServeProcess(
        ["--redis-url", f"redis://127.0.0.1:{port}/0", "--agent-mcp-key-file", str(key)],
        tmp_path / "serve.log",
    )
    store = EmbeddedRedis(tmp_path / "data", port=port, appendfsync="always")
    try:
        serve.start(until="/healthz")
        wait_until(lambda: DOWN in serve.log.read_text(), 10, "the store-down line")
        with serve.client() as http:
            assert http.get("/readyz").status_code == 503
        store.start()
        wait_until(lambda: BACK in serve.log.read_text(), 10, "the store-back line")
        ok_sync(serve.url, headers, "RegisterAgentAddress", REGISTER)
        sent = ok_sync(
            serve.url, headers, "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "a"}}
        )

        store.stop()
        store.start()
        # the first request of each kind after the restart succeeds
        fetched = ok_sync(serve.url, headers, "FetchAgentInbox", {"limit": 1})
        assert [e["id"] for e in fetched["envelopes"]] == [sent["id"]]
        store.stop()
        store.start()
        ok_sync(serve.url, headers, "SendAgentMessage", {"to": "alice", "message": {"kind": 1, "text": "b"}})
        store.stop()
        store.start()
        ok_sync(serve.url, headers, "AcknowledgeAgentInbox", {"ids": [sent["id"]]})
    finally:
        serve.stop()
        store.stop()
    log = serve.log.read_text()
    assert log.count(DOWN) >= 1 and "Traceback" not in log
    line = next(line for line in log.splitlines() if DOWN in line)
    assert f"127.0.0.1:{port}" in line and "--redis-url" in line
