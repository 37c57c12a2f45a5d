"""The secure local broker (docs/SECURITY.md) against real clients: what it
writes for them, the connections it refuses and why, and what the gateway,
worker and auditor roles may not do. The pipeline over SASL_SSL is in
tests/worker/test_secure_pipeline.py."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import urllib.request
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from helpers import LOOPWARDEN, REPO, env_file, make_trace, produce
from schemas.configfile import ROLLING_OFF
from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC, INCIDENTS_TOPIC
from streams.fleet.settings import FLEET_APP_ID
from streams import kafka_clients
from streams.kafka_clients import ConnectionRefused, KafkaSecurity, check_connection
from streams.tools import secure

pytestmark = pytest.mark.integration


def secrets(broker) -> Path:
    return broker.data_dir / "secrets"


def test_the_secrets_a_client_needs(secure_broker) -> None:
    """ca.pem, one password file and one env file per user, which give every
    setting, bootstrap included; passwords and env files are the owner's
    only, and no env file holds a password."""
    folder = secrets(secure_broker)
    for role in ("gateway", "worker", "auditor", "admin"):
        env = env_file(folder / f"{role}.env")
        assert env == {
            "LOOPWARDEN_BOOTSTRAP": secure_broker.bootstrap,
            "LOOPWARDEN_SECURITY_PROTOCOL": "SASL_SSL",
            "LOOPWARDEN_SASL_MECHANISM": "SCRAM-SHA-512",
            "LOOPWARDEN_SASL_USERNAME": role,
            "LOOPWARDEN_SASL_PASSWORD_FILE": str(folder / f"{role}.password"),
            "LOOPWARDEN_SSL_CAFILE": str(folder / "ca.pem"),
            **({"LOOPWARDEN_APP_ID": "loopwarden"} if role == "worker" else {}),
        }
        password = (folder / f"{role}.password").read_text().strip()
        assert len(password) >= 24 and password not in (folder / f"{role}.env").read_text()
        for name in (f"{role}.password", f"{role}.env"):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    assert (folder / "ca.pem").read_text().startswith("-----BEGIN CERTIFICATE-----")


def test_the_env_file_is_all_a_command_needs(secure_broker) -> None:
    """`set -a; . worker.env` and a command connects as the worker: the
    topics the set-up created, the incident topic among them, are there (and
    describing them is allowed)."""
    shown = subprocess.run(
        [
            "bash",
            "-c",
            'set -a; . "$0"; exec "$@"',
            secrets(secure_broker) / "worker.env",
            *LOOPWARDEN,
            "topics",
            "create",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        f"exists  {EVENTS_TOPIC} (12 partitions)",
        f"exists  {DECISIONS_TOPIC} (12 partitions)",
        f"exists  {DEADLETTER_TOPIC} (12 partitions)",
        f"exists  {INCIDENTS_TOPIC} (12 partitions)",
    ]


def _other(broker, **changes: str) -> KafkaSecurity:
    """The gateway's settings with some changed."""
    gateway = broker.security("gateway")
    values = {
        "protocol": gateway.protocol,
        "sasl_username": gateway.sasl_username,
        "sasl_password_file": gateway.sasl_password_file,
        "ssl_cafile": gateway.ssl_cafile,
    }
    return KafkaSecurity.checked({**values, **changes})


def test_refused_connections_say_why(secure_broker, tmp_path: Path) -> None:
    """A plaintext client on the TLS listener, a wrong password and a client
    that does not trust the CA are each refused, with the step and the reason."""
    check_connection(secure_broker.bootstrap, secure_broker.security("gateway"))  # the right settings pass

    with pytest.raises(ConnectionRefused, match=r"closed the connection .*does its listener require TLS"):
        check_connection(secure_broker.bootstrap, kafka_clients.PLAINTEXT)

    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    with pytest.raises(ConnectionRefused) as refused:
        check_connection(secure_broker.bootstrap, _other(secure_broker, sasl_password_file=str(wrong)))
    assert "as gateway: SaslAuthenticationFailed" in str(refused.value)
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in str(refused.value)

    with pytest.raises(ConnectionRefused) as refused:
        check_connection(secure_broker.bootstrap, _other(secure_broker, ssl_cafile=""))  # the system's CAs
    assert "TLS handshake with" in str(refused.value)
    assert "unable to get local issuer certificate" in str(refused.value)
    assert "not signed by a CA this client trusts" in str(refused.value)


def test_a_worker_with_a_wrong_password_does_not_start(secure_broker, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    env = {**env_file(secrets(secure_broker) / "worker.env"), "LOOPWARDEN_SASL_PASSWORD_FILE": str(wrong)}
    run = subprocess.run(
        [*LOOPWARDEN, "worker", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert run.returncode == 2
    assert "event=startup_failed" in run.stderr and "SaslAuthenticationFailed" in run.stderr
    assert "not-the-password" not in run.stderr


def _send(broker, role: str, topic: str) -> None:
    producer = kafka_clients.producer(
        broker.bootstrap, security=broker.security(role), retries=0, enable_idempotence=False
    )
    try:
        producer.send(topic, key=b"run-forged", value=b'{"decision":"allow"}').get(timeout=30)
    finally:
        producer.close()


def _read(broker, role: str, topic: str, group: str | None = None, *, join: bool = False) -> None:
    """Poll ``topic`` as ``role``: its partition 0 from the beginning, or,
    with ``group``, from that group's position; with ``join`` as a member of
    the group. (A join alone can be assigned nothing, when the group's leader
    has no metadata for the topic yet, and then nothing is ever refused.)"""
    consumer = kafka_clients.consumer(
        broker.bootstrap, security=broker.security(role), group_id=group, enable_auto_commit=False
    )
    try:
        if join:
            consumer.subscribe([topic])
        else:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            if group is None:
                consumer.seek_to_beginning(tp)
        for _ in range(150):  # a group join on a loaded machine can take seconds; a refusal ends it at once
            consumer.poll(timeout_ms=200)
    finally:
        consumer.close()


def test_the_gateway_cannot_forge_verdicts_or_read_events(secure_broker) -> None:
    """A forged verdict is refused with an authorization error, and so is
    reading the events topic, with no group or with a group (which the
    gateway role may not use at all)."""
    with pytest.raises(TopicAuthorizationFailedError, match=DECISIONS_TOPIC):
        _send(secure_broker, "gateway", DECISIONS_TOPIC)
    with pytest.raises(TopicAuthorizationFailedError, match=EVENTS_TOPIC):
        _read(secure_broker, "gateway", EVENTS_TOPIC)
    with pytest.raises((TopicAuthorizationFailedError, GroupAuthorizationFailedError)):
        _read(secure_broker, "gateway", EVENTS_TOPIC, group=f"{secure.GATEWAY_GROUP_PREFIX}other")


def test_the_gateway_cannot_join_the_workers_group(secure_broker) -> None:
    with pytest.raises(GroupAuthorizationFailedError):
        _read(secure_broker, "gateway", DECISIONS_TOPIC, group=secure.APP_ID, join=True)


def test_the_gateway_cannot_read_incidents_or_join_the_fleet_stages_group(secure_broker) -> None:
    """A topic the gateway may not even describe: its offsets are refused."""
    consumer = kafka_clients.consumer(secure_broker.bootstrap, security=secure_broker.security("gateway"))
    try:
        with pytest.raises(TopicAuthorizationFailedError, match=INCIDENTS_TOPIC):
            consumer.beginning_offsets([TopicPartition(INCIDENTS_TOPIC, 0)])
    finally:
        consumer.close()
    with pytest.raises(GroupAuthorizationFailedError):
        _read(secure_broker, "gateway", DECISIONS_TOPIC, group=FLEET_APP_ID, join=True)


@pytest.mark.parametrize(
    ("role", "topic"),
    [
        ("gateway", EVENTS_TOPIC),
        ("gateway", DEADLETTER_TOPIC),
        ("gateway", INCIDENTS_TOPIC),
        ("worker", DEADLETTER_TOPIC),
    ],
)
def test_tail_refused_a_topic_says_so_at_once(secure_broker, role: str, topic: str) -> None:
    """A topic this user may not read or describe: one line naming it and the
    user, exit 2 as audit and explain, instead of waiting out the timeout."""
    done = subprocess.run(
        ["bash", "-c", 'set -a; . "$0"; exec "$@"', secrets(secure_broker) / f"{role}.env",
         *LOOPWARDEN, "tail", "--topic", topic, "--timeout", "10m"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,  # far below tail's own timeout: a tail that waits fails here
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        f"loopwarden: not authorized to read topic {topic}: the ACLs of user {role} do not allow it\n"
    )


@pytest.mark.parametrize(
    ("command", "events_first"),
    [
        (["audit", "--since", "0s"], False),  # nothing since now: a range with nothing to fetch
        (["explain", "no-such-run"], False),
        (["audit", "--from-beginning"], True),  # refused in the read itself
        (["explain", "refused-0000"], True),
    ],
)
def test_audit_and_explain_refused_with_or_without_something_to_read(
    secure_broker, command: list[str], events_first: bool
) -> None:
    """The gateway may not read the events topic: said at once, not "all 0 match" nor a traceback."""
    if events_first:
        produce(
            secure_broker.bootstrap,
            EVENTS_TOPIC,
            make_trace(1, 3, prefix="refused"),
            security=secure_broker.security("gateway"),
        )
    done = subprocess.run(
        ["bash", "-c", 'set -a; . "$0"; exec "$@"', secrets(secure_broker) / "gateway.env", *LOOPWARDEN, *command],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines() == [
        f"loopwarden: note: {ROLLING_OFF}",  # no --config
        f"loopwarden: not authorized to read topic {EVENTS_TOPIC}: the ACLs of user gateway do not allow it",
    ]


def _as(broker, role: str, *command: str) -> subprocess.CompletedProcess[str]:
    """`loopwarden COMMAND` with nothing but `secrets/ROLE.env` for its connection."""
    return subprocess.run(
        ["bash", "-c", 'set -a; . "$0"; exec "$@"', secrets(broker) / f"{role}.env", *LOOPWARDEN, *command],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_the_auditor_reads_for_audit_explain_and_the_dashboard_and_does_nothing_else(secure_broker) -> None:
    """auditor.env is all audit, explain and the dashboard's reads need; the
    auditor cannot write a topic, read the dead letters or the worker's
    changelog, or use a consumer group."""
    trace = make_trace(1, 3, prefix="audited")
    run = json.loads(trace[0])["run_id"]
    produce(secure_broker.bootstrap, EVENTS_TOPIC, trace, security=secure_broker.security("gateway"))
    explained = _as(secure_broker, "auditor", "explain", run)
    assert explained.returncode == 0 and explained.stdout.startswith(f"run {run}: {len(trace)} events"), (
        explained.stderr
    )
    audited = _as(secure_broker, "auditor", "audit", "--from-beginning", "--run", run, "--wait", "0s")
    assert "not authorized" not in audited.stderr, audited.stderr
    for topic in (DECISIONS_TOPIC, INCIDENTS_TOPIC):
        _read(secure_broker, "auditor", topic)  # allowed: returns
    for topic in (EVENTS_TOPIC, DECISIONS_TOPIC, INCIDENTS_TOPIC):
        with pytest.raises(TopicAuthorizationFailedError, match=topic):
            _send(secure_broker, "auditor", topic)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = secrets(secure_broker) / "auditor.env"
    dashboard = subprocess.Popen(
        ["bash", "-c", 'set -a; . "$0"; exec "$@"', env, *LOOPWARDEN, "dashboard", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        for line in dashboard.stderr:  # serving once the page listens
            if "event=serving" in line:
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/explain?run={run}", timeout=60) as answer:
            assert answer.read().decode().startswith(f"run {run}: {len(trace)} events")
    finally:
        dashboard.terminate()
        dashboard.wait(30)
    assert "not authorized" not in dashboard.stderr.read()
    consumer = kafka_clients.consumer(secure_broker.bootstrap, security=secure_broker.security("auditor"))
    try:
        with pytest.raises(TopicAuthorizationFailedError, match=DEADLETTER_TOPIC):  # not even described
            consumer.beginning_offsets([TopicPartition(DEADLETTER_TOPIC, 0)])
    finally:
        consumer.close()
    for group in (secure.APP_ID, FLEET_APP_ID, f"{secure.GATEWAY_GROUP_PREFIX}x", "auditor"):
        with pytest.raises(GroupAuthorizationFailedError):
            _read(secure_broker, "auditor", DECISIONS_TOPIC, group=group, join=True)


def test_the_worker_cannot_forge_events(secure_broker) -> None:
    with pytest.raises(TopicAuthorizationFailedError, match=EVENTS_TOPIC):
        _send(secure_broker, "worker", EVENTS_TOPIC)


def test_the_acls_are_the_roles_and_nothing_else(secure_broker) -> None:
    """What the broker enforces is exactly the set in streams/tools/secure.py."""
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType
    from kafka.admin import ResourcePatternFilter, ResourceType

    admin = kafka_clients.admin(secure_broker.bootstrap, security=secure_broker.security("admin"))
    try:
        every = ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY)
        acls, error = admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY, every))
    finally:
        admin.close()
    assert error.errno == 0
    assert set(acls) == set(secure.role_acls())
    assert {acl.principal for acl in acls} == {"User:gateway", "User:worker", "User:auditor"}
    audited = {(a.resource_pattern.resource_name, a.operation) for a in acls if a.principal == "User:auditor"}
    assert audited == {(topic, ACLOperation.READ) for topic in (EVENTS_TOPIC, DECISIONS_TOPIC, INCIDENTS_TOPIC)}
    assert all(acl.permission_type == ACLPermissionType.ALLOW and acl.host == "*" for acl in acls)


def test_a_password_file_it_did_not_write_is_never_adopted(tmp_path: Path, kafka_lib) -> None:
    """A password file planted before the first start would set that user's
    password: the set-up refuses it; files it finds too open are made owner-only."""
    from streams.tools.broker import LocalBroker

    folder = tmp_path / "kafka" / "secrets"
    folder.mkdir(parents=True)
    (folder / "admin.password").write_text("chosen-by-someone-else\n")
    with pytest.raises(secure.SecureSetupError, match=r"admin.password was not written by this set-up"):
        LocalBroker(data_dir=tmp_path / "kafka", lib_dir=kafka_lib, secure=True).start()
    (folder / "admin.password").unlink()
    secure.make_secrets(tmp_path / "kafka")
    (folder / "worker.password").chmod(0o644)
    folder.chmod(0o755)
    secure.make_secrets(tmp_path / "kafka")  # its own files: kept, and their modes fixed
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "worker.password").stat().st_mode) == 0o600
    assert stat.S_IMODE((folder / "ca.pem").stat().st_mode) == 0o644
    (folder / "worker.password").write_text("changed\n")
    with pytest.raises(secure.SecureSetupError, match=r"worker.password was not written by this set-up"):
        secure.make_secrets(tmp_path / "kafka")


def test_the_broker_data_dir_is_the_owners_only(secure_broker) -> None:
    for folder in (secure_broker.data_dir, secure_broker.data_dir / "logs", secrets(secure_broker)):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
