"""The fetch pacer: fetches are held while events stream in, never while they trickle or stop."""

from __future__ import annotations

from streams.worker.transport import FetchPacer


def feed(pacer: FetchPacer, per_second: int, seconds: float, start: float, step: float = 0.01) -> list[bool]:
    """Batches every ``step`` seconds at ``per_second``; the changes the pacer asked for."""
    changes = []
    ticks = round(seconds / step)
    for tick in range(1, ticks + 1):
        change = pacer.observe(round(per_second * step), start + tick * step)
        if change is not None:
            changes.append(change)
    return changes


def test_a_stream_of_two_or_more_events_per_hold_is_held() -> None:
    pacer = FetchPacer(hold=0.002)
    assert feed(pacer, 2000, 1.0, start=0.0) == [True]
    assert pacer.held


def test_a_trickle_is_never_held() -> None:
    pacer = FetchPacer(hold=0.002)
    assert feed(pacer, 500, 2.0, start=0.0) == []  # one event per hold: each fetch would come back nearly empty


def test_held_fetches_are_released_when_the_stream_stops_or_thins() -> None:
    pacer = FetchPacer(hold=0.002)
    feed(pacer, 2000, 1.0, start=0.0)
    assert feed(pacer, 700, 1.0, start=1.0) == []  # above one per hold: still held (no flapping at the edge)
    assert feed(pacer, 300, 1.0, start=2.0) == [False]
    # Idle, the consumer's poll returns empty once its timeout ends: that releases too.
    pacer = FetchPacer(hold=0.002)
    feed(pacer, 2000, 1.0, start=0.0)
    assert pacer.observe(0, 2.0) is False


def test_a_rate_is_judged_over_a_whole_window() -> None:
    pacer = FetchPacer(hold=0.002, window=0.25)
    assert pacer.observe(400, 0.0) is None  # a burst opens the window...
    assert pacer.observe(0, 0.1) is None  # ...which is judged only once it is over
    assert pacer.observe(0, 0.3) is True  # 400 events in 0.3 s: 2.7 per 2 ms hold
    assert pacer.observe(100, 0.4) is None
    assert pacer.observe(0, 0.6) is False  # 100 in 0.3 s: 0.67 per hold


def test_a_hold_of_zero_never_holds() -> None:
    assert feed(FetchPacer(hold=0.0), 20000, 1.0, start=0.0) == []
