"""docker-compose.yml, the Dockerfile and deploy/ agree with each other and with relay itself.

No Docker engine is needed: the compose file is parsed, each worker's command line goes through
relay's own argument parser, and keys, ports, scrape targets and alert rules are checked to line up.
When ``promtool`` or ``docker-compose`` is installed, they check the files too.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry

from adapters.redis.connection import RedisConnection, RedisSettings
from adapters.redis.gauges import InboxGauges
from broker.metrics import RelayMetrics
from relay.cli import build_parser
from relay.settings import ServeSettings, load
from tests.support import dockerfile

ROOT = Path(__file__).resolve().parents[1]
yaml = importlib.import_module("yaml")  # PyYAML (dev extra); untyped, so loaded as a plain module


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


COMPOSE = load_yaml(ROOT / "docker-compose.yml")
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DEFAULT = {name: service for name, service in SERVICES.items() if "profiles" not in service}
CLUSTER = {name: service for name, service in SERVICES.items() if "cluster" in service.get("profiles", [])}
WORKERS = {name: service for name, service in DEFAULT.items() if "build" in service}
CLUSTER_WORKERS = {name: service for name, service in CLUSTER.items() if "build" in service}
CLUSTER_NODES = {
    name: s for name, s in CLUSTER.items() if s.get("image", "").startswith("redis:") and "healthcheck" in s
}
PROMETHEUS = load_yaml(ROOT / "deploy" / "prometheus.yml")
ALERTS = load_yaml(ROOT / "deploy" / "alerts.yml")


def image_env() -> dict[str, str]:
    final_stage = [row for row in dockerfile() if row[0] == "FROM"][-1]
    rows = dockerfile()
    env: dict[str, str] = {}
    for instruction, rest in rows[rows.index(final_stage) :]:
        if instruction == "ENV":
            for word in shlex.split(rest):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def worker_settings(service: dict[str, Any]) -> ServeSettings:
    command = service["command"]
    assert isinstance(command, list) and all(isinstance(word, str) for word in command), command
    args = build_parser().parse_args(command)  # exits (fails the test) on anything relay refuses
    assert args.command == "serve"
    environ = {**image_env(), **{k: str(v) for k, v in (service.get("environment") or {}).items()}}
    with mock.patch.dict(os.environ, environ, clear=True):
        return load(ServeSettings, args)


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of each short-syntax port mapping."""
    found = []
    for entry in service.get("ports", []):
        ip, host, container = str(entry).split(":")
        found.append((ip, int(host), int(container.split("/")[0])))
    return found


def test_the_stack_is_redis_two_workers_and_prometheus() -> None:
    assert set(DEFAULT) == {"redis", "prometheus", "network-tls", *WORKERS}
    assert len(WORKERS) == 2
    for service in WORKERS.values():
        build = service["build"]
        assert build == "." or build.get("context") == ".", build


def test_redis_persists_append_only_on_a_named_volume_with_a_healthcheck() -> None:
    redis = SERVICES["redis"]
    assert redis["image"].startswith("redis:7")
    command = redis["command"]
    assert command[0] == "redis-server"
    pairs = dict(zip(command[1::2], command[2::2], strict=True))
    assert pairs == {"--appendonly": "yes", "--appendfsync": "everysec"}
    volume, _, target = redis["volumes"][0].partition(":")
    assert target == "/data" and volume in COMPOSE["volumes"]
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "ports" not in redis, (
        "Redis stays on the compose network (use `docker compose exec redis redis-cli`)"
    )


def test_one_worker_runs_the_network_listener_with_the_certificate_made_at_start_up() -> None:
    network = {name: worker_settings(s) for name, s in WORKERS.items() if worker_settings(s).network_port}
    assert list(network) == ["relay-a"]
    settings, service = network["relay-a"], WORKERS["relay-a"]
    assert service["depends_on"]["network-tls"]["condition"] == "service_completed_successfully"
    volume, _, target = service["volumes"][0].partition(":")
    assert volume in COMPOSE["volumes"] and DEFAULT["network-tls"]["volumes"] == [f"{volume}:/tls"]
    mounted = PurePosixPath(target.removesuffix(":ro"))
    assert settings.tls_cert == Path(mounted / "cert.pem") and settings.tls_key == Path(mounted / "key.pem")
    made = " ".join(DEFAULT["network-tls"]["command"])
    assert "/tls/cert.pem" in made and "/tls/key.pem" in made and "${RELAY_UID:-1000}" in made


def test_each_worker_command_is_accepted_by_relay_serve() -> None:
    for name, service in WORKERS.items():
        settings = worker_settings(service)
        assert settings.redis_url == "redis://redis:6379/0", name
        assert settings.host == "0.0.0.0", name
        assert settings.log_format == "json", name
        assert settings.port == int(image_env()["RELAY_PORT"]), (
            f"{name}: the image's HEALTHCHECK probes RELAY_PORT"
        )
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_keys_ports_and_scrape_targets_line_up() -> None:
    secrets = COMPOSE["secrets"]
    host_ports = []
    targets = []
    for name, service in WORKERS.items():
        settings = worker_settings(service)
        (secret,) = service["secrets"]
        assert secret["source"] in secrets
        assert secrets[secret["source"]] == {"file": "./relay.key"}
        assert settings.agent_mcp_key_file == Path(secret["target"]), name
        assert PurePosixPath(secret["target"]).is_absolute()
        ports = published(service)
        wanted = {settings.port} | ({settings.network_port} if settings.network_port else set())
        assert {container for _, _, container in ports} == wanted, name
        assert all(ip == "127.0.0.1" for ip, _, _ in ports), name
        host_ports.extend(host for _, host, _ in ports)
        targets.append(f"{name}:{settings.port}")
        assert service["user"] == "${RELAY_UID:-1000}:${RELAY_GID:-1000}", "the key file owner must run it"
    assert len(set(host_ports)) == len(host_ports), "each worker needs its own published port"

    (job,) = PROMETHEUS["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (static,) = job["static_configs"]
    assert sorted(static["targets"]) == sorted(targets)
    assert sum(1 for _, port, _ in published(SERVICES["prometheus"]) if port in host_ports) == 0


def test_prometheus_mounts_its_config_and_rules_from_the_repo() -> None:
    prometheus = SERVICES["prometheus"]
    flags = dict(arg.split("=", 1) for arg in prometheus["command"])
    config = PurePosixPath(flags["--config.file"])
    mounts = {}
    for volume in prometheus["volumes"]:
        source, target, *mode = volume.split(":")
        mounts[PurePosixPath(target)] = (source, mode)
    assert mounts[config] == ("./deploy/prometheus.yml", ["ro"])
    for rule_file in PROMETHEUS["rule_files"]:
        source, mode = mounts[config.parent / rule_file]
        assert (ROOT / source).resolve() == (ROOT / "deploy" / rule_file).resolve() and mode == ["ro"]
    assert set(prometheus["depends_on"]) == set(WORKERS)


def test_the_dockerfile_builds_a_slim_non_root_image_running_relay() -> None:
    rows = dockerfile()
    froms = [rest for instruction, rest in rows if instruction == "FROM"]
    assert froms and all(re.match(r"python:\$\{PYTHON_VERSION\}-slim", f) for f in froms), froms
    (user,) = [rest for instruction, rest in rows if instruction == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    (entrypoint,) = [rest for instruction, rest in rows if instruction == "ENTRYPOINT"]
    assert entrypoint == '["relay"]'
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "relay" in pyproject["project"]["scripts"]
    (healthcheck,) = [rest for instruction, rest in rows if instruction == "HEALTHCHECK"]
    assert "/healthz" in healthcheck and "RELAY_PORT" in healthcheck
    assert any(instruction == "RUN" and "pip install ." in rest for instruction, rest in rows)
    copied = {
        PurePosixPath(word).name
        for instruction, rest in rows
        if instruction == "COPY" and "--from" not in rest
        for word in rest.split()[:-1]
    }
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {
        pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert needed <= copied


def test_dockerignore_keeps_keys_and_local_state_out_of_the_build_context() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {"*.key", "**/*.key", ".venv/", ".relay/", ".git/"} <= ignored
    assert not {"broker/", "adapters/", "relay/", "pyproject.toml", "README.md"} & ignored


def test_the_cluster_profile_is_six_nodes_a_one_shot_create_and_two_workers_on_different_nodes() -> None:
    assert set(CLUSTER) == {*CLUSTER_NODES, "redis-cluster-init", *CLUSTER_WORKERS}
    assert len(CLUSTER_NODES) == 6 and len(CLUSTER_WORKERS) == 2
    volumes = set()
    for node in CLUSTER_NODES.values():
        command = node["command"]
        flags = dict(zip(command[1::2], command[2::2], strict=True))
        assert command[0] == "redis-server" and flags["--cluster-enabled"] == "yes"
        assert flags["--appendonly"] == "yes"
        (volume,) = node["volumes"]
        volumes.add(volume.split(":")[0])
        assert node["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"] and "ports" not in node
    assert volumes <= set(COMPOSE["volumes"]) and len(volumes) == 6
    init = CLUSTER["redis-cluster-init"]
    script = " ".join(init["command"])
    assert "--cluster create" in script and "--cluster-replicas 1" in script and "--cluster-yes" in script
    assert set(init["depends_on"]) == set(CLUSTER_NODES)
    assert all(dep["condition"] == "service_healthy" for dep in init["depends_on"].values())
    urls = set()
    for name, service in CLUSTER_WORKERS.items():
        settings = worker_settings(service)
        assert settings.redis_url is not None
        node = settings.redis_url.removeprefix("redis://").split(":")[0]
        assert node in CLUSTER_NODES, name
        urls.add(node)
        assert service["depends_on"] == {
            "redis-cluster-init": {"condition": "service_completed_successfully"}
        }
        ((ip, _, container_port),) = published(service)
        assert ip == "127.0.0.1" and container_port == settings.port
    assert len(urls) == 2, "the two workers enter the cluster through different nodes"
    ports = [p for s in [*WORKERS.values(), *CLUSTER_WORKERS.values()] for _, p, _ in published(s)]
    assert len(set(ports)) == len(ports)


def exported_metric_names() -> set[str]:
    registry = CollectorRegistry()
    RelayMetrics(registry)
    registry.register(InboxGauges(RedisConnection(RedisSettings(url="redis://127.0.0.1:1/0"))))
    names = set()
    for family in registry.collect():
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


def test_alert_rules_use_only_metrics_relay_exports() -> None:
    exported = exported_metric_names()
    used: set[str] = set()
    rules = [rule for group in ALERTS["groups"] for rule in group["rules"]]
    assert {"RelayInboxBacklog", "RelayOldestUnackedTooOld", "RelayDeadLetters"} <= {
        r["alert"] for r in rules
    }
    for rule in rules:
        used |= set(re.findall(r"\bcsf_relay_[a-z_]+", rule["expr"]))
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
    assert used and used <= exported, used - exported


def test_operations_doc_explains_every_metric() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(name for name in exported_metric_names() if f"`{name}" not in doc)
    assert not missing, f"docs/operations.md does not describe {missing}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_config_and_the_alerts_fire(tmp_path: Path) -> None:
    for args in (["check", "config", "deploy/prometheus.yml"], ["check", "rules", "deploy/alerts.yml"]):
        result = subprocess.run(["promtool", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
    shutil.copy(ROOT / "deploy" / "alerts.yml", tmp_path / "alerts.yml")
    workers = [f"{name}:8080" for name in sorted(WORKERS)]

    def series(name: str, values: str, **labels: str) -> list[dict[str, str]]:
        out = []
        for instance in workers:
            rendered = ",".join(
                f'{k}="{v}"' for k, v in {**labels, "instance": instance, "job": "relay"}.items()
            )
            out.append({"series": f"{name}{{{rendered}}}", "values": values})
        return out

    rules = {rule["alert"]: rule for group in ALERTS["groups"] for rule in group["rules"]}

    def fired(alert: str, value: str = "", **labels: str) -> dict[str, Any]:
        """The alert at 20m: firing with ``labels`` and its annotations rendered for ``value``, or
        (without labels) not firing."""
        if not labels:
            return {"eval_time": "20m", "alertname": alert, "exp_alerts": []}
        annotations = {}
        for key, template in rules[alert]["annotations"].items():
            text = template.replace("{{ $labels.agent }}", labels.get("agent", ""))
            text = text.replace("{{ $value | humanizeDuration }}", value)
            annotations[key] = text.replace("{{ $value }}", value)
        expected = {"exp_labels": {**labels, "severity": rules[alert]["labels"]["severity"]}}
        return {
            "eval_time": "20m",
            "alertname": alert,
            "exp_alerts": [{**expected, "exp_annotations": annotations}],
        }

    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    *series("csf_relay_inbox_depth", "1500x30", agent="bob"),
                    *series("csf_relay_inbox_depth", "3x30", agent="alice"),
                    *series("csf_relay_inbox_oldest_unacked_seconds", "1000+60x30", agent="bob"),
                    *series("csf_relay_dead_letter_depth", "0 0 2x30", agent="carol"),
                    *series("csf_relay_inspection_up", "1x30"),
                ],
                "alert_rule_test": [
                    fired("RelayInboxBacklog", "1500", agent="bob"),
                    fired("RelayInboxNearCap"),
                    fired("RelayOldestUnackedTooOld", "36m 40s", agent="bob"),  # 1000 s + 20 x 60 s
                    fired("RelayDeadLetters", "2", agent="carol"),
                    fired("RelayInspectionFailing"),
                ],
            }
        ],
    }
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
def test_docker_compose_accepts_the_file() -> None:
    env = {**os.environ, "RELAY_UID": "1234", "RELAY_GID": "1234"}
    result = subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert {resolved["services"][name]["user"] for name in WORKERS} == {"1234:1234"}
