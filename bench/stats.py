"""The one percentile every benchmark here reports, so that a p99 means the
same in every table of bench/README.md."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 ≤ q ≤ 1) of ``values``: the value with ⌊q·n⌋ of the
    n values ordered before it (the largest for q = 1), so that the calls at or
    above the p99 of 100 are the slowest one; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])
