"""The engine bench runs end to end on a small trace and its record is
self-consistent: every stage measured, the baseline's scale applied to the
goals. Rates themselves are never asserted (they belong to the machine)."""

from __future__ import annotations

import json
import statistics

import pytest

from bench import engine_bench

EVENTS = 1500


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "engine.json"
    argv = ["--runs", "40", "--events", str(EVENTS), "--repeat", "3", "--latency-repeat", "1", "--out", str(out)]
    assert engine_bench.main(argv) == 0
    return json.loads(out.read_text())


def test_every_stage_of_both_variants_is_measured(record: dict) -> None:
    assert record["check"]["identical"] is True
    for variant in ("precomputed", "raw"):
        assert set(record["results"][variant]) == set(engine_bench.STAGES)
        for entry in record["results"][variant].values():
            assert entry["events"] == EVENTS
            assert len(entry["cpu_seconds"]) == 3


@pytest.mark.parametrize("variant", ["precomputed", "raw"])
def test_goals_are_scaled_by_the_baseline_pass_beside_each_pass(record: dict, variant: str) -> None:
    entries = record["results"][variant]
    goal = engine_bench.GOALS[variant]
    base = [EVENTS / c for c in entries["msgspec"]["cpu_seconds"]]
    for stage in ("apply", "decode+apply", "replay"):
        entry = entries[stage]
        ratios = [
            (EVENTS / c) * engine_bench.BASELINE_AT_GOALS / (goal * b)
            for c, b in zip(entry["cpu_seconds"], base, strict=True)
        ]
        assert entry["scaled_goal_ratio"] == pytest.approx(statistics.median(ratios))
        assert entry["scaled_goal"] == pytest.approx(goal * statistics.median(base) / engine_bench.BASELINE_AT_GOALS)
    assert "scaled_goal" not in entries["decode"]


def test_goal_text_states_both_ratios() -> None:
    entry = {"events_per_cpu_s_median": 120_000.0, "scaled_goal": 60_000.0, "scaled_goal_ratio": 1.9}
    assert engine_bench.goal_text("raw", "decode+apply", entry) == "0.80x of 150,000/s; 1.90x of 60,000/s"
    del entry["scaled_goal"]
    assert engine_bench.goal_text("raw", "decode+apply", entry) == "0.80x of 150,000/s"
    assert engine_bench.goal_text("raw", "msgspec", entry) == ""


def test_without_the_raw_trace_there_is_no_baseline(tmp_path) -> None:
    out = tmp_path / "engine.json"
    argv = ["--variants", "precomputed", "--runs", "20", "--events", "300", "--repeat", "1", "--latency-repeat", "1"]
    assert engine_bench.main([*argv, "--out", str(out)]) == 0
    entries = json.loads(out.read_text())["results"]["precomputed"]
    assert "msgspec" not in entries and "scaled_goal" not in entries["apply"]
