"""The whole pipeline over SASL_SSL on the secure broker (docs/SECURITY.md):
the gateway client as the gateway role, a real `loopwarden worker` as the
worker role started from `secrets/worker.env` alone, through a restart, with
the ACLs on; the verdicts are replay's, and the worker's password is in
neither its log nor its metrics."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.errors import TopicAuthorizationFailedError

from helpers import LOOPWARDEN, REPO, Worker, env_file, keyed, reference, write_config
from schemas.codec import decode_verdict
from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC
from streams import kafka_clients
from schemas.verdicts import Verdict
from streams.client import ClientVerdict, GuardClient
from streams.tools import secure
from streams.tools.broker import free_port

pytestmark = pytest.mark.integration

#: The names the roles' ACLs are written for.
DEFAULT_NAMES = {
    "app_id": secure.APP_ID,
    "events": EVENTS_TOPIC,
    "decisions": DECISIONS_TOPIC,
    "deadletter": DEADLETTER_TOPIC,
}
CHANGELOG = f"{secure.APP_ID}-runs-changelog"


def _loop(client: GuardClient, run_id: str, calls: int) -> list:
    """An agent repeating one failing command: allows, a warning, blocks."""
    verdicts = []
    for _ in range(calls):
        call = client.tool_call(run_id, "exec", {"command": "make test"})
        verdict = client.check(call)
        verdicts.append(verdict)
        if verdict.allowed:
            client.tool_result(call, result={"content": [{"type": "text", "text": "FAIL"}]})
    return verdicts


def test_gateway_to_worker_over_sasl_ssl_matches_replay(secure_broker, tmp_path: Path) -> None:
    folder = secure_broker.data_dir / "secrets"
    config = write_config(tmp_path)
    worker_env = env_file(folder / "worker.env")
    gateway = kafka_clients.security_from(environ=env_file(folder / "gateway.env"))
    password = Path(worker_env["LOOPWARDEN_SASL_PASSWORD_FILE"]).read_text().strip()
    assert gateway.sasl_username == "gateway" and gateway.protocol == "SASL_SSL"

    web_port = free_port()

    def worker(name: str) -> Worker:
        return Worker(
            secure_broker.bootstrap,
            DEFAULT_NAMES,
            tmp_path,
            name,
            config=config,
            env=worker_env,
            extra=["--web-port", str(web_port)],
        )

    first = worker("secure").start()
    try:
        with GuardClient(secure_broker.bootstrap, security=gateway, timeout=60) as client:
            warmup = client.check(client.tool_call("secure-warmup", "read", {"path": "x"}))
            assert warmup.fallback is None, first.log()[-3000:]
            client.timeout = 15
            before = _loop(client, "secure-run", 4)
            with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=10) as page:
                metrics = page.read().decode()
            assert 'loopwarden_verdicts_total{decision="warn"' in metrics
            assert password not in metrics
            assert first.stop() == 0  # graceful: offsets committed as the worker's group, state kept
            again = worker("secure").start()  # the same data dir
            try:
                after = _loop(client, "secure-run", 4)
            finally:
                assert again.stop() == 0
    finally:
        first.stop(signal.SIGKILL)
    got = before + after
    assert all(v.fallback is None for v in got), again.log()[-3000:]
    # the loop, back after its block, ends the run (recovery, spec §8.3)
    assert [v.decision for v in got] == ["allow", "allow", "allow", "warn", "allow", "block", "abort", "abort"]
    admin = secure_broker.security("admin")  # neither role may read the events topic
    events = keyed(secure_broker.bootstrap, EVENTS_TOPIC, b"secure-run", security=admin)
    expected = reference([line + b"\n" for line in events], config)
    assert [decode_verdict(line) for line in expected] == [_wire(v) for v in got]
    audited = _audit(folder / "admin.env", config)
    assert audited.returncode == 0, audited.stderr
    assert f"OK: all {len(expected)} recomputed verdicts match what was published" in audited.stdout
    refused = _audit(folder / "gateway.env", config)
    assert refused.returncode == 2
    assert refused.stderr.endswith(
        "loopwarden: not authorized to read topic loopwarden.events: the ACLs of user gateway do not allow it\n"
    )

    log = first.log() + again.log()
    assert "security=SASL_SSL sasl_user=worker" in log
    assert password not in log

    # The worker made its changelog through its prefix ACL; the gateway may neither read nor write it.
    client = kafka_clients.admin(secure_broker.bootstrap, security=admin)
    try:
        assert CHANGELOG in client.list_topics()
    finally:
        client.close()
    with pytest.raises(TopicAuthorizationFailedError, match=CHANGELOG):
        producer = kafka_clients.producer(
            secure_broker.bootstrap, security=gateway, retries=0, enable_idempotence=False
        )
        try:
            producer.send(CHANGELOG, key=b"secure-run", value=b"forged state").get(timeout=30)
        finally:
            producer.close()
    consumer = kafka_clients.consumer(secure_broker.bootstrap, security=gateway, group_id=None)
    try:
        with pytest.raises(TopicAuthorizationFailedError, match=CHANGELOG):
            consumer.beginning_offsets([TopicPartition(CHANGELOG, 0)])
    finally:
        consumer.close()


def _audit(env: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """`set -a; . ENV; loopwarden audit` for the test's run."""
    return subprocess.run(
        ["bash", "-c", 'set -a; . "$0"; exec "$@"', str(env), *LOOPWARDEN, "audit", "--run", "secure-run"]
        + ["--config", str(config), "--wait", "1s"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def _wire(verdict: ClientVerdict) -> Verdict:
    """A client verdict's wire part (without the client's fallback fields)."""
    return Verdict(**{name: getattr(verdict, name) for name in Verdict.__struct_fields__})


def test_a_worker_refused_its_group_stops_naming_it(secure_broker, tmp_path: Path) -> None:
    """A consumer refused its group only retries, quietly: the worker checks
    its group at start-up and stops, naming it, before it stores anything."""
    names = {**DEFAULT_NAMES, "app_id": "loopwarden-not-granted"}
    env = env_file(secure_broker.data_dir / "secrets" / "worker.env")
    with Worker(secure_broker.bootstrap, names, tmp_path, "refused", config=None, env=env) as worker:
        assert worker.proc is not None and worker.proc.wait(60) == 2
    (failed,) = worker.lines("startup_failed")
    assert failed["msg"] == (
        "not authorized to use consumer group loopwarden-not-granted: the ACLs of user worker do not allow it"
    )
    assert worker.lines("starting") == [] and not worker.data_dir.exists()
