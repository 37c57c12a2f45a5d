"""The fleet stage and the dashboard on the secure broker (docs/SECURITY.md):
the stage as the worker role, started from `secrets/worker.env` alone,
publishes over SASL_SSL what `loopwarden incidents` prints; the dashboard, as
the operator (`secrets/admin.env`), serves those incidents; started with
settings the broker refuses, or a user whose ACLs do not cover it, each
stops at start-up naming why."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from builders import run_cli
from helpers import LOOPWARDEN, REPO, FleetStage, dedupe_key, env_file, incidents_until, produce
from schemas.codec import decode_incident
from schemas.topics import DECISIONS_TOPIC, INCIDENTS_TOPIC
from streams.fleet.settings import FLEET_APP_ID
from streams.tools import secure
from streams.tools.broker import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet-trace.jsonl"
CONFIG = ROOT / "examples" / "loopwarden.json5"

#: The names the worker role's ACLs are written for: FleetStage's app id is `<app_id>-fleet`.
DEFAULT_NAMES = {"app_id": secure.APP_ID, "decisions": DECISIONS_TOPIC, "incidents": INCIDENTS_TOPIC}


def _env(broker, role: str) -> dict[str, str]:
    return env_file(broker.data_dir / "secrets" / f"{role}.env")


def test_the_stage_as_the_worker_publishes_the_offline_incidents_and_the_dashboard_serves_them(
    secure_broker, tmp_path: Path
) -> None:
    """The trace's verdicts (replay's, which a worker publishes) go to the
    decision topic on one partition, so the stage sees them in the order they
    were decided (docs/FLEET.md). Other tests on this broker publish verdicts
    too: the trace's fingerprints are compared."""
    offline = run_cli("--config", str(CONFIG), str(FLEET), command="incidents")
    assert offline.returncode == 0, offline.stderr
    expected = offline.stdout.splitlines()
    mine = {decode_incident(line).fingerprint for line in expected}
    verdicts = run_cli("--config", str(CONFIG), str(FLEET)).stdout.splitlines()
    worker = secure_broker.security("worker")
    produce(secure_broker.bootstrap, DECISIONS_TOPIC, verdicts, keys=[b"fleet-trace"] * len(verdicts), security=worker)
    worker_env = _env(secure_broker, "worker")
    password = Path(worker_env["LOOPWARDEN_SASL_PASSWORD_FILE"]).read_text().strip()

    with FleetStage(secure_broker.bootstrap, DEFAULT_NAMES, tmp_path, "fleet", env=worker_env) as stage:
        wanted = {dedupe_key(line) for line in expected}
        records = incidents_until(secure_broker.bootstrap, INCIDENTS_TOPIC, wanted, 120, security=worker)
    got = {record for record in records if decode_incident(record).fingerprint in mine}
    assert sorted(got) == sorted(expected), stage.log()[-4000:]
    log = stage.log()
    assert "security=SASL_SSL sasl_user=worker" in log
    assert stage.lines("starting")[0]["app_id"] == FLEET_APP_ID  # the group the worker role may join
    assert password not in log

    final = {(i.fingerprint, i.window_start): i.runs for i in map(decode_incident, expected)}
    port = free_port()
    dashboard = subprocess.Popen(
        [*LOOPWARDEN, "dashboard", "--port", str(port), "--from", "earliest", "--config", str(CONFIG)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, **_env(secure_broker, "admin")},
    )
    try:
        shown = _incidents_shown(port, mine, final)
    finally:
        dashboard.terminate()
        _, stderr = dashboard.communicate(timeout=30)
    assert shown == final, stderr.decode()[-3000:]


def _incidents_shown(port: int, fingerprints: set[str], final: dict, timeout: float = 60.0) -> dict:
    """The dashboard's incidents of these fingerprints, from its live feed,
    once they are the final ones (or at the timeout)."""
    deadline = time.monotonic() + timeout
    shown: dict = {}
    while time.monotonic() < deadline:
        try:
            feed = urllib.request.urlopen(f"http://127.0.0.1:{port}/events", timeout=10)
        except urllib.error.URLError:  # still starting
            time.sleep(0.3)
            continue
        with feed:
            for line in feed:
                if line.startswith(b"data: "):
                    incidents = json.loads(line[len(b"data: ") :])["incidents"]
                    shown = {
                        (i["fingerprint"], i["window_start"]): i["runs"]
                        for i in incidents
                        if i["fingerprint"] in fingerprints
                    }
                if shown == final or time.monotonic() >= deadline:
                    return shown
    return shown


def test_a_stage_as_the_gateway_stops_naming_the_topic_it_may_not_describe(secure_broker, tmp_path: Path) -> None:
    with FleetStage(
        secure_broker.bootstrap, DEFAULT_NAMES, tmp_path, "fleet", env=_env(secure_broker, "gateway")
    ) as stage:
        assert stage.proc.wait(60) == 1
    (failed,) = stage.lines("startup_failed")
    assert failed["msg"] == (
        f"not authorized to describe topic {FLEET_APP_ID}-fingerprint-repartition: "
        "the ACLs of user gateway do not allow it"
    )
    assert stage.lines("starting") == []


def test_a_stage_refused_its_group_stops_naming_it(secure_broker, tmp_path: Path) -> None:
    """The worker role may use the group `loopwarden-fleet` only: under
    another app id the stage stops at start-up naming the group, instead of
    running and publishing nothing."""
    with FleetStage(
        secure_broker.bootstrap, DEFAULT_NAMES, tmp_path, "not-granted", env=_env(secure_broker, "worker")
    ) as stage:
        assert stage.proc is not None and stage.proc.wait(60) == 2
    (failed,) = stage.lines("startup_failed")
    assert failed["msg"] == (
        f"not authorized to use consumer group {secure.APP_ID}-not-granted: the ACLs of user worker do not allow it"
    )
    assert stage.lines("starting") == [] and not stage.data_dir.exists()


@pytest.mark.parametrize("command", ["fleet", "dashboard"])
def test_a_plaintext_client_of_the_tls_listener_is_refused_at_start_up(secure_broker, tmp_path, command) -> None:
    """Named before anything else is made: no topic, no data dir, no page."""
    data_dir = tmp_path / "data"
    options = ["--data-dir", str(data_dir)] if command == "fleet" else ["--port", str(free_port())]
    done = run_cli("--bootstrap", secure_broker.bootstrap, *options, command=command)
    assert done.returncode == 2, done.stderr
    assert b"closed the connection" in done.stderr and b"does its listener require TLS?" in done.stderr
    assert not data_dir.exists()
