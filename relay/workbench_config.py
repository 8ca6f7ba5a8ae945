"""``workbench.toml``: the sessions ``relay workbench`` hosts. A public contract (docs/workbench.md).

Read once, checked whole before anything starts: a config relay cannot honour is refused with
``WorkbenchConfigError`` naming the field (``agent[1].provider.api_key_env: ...``). Relative paths are
relative to the file's folder. API keys are read from the environment variables the file names, never
from the file.

```toml
[delivery]                      # optional: how prompts are retried (defaults below)
max_attempts = 5
visibility_seconds = 30

[[agent]]
id = "planner"                  # the relay agent id
runtime = "copilot"             # or "claude-agent"
model = "gpt-4.1"
dir = "work/planner"            # the session's working folder (created if missing)
instructions = "You plan the work and ask builder for changes."
tools = []                      # the runtime's own tools it may use, beyond relay's own
max_queued = 8                  # optional: prompts a busy session holds before it refuses more
cli_path = "/path/to/cli"       # optional: the runtime's CLI (default: the SDK's)
[agent.provider]                # optional: BYOK; without it the SDK's own login is used
type = "openai"                 # copilot: openai | anthropic | azure; claude-agent: anthropic
base_url = "http://127.0.0.1:9999/v1"   # or base_url_env = "VAR"
api_key_env = "PLANNER_API_KEY"
```
"""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from broker.ids import AGENT_ID_PATTERN

RUNTIMES: Mapping[str, tuple[str, str, tuple[str, ...]]] = {
    "copilot": ("copilot", "relay[copilot]", ("openai", "anthropic", "azure")),
    "claude-agent": ("claude_agent_sdk", "relay[claude-agent]", ("anthropic",)),
}
"""runtime -> (the SDK's module, the extra that installs it, the provider types it takes)"""
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_URL = r"^https?://[^\s/]+(/\S*)?$"


class WorkbenchConfigError(ValueError):
    """The config cannot be honoured; the message names the file and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class ProviderConfig(_Model):
    type: Literal["openai", "anthropic", "azure"]
    base_url: Annotated[str, Field(pattern=_URL, max_length=2048)] | None = None
    base_url_env: Annotated[str, Field(pattern=_ENV_NAME)] | None = None
    api_key_env: Annotated[str, Field(pattern=_ENV_NAME)]

    @model_validator(mode="after")
    def _one_base_url(self) -> ProviderConfig:
        if (self.base_url is None) == (self.base_url_env is None):
            raise ValueError("give exactly one of base_url and base_url_env")
        return self


class AgentConfig(_Model):
    id: Annotated[str, Field(pattern=AGENT_ID_PATTERN)]
    runtime: Literal["copilot", "claude-agent"]
    model: Annotated[str, Field(min_length=1, max_length=200)]
    dir: Annotated[str, Field(min_length=1, max_length=4096)]
    instructions: Annotated[str, Field(max_length=100_000)] = ""
    tools: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:*()-]{1,128}$")], ...] = ()
    max_queued: Annotated[int, Field(ge=0, le=1000)] = 8
    cli_path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    provider: ProviderConfig | None = None

    @field_validator("tools")
    @classmethod
    def _not_relays(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name in ("register_agent", "send_agent_message", "search_agent_messages"):
                raise ValueError(f"{name!r} is relay's own tool, always given: leave it out")
        return value


class DeliveryConfig(_Model):
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 5
    visibility_seconds: Annotated[float, Field(ge=1, le=24 * 3600)] = 30.0


class WorkbenchConfig(_Model):
    delivery: DeliveryConfig = DeliveryConfig()
    agent: Annotated[tuple[AgentConfig, ...], Field(min_length=1, max_length=256)]

    @model_validator(mode="after")
    def _unique(self) -> WorkbenchConfig:
        seen: set[str] = set()
        for agent in self.agent:
            if agent.id in seen:
                raise ValueError(f"agent id {agent.id!r} appears twice")
            seen.add(agent.id)
        return self


@dataclass(frozen=True, slots=True)
class Loaded:
    """A checked config with what it refers to resolved: folders, keys, base URLs (by agent)."""

    config: WorkbenchConfig
    folder: Path
    directories: tuple[Path, ...]
    keys: tuple[str | None, ...] = field(repr=False)
    base_urls: tuple[str | None, ...]


def load(path: Path, environ: Mapping[str, str] | None = None) -> Loaded:
    """Read and check ``path``; ``WorkbenchConfigError`` naming the field when it cannot be honoured."""
    env = os.environ if environ is None else environ
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkbenchConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise WorkbenchConfigError(f"{path}: not valid TOML ({exc})") from None
    try:
        config = WorkbenchConfig.model_validate(raw)
    except ValidationError as exc:
        raise WorkbenchConfigError(f"{path}: {_describe(exc)}") from None
    folder = path.resolve().parent
    directories, keys, urls = [], [], []
    for n, agent in enumerate(config.agent):
        where = f"{path}: agent[{n}] ({agent.id})"
        module, extra, providers = RUNTIMES[agent.runtime]
        if importlib.util.find_spec(module) is None:
            raise WorkbenchConfigError(
                f"{where}.runtime: {agent.runtime!r} needs its SDK, which is not installed: "
                f"pip install '{extra}'"
            )
        if agent.cli_path is not None and not os.access(folder / agent.cli_path, os.X_OK):
            raise WorkbenchConfigError(f"{where}.cli_path: {agent.cli_path!r} is not an executable file")
        directories.append(folder / agent.dir)
        key = url = None
        if agent.provider is not None:
            provider = agent.provider
            if provider.type not in providers:
                raise WorkbenchConfigError(
                    f"{where}.provider.type: {agent.runtime} takes {' | '.join(providers)}, "
                    f"not {provider.type!r}"
                )
            key = env.get(provider.api_key_env) or None
            if key is None:
                raise WorkbenchConfigError(
                    f"{where}.provider.api_key_env: the variable {provider.api_key_env} is not set (it "
                    "holds the provider's API key; the file never does)"
                )
            url = provider.base_url
            if provider.base_url_env is not None:
                url = env.get(provider.base_url_env) or None
                if url is None or not re.match(_URL, url):
                    raise WorkbenchConfigError(
                        f"{where}.provider.base_url_env: the variable {provider.base_url_env} is "
                        f"{'not set' if url is None else 'not an http(s) URL'}"
                    )
        keys.append(key)
        urls.append(url)
    return Loaded(
        config=config,
        folder=folder,
        directories=tuple(directories),
        keys=tuple(keys),
        base_urls=tuple(urls),
    )


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = _field(error["loc"])
        shown = repr(error.get("input"))[:80]
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown field (see docs/workbench.md for the fields)")
        elif error["type"] == "missing":
            problems.append(f"{where}: required")
        else:
            problems.append(f"{where}: {message} (got {shown})")
    return "; ".join(problems)


def _field(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "the file"
