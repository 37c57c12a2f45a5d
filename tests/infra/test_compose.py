"""docker-compose.yml and its three-broker variant cannot run here (no Docker
engine), so check that they agree with the code: images, commands, topics,
the bootstrap variable, and the brokers as the local cluster runs them."""

from __future__ import annotations

import base64
import tomllib
from pathlib import Path

import pytest
import yaml

from streams.tools.broker import internal_replication, kafka_version
from streams.cli import build_parser
from schemas.configfile import CONFIG_ENV, load_config
from streams.worker.settings import BOOTSTRAP_ENV, DATA_DIR_ENV

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


# -- the three-broker variant (docker-compose.cluster.yml, an override of the file above) --

NODES = ("kafka", "kafka-2", "kafka-3")


def _merged(base: object, override: object) -> object:
    """What `docker compose -f A -f B` makes of B over A, for what these files
    use: mappings merge key by key (recursively), anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{key: _merged(base[key], value) if key in base else value for key, value in override.items()}}
    return override


@pytest.fixture(scope="module")
def cluster(compose: dict) -> dict:
    override = yaml.safe_load((ROOT / "docker-compose.cluster.yml").read_text(encoding="utf-8"))
    merged = _merged(compose, override)
    assert isinstance(merged, dict)
    return merged


def test_the_cluster_variant_adds_two_brokers(compose: dict, cluster: dict) -> None:
    assert set(cluster["services"]) == set(compose["services"]) | {"kafka-2", "kafka-3"}


def test_its_brokers_are_three_voters_of_one_cluster_as_the_local_cluster_runs_them(cluster: dict) -> None:
    nodes = [cluster["services"][name] for name in NODES]
    envs = [node["environment"] for node in nodes]
    assert [node["image"] for node in nodes] == [f"apache/kafka:{kafka_version()}"] * 3
    assert [int(env["KAFKA_NODE_ID"]) for env in envs] == [1, 2, 3]
    hosts = [node["hostname"] for node in nodes]
    assert hosts == list(NODES)
    voters = ",".join(f"{env['KAFKA_NODE_ID']}@{host}:9093" for env, host in zip(envs, hosts, strict=True))
    replicas, min_isr = internal_replication(len(nodes))  # what streams/tools/broker.py gives a cluster's nodes
    external = set()
    for env, host in zip(envs, hosts, strict=True):
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == voters
        assert env["CLUSTER_ID"] == envs[0]["CLUSTER_ID"]
        assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16  # Kafka's own id format
        assert f"PLAINTEXT://{host}:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        external |= {
            listener for listener in env["KAFKA_ADVERTISED_LISTENERS"].split(",") if listener.startswith("EXTERNAL")
        }
        assert int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == replicas == 3
        assert int(env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"]) == replicas
        assert int(env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == min_isr == 2
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert len(external) == 3  # one port on the host per broker


@pytest.mark.parametrize("name", ["topics-init", "worker-1", "worker-2", "fleet", "dashboard"])
def test_its_project_services_reach_every_broker_and_follow_the_cluster(cluster: dict, name: str) -> None:
    service = cluster["services"][name]
    assert service["environment"][BOOTSTRAP_ENV] == ",".join(f"{host}:9092" for host in NODES)
    assert service["environment"][CONFIG_ENV] == "/app/examples/loopwarden.json5"  # the base file's, kept
    args = build_parser().parse_args(service["command"])
    # No --replication-factor: three brokers give three replicas and min.insync.replicas=2.
    assert getattr(args, "replication_factor", None) is None


def test_topics_are_created_once_every_broker_is_up(cluster: dict) -> None:
    depends = cluster["services"]["topics-init"]["depends_on"]
    assert {name: depends[name]["condition"] for name in NODES} == dict.fromkeys(NODES, "service_healthy")
