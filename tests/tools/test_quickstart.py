"""`loopwarden up --demo`, the plaintext default and `--secure` (with the fleet
stage and the dashboard): the demo's verdicts all arrive, and they are
replay's (the summary `make up` prints)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
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
    assert "loopwarden up: starting the worker (log: ./data/worker.log)" in run.stderr  # beneath the current directory


def test_up_secure_with_a_dashboard_connects_as_the_roles_and_serves_the_demo(tmp_path: Path) -> None:
    """`up --secure --demo --dashboard`: the demo's verdicts arrive, the page (as the auditor)
    lists the demo's blocks and aborts, the fleet stage runs as the worker, and
    SIGTERM stops everything, the page first, the broker last."""
    bootstrap, port = f"127.0.0.1:{free_port()}", free_port()
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    argv = [*LOOPWARDEN, "up", "--config", str(CONFIG), "--demo", str(TRACE), "--secure", "--bootstrap", bootstrap]
    with open(out, "w") as stdout, open(err, "w") as stderr:
        up = subprocess.Popen([*argv, "--dashboard", str(port)], stdout=stdout, stderr=stderr, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while f"the demo is on http://127.0.0.1:{port}/" not in err.read_text():
            assert up.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.5)
        expected = {
            verdict["run_id"]
            for verdict in map(json.loads, reference(TRACE.read_bytes().splitlines(), CONFIG))
            if verdict["decision"] in ("block", "abort")
        }
        shown: set[str] = set()
        while shown != expected:
            assert time.monotonic() < deadline, (shown, expected)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/events", timeout=10) as feed:
                board = json.loads(feed.readline().removeprefix(b"data: "))
            shown = {latest["run_id"].split("@")[0] for latest in board["latest"]}
    finally:
        up.terminate()
        up.wait(120)
    run = subprocess.CompletedProcess(argv, up.returncode, out.read_text(), err.read_text())
    _check_demo(run)
    assert "starting a secure local one (TLS, SASL/SCRAM, ACLs)" in run.stderr
    stops = [line for line in run.stderr.splitlines() if "stopping the" in line]
    assert stops == [
        f"loopwarden up: stopping the {name}"
        for name in ("dashboard", "fleet stage", "worker", "broker this command started")
    ]
    logs = tmp_path / "data"
    assert "security=SASL_SSL sasl_user=worker" in (logs / "worker.log").read_text()
    assert "security=SASL_SSL sasl_user=worker" in (logs / "fleet-stage.log").read_text()
    assert "security=SASL_SSL sasl_user=auditor" in (logs / "dashboard.log").read_text()
    assert (logs / "kafka" / "secrets" / "gateway.env").exists()


def test_up_names_a_taken_dashboard_port_before_starting_anything(broker, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            [*LOOPWARDEN, "up", "--bootstrap", broker.bootstrap, "--dashboard", str(port)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=240,
        )
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[-1] == f"loopwarden up: cannot listen on 127.0.0.1:{port}: address already in use"
    assert "starting" not in run.stderr and "stopping" not in run.stderr
    assert not (tmp_path / "data").exists()  # no worker, no stage, no page: nothing was started
