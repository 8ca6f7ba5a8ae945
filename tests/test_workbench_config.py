"""``workbench.toml`` is checked whole before anything starts: a config relay cannot honour is refused
with the field named (and ``relay workbench`` exits 2 with that one line); keys come only from the
environment variables the file names. Workbench agents show in ``relay agents``, ``relay inspect`` and
the inbox gauges like any other."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from adapters.redis import RedisConnection, RedisSettings
from adapters.redis.gauges import InboxGauges
from adapters.workbench import SessionMessaging
from broker.agent_message import AgentMessage, Kind
from broker.delivery import DeliverySettings
from relay.workbench import messenger_on, session_id
from relay.workbench_config import WorkbenchConfigError, load
from tests.processes import run_relay

GOOD = """
[[agent]]
id = "planner"
runtime = "copilot"
model = "gpt-4.1"
dir = "work/planner"
instructions = "You plan the work and ask builder for changes."
tools = []
[agent.provider]
type = "openai"
base_url = "http://127.0.0.1:9999/v1"
api_key_env = "PLANNER_API_KEY"

[[agent]]
id = "builder"
runtime = "claude-agent"
model = "claude-sonnet-4-5"
dir = "work/builder"
"""
ENV = {"PLANNER_API_KEY": "sk-planner"}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "workbench.toml"
    path.write_text(text)
    return path


def test_the_issue_example_loads_with_the_key_from_the_environment(tmp_path: Path) -> None:
    loaded = load(_write(tmp_path, GOOD), ENV)
    planner, builder = loaded.config.agent
    assert (planner.id, planner.runtime, planner.model, planner.provider and planner.provider.type) == (
        "planner", "copilot", "gpt-4.1", "openai",
    )  # fmt: skip
    assert loaded.keys == ("sk-planner", None) and loaded.base_urls == ("http://127.0.0.1:9999/v1", None)
    assert loaded.directories == (tmp_path / "work/planner", tmp_path / "work/builder")
    assert builder.provider is None and loaded.config.delivery.max_attempts == 5
    assert "sk-planner" not in repr(loaded)


@pytest.mark.parametrize(
    ("change", "env", "message"),
    [
        (('model = "gpt-4.1"', 'colour = "red"\nmodel = "gpt-4.1"'), ENV, "agent[0].colour: unknown field"),
        (('model = "gpt-4.1"\n', ""), ENV, "agent[0].model: required"),
        (('id = "planner"', 'id = "Planner!"'), ENV, "agent[0].id: String should match pattern"),
        (('id = "builder"', 'id = "planner"'), ENV, "agent id 'planner' appears twice"),
        (('runtime = "copilot"', 'runtime = "codex"'), ENV, "agent[0].runtime: Input should be 'copilot'"),
        ((), {}, "agent[0] (planner).provider.api_key_env: the variable PLANNER_API_KEY is not set"),
        (('api_key_env = "PLANNER_API_KEY"', 'api_key = "sk-in-the-file"'), ENV,
         "agent[0].provider.api_key: unknown"),
        (('base_url = "http://127.0.0.1:9999/v1"', 'base_url = "ftp://x"'), ENV,
         "agent[0].provider.base_url: "),
        (('tools = []', 'tools = ["send_agent_message"]'), ENV, "relay's own tool, always given"),
        (('dir = "work/builder"', 'dir = "work/builder"\n[agent.provider]\ntype = "openai"\n'
          'base_url = "http://127.0.0.1:1"\napi_key_env = "PLANNER_API_KEY"'), ENV,
         "agent[1] (builder).provider.type: claude-agent takes anthropic, not 'openai'"),
        (('[[agent]]\nid = "planner"', '[[agent]\nid = "planner"'), ENV, "not valid TOML"),
    ],
    ids=["unknown-field", "missing", "bad-id", "twice", "runtime", "no-key", "key-in-file", "url",
         "relay-tool", "provider-type", "toml"],
)  # fmt: skip
def test_a_config_that_cannot_be_honoured_is_refused_naming_the_field(
    tmp_path: Path, change: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    text = GOOD.replace(change[0], change[1], 1) if change else GOOD
    with pytest.raises(WorkbenchConfigError) as refused:
        load(_write(tmp_path, text), env)
    assert message in str(refused.value)
    assert str(tmp_path / "workbench.toml") in str(refused.value)


def test_relay_workbench_refuses_with_one_line_and_starts_nothing(tmp_path: Path) -> None:
    config = _write(tmp_path, GOOD)
    done = run_relay("workbench", "--config", config, "--redis-url", "redis://127.0.0.1:9/0", env={})
    assert done.returncode == 2
    assert done.stderr.startswith("relay: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "provider.api_key_env: the variable PLANNER_API_KEY is not set" in done.stderr
    assert not (tmp_path / "work").exists()


async def test_workbench_agents_show_in_agents_inspect_and_the_gauges_like_any_other(redis_url: str) -> None:
    agent = f"wb-{time.monotonic_ns() % 10**8}"

    class Refusing:
        async def submit(self, session: str, prompt: str) -> None:
            raise ConnectionError("not now")

    async with messenger_on(redis_url, DeliverySettings()) as messenger:  # the store relay serve uses
        messaging = SessionMessaging(messenger, Refusing())  # not running: nothing is delivered
        await messaging.register(session_id(agent), agent)
        await messenger.send(agent, agent, AgentMessage(kind=Kind.KIND_NOTE, text="to myself"))
        gauges = InboxGauges(RedisConnection(RedisSettings(url=redis_url)))
        await gauges.refresh()
        registry = CollectorRegistry()
        registry.register(gauges)
        metrics = generate_latest(registry).decode()
    assert f'csf_relay_inbox_depth{{agent="{agent}"}} 1.0' in metrics
    listed = run_relay("agents", "--json", "--redis-url", redis_url)
    (row,) = [a for a in json.loads(listed.stdout)["agents"] if a["agent"] == agent]
    assert (row["provider"], row["tier"], row["session"], row["inbox_depth"]) == (
        "workbench", "in_process", f"workbench.{agent}", 1,
    )  # fmt: skip
    inspected = json.loads(run_relay("inspect", agent, "--json", "--redis-url", redis_url).stdout)
    (found,) = inspected["agents"]
    assert (found["provider"], found["tier"], found["inbox_depth"]) == ("workbench", "in_process", 1)
