"""The latency benchmark's arithmetic: stages from the three clocks, the
tail taken among the slowest calls, worker options and environment of a
variant, the cores given to the sides. The figures themselves belong to the machine and are never asserted."""

from __future__ import annotations

import argparse
import os

import pytest

from bench.pipeline.common import cpu_set
from bench.pipeline.latency import Sample, Trace, breakdown, pin_outside_sides, variant


def sample(i: int, latency: float) -> Sample:
    # published at 100 s; the broker appends the call 1 ms later and the
    # verdict `latency` - 3 ms after publish; the client sees it 2 ms after that
    return Sample("r", i, 100.0, 100.001, 100.0 + latency - 0.002, 100.0 + latency, latency)


def test_broker_stages_add_up_and_the_tail_is_the_slowest_percent() -> None:
    samples = [sample(i, 0.010) for i in range(99)] + [sample(99, 0.200)]
    stages = breakdown(samples, {})
    assert set(stages) == {"publish→in", "in→out", "out→seen"}
    assert stages["publish→in"]["p50"] == pytest.approx(1.0)
    assert stages["in→out"]["p50"] == pytest.approx(7.0)
    assert stages["out→seen"]["p50"] == pytest.approx(2.0)
    assert stages["in→out"]["tail"] == pytest.approx(197.0)  # only the 200 ms call is at or above the p99
    assert stages["in→out"]["n"] == 100


def test_worker_stages_come_from_its_clocks_when_it_traced_the_calls() -> None:
    samples = [sample(i, 0.020) for i in range(10)]
    traces = {("r", i): Trace("r", i, 100.0, 100.0035, 100.004, 100.005, 100.006, 100.016) for i in range(5)}
    stages = breakdown(samples, traces)
    assert stages["publish→fetched"]["n"] == 5  # calls the worker did not trace are left out
    assert stages["publish→fetched"]["p50"] == pytest.approx(4.0)
    assert stages["  in→polled"]["p50"] + stages["  polled→fetched"]["p50"] == pytest.approx(3.0)
    assert stages["  polled→fetched"]["p50"] == pytest.approx(0.5)
    assert stages["fetched→sent"]["p50"] == pytest.approx(2.0)
    assert stages["  fetched→taken"]["p50"] == pytest.approx(1.0)
    assert stages["sent→acked"]["p50"] == pytest.approx(10.0)
    assert stages["acked→seen"]["p50"] == pytest.approx(4.0)
    assert stages["  sent→out"]["p50"] + stages["  out→acked"]["p50"] == pytest.approx(10.0)


def test_a_variant_splits_worker_options_from_environment() -> None:
    assert variant("lin0=--linger 0 PYTHONHASHSEED=1") == ("lin0", ["--linger", "0"], {"PYTHONHASHSEED": "1"})
    with pytest.raises(SystemExit, match="LABEL=OPTIONS"):
        variant("--linger 0")
    with pytest.raises(SystemExit):
        variant("relay=--linger 0")


def test_side_cores_are_read_as_lists_and_ranges() -> None:
    assert cpu_set("1") == {1}
    assert cpu_set("0,2-3") == {0, 2, 3}


def test_side_cores_need_the_broker_and_leave_cores_for_it() -> None:
    def args(
        side_cpus: str, bootstrap: str | None = "localhost:9092", broker_pid: int | None = 1
    ) -> argparse.Namespace:
        return argparse.Namespace(side_cpus=side_cpus, bootstrap=bootstrap, broker_pid=broker_pid)

    assert pin_outside_sides(args("", None, None)) == set()
    with pytest.raises(SystemExit, match="needs --bootstrap and --broker-pid"):
        pin_outside_sides(args("1", broker_pid=None))
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    with pytest.raises(SystemExit, match="leaves no core"):
        pin_outside_sides(args(every))
