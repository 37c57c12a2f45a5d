"""Spec §4 "Warnings are not repeated on every call" and decision 2."""

from __future__ import annotations

from builders import NO_RECOVERY, Driver, expected_args_hash, low
from streams.engine.warnings import should_deliver


def test_first_warning_delivered_then_only_when_count_div_10_rises():
    buckets: dict[str, int] = {}
    got = [should_deliver(buckets, "k", count) for count in range(3, 32)]
    delivered = [count for count, ok in zip(range(3, 32), got, strict=True) if ok]
    assert delivered == [3, 10, 20, 30]


def test_first_warning_delivered_even_when_already_past_ten():
    buckets: dict[str, int] = {}
    assert should_deliver(buckets, "k", 14) is True
    assert should_deliver(buckets, "k", 15) is False
    assert should_deliver(buckets, "k", 19) is False
    assert should_deliver(buckets, "k", 20) is True


def test_count_falling_back_is_not_delivered_again():
    buckets: dict[str, int] = {}
    assert should_deliver(buckets, "k", 12)
    assert not should_deliver(buckets, "k", 5)
    assert not should_deliver(buckets, "k", 12)


def test_keys_are_independent():
    buckets: dict[str, int] = {}
    assert should_deliver(buckets, "a", 3)
    assert should_deliver(buckets, "b", 3)
    assert not should_deliver(buckets, "a", 4)
    assert not should_deliver(buckets, "b", 4)


def test_at_most_256_keys_oldest_dropped():
    buckets: dict[str, int] = {}
    for i in range(257):
        assert should_deliver(buckets, f"k{i}", 3)
    assert len(buckets) == 256
    assert "k0" not in buckets
    assert not should_deliver(buckets, "k1", 4)  # still remembered
    assert not should_deliver(buckets, "k256", 4)
    assert should_deliver(buckets, "k0", 4)  # forgotten: delivered again as a first warning
    assert len(buckets) == 256


def test_engine_delivers_first_and_every_tenth():
    d = Driver(low())
    verdicts = [d.step("read", {"p": 1}, res={"content": [{"type": "text", "text": f"v{i}"}]}) for i in range(25)]
    # call i sees i earlier identical calls; results change so there is never a block
    warned = [i for i, v in enumerate(verdicts) if v.decision == "warn"]
    assert warned == [3, 10, 20]
    key = "generic:read:" + expected_args_hash("read", {"p": 1})
    for i, v in enumerate(verdicts):
        if i < 3:
            assert (v.decision, v.level, v.detector, v.count, v.warning_key, v.message) == (
                "allow",
                "none",
                None,
                0,
                None,
                None,
            )
        else:
            assert v.level == "warning" and v.detector == "generic_repeat"
            assert v.count == i and v.warning_key == key
            assert v.message and "read" in v.message and str(i) in v.message
            assert v.decision == ("warn" if i in (3, 10, 20) else "allow")


def test_suppressed_warning_keeps_call_in_history():
    d = Driver(low())
    for i in range(5):
        d.step("read", {"p": 1}, res={"content": [{"type": "text", "text": f"v{i}"}]})
    assert len(d.state().history) == 5


def test_warning_keys_per_run_are_separate():
    d = Driver(low())
    first = [d.step("read", {"p": 1}, run="r1", res={"content": [{"type": "text", "text": str(i)}]}) for i in range(4)]
    second = [d.step("read", {"p": 1}, run="r2", res={"content": [{"type": "text", "text": str(i)}]}) for i in range(4)]
    assert first[3].decision == "warn" and second[3].decision == "warn"
    assert first[3].warning_key == second[3].warning_key
    assert d.step("read", {"p": 1}, run="r1", res={"content": []}).decision == "allow"


def test_different_patterns_warn_independently():
    d = Driver(low())
    a = [d.step("read", {"p": 1}, res={"content": [{"type": "text", "text": str(i)}]}) for i in range(4)]
    b = [d.step("read", {"p": 2}, res={"content": [{"type": "text", "text": str(i)}]}) for i in range(4)]
    assert a[3].decision == "warn"
    assert b[3].decision == "warn"
    assert a[3].warning_key != b[3].warning_key


def test_critical_is_always_delivered():
    d = Driver(low(), NO_RECOVERY)
    res = {"content": [{"type": "text", "text": "same"}]}
    verdicts = [d.step("read", {"p": 1}, res=res) for _ in range(8)]
    assert [v.decision for v in verdicts] == ["allow"] * 3 + ["warn", "allow", "block", "block", "block"]
