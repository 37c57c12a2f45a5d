"""Spec §5: the post-compaction guard, and decision 5 (abort verdicts, stickiness)."""

from __future__ import annotations

import pytest

from builders import Driver, compaction, fleet, low
from schemas.config import FleetConfig
from streams.engine import apply

SAME = {"content": [{"type": "text", "text": "same"}]}


def out(i):
    return {"content": [{"type": "text", "text": f"out{i}"}]}


def loop_after_compaction(d: Driver, n: int, *, run="r1"):
    """n identical calls with identical results; returns every verdict (calls and results)."""
    seen = []
    for _ in range(n):
        v = d.call("exec", {"command": "make"}, run=run)
        seen.append(v)
        if v.decision != "abort":
            seen.extend(d.result("exec", run=run, result=SAME))
    return seen


def test_armed_by_compaction_with_window_size():
    d = Driver(FleetConfig())
    assert d.compact().armed == 3
    assert d.state().guard_remaining == 3
    d = Driver(fleet(postCompactionGuard={"windowSize": 5}))
    assert d.compact().armed == 5


def test_aborts_after_window_size_identical_triples():
    d = Driver(FleetConfig())  # no configuration at all: the guard still runs
    d.compact()
    verdicts = loop_after_compaction(d, 3)
    # three call verdicts, then the third result answers with the abort
    assert [v.decision for v in verdicts] == ["allow", "allow", "allow", "abort"]
    abort = verdicts[-1]
    assert abort.seq == 7 and abort.tool_call_id == "k3" and abort.tool_name == "exec"
    assert (abort.decision, abort.level, abort.detector, abort.error) == (
        "abort",
        "critical",
        "compaction_loop_persisted",
        "compaction_loop_persisted",
    )
    assert abort.count == 3
    assert "exec" in abort.message and "3" in abort.message
    assert abort.warning_key is None and abort.paired_tool_name is None


def test_no_abort_without_compaction():
    d = Driver(FleetConfig())
    verdicts = loop_after_compaction(d, 12)
    assert all(v.decision == "allow" for v in verdicts)
    assert len(verdicts) == 12  # tool results answer nothing


def test_never_aborts_while_results_change():
    d = Driver(FleetConfig())
    d.compact()
    for i in range(6):
        assert d.call("exec", {"command": "make"}).decision == "allow"
        assert d.result("exec", result=out(i)) == []


def test_window_is_the_next_window_size_results():
    d = Driver(FleetConfig())
    d.compact()
    d.call("exec", {"c": 1})
    d.result("exec", result=SAME)
    d.call("exec", {"c": 1})
    d.result("exec", result=out(1))  # breaks it
    d.call("exec", {"c": 1})
    assert d.result("exec", result=SAME) == []
    assert d.state().guard_remaining == 0
    # the window is spent: further identical triples are not observed
    for _ in range(4):
        assert d.call("exec", {"c": 1}).decision == "allow"
        assert d.result("exec", result=SAME) == []


def test_different_args_are_different_triples():
    d = Driver(FleetConfig())
    d.compact()
    for i in range(3):
        d.call("exec", {"c": i})
        assert d.result("exec", result=SAME) == []


def test_compaction_rearms_and_clears_window():
    d = Driver(FleetConfig())
    d.compact()
    for _ in range(2):
        d.call("exec", {"c": 1})
        d.result("exec", result=SAME)
    d.compact()  # window cleared: the two earlier triples no longer count
    assert d.state().guard_remaining == 3 and d.state().guard_window == []
    for _ in range(2):
        d.call("exec", {"c": 1})
        assert d.result("exec", result=SAME) == []
    d.call("exec", {"c": 1})
    assert [v.decision for v in d.result("exec", result=SAME)] == ["abort"]


def test_results_without_hash_are_not_observed():
    d = Driver(FleetConfig())
    d.compact()
    veto = {"details": {"status": "blocked", "deniedReason": "tool-loop"}}
    for _ in range(3):
        d.call("exec", {"c": 1})
        assert d.result("exec", result=veto) == []
    assert d.state().guard_remaining == 3
    for _ in range(3):
        d.call("exec", {"c": 1})
        got = d.result("exec", result=SAME)
    assert [v.decision for v in got] == ["abort"]


def test_errors_count_as_identical_results():
    d = Driver(FleetConfig())
    d.compact()
    got = []
    for _ in range(3):
        d.call("exec", {"c": 1})
        got = d.result("exec", error="boom")
    assert [v.detector for v in got] == ["compaction_loop_persisted"]


def test_window_size_two_from_config():
    d = Driver(fleet(postCompactionGuard={"windowSize": 2}))
    d.compact()
    d.call("read", {"p": 1})
    assert d.result("read", result=SAME) == []
    d.call("read", {"p": 1})
    got = d.result("read", result=SAME)
    assert [(v.decision, v.count) for v in got] == [("abort", 2)]


@pytest.mark.parametrize(("enabled", "runs"), [(None, True), (True, True), (False, False)])
def test_guard_runs_unless_explicitly_disabled(enabled, runs):
    cfg = fleet() if enabled is None else fleet(enabled=enabled)
    d = Driver(cfg)
    assert d.compact().armed == (3 if runs else 0)
    verdicts = loop_after_compaction(d, 3)
    assert any(v.decision == "abort" for v in verdicts) is runs


def test_explicit_false_per_agent_disables_guard_for_that_agent():
    cfg = fleet(agents={"quiet": {"enabled": False}})
    d = Driver(cfg)
    assert d.compact(agent="quiet").armed == 0
    assert not any(v.decision == "abort" for v in loop_after_compaction(d, 3))
    assert d.compact(run="r2", agent="other").armed == 3


def test_guard_runs_with_rolling_detectors_off_and_on():
    for cfg in (fleet(), low()):
        d = Driver(cfg)
        d.compact()
        assert any(v.decision == "abort" for v in loop_after_compaction(d, 3))


def test_abort_is_sticky():
    d = Driver(FleetConfig())
    d.compact()
    abort = loop_after_compaction(d, 3)[-1]
    assert abort.decision == "abort"
    # every later call of the run is answered abort, whatever it is
    later = d.call("read", {"something": "else"})
    assert (later.decision, later.level, later.detector, later.error) == (
        "abort",
        "critical",
        "compaction_loop_persisted",
        "compaction_loop_persisted",
    )
    assert later.tool_name == "read" and later.seq == 8
    assert later.count == abort.count and later.message == abort.message
    # results after the abort produce nothing, and a compaction does not re-arm
    assert d.result("read", result=out(1)) == []
    outcome = d.compact()
    assert outcome.verdicts == [] and outcome.armed == 0
    assert d.call("exec", {"command": "make"}).decision == "abort"


def test_abort_only_hits_its_run():
    d = Driver(FleetConfig())
    d.compact(run="r1")
    loop_after_compaction(d, 3, run="r1")
    assert d.call("exec", {"command": "make"}, run="r1").decision == "abort"
    assert d.call("exec", {"command": "make"}, run="r2").decision == "allow"


def test_abort_state_survives_rolling_detectors_blocking():
    # with low thresholds the rolling detectors also fire; the guard still aborts on the results
    d = Driver(low(postCompactionGuard={"windowSize": 3}))
    for _ in range(2):
        d.step("exec", {"c": 1}, res=SAME)
    d.compact()
    verdicts = loop_after_compaction(d, 3)
    assert verdicts[-1].decision == "abort"


def test_compaction_event_itself_gives_no_verdict():
    outcome = apply(None, compaction("r1", 1), FleetConfig())
    assert outcome.verdicts == [] and outcome.armed == 3
