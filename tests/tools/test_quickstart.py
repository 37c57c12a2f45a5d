"""`loopwarden up --demo`, the plaintext default and `--secure`: the demo's
verdicts all arrive, and they are replay's (the summary `make up` prints)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import LOOPWARDEN, REPO, reference
from streams.tools.broker import free_port

pytestmark = pytest.mark.integration

CONFIG = REPO / "examples" / "loopwarden.json5"
TRACE = REPO / "examples" / "sample-trace.jsonl"


def _up(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LOOPWARDEN, "up", "--config", str(CONFIG), "--demo", str(TRACE), *options],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # ./data/kafka and ./data/worker land here
        timeout=240,
    )


def _check_demo(run: subprocess.CompletedProcess[str]) -> None:
    assert run.returncode == 0, run.stderr
    expected = reference(TRACE.read_bytes().splitlines(), CONFIG)
    got = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(got) == len(expected)
    assert sorted((v["run_id"].split("@")[0], v["seq"], v["decision"]) for v in got) == sorted(
        (v["run_id"], v["seq"], v["decision"]) for v in map(json.loads, expected)
    )
    assert f"all {len(expected)} verdicts arrived" in run.stderr


def test_up_plaintext_default_is_unchanged(broker, tmp_path: Path) -> None:
    run = _up(tmp_path, "--bootstrap", broker.bootstrap)
    _check_demo(run)
    assert f"using the Kafka broker at {broker.bootstrap}" in run.stderr


def test_up_secure_starts_a_secure_broker_and_connects_as_the_roles(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    run = _up(tmp_path, "--secure", "--bootstrap", bootstrap)
    _check_demo(run)
    assert "starting a secure local one (TLS, SASL/SCRAM, ACLs)" in run.stderr
    assert "stopping the broker this command started" in run.stderr
    worker_log = (tmp_path / "data" / "worker.log").read_text()
    assert "security=SASL_SSL sasl_user=worker" in worker_log
    assert (tmp_path / "data" / "kafka" / "secrets" / "gateway.env").exists()
