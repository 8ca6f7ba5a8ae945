"""Per-agent credentials through a real ``relay serve`` (loopback and network listeners) and the real
``relay`` command: a folder set up by ``relay setup claude-code`` holds only its own credential, which
mints for its agent and nobody else, never opens the dashboard, stays off the network listener unless
issued with ``--network``, and stops at once (exchange) and within ``REVOCATION_CHECK_SECONDS`` (tokens
already minted) after ``relay credentials revoke``; hostile callers get precise refusals, every event is
an audit line and a count on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from broker.credentials import Credential, hash_secret, new_credential
from broker.front.key_file import load_key_file
from broker.front.token_route import EXCHANGE_TTL_SECONDS, MAX_FAILURES, REVOCATION_CHECK_SECONDS
from broker.front.tokens import agent_headers
from broker.testing.polling import wait_until
from tests.front_support import free_port, key_file
from tests.processes import (
    MCP_HEADERS,
    ServeProcess,
    first_command,
    relay_env,
    run_relay,
    sample,
    tool_call_body,
)
from tests.tls_support import Certificates, certificates

REGISTER = {"provider": "claudecode", "endpoint": "127.0.0.1:14111"}


class Relay:
    def __init__(
        self, process: ServeProcess, key: Path, redis_url: str, port: int, certs: Certificates
    ) -> None:
        self.process, self.key, self.redis_url, self.port, self.certs = process, key, redis_url, port, certs

    @property
    def token_url(self) -> str:
        return f"{self.process.base}/agent/token"

    @property
    def network_base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def relay(self, *args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_relay(*args, env=env)

    def issue(self, agent: str, *extra: str) -> tuple[str, str]:
        done = run_relay("credentials", "issue", "--agent", agent, "--redis-url", self.redis_url, *extra)
        assert done.returncode == 0, done.stderr
        text = done.stdout.strip()
        return text.partition(".")[0], text

    def revoke(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = run_relay("credentials", "revoke", *args, "--redis-url", self.redis_url)
        assert done.returncode == 0, done.stderr
        return done


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    tmp = tmp_path_factory.mktemp("credentials")
    certs = certificates(tmp)
    key, port = key_file(tmp), free_port()
    args = [
        "--redis-url", redis_url, "--agent-mcp-key-file", str(key), "--log-format", "json",
        "--network-host", "127.0.0.1", "--network-port", str(port),
        "--tls-cert", str(certs.cert_file), "--tls-key", str(certs.key_file),
    ]  # fmt: skip
    process = ServeProcess(args, tmp / "serve.log").start()
    try:
        yield Relay(process, key, redis_url, port, certs)
    finally:
        process.stop()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def exchange(url: str, credential: str, agent: str, session: str = "s1", **kwargs: Any) -> httpx2.Response:
    verify = kwargs.pop("verify", True)
    body = kwargs.pop("body", {"agent": agent, "session": session})
    with httpx2.Client(timeout=30, verify=verify) as http:
        return http.post(url, json=body, headers={"authorization": f"Bearer {credential}", **kwargs})


def call(
    url: str, headers: dict[str, str], tool: str = "FetchAgentInbox", arguments: Any = None, **kw: Any
) -> httpx2.Response:
    body = tool_call_body(tool, arguments if arguments is not None else {})
    with httpx2.Client(timeout=30, **kw) as http:
        return http.post(url, json=body, headers={**MCP_HEADERS, **headers})


def cause(response: httpx2.Response) -> str:
    error = response.json()["error"]
    return str(error["data"]["cause"] if "data" in error else error["cause"])


def set_up(served: Relay, folder: Path, agent: str, *extra: str) -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    done = run_relay(
        "setup", "claude-code", "--url", served.process.url, "--agent", agent,
        "--redis-url", served.redis_url, "--dir", folder, *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def test_a_set_up_folder_mints_for_its_own_agent_only_and_names_no_master_key(
    served: Relay, tmp_path: Path
) -> None:
    agent, other = unique("author"), unique("reviewer")
    folder = tmp_path / agent
    folder.mkdir()
    subprocess.run(["git", "init", "-q", str(folder)], check=True, timeout=30)
    done = set_up(served, folder, agent)

    path = folder / ".relay" / "credential"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    saved = json.loads(path.read_text())
    assert saved["agent"] == agent and saved["url"] == served.process.url
    assert f"issued credential {saved['credential'].partition('.')[0]}" in done.stdout
    # no file of the folder names the master key (its path, its name or its text)
    for needle in (str(served.key), served.key.name, served.key.read_text().split()[-1], "--key-file"):
        found = subprocess.run(
            ["grep", "-rlF", "-e", needle, str(folder)], capture_output=True, text=True, timeout=30
        )
        assert found.returncode == 1, (needle, found.stdout)
    status = subprocess.run(
        ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert ".relay" not in status.stdout and ".gitignore" in status.stdout
    assert "/.relay/credential" in (folder / ".gitignore").read_text()

    helper = json.loads((folder / ".mcp.json").read_text())["mcpServers"]["relay"]["headersHelper"]
    assert f"hook headers --credential-file {path} --claude-pid $PPID" in helper
    minted = run_relay("hook", "headers", "--credential-file", path, "--session", "s1")
    assert minted.returncode == 0, minted.stderr
    headers = json.loads(minted.stdout)
    assert headers["X-CSF-Agent-ID"] == agent
    registered = call(served.process.url, headers, "RegisterAgentAddress", REGISTER)
    assert registered.status_code == 200 and not registered.json()["result"]["isError"], registered.text

    refused = exchange(served.token_url, saved["credential"], other)
    assert refused.status_code == 401 and cause(refused) == "wrong_agent", refused.text
    assert refused.headers["www-authenticate"].endswith('error_description="wrong_agent"')
    (folder / "forged").write_text(json.dumps({**saved, "agent": other}))
    (folder / "forged").chmod(0o600)
    forged = run_relay("hook", "headers", "--credential-file", folder / "forged", "--session", "s1")
    assert forged.returncode == 1 and "(wrong_agent)" in forged.stderr and forged.stdout == ""
    # a stolen token of one agent, sent as another
    stolen = call(served.process.url, {**headers, "X-CSF-Agent-ID": other})
    assert stolen.status_code == 401 and cause(stolen) == "agent_mismatch"
    # nor is a token a credential: it mints nothing at /agent/token
    token = headers["Authorization"].removeprefix("Bearer ")
    assert cause(exchange(served.token_url, token, agent)) == "unknown_credential"


def test_a_credential_cannot_open_the_dashboard(served: Relay) -> None:
    agent = unique("peeker")
    _, credential = served.issue(agent)
    token = exchange(served.token_url, credential, agent).json()["token"]
    with httpx2.Client(base_url=served.process.base, timeout=30, follow_redirects=False) as http:
        for login in (credential, token):
            answer = http.get("/ui/login", params={"token": login})
            assert answer.status_code in (401, 403) and "relay_session" not in answer.headers.get(
                "set-cookie", ""
            )
        api = http.get("/ui/api/agents", headers={"authorization": f"Bearer {token}"})
        assert api.status_code == 401


def test_the_network_listener_takes_only_network_credentials(served: Relay) -> None:
    agent = unique("remote")
    verify = served.certs.client_context()
    _, loopback = served.issue(agent)
    on_network = exchange(f"{served.network_base}/agent/token", loopback, agent, verify=verify)
    assert on_network.status_code == 401 and cause(on_network) == "wrong_audience", on_network.text
    assert "without --network" not in on_network.json()["error"]["message"]

    _, network = served.issue(agent, "--network")
    minted = exchange(f"{served.network_base}/agent/token", network, agent, verify=verify)
    assert minted.status_code == 200, minted.text
    answer = call(f"{served.network_base}/mcp/agent", minted.json()["headers"], verify=verify)
    # authenticated as the agent (which has registered no address yet): the tool answers, no 401
    assert answer.status_code == 200 and f"agent '{agent}' is not registered" in answer.text, answer.text
    # its token is for the network listener only, and the credential too
    assert cause(call(served.process.url, minted.json()["headers"])) == "wrong_audience"
    assert cause(exchange(served.token_url, network, agent)) == "wrong_audience"


def test_revocation_refuses_the_next_exchange_and_stops_minted_tokens_within_the_check_time(
    served: Relay,
) -> None:
    agent = unique("revoked")
    ident, credential = served.issue(agent, "--label", "to revoke")
    first = exchange(served.token_url, credential, agent)
    assert first.status_code == 200 and first.json()["expires_in"] == EXCHANGE_TTL_SECONDS
    headers = first.json()["headers"]
    assert call(served.process.url, headers, "RegisterAgentAddress", REGISTER).status_code == 200
    listed = run_relay("credentials", "list", "--agent", agent, "--json", "--redis-url", served.redis_url)
    (record,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert record["id"] == ident and record["last_used_at_ms"] is not None and not record["revoked"]
    assert "secret" not in listed.stdout and credential.partition(".")[2] not in listed.stdout

    revoked = served.revoke(ident)
    started = time.monotonic()
    assert f"revoked {ident}" in revoked.stdout
    assert '"event": "revoked"' in revoked.stderr and credential.partition(".")[2] not in revoked.stderr
    replay = exchange(served.token_url, credential, agent)
    assert replay.status_code == 401 and cause(replay) == "revoked", replay.text

    def refused() -> bool:
        answer = call(served.process.url, headers)
        return answer.status_code == 401 and cause(answer) == "revoked"

    wait_until(refused, REVOCATION_CHECK_SECONDS + 10, "the minted token refused", interval=0.1)
    stopped = time.monotonic() - started
    print(f"revocation stopped a minted token after {stopped:.2f} s (bound {REVOCATION_CHECK_SECONDS} s)")
    assert stopped <= REVOCATION_CHECK_SECONDS + 10

    other, spare = served.issue(agent), served.issue(agent)
    everything = served.revoke("--agent", agent)
    assert other[0] in everything.stdout and spare[0] in everything.stdout
    assert cause(exchange(served.token_url, spare[1], agent)) == "revoked"


def test_an_expired_credential_is_refused_as_expired(served: Relay) -> None:
    agent = unique("brief")
    _, credential = served.issue(agent, "--expires", "1s")
    wait_until(
        lambda: exchange(served.token_url, credential, agent).status_code == 401, 30, "the credential expired"
    )
    answer = exchange(served.token_url, credential, agent)
    assert cause(answer) == "expired" and "expired at" in answer.json()["error"]["message"]
    bad = run_relay(
        "credentials", "issue", "--agent", agent, "--expires", "soon", "--redis-url", served.redis_url
    )
    assert bad.returncode == 2 and "not a duration" in bad.stderr


async def test_a_thousand_wrong_secrets_are_limited_with_a_clear_error(served: Relay) -> None:
    agent = unique("target")
    ident, credential = served.issue(agent)
    secret = credential.partition(".")[2]
    wrong = [f"{ident}.{secret[:-2]}{n:02d}"[: len(credential)] for n in range(1000)]
    async with httpx2.AsyncClient(timeout=60) as http:
        semaphore = asyncio.Semaphore(16)

        async def attempt(text: str) -> httpx2.Response:
            async with semaphore:
                return await http.post(
                    served.token_url,
                    json={"agent": agent, "session": "s1"},
                    headers={"authorization": f"Bearer {text}"},
                )

        answers = await asyncio.gather(*(attempt(text) for text in wrong if text != credential))
    statuses = [a.status_code for a in answers]
    assert statuses.count(401) == MAX_FAILURES and statuses.count(429) == len(answers) - MAX_FAILURES
    assert {cause(a) for a in answers if a.status_code == 401} == {"unknown_credential"}
    limited = next(a for a in answers if a.status_code == 429)
    error = limited.json()["error"]
    assert error["code"] == "too_many_failures" and error["retryable"] is True and error["retry_after"] > 0
    assert int(limited.headers["retry-after"]) >= 1 and "wrong credentials" in error["message"]
    # another credential of the same client is not locked out
    _, fresh = served.issue(agent)
    assert exchange(served.token_url, fresh, agent).status_code == 200


def test_the_secret_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    record, text = new_credential("alice", now_ms=1)
    compared: list[tuple[object, object]] = []
    import broker.credentials as credentials

    real = credentials.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(credentials.hmac, "compare_digest", spy)
    assert record.matches(text.partition(".")[2]) and not record.matches("x")
    assert compared == [(record.secret_hash, record.secret_hash), (hash_secret("x"), record.secret_hash)]
    assert isinstance(record, Credential) and text.partition(".")[2] not in repr(record)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        (b"[]", "body"),
        (b'{"agent": "a"}', "session"),
        (b'{"agent": "a", "session": "s", "x": 1}', "x"),
        (b'{"agent": "Bad Id", "session": "s"}', "agent"),
        (b'{"agent": "a", "session": "s", "ttl_seconds": 901}', "ttl_seconds"),
        (b'{"\\ud800": 1}', "\\ud800"),
    ],
)
def test_a_bad_exchange_body_is_refused_naming_the_field(served: Relay, body: bytes, field: str) -> None:
    with httpx2.Client(timeout=30) as http:
        answer = http.post(
            served.token_url,
            content=body,
            headers={"authorization": "Bearer cr_x.y", "content-type": "application/json"},
        )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["violations"][0]["field"] == field and error["code"] == "invalid_argument"


def test_every_credential_event_is_one_audit_line_and_a_count(served: Relay) -> None:
    before = served.process.metrics()
    agent = unique("audited")
    ident, credential = served.issue(agent)
    assert exchange(served.token_url, credential, agent).status_code == 200
    assert exchange(served.token_url, credential, unique("x")).status_code == 401
    served.revoke(ident)
    after = served.process.metrics()
    for event, grown in (("issued", 1), ("exchanged", 1), ("refused", 1), ("revoked", 1)):
        assert (
            sample(after, "csf_relay_credentials_total", event=event)
            - sample(before, "csf_relay_credentials_total", event=event)
            >= grown
        ), event
    lines = [json.loads(line) for line in served.process.log.read_text().splitlines() if line.startswith("{")]
    mine = [
        line
        for line in lines
        if line.get("logger") == "relay.credentials" and line.get("credential") == ident
    ]
    assert {line["event"] for line in mine} == {"exchanged", "refused"}
    assert all(line["listener"] == "loopback" and "agent" in line for line in mine)
    assert credential.partition(".")[2] not in served.process.log.read_text()


def test_a_folder_of_the_master_key_form_keeps_working_and_setup_says_so(
    served: Relay, tmp_path: Path
) -> None:
    agent = unique("legacy")
    folder = tmp_path / agent
    folder.mkdir()
    old = run_relay("hook", "headers", "--key-file", served.key, "--agent", agent, "--session", "s1")
    assert old.returncode == 0 and "re-run `relay setup claude-code`" in old.stderr
    assert (
        call(served.process.url, json.loads(old.stdout), "RegisterAgentAddress", REGISTER).status_code == 200
    )
    helper = f"relay hook headers --key-file {served.key} --agent {agent} --claude-pid $PPID"
    (folder / ".mcp.json").write_text(
        json.dumps({"mcpServers": {"relay": {"type": "http", "headersHelper": helper}}})
    )
    done = set_up(served, folder, agent)
    assert "replaced the old form" in done.stdout and "master signing key" in done.stdout
    assert str(served.key) not in (folder / ".mcp.json").read_text()
    # a second run revokes the credential of the first
    first = json.loads((folder / ".relay" / "credential").read_text())["credential"]
    again = set_up(served, folder, agent)
    assert f"revoked the folder's previous credential {first.partition('.')[0]}" in again.stdout
    assert cause(exchange(served.token_url, first, agent)) == "revoked"


def test_setup_warns_when_the_url_does_not_answer_and_says_what_it_did_outside_git(
    served: Relay, tmp_path: Path
) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    nowhere = f"http://127.0.0.1:{free_port()}/mcp/agent"
    done = run_relay(
        "setup", "claude-code", "--url", nowhere, "--agent", unique("lonely"),
        "--redis-url", served.redis_url, "--dir", folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"warning: nothing answers at {nowhere}" in done.stdout
    assert "is not in a git repository, so no .gitignore was written" in done.stdout
    assert "becomes reachable when its Claude Code" in done.stdout
    assert not (folder / ".gitignore").exists()


def test_every_command_finds_the_signing_key_the_same_way(served: Relay, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.key"
    env = {"RELAY_KEY_FILE": str(missing)}
    recipient = unique("recipient")
    registering = agent_headers(load_key_file(served.key), recipient, "s1", 60)
    assert call(served.process.url, registering, "RegisterAgentAddress", REGISTER).status_code == 200
    minting = run_relay("agent-headers", "--agent", "a", "--session", "s", env=env)
    dashboard = run_relay("dashboard-url", "--url", served.process.base, env=env)
    send = run_relay(
        "send",
        "--from",
        unique("ada"),
        "--to",
        recipient,
        "--url",
        served.process.base,
        "--redis-url",
        served.redis_url,
        "hi",
        env=env,
    )
    advice = f"no signing key at {missing} (--key-file / RELAY_KEY_FILE)"
    for done in (minting, dashboard, send):
        assert done.returncode != 0 and advice in done.stderr and "relay keygen" not in done.stderr, done
    ok = run_relay("dashboard-url", "--url", served.process.base, env={"RELAY_KEY_FILE": str(served.key)})
    assert ok.returncode == 0 and "/ui/login?token=" in ok.stdout


def test_the_readmes_setup_from_relays_folder_finds_its_store(tmp_path: Path) -> None:
    relay_folder, agent_folder = tmp_path / "relay", tmp_path / "author"
    relay_folder.mkdir()
    agent_folder.mkdir()
    with first_command(relay_folder, creates_key=True) as port:
        base = f"http://127.0.0.1:{port}"
        done = subprocess.run(
            [sys.executable, "-m", "relay", "setup", "claude-code", "--url", base, "--agent", "author",
             "--dir", str(agent_folder)],
            cwd=relay_folder, env=relay_env(port), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stdout  # the URL answers
        saved = json.loads((agent_folder / ".relay" / "credential").read_text())
        assert saved["url"] == f"{base}/mcp/agent"
        assert exchange(f"{base}/agent/token", saved["credential"], "author").status_code == 200
