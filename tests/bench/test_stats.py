"""The benchmarks' one percentile: on any order, the slowest one of 100 at the p99, NaN for nothing."""

from __future__ import annotations

import math
import random

from bench.stats import percentile


def test_nearest_rank_of_an_unordered_sample() -> None:
    values = list(range(1, 101))
    random.Random(3).shuffle(values)
    assert (percentile(values, 0.0), percentile(values, 0.5), percentile(values, 0.99)) == (1.0, 51.0, 100.0)
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.5], 0.99) == 7.5


def test_no_sample_has_no_percentile() -> None:
    assert math.isnan(percentile([], 0.5))
