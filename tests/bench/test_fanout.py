"""bench/fanout.py end to end on a small fleet through a real worker: with
reply partitions the gateways read what the worker produced once, without
them once per gateway. (Times are never asserted: they belong to the machine.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fanout

pytestmark = pytest.mark.integration


def test_reply_partitions_end_the_fan_out(broker, tmp_path: Path) -> None:
    out = tmp_path / "fanout.json"
    argv = ["--bootstrap", broker.bootstrap, "--clients", "3", "--runs", "1", "--calls", "3"]
    assert fanout.main([*argv, "--decisions-partitions", "4", "--out", str(out)]) == 0
    rows = {row["mode"]: row for row in json.loads(out.read_text())["results"]}
    for row in rows.values():
        assert row["verdicts"] == 9 and row["fallbacks"] == 0 and row["produced_bytes"] > 0
    assert rows["whole_topic"]["read_bytes"] == 3 * rows["whole_topic"]["produced_bytes"]
    assert rows["reply_partition"]["read_bytes"] == rows["reply_partition"]["produced_bytes"]
