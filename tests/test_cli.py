"""Tests for the ``relay`` command, run as ``python -m relay`` in a child process."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from broker.front.key_file import load_key_file
from relay.settings import ServeSettings, variable
from tests.processes import run_relay

ENVIRONMENT = [variable(name) for name in ServeSettings.model_fields]


def assert_one_error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode != 0, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("relay: error: "), lines[0]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "relay.key"
    result = run_relay("keygen", path)
    assert result.returncode == 0, result.stderr
    return path


def test_keygen_writes_0600_and_refuses_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "relay.key"
    result = run_relay("keygen", path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 1
    assert str(path) in result.stdout
    assert f"relay serve --agent-mcp-key-file {path}" in result.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = load_key_file(path).signing_kid
    assert first in result.stdout

    again = run_relay("keygen", path)
    assert_one_error_line(again, "already exists", "--force")
    assert again.returncode == 1
    assert load_key_file(path).signing_kid == first

    forced = run_relay("keygen", path, "--force")
    assert forced.returncode == 0, forced.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key_file(path).signing_kid != first


def test_agent_headers(key_file: Path) -> None:
    result = run_relay("agent-headers", "--key-file", key_file, "--agent", "reviewer", "--session", "s-1")
    assert result.returncode == 0, result.stderr
    headers = json.loads(result.stdout)
    assert result.stdout.startswith('{\n  "')  # indent 2
    assert set(headers) == {"Authorization", "X-CSF-Agent-ID", "X-CSF-Session-ID"}
    assert headers["X-CSF-Agent-ID"] == "reviewer"
    assert headers["X-CSF-Session-ID"] == "s-1"
    scheme, token = headers["Authorization"].split(" ")
    assert scheme == "Bearer"
    identity = load_key_file(key_file).verify(token, "reviewer", "s-1")
    assert identity.agent == "reviewer"
    assert identity.session == "s-1"


def test_agent_headers_ttl(key_file: Path) -> None:
    result = run_relay(
        "agent-headers", "--key-file", key_file, "--agent", "a", "--session", "s", "--ttl", "120"
    )
    assert result.returncode == 0, result.stderr
    token = json.loads(result.stdout)["Authorization"].split(" ")[1]
    identity = load_key_file(key_file).verify(token, "a", "s")
    ring = load_key_file(key_file)
    assert ring.verify(token, "a", "s", now=identity.expires_at - 120).expires_at == identity.expires_at


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8080/mcp/agent", "http://127.0.0.1:8080/mcp/agent"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/mcp/agent"),
        ("https://relay.example.net/", "https://relay.example.net/mcp/agent"),
        ("http://[::1]:9/prefix/mcp/agent", "http://[::1]:9/prefix/mcp/agent"),
    ],
)
def test_mcp_config(key_file: Path, url: str, expected: str) -> None:
    result = run_relay(
        "mcp-config", "--key-file", key_file, "--agent", "reviewer", "--session", "s-1", "--url", url
    )
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert list(config) == ["mcpServers"]
    assert list(config["mcpServers"]) == ["relay"]
    entry = config["mcpServers"]["relay"]
    assert entry["type"] == "http"
    assert entry["url"] == expected
    assert set(entry["headers"]) == {"Authorization", "X-CSF-Agent-ID", "X-CSF-Session-ID"}
    token = entry["headers"]["Authorization"].removeprefix("Bearer ")
    assert load_key_file(key_file).verify(token, "reviewer", "s-1").agent == "reviewer"


def test_mcp_config_name(key_file: Path) -> None:
    result = run_relay(
        "mcp-config", "--key-file", key_file, "--agent", "a", "--session", "s",
        "--url", "http://127.0.0.1:8080", "--name", "team-relay",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert list(json.loads(result.stdout)["mcpServers"]) == ["team-relay"]


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://127.0.0.1/mcp/agent", "http(s)"),
        ("127.0.0.1:8080", "http(s)"),
        ("http://127.0.0.1:8080/other", "/mcp/agent"),
        ("http://127.0.0.1:8080/mcp/agent/", "/mcp/agent"),
        ("http://127.0.0.1:8080/mcp/agent?x=1", "query"),
    ],
)
def test_mcp_config_refuses_bad_urls(key_file: Path, url: str, fragment: str) -> None:
    result = run_relay("mcp-config", "--key-file", key_file, "--agent", "a", "--session", "s", "--url", url)
    assert_one_error_line(result, fragment)
    assert result.returncode == 2


def test_missing_key_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.key"
    result = run_relay("agent-headers", "--key-file", missing, "--agent", "a", "--session", "s")
    # the one advice of every command (issue 21 item 17): the running relay's key, never a new one
    assert_one_error_line(result, f"no signing key at {missing} (--key-file / RELAY_KEY_FILE)")
    assert "relay keygen" not in result.stderr and "use the key relay serve signs with" in result.stderr
    assert result.returncode == 2


@pytest.mark.parametrize("command", ["agent-headers", "mcp-config"])
def test_loose_key_file_permissions(key_file: Path, command: str) -> None:
    key_file.chmod(0o644)
    extra = ["--url", "http://127.0.0.1:8080"] if command == "mcp-config" else []
    result = run_relay(command, "--key-file", key_file, "--agent", "a", "--session", "s", *extra)
    assert_one_error_line(result, f"chmod 600 {key_file}")
    assert result.returncode == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--agent", "Bad:Id", "--session", "s"], "--agent"),
        (["--agent", "a", "--session", "bad session"], "--session"),
        (["--agent", "a", "--session", "s", "--ttl", "0"], "--ttl"),
        (["--agent", "a", "--session", "s", "--ttl", "soon"], "--ttl"),
        (["--agent", "a"], "--session"),
    ],
)
def test_bad_arguments(key_file: Path, args: list[str], fragment: str) -> None:
    result = run_relay("agent-headers", "--key-file", key_file, *args)
    assert_one_error_line(result, fragment)
    assert result.returncode == 2


def test_bad_key_file_contents(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text("# nothing but a comment\n")
    path.chmod(0o600)
    result = run_relay("agent-headers", "--key-file", path, "--agent", "a", "--session", "s")
    assert_one_error_line(result, "no key")


def test_serve_settings_error_is_one_line() -> None:
    result = run_relay("serve", "--port", "70000")
    assert_one_error_line(result, "--port")
    assert result.returncode == 2


def test_no_command_is_a_usage_error() -> None:
    result = run_relay()
    assert_one_error_line(result)
    assert result.returncode == 2


HELP = {
    None: ["serve", "keygen", "agent-headers", "mcp-config", "inspect", "dead-letters"],
    "serve": [
        "--host", "--port", "--uds", "--redis-url", "--agent-mcp-key-file", "--data-dir", "--log-format",
        "--log-level", "--inbox-cap", "--send-rate", "--send-burst", "--max-body-bytes", *ENVIRONMENT,
    ],
    "keygen": ["PATH", "--force"],
    "agent-headers": ["--key-file", "--agent", "--session", "--ttl"],
    "mcp-config": ["--key-file", "--agent", "--session", "--ttl", "--url", "--name"],
}  # fmt: skip


@pytest.mark.parametrize("command", list(HELP), ids=lambda c: c or "relay")
def test_help(command: str | None) -> None:
    result = run_relay(*([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for word in HELP[command]:
        assert word in result.stdout, word


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = run_relay("--version")
    assert result.returncode == 0 and result.stdout == f"relay {version('relay')}\n", result


HOOK_WAIT = ["hook", "wait", "--url", "http://127.0.0.1:1/mcp/agent", "--key-file", "k", "--agent", "a"]
MISTYPED = [
    (["agents", "--jsn"], "`relay agents` has no option --jsn (did you mean --json?)", "relay agents", 2),
    (["dead-letters", "list", "b", "--limti"], "(did you mean --limit?)", "relay dead-letters list", 2),
    (["send", "--from", "a", "--to", "b", "--tll=5"], "--tll (did you mean --ttl?)", "relay send", 2),
    (["--bogus", "agents"], "`relay` has no option --bogus", "relay", 2),
    (["thread", "env_x", "extra"], "`relay thread` takes no further argument 'extra'", "relay thread", 2),
    ([*HOOK_WAIT, "--claude-pid", "5", "--timout", "9"], "(did you mean --timeout?)", "relay hook wait", 1),
]  # fmt: skip


@pytest.mark.parametrize(("args", "says", "command", "code"), MISTYPED)
def test_a_mistyped_option_is_named_with_the_help_of_its_command(
    args: list[str], says: str, command: str, code: int
) -> None:
    result = run_relay(*args)
    assert result.returncode == code
    assert assert_one_error_line(result, says).endswith(f"; see `{command} --help`")
