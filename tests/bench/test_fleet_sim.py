"""bench/fleet_sim.py end to end on a small fleet: ten gateways, each reading
only its reply partition, through two real workers on the session's broker.
Every call gets its verdict, the verdicts read are replay's, and every figure
of the report is there. (Times are never asserted: they belong to the machine.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import fleet_sim
from streams.tools.broker import KRAFT_DIR

pytestmark = pytest.mark.integration


def test_a_small_fleet_gets_every_verdict_and_they_are_replays(broker, tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    log_dir = broker.log_file.parents[1] / KRAFT_DIR
    argv = ["--bootstrap", broker.bootstrap, "--log-dir", str(log_dir), "--gateways", "10", "--processes", "1"]
    argv += ["--rate", "40", "--seconds", "8", "--timeout", "30", "--check", "--out", str(out)]
    assert fleet_sim.main(argv) == 0
    record = json.loads(out.read_text())
    (whole,) = record["windows"]
    assert whole["calls"] > 0 and whole["timeouts"] == 0
    check = record["check"]
    assert check["replay_verdicts"] >= whole["calls"]  # every call's verdict, and the aborts of results
    assert check["gateways_verdicts"] == check["replay_verdicts"] == record["verdicts"]
    assert check["missing"] == check["different"] == check["unexpected"] == 0
    assert record["publish_failed"] == 0 and record["late"] == 0
    for figure in ("p50_ms", "p99_ms", "max_ms"):
        assert 0 < whole[figure] < 30_000 and not math.isnan(whole[figure])
    assert len(whole["worker_cpu"]) == 2 and all(cores > 0 for cores in whole["worker_cpu"])
    assert record["gateway_sent_bytes"] > 0 and record["gateway_read_bytes"] > 0
    stored = record["log_bytes_by_topic"]
    assert stored[f"{record['names']['events']}"] > 0 and stored[f"{record['names']['decisions']}"] > 0
    assert record["broker_in_per_verdict"] > 0 and record["broker_out_per_verdict"] > 0
