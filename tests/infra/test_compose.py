"""docker-compose.yml cannot run here (no Docker engine), so check that it
agrees with the code: images, commands, topics and the bootstrap variable."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from streams.tools.broker import kafka_version
from streams.cli import build_parser
from schemas.configfile import CONFIG_ENV, load_config
from streams.kafka.options import BOOTSTRAP_ENV
from streams.worker.settings import DATA_DIR_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def test_services(compose: dict) -> None:
    assert set(compose["services"]) == {"kafka", "topics-init", "worker-1", "worker-2", "fleet", "dashboard"}


def test_broker_is_the_same_kafka_in_kraft_mode(compose: dict) -> None:
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{kafka_version()}"
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # topics-init creates them


@pytest.mark.parametrize("name", ["topics-init", "worker-1", "worker-2", "fleet", "dashboard"])
def test_project_services_run_real_commands_against_the_broker(compose: dict, name: str) -> None:
    service = compose["services"][name]
    args = build_parser().parse_args(service["command"])  # fails on an option the CLI does not have
    assert args.command in {"topics", "worker", "fleet", "dashboard"}
    env = service["environment"]
    assert env[BOOTSTRAP_ENV] == "kafka:9092"
    config = env[CONFIG_ENV]
    assert config.startswith("/app/")
    load_config(ROOT / config.removeprefix("/app/"))  # the file exists and is valid
    assert "kafka" in service["depends_on"] or "topics-init" in service["depends_on"]


def test_workers_keep_state_on_their_own_volumes(compose: dict) -> None:
    mounts = {name: compose["services"][name]["volumes"][0] for name in ("worker-1", "worker-2")}
    assert mounts["worker-1"] != mounts["worker-2"]
    for name, mount in mounts.items():
        assert mount.endswith(":" + compose["services"][name]["environment"][DATA_DIR_ENV])


def test_image_entrypoint_is_the_console_script() -> None:
    dockerfile = (ROOT / "infra/docker/Dockerfile").read_text(encoding="utf-8")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert 'ENTRYPOINT ["loopwarden"]' in dockerfile and "loopwarden" in scripts
    assert "COPY examples" in dockerfile
