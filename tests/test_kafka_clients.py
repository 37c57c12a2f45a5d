"""Every Kafka client, the worker's, the tools', the benchmarks' and the
tests', is made by streams/kafka_clients.py, so that how clients reach and
authenticate to the brokers is configured in one place; and the security
settings it applies are checked at start-up, named when wrong, and never show
the password."""

from __future__ import annotations

import ast
import asyncio
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from kafka import TopicPartition

from streams import kafka_clients
from streams.kafka_clients import SecurityError, security_from

ROOT = Path(__file__).resolve().parents[1]
CLIENT_CLASSES = {
    "KafkaProducer",
    "KafkaConsumer",
    "KafkaAdminClient",
    "AIOKafkaProducer",
    "AIOKafkaConsumer",
    "AIOKafkaAdminClient",
    "App",
}
#: The factory's connection settings, spread into a client it has no function for.
CONNECTIONS = ("kafka_clients.connection", "kafka_clients.faust_connection")


def made_outside_the_factory() -> list[str]:
    found = []
    paths = sorted(path for folder in ("streams", "bench", "tests") for path in (ROOT / folder).rglob("*.py"))
    for path in paths:
        if path == ROOT / "streams" / "kafka_clients.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name not in CLIENT_CLASSES:
                continue
            # A Faust app (or a client without a factory function) takes its
            # broker settings from the factory.
            if any(kw.arg is None and ast.unparse(kw.value).startswith(CONNECTIONS) for kw in node.keywords):
                continue
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(...)")
    return found


def test_no_kafka_client_is_made_outside_the_factory():
    assert made_outside_the_factory() == []


def test_options_are_the_clients_own_and_the_connection_is_shared():
    assert kafka_clients.connection("h:1") == {"bootstrap_servers": "h:1"}
    assert kafka_clients.faust_connection(" a:1, b:2 ,") == {"broker": "kafka://a:1,kafka://b:2"}


# -- security settings ---------------------------------------------------------

PASSWORD = "s3cret-Pa55word-that-must-not-leak"


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    """A CA, a client certificate and key signed by it, a password file."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test CA")
    openssl("req", "-new", *ec, "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=gateway")
    openssl(
        "x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-out", "client.pem", "-days", "1"
    )
    (tmp_path / "password").write_text(PASSWORD + "\n")
    files = {"ca": "ca.pem", "ca_key": "ca.key", "client_cert": "client.pem", "client_key": "client.key"}
    return {key: str(tmp_path / name) for key, name in {**files, "password": "password"}.items()}


def sasl_ssl(pki: dict[str, str], **changes: str) -> dict[str, str]:
    return {
        "LOOPWARDEN_SECURITY_PROTOCOL": "SASL_SSL",
        "LOOPWARDEN_SASL_USERNAME": "gateway",
        "LOOPWARDEN_SASL_PASSWORD_FILE": pki["password"],
        "LOOPWARDEN_SSL_CAFILE": pki["ca"],
        **changes,
    }


def test_plaintext_is_the_default_and_changes_nothing():
    assert security_from(environ={}) == kafka_clients.PLAINTEXT
    assert kafka_clients.connection("h:1", kafka_clients.PLAINTEXT) == {"bootstrap_servers": "h:1"}
    assert kafka_clients.faust_connection("h:1", security=kafka_clients.PLAINTEXT) == {"broker": "kafka://h:1"}


def test_sasl_ssl_reaches_kafka_python_aiokafka_and_faust(pki):
    security = security_from(environ=sasl_ssl(pki))
    assert security.sasl_mechanism == "SCRAM-SHA-512"  # the default mechanism
    settings = kafka_clients.connection("h:1", security)
    context = settings.pop("ssl_context")
    assert settings == {
        "bootstrap_servers": "h:1",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "gateway",
        "sasl_plain_password": PASSWORD,
    }
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    # Faust hands its broker_credentials to every aiokafka client it makes, through this function.
    credentials = kafka_clients.faust_connection("h:1,h:2", "loopwarden", security)
    assert credentials["broker"] == "loopwarden://h:1,loopwarden://h:2"
    auth = credentials_to_aiokafka_auth(credentials["broker_credentials"])
    assert {k: v for k, v in auth.items() if k != "ssl_context"} == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "gateway",
        "sasl_plain_password": PASSWORD,
    }
    assert auth["ssl_context"].verify_mode == ssl.CERT_REQUIRED


def test_mutual_tls_and_sasl_plaintext(pki):
    mtls = security_from(
        environ={
            "LOOPWARDEN_SECURITY_PROTOCOL": "SSL",
            "LOOPWARDEN_SSL_CAFILE": pki["ca"],
            "LOOPWARDEN_SSL_CERTFILE": pki["client_cert"],
            "LOOPWARDEN_SSL_KEYFILE": pki["client_key"],
        }
    )
    assert kafka_clients.connection("h:1", mtls)["security_protocol"] == "SSL"
    auth = credentials_to_aiokafka_auth(kafka_clients.faust_connection("h:1", security=mtls)["broker_credentials"])
    assert auth["security_protocol"] == "SSL" and isinstance(auth["ssl_context"], ssl.SSLContext)
    plain = security_from(
        environ={
            "LOOPWARDEN_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "LOOPWARDEN_SASL_MECHANISM": "scram-sha-256",
            "LOOPWARDEN_SASL_USERNAME": "worker",
            "LOOPWARDEN_SASL_PASSWORD_FILE": pki["password"],
        }
    )
    settings = kafka_clients.connection("h:1", plain)
    assert settings["sasl_mechanism"] == "SCRAM-SHA-256" and "ssl_context" not in settings
    auth = credentials_to_aiokafka_auth(kafka_clients.faust_connection("h:1", security=plain)["broker_credentials"])
    assert auth["security_protocol"] == "SASL_PLAINTEXT" and auth["ssl_context"] is None


def test_a_flag_wins_over_its_variable(pki):
    security = security_from({"sasl_username": "worker"}, sasl_ssl(pki))
    assert security.sasl_username == "worker"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"LOOPWARDEN_SECURITY_PROTOCOL": "TLS"},
            "LOOPWARDEN_SECURITY_PROTOCOL (--security-protocol): expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, "
            "SASL_SSL, got 'TLS'",
        ),
        (
            {"LOOPWARDEN_SASL_MECHANISM": "GSSAPI"},
            "LOOPWARDEN_SASL_MECHANISM (--sasl-mechanism): expected one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN, "
            "got 'GSSAPI'",
        ),
        ({"LOOPWARDEN_SASL_USERNAME": ""}, "LOOPWARDEN_SASL_USERNAME (--sasl-username) is required with SASL_SSL"),
        (
            {"LOOPWARDEN_SASL_PASSWORD_FILE": ""},
            "LOOPWARDEN_SASL_PASSWORD_FILE (--sasl-password-file) is required with SASL_SSL",
        ),
        (
            {"LOOPWARDEN_SASL_PASSWORD_FILE": "/nonexistent/password"},
            "LOOPWARDEN_SASL_PASSWORD_FILE (--sasl-password-file): cannot read /nonexistent/password: "
            "No such file or directory",
        ),
        (
            {"LOOPWARDEN_SSL_CAFILE": "/nonexistent/ca.pem"},
            "LOOPWARDEN_SSL_CAFILE (--ssl-cafile): cannot read /nonexistent/ca.pem: No such file or directory",
        ),
        (
            {"LOOPWARDEN_SECURITY_PROTOCOL": "SSL"},
            "LOOPWARDEN_SASL_USERNAME (--sasl-username) is set, but LOOPWARDEN_SECURITY_PROTOCOL "
            "(--security-protocol) is SSL, not SASL_PLAINTEXT or SASL_SSL",
        ),
        (
            {"LOOPWARDEN_SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
            "LOOPWARDEN_SSL_CAFILE (--ssl-cafile) is set, but LOOPWARDEN_SECURITY_PROTOCOL (--security-protocol) "
            "is SASL_PLAINTEXT, not SSL or SASL_SSL",
        ),
        (
            {"LOOPWARDEN_SSL_KEYFILE": "{client_key}"},
            "LOOPWARDEN_SSL_KEYFILE (--ssl-keyfile) is set without LOOPWARDEN_SSL_CERTFILE (--ssl-certfile)",
        ),
        ({"LOOPWARDEN_SSL_CAFILE": "{password}"}, "LOOPWARDEN_SSL_CAFILE (--ssl-cafile): not a usable PEM file"),
        (
            {"LOOPWARDEN_SSL_CERTFILE": "{client_cert}", "LOOPWARDEN_SSL_KEYFILE": "{ca_key}"},
            "LOOPWARDEN_SSL_CERTFILE (--ssl-certfile): not a usable PEM file",
        ),
    ],
)
def test_a_wrong_setting_is_named(pki, changes, message):
    environ = {key: value.format(**pki) for key, value in sasl_ssl(pki, **changes).items()}
    with pytest.raises(SecurityError) as refused:
        security_from(environ=environ)
    assert str(refused.value).startswith(message)


def test_an_empty_password_file_is_refused(pki, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SecurityError, match=r"--sasl-password-file\): .*empty is empty"):
        security_from(environ=sasl_ssl(pki, LOOPWARDEN_SASL_PASSWORD_FILE=str(empty)))


def test_the_password_never_shows(pki):
    """Not in the settings' repr or str, not in the flags or variables handed
    to a child process, not in Faust's credentials' repr, not in --help."""
    security = security_from(environ=sasl_ssl(pki))
    assert security.sasl_password is not None and security.sasl_password.reveal() == PASSWORD
    shown = [repr(security), str(security), " ".join(security.argv()), repr(security.env())]
    shown.append(repr(kafka_clients.faust_connection("h:1", security=security)["broker_credentials"]))
    from streams.worker.settings import Settings, worker_argv

    shown.append(" ".join(worker_argv(Settings(security=security))))
    shown.append(repr(Settings(security=security)))
    assert all(PASSWORD not in text for text in shown)
    assert "--sasl-password-file" in shown[2] and pki["password"] in shown[2]
    helped = subprocess.run(
        [sys.executable, "-m", "streams.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        env={**sasl_ssl(pki), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert helped.returncode == 0
    assert "$LOOPWARDEN_SASL_PASSWORD_FILE" in helped.stdout
    assert PASSWORD not in helped.stdout and pki["password"] not in helped.stdout


def test_a_bad_setting_stops_a_command_with_exit_2(pki):
    run = subprocess.run(
        [sys.executable, "-m", "streams.cli", "tail"],
        capture_output=True,
        text=True,
        env={**sasl_ssl(pki, LOOPWARDEN_SASL_MECHANISM="MD5"), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("loopwarden: security settings: LOOPWARDEN_SASL_MECHANISM (--sasl-mechanism)")


def test_a_client_error_reads_as_one_phrase() -> None:
    from kafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

    assert kafka_clients.describe_error(TopicAuthorizationFailedError("loopwarden.decisions")) == (
        "TopicAuthorizationFailedError: loopwarden.decisions"
    )
    assert kafka_clients.describe_error(KafkaTimeoutError("Failed to update metadata after 60.0 secs.")) == (
        "KafkaTimeoutError: Failed to update metadata after 60.0 secs."
    )
    assert kafka_clients.describe_error(TopicAuthorizationFailedError()) == "TopicAuthorizationFailedError"


# -- delivery ------------------------------------------------------------------


def active_producers(bootstrap: str, topic: str, partition: int) -> list[int]:
    """Producer ids the partition's leader tracks: an idempotent producer's
    batches carry one, which the broker checks their sequence against; others' carry none."""
    with kafka_clients.admin(bootstrap) as admin:
        states = admin.describe_producers([TopicPartition(topic, partition)])
    return [state.producer_id for state in states[TopicPartition(topic, partition)].active_producers]


@pytest.mark.integration
def test_every_producer_made_here_is_idempotent_with_acks_all(broker) -> None:
    topic = f"delivery-{uuid.uuid4().hex[:8]}"
    with kafka_clients.admin(broker.bootstrap) as admin:
        admin.create_topics({topic: {"num_partitions": 3, "replication_factor": 1}})
        admin.wait_for_topics([topic])

    plain = kafka_clients.producer(broker.bootstrap)
    opted_out = kafka_clients.producer(broker.bootstrap, acks=1, enable_idempotence=False)
    try:
        assert plain.config["acks"] == -1 and plain.config["enable_idempotence"]
        plain.send(topic, b"kafka-python", partition=0).get(timeout=30)
        opted_out.send(topic, b"opted out", partition=2).get(timeout=30)
    finally:
        plain.close()
        opted_out.close()

    async def aio_send() -> None:
        producer = kafka_clients.aio_producer(broker.bootstrap)
        await producer.start()
        try:
            assert producer._sender._acks == -1
            await producer.send_and_wait(topic, b"aiokafka", partition=1)
        finally:
            await producer.stop()

    asyncio.run(aio_send())
    assert [len(active_producers(broker.bootstrap, topic, p)) for p in (0, 1, 2)] == [1, 1, 0]
    assert all(pid >= 0 for p in (0, 1) for pid in active_producers(broker.bootstrap, topic, p))
