"""Tenants on a real secure broker, through a real worker (docs/SECURITY.md,
"Tenants"): `loopwarden tenants add|list`, what a tenant's gateway may not
do, equal run ids of two tenants kept apart, and a seq jump refused while the
run goes on. The broker is this module's own: tenants add ACLs that the
shared secure broker's tests check are exactly the roles'."""

from __future__ import annotations

import json
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from helpers import LOOPWARDEN, REPO, Worker, consume, env_file, write_config
from schemas.codec import decode_verdict
from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC, HEADER_KIND, HEADER_REASON
from streams import kafka_clients
from streams.client import GuardClient
from streams.tools import secure
from streams.tools.broker import LocalBroker

pytestmark = pytest.mark.integration

DEFAULT_NAMES = {
    "app_id": secure.APP_ID,
    "events": EVENTS_TOPIC,
    "decisions": DECISIONS_TOPIC,
    "deadletter": DEADLETTER_TOPIC,
}


@pytest.fixture(scope="module")
def tenant_broker(kafka_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A secure broker with the tenants `acme` and `beta`, added by the command."""
    with LocalBroker(data_dir=tmp_path_factory.mktemp("tenants") / "kafka", lib_dir=kafka_lib, secure=True) as broker:
        for name in ("acme", "beta"):
            added = _loopwarden("tenants", "add", name, "--data-dir", str(broker.data_dir))
            assert added.returncode == 0, added.stderr
        yield broker


def _loopwarden(*args: str, env: Path | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["bash", "-c", 'set -a; . "$0"; exec "$@"', str(env)] if env else []
    return subprocess.run([*prefix, *LOOPWARDEN, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def _env(broker: LocalBroker, tenant: str) -> Path:
    return broker.data_dir / "secrets" / "tenants" / tenant / "gateway.env"


def _security(broker: LocalBroker, tenant: str) -> kafka_clients.KafkaSecurity:
    return kafka_clients.security_from(environ=env_file(_env(broker, tenant)))


def test_a_tenant_gets_a_user_two_topics_and_its_settings(tenant_broker) -> None:
    env = env_file(_env(tenant_broker, "acme"))
    folder = _env(tenant_broker, "acme").parent
    assert env == {
        "LOOPWARDEN_BOOTSTRAP": tenant_broker.bootstrap,
        "LOOPWARDEN_SECURITY_PROTOCOL": "SASL_SSL",
        "LOOPWARDEN_SASL_MECHANISM": "SCRAM-SHA-512",
        "LOOPWARDEN_SASL_USERNAME": "tenant-acme",
        "LOOPWARDEN_SASL_PASSWORD_FILE": str(folder / "gateway.password"),
        "LOOPWARDEN_SSL_CAFILE": str(tenant_broker.data_dir / "secrets" / "ca.pem"),
        "LOOPWARDEN_EVENTS_TOPIC": "loopwarden.acme.events",
        "LOOPWARDEN_DECISIONS_TOPIC": "loopwarden.acme.decisions",
    }
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("gateway.env", "gateway.password"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    password = (folder / "gateway.password").read_text()
    again = _loopwarden("tenants", "add", "acme", "--data-dir", str(tenant_broker.data_dir))
    assert again.returncode == 0, again.stderr
    assert (folder / "gateway.password").read_text() == password  # idempotent: the same credentials
    assert again.stdout == (
        "tenant acme: user tenant-acme; topics loopwarden.acme.events (12 partitions), "
        f"loopwarden.acme.decisions (12 partitions); settings in {folder / 'gateway.env'}\n"
    )
    listed = _loopwarden("tenants", "list", "--data-dir", str(tenant_broker.data_dir))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        f"{name}  user=tenant-{name}  events=loopwarden.{name}.events (12)  "
        f"decisions=loopwarden.{name}.decisions (12)  acls=ok  env={_env(tenant_broker, name)}"
        for name in ("acme", "beta")
    ]
    bad = _loopwarden("tenants", "add", "Bad.Name", "--data-dir", str(tenant_broker.data_dir))
    assert bad.returncode == 2 and "tenant name 'Bad.Name': expected 1 to 63 of a-z" in bad.stderr


def _send(broker: LocalBroker, tenant: str, topic: str) -> None:
    producer = kafka_clients.producer(
        broker.bootstrap, security=_security(broker, tenant), retries=0, enable_idempotence=False
    )
    try:
        producer.send(topic, key=b"r", value=b"{}").get(timeout=30)
    finally:
        producer.close()


def _read(broker: LocalBroker, tenant: str, topic: str, group: str | None = None) -> None:
    consumer = kafka_clients.consumer(
        broker.bootstrap, security=_security(broker, tenant), group_id=group, enable_auto_commit=False
    )
    try:
        if group is None:
            tp = TopicPartition(topic, 0)
            consumer.beginning_offsets([tp])  # refused here for a topic it may not even describe
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
        else:
            consumer.subscribe([topic])
        for _ in range(150):  # a refusal ends it at once
            consumer.poll(timeout_ms=200)
    finally:
        consumer.close()


@pytest.mark.parametrize(
    "topic", ["loopwarden.beta.decisions", "loopwarden.beta.events", DECISIONS_TOPIC, "loopwarden.acme.events"]
)
def test_a_tenant_reads_no_decisions_but_its_own(tenant_broker, topic: str) -> None:
    with pytest.raises(TopicAuthorizationFailedError, match=topic):
        _read(tenant_broker, "acme", topic)


@pytest.mark.parametrize("topic", ["loopwarden.beta.events", EVENTS_TOPIC, "loopwarden.acme.decisions"])
def test_a_tenant_writes_no_events_but_its_own(tenant_broker, topic: str) -> None:
    with pytest.raises(TopicAuthorizationFailedError, match=topic):
        _send(tenant_broker, "acme", topic)


def test_a_tenant_joins_no_group(tenant_broker) -> None:
    """Its client reads its reply partition without a group: it has none to hijack, nor may join another's."""
    with pytest.raises(GroupAuthorizationFailedError):
        _read(tenant_broker, "acme", "loopwarden.acme.decisions", group=f"{secure.GATEWAY_GROUP_PREFIX}acme")


def _client(broker: LocalBroker, tenant: str) -> GuardClient:
    environ = env_file(_env(broker, tenant))
    return GuardClient(
        broker.bootstrap,
        events_topic=environ["LOOPWARDEN_EVENTS_TOPIC"],
        decisions_topic=environ["LOOPWARDEN_DECISIONS_TOPIC"],
        security=_security(broker, tenant),
        timeout=60,
    )


def test_one_worker_serves_every_tenant_apart(tenant_broker, tmp_path: Path) -> None:
    """One worker (the worker role, its default topics) serves both tenants:
    acme's loop under run id `shared` leaves beta's run `shared` untouched,
    each verdict is on its own tenant's decisions topic only, and a seq jump
    is dead-lettered while the run goes on."""
    worker_env = env_file(tenant_broker.data_dir / "secrets" / "worker.env")
    worker = Worker(
        tenant_broker.bootstrap, DEFAULT_NAMES, tmp_path, "tenants", config=write_config(tmp_path), env=worker_env
    ).start()
    try:
        with _client(tenant_broker, "acme") as acme, _client(tenant_broker, "beta") as beta:
            assert acme.guard("warm-acme", "read", {"path": "x"})[1].fallback is None, worker.log()[-3000:]
            assert beta.guard("warm-beta", "read", {"path": "x"})[1].fallback is None, worker.log()[-3000:]
            looped = []
            for _ in range(6):
                call, verdict = acme.guard("shared", "exec", {"command": "make test"})
                looped.append(verdict.decision)
                if verdict.allowed:
                    acme.tool_result(call, result={"content": [{"type": "text", "text": "FAIL"}]})
            assert looped == ["allow", "allow", "allow", "warn", "allow", "block"]
            healthy = [beta.guard("shared", "exec", {"command": "make test"})[1] for _ in range(2)]
            assert [(v.seq, v.decision, v.fallback) for v in healthy] == [(0, "allow", None), (1, "allow", None)]

            jump = {"type": "tool_call", "run_id": "shared", "seq": 2**63 - 1, "tool_call_id": "x", "tool_name": "read"}
            producer = kafka_clients.producer(tenant_broker.bootstrap, security=_security(tenant_broker, "beta"))
            producer.send("loopwarden.beta.events", key=b"shared", value=json.dumps(jump).encode()).get(timeout=30)
            producer.close()
            after = beta.guard("shared", "read", {"path": "README.md"})[1]
            assert (after.seq, after.decision, after.fallback) == (2, "allow", None)
    finally:
        assert worker.stop() == 0
    admin = tenant_broker.security("admin")
    letters = consume(tenant_broker.bootstrap, DEADLETTER_TOPIC, count=1, timeout=30, security=admin)
    (letter,) = [r for r in letters if r.key == b"shared"]
    headers = dict(letter.headers)
    assert headers[HEADER_KIND] == b"seq_jump"
    assert headers[HEADER_REASON].startswith(
        b"seq 9223372036854775807 is 9223372036854775806 above the run's last seq 1"
    )
    on_beta = consume(
        tenant_broker.bootstrap, "loopwarden.beta.decisions", count=4, timeout=30, settle=1, security=admin
    )
    on_acme = consume(
        tenant_broker.bootstrap, "loopwarden.acme.decisions", count=7, timeout=30, settle=1, security=admin
    )
    assert sorted({decode_verdict(r.value).run_id for r in on_beta}) == ["shared", "warm-beta"]
    assert [decode_verdict(r.value).decision for r in on_beta if r.key == b"shared"] == ["allow"] * 3
    assert sorted({decode_verdict(r.value).run_id for r in on_acme}) == ["shared", "warm-acme"]
    assert consume(tenant_broker.bootstrap, DECISIONS_TOPIC, count=1, timeout=3, security=admin) == []
    assert stat.S_IMODE(worker.data_dir.stat().st_mode) == 0o700  # run tables: the owner's only
    (starting,) = worker.lines("starting")
    assert starting["tenants"] == "acme,beta"
