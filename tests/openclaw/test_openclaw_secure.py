"""The OpenClaw plugin over SASL_SSL on the secure broker (docs/SECURITY.md):
a real `openclaw agent --local` run whose plugin connects as the gateway role
(TLS with the broker's CA, SCRAM, its own consumer group under the gateway
prefix) against a real worker started from `worker.env`; and the plugin's
Kafka clients with a wrong password, refused with the broker's reason."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path

import pytest

from helpers import Worker, env_file
from openclaw_gateway import OpenClaw, gateway_home
from schemas.topics import DEADLETTER_TOPIC, DECISIONS_TOPIC, EVENTS_TOPIC
from scripted_model import ScriptedModel
from streams.tools import secure
from test_openclaw import executions, loop_on_exec, loopwarden_config, shown_results

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("secure_bus.mjs")
DEFAULT_NAMES = {
    "app_id": secure.APP_ID,
    "events": EVENTS_TOPIC,
    "decisions": DECISIONS_TOPIC,
    "deadletter": DEADLETTER_TOPIC,
}


def _plugin_security(broker, password_file: Path) -> dict[str, str]:
    return {
        "securityProtocol": "SASL_SSL",
        "saslUsername": "gateway",
        "saslPasswordFile": str(password_file),
        "sslCaFile": str(broker.data_dir / "secrets" / "ca.pem"),
    }


def test_a_looping_run_is_blocked_over_sasl_ssl(openclaw: OpenClaw, secure_broker, tmp_path: Path) -> None:
    folder = secure_broker.data_dir / "secrets"
    config = loopwarden_config(tmp_path, warningThreshold=3, criticalThreshold=5)
    counter = tmp_path / "executions.txt"
    env = env_file(folder / "worker.env")
    with (
        Worker(secure_broker.bootstrap, DEFAULT_NAMES, tmp_path, "worker", config=config, env=env) as worker,
        ScriptedModel(loop_on_exec(counter, stop_when="CRITICAL", after=1)) as model,
    ):
        worker.wait_assigned()
        plugin = {"bootstrap": secure_broker.bootstrap, **_plugin_security(secure_broker, folder / "gateway.password")}
        done = openclaw.run_agent(gateway_home(tmp_path, model.base_url, plugin), "Run the tests until they pass.")
        assert done.returncode == 0, done.stderr[-4000:]
        assert f"reading verdicts from {DECISIONS_TOPIC} at {secure_broker.bootstrap}" in done.stderr
    results = shown_results(model)
    assert executions(counter) == 5
    assert results[5].startswith("CRITICAL: exec was called 5 times with identical arguments and identical results")
    assert "WARNING: exec was called 3 times" in results[3]


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))


def test_the_plugin_with_a_wrong_password_is_refused(openclaw: OpenClaw, secure_broker, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    settings = {"bootstrap": secure_broker.bootstrap, **_plugin_security(secure_broker, wrong)}
    proc = subprocess.Popen(
        [openclaw.node, str(SCRIPT), json.dumps(settings)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, err), daemon=True).start()
    try:
        while "loopwarden: cannot read loopwarden.decisions" not in (line := err.get(timeout=60)):
            pass
    finally:
        proc.kill()
        proc.wait()
    assert line.endswith(f"{secure_broker.bootstrap}: SASL authentication failed.; retrying in 5s")
