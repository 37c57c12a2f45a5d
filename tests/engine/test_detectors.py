"""Spec §4: the four measurements and the eight checks, in order."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from builders import NO_RECOVERY, Driver, fleet, low
from schemas.state import KIND_PROCESS_POLL, Record
from streams.engine.detectors import Streak, detect, no_progress_streak, ping_pong, unknown_tool_streak
from streams.engine.hashing import args_hash, classify

# thresholds: warning 3, critical 5, breaker 7, unknown-tool 4
CFG = low(unknownToolThreshold=4).default

A = "exec:aaa"
B = "exec:bbb"
C = "read:ccc"
P = "process:ppp"  # a known poll (kind decided by the caller of detect)


def rec(sig, result=None, unknown=None, tool=None):
    return Record(tool or sig.split(":")[0], sig, None, 0, result, unknown)


def fire(history, sig, *, poll=False, cfg=CFG, tool=None):
    return detect(history, tool or sig.split(":")[0], sig, poll, cfg, Counter(r.args_hash for r in history))


# --- measurements ------------------------------------------------------------------------


def test_no_progress_streak_reference_is_newest_with_a_result():
    same = [rec(A, "r1"), rec(A, "r2"), rec(A, "r2"), rec(A, None), rec(A, "r2")]
    assert no_progress_streak(same) == Streak(3, "r2")


def test_no_progress_streak_stops_at_first_different():
    assert no_progress_streak([rec(A, "r1"), rec(A, "r1"), rec(A, "r2")]) == Streak(1, "r2")
    assert no_progress_streak([]) == Streak(0, None)
    assert no_progress_streak([rec(A), rec(A)]) == Streak(0, None)


def test_streak_considers_only_same_tool_and_args():
    # other calls in between do not break the streak of identical calls
    history = [rec(A, "x"), rec(C, "c"), rec(A, "x"), rec(B, "y"), rec(A, "x"), rec(C, "d"), rec(A, "x"), rec(A, "x")]
    found = fire(history, A)
    assert (found.detector, found.level, found.count) == ("generic_repeat", "critical", 5)


def test_unknown_tool_streak():
    history = [rec(A, "e0", "zzz"), rec(A, "e1", "foo"), rec(A, "e1", "foo"), rec(A, "e1", "foo")]
    assert unknown_tool_streak(history, "exec") == (3, "foo")
    assert unknown_tool_streak(history + [rec(C, "r")], "exec") == (0, None)
    assert unknown_tool_streak(history + [rec(A, "ok")], "exec") == (0, None)
    assert unknown_tool_streak(history, "read") == (0, None)


def test_unknown_tool_streak_counts_any_args_of_the_tool():
    history = [rec("exec:1", "e", "foo"), rec("exec:2", "e2", "foo"), rec("exec:3", "e3", "foo")]
    assert unknown_tool_streak(history, "exec") == (3, "foo")


def test_ping_pong_count_is_tail_plus_one():
    assert ping_pong([rec(A), rec(B)], A).count == 3
    assert ping_pong([rec(A), rec(B), rec(A), rec(B)], A).count == 5
    # the tail stops at the first record that breaks the alternation
    assert ping_pong([rec(C), rec(A), rec(B), rec(A), rec(B)], A).count == 5
    assert ping_pong([rec(B), rec(B), rec(A), rec(B)], A).count == 4


def test_ping_pong_zero_cases():
    assert ping_pong([], A).count == 0
    assert ping_pong([rec(A)], B).count == 0  # no other signature
    assert ping_pong([rec(A), rec(A)], B).count == 0
    assert ping_pong([rec(A), rec(B)], C).count == 0  # new call is not O
    assert ping_pong([rec(A), rec(B)], B).count == 0  # new call repeats L
    assert ping_pong([rec(B), rec(A), rec(A)], B).count == 0  # tail L only: shorter than 2


def test_ping_pong_no_progress_evidence():
    same = [rec(A, "ra"), rec(B, "rb"), rec(A, "ra"), rec(B, "rb")]
    assert ping_pong(same, A).no_progress is True
    assert ping_pong(same, A).paired_tool == "exec"
    changed = [rec(A, "ra"), rec(B, "rb"), rec(A, "ra2"), rec(B, "rb")]
    assert ping_pong(changed, A).no_progress is False
    missing = [rec(A, "ra"), rec(B, "rb"), rec(A, None), rec(B, "rb")]
    assert ping_pong(missing, A).no_progress is False
    # only the tail matters: an earlier different result does not remove the evidence
    earlier = [rec(A, "old"), rec(C, "c"), rec(A, "ra"), rec(B, "rb"), rec(A, "ra"), rec(B, "rb")]
    assert ping_pong(earlier, A).no_progress is True


# --- each check -----------------------------------------------------------------------------


def test_nothing_fires_on_a_healthy_history():
    assert fire([rec(A, "1"), rec(B, "2"), rec(C, "3")], A) is None
    assert fire([], A) is None


def test_generic_warning_on_recent_count_even_when_results_change():
    history = [rec(A, "r1"), rec(A, "r2"), rec(A, "r3")]
    found = fire(history, A)
    assert found.level == "warning" and found.detector == "generic_repeat" and found.count == 3
    assert found.warning_key == f"generic:exec:{A}"
    assert fire(history[:2], A) is None


def test_generic_warning_recent_count_includes_unfinished_calls():
    found = fire([rec(A), rec(A), rec(A)], A)
    assert (found.detector, found.level, found.count) == ("generic_repeat", "warning", 3)


def test_generic_critical_needs_identical_results():
    found = fire([rec(A, "same")] * 5, A)
    assert (found.detector, found.level, found.count) == ("generic_repeat", "critical", 5)
    assert found.warning_key == f"generic:exec:{A}:same"
    assert "exec" in found.message and "5" in found.message
    # five identical calls with changing results only warn
    found = fire([rec(A, str(i)) for i in range(6)], A)
    assert (found.level, found.count) == ("warning", 6)


def test_known_poll_warning_and_critical():
    found = fire([rec(P, "same")] * 3, P, poll=True)
    assert (found.detector, found.level, found.count) == ("known_poll_no_progress", "warning", 3)
    assert found.warning_key == f"poll:process:{P}:same"
    found = fire([rec(P, "same")] * 5, P, poll=True)
    assert (found.detector, found.level, found.count) == ("known_poll_no_progress", "critical", 5)
    assert found.warning_key == f"poll:process:{P}:same"


def test_poll_calls_never_generic_repeat():
    # identical poll calls with changing results: no streak, and generic does not apply to polls
    assert fire([rec(P, str(i)) for i in range(6)], P, poll=True) is None


def test_global_circuit_breaker():
    found = fire([rec(A, "same")] * 7, A)
    assert (found.detector, found.level, found.count) == ("global_circuit_breaker", "critical", 7)
    assert found.warning_key == f"global:exec:{A}:same"


def test_unknown_tool_repeat():
    history = [rec(A, "e", "gone")] * 4
    found = fire(history, A)
    assert (found.detector, found.level, found.count) == ("unknown_tool_repeat", "critical", 4)
    assert found.warning_key == "unknown-tool:exec:gone"
    assert "gone" in found.message
    assert fire(history[:3], A).detector == "generic_repeat"  # below the unknown threshold


def test_ping_pong_warning_and_critical():
    history = [rec(A, "ra"), rec(B, "rb")]
    found = fire(history, A)
    assert (found.detector, found.level, found.count) == ("ping_pong", "warning", 3)
    assert found.warning_key == "pingpong:" + "|".join(sorted([A, B]))
    assert found.paired_tool_name == "exec"
    found = fire(history * 2, A)
    assert (found.detector, found.level, found.count) == ("ping_pong", "critical", 5)
    assert found.warning_key == "pingpong:" + "|".join(sorted([A, B]))


def test_ping_pong_without_evidence_only_warns():
    history = [rec(A, "ra"), rec(B, "rb1"), rec(A, "ra"), rec(B, "rb2")]
    found = fire(history, A)
    assert (found.detector, found.level, found.count) == ("ping_pong", "warning", 5)
    history = [rec(A, "ra"), rec(B, "rb"), rec(A, "ra"), rec(B)]
    found = fire(history, A)
    assert (found.detector, found.level, found.count) == ("ping_pong", "warning", 5)


def test_ping_pong_key_is_symmetric_and_paired_tool_is_the_other_side():
    history = [rec("read:x", "1"), rec("exec:y", "2")]
    one = fire(history, "read:x")
    two = fire([rec("exec:y", "2"), rec("read:x", "1")], "exec:y")
    assert one.warning_key == two.warning_key == "pingpong:exec:y|read:x"
    assert one.paired_tool_name == "exec"
    assert two.paired_tool_name == "read"


# --- priority order ---------------------------------------------------------------------------------


def test_unknown_tool_beats_circuit_breaker():
    history = [rec(A, "e", "gone")] * 8  # streak 8 >= breaker 7 and unknown streak 8 >= 4
    assert fire(history, A).detector == "unknown_tool_repeat"


def test_circuit_breaker_beats_known_poll_critical():
    found = fire([rec(P, "same")] * 7, P, poll=True)
    assert (found.detector, found.level) == ("global_circuit_breaker", "critical")


def test_circuit_breaker_beats_generic_and_ping_pong():
    # A with an identical result 7 times, alternating with B: breaker, ping-pong and generic all fire
    history = []
    for _ in range(7):
        history += [rec(A, "ra"), rec(B, "rb")]
    cfg = low(historySize=30).default
    assert ping_pong(history, A).count == 15
    found = fire(history, A, cfg=cfg)
    assert (found.detector, found.count) == ("global_circuit_breaker", 7)


def test_known_poll_critical_beats_ping_pong_critical():
    history = []
    for _ in range(5):
        history += [rec(P, "rp"), rec(B, "rb")]
    assert ping_pong(history, P).no_progress
    found = fire(history, P, poll=True)
    assert (found.detector, found.level, found.count) == ("known_poll_no_progress", "critical", 5)


def test_known_poll_warning_beats_ping_pong_critical():
    history = []
    for _ in range(3):
        history += [rec(P, "rp"), rec(B, "rb")]
    assert ping_pong(history, P).count == 7 and ping_pong(history, P).no_progress
    found = fire(history, P, poll=True)
    assert (found.detector, found.level, found.count) == ("known_poll_no_progress", "warning", 3)


def test_ping_pong_critical_beats_generic_critical():
    history = []
    for _ in range(5):
        history += [rec(A, "ra"), rec(B, "rb")]
    found = fire(history, A)
    assert (found.detector, found.level, found.count) == ("ping_pong", "critical", 11)


def test_ping_pong_warning_beats_generic_critical():
    history = []
    for i in range(5):
        history += [rec(A, "ra"), rec(B, f"rb{i}")]  # B makes progress: no evidence
    found = fire(history, A)
    assert (found.detector, found.level, found.count) == ("ping_pong", "warning", 11)


def test_ping_pong_warning_beats_generic_warning():
    history = [rec(A, "1"), rec(B, "x"), rec(A, "2"), rec(B, "y"), rec(A, "3"), rec(B, "z")]
    found = fire(history, A)
    assert (found.detector, found.level) == ("ping_pong", "warning")


# --- detector flags ------------------------------------------------------------------------------------


def test_generic_flag_off():
    cfg = low(detectors={"genericRepeat": False}).default
    assert fire([rec(A, "same")] * 6, A, cfg=cfg) is None
    assert fire([rec(A, "same")] * 7, A, cfg=cfg).detector == "global_circuit_breaker"


def test_poll_flag_off():
    cfg = low(detectors={"knownPollNoProgress": False}).default
    assert fire([rec(P, "same")] * 6, P, poll=True, cfg=cfg) is None
    assert fire([rec(P, "same")] * 7, P, poll=True, cfg=cfg).detector == "global_circuit_breaker"


def test_ping_pong_flag_off_falls_through_to_generic():
    cfg = low(detectors={"pingPong": False}).default
    history = []
    for _ in range(5):
        history += [rec(A, "ra"), rec(B, "rb")]
    found = fire(history, A, cfg=cfg)
    assert (found.detector, found.level, found.count) == ("generic_repeat", "critical", 5)
    assert fire([rec(A, "ra"), rec(B, "rb")], A, cfg=cfg) is None


def test_unknown_tool_and_breaker_not_switched_off_by_flags():
    cfg = low(
        unknownToolThreshold=4, detectors={"genericRepeat": False, "knownPollNoProgress": False, "pingPong": False}
    ).default
    assert fire([rec(A, "e", "gone")] * 4, A, cfg=cfg).detector == "unknown_tool_repeat"
    assert fire([rec(A, "same")] * 7, A, cfg=cfg).detector == "global_circuit_breaker"
    assert fire([rec(P, "same")] * 7, P, poll=True, cfg=cfg).detector == "global_circuit_breaker"
    assert fire([rec(A, "same")] * 6, A, cfg=cfg) is None


# --- through the engine -----------------------------------------------------------------------------------


def test_known_poll_through_engine_uses_classification():
    d = Driver(low(), NO_RECOVERY)
    poll = {"action": "poll", "sessionId": "s1"}
    res = {"details": {"status": "running", "aggregated": "..."}, "content": []}
    verdicts = [d.step("process", poll, res=res) for _ in range(7)]
    assert [v.detector for v in verdicts] == [None, None, None] + ["known_poll_no_progress"] * 4
    assert [v.decision for v in verdicts] == ["allow", "allow", "allow", "warn", "allow", "block", "block"]
    # a blocked call is recorded as a veto: the block stays in force and its count grows (spec §7.2)
    assert [v.count for v in verdicts[3:]] == [3, 4, 5, 6]
    assert classify("process", poll) == KIND_PROCESS_POLL
    assert verdicts[3].warning_key.startswith(f"poll:process:{args_hash('process', poll)}:")


def test_command_status_is_a_known_poll():
    d = Driver(low())
    verdicts = [
        d.step("command_status", {"id": "x"}, res={"content": [{"type": "text", "text": "running"}]}) for _ in range(6)
    ]
    assert [v.detector for v in verdicts][3:] == ["known_poll_no_progress"] * 3
    assert verdicts[5].level == "critical"


def test_unknown_tool_through_engine():
    d = Driver(low(unknownToolThreshold=3), NO_RECOVERY)
    verdicts = [d.step("browse", {"url": str(i)}, err="Unknown tool: Browse") for i in range(5)]
    assert [v.decision for v in verdicts] == ["allow", "allow", "allow", "block", "block"]
    assert verdicts[3].detector == "unknown_tool_repeat"
    assert verdicts[3].warning_key == "unknown-tool:browse:browse"
    assert verdicts[3].count == 3


def test_identical_calls_alone_only_warn():
    d = Driver(low())
    verdicts = [d.step("read", {"p": 1}, res={"content": [{"type": "text", "text": str(i)}]}) for i in range(12)]
    assert {v.decision for v in verdicts} == {"allow", "warn"}
    assert all(v.level in ("none", "warning") for v in verdicts)


def test_absent_args_are_one_signature():
    d = Driver(low())
    verdicts = [d.step("ping", UNSET, res={"content": [{"type": "text", "text": "pong"}]}) for _ in range(6)]
    assert verdicts[5].decision == "block"
    assert verdicts[5].warning_key.startswith("generic:ping:" + args_hash("ping", UNSET))


# --- detect against the spec's definitions, computed in full ---------------------------------


def _spec_detect(history, tool, sig, is_poll, cfg):
    """§4 read literally: all four measurements over the whole history, then
    the eight checks in order. (level, detector, count, warning key, paired tool) or None."""
    streak, latest = 0, None
    for r in reversed(history):
        if r.tool == tool and r.args_hash == sig and r.result_hash is not None:
            if latest is None:
                latest = r.result_hash
            elif r.result_hash != latest:
                break
            streak += 1
    unknown, name = 0, None
    for r in reversed(history):
        if r.tool != tool or r.unknown_tool is None or (name is not None and r.unknown_tool != name):
            break
        unknown, name = unknown + 1, r.unknown_tool
    pp, pp_tool, pp_sig, pp_evidence = 0, None, None, False
    if history:
        last = history[-1]
        other = next((r.args_hash for r in reversed(history[:-1]) if r.args_hash != last.args_hash), None)
        tail = 0
        for r in reversed(history):
            if r.args_hash != (last.args_hash if tail % 2 == 0 else other):
                break
            tail += 1
        if other is not None and sig == other and tail >= 2:
            pp, pp_tool, pp_sig = tail + 1, last.tool, last.args_hash
            sides = {}
            for r in history[-tail:]:
                sides.setdefault(r.args_hash, set()).add(r.result_hash)
            pp_evidence = len(sides) == 2 and all(len(v) == 1 and None not in v for v in sides.values())
    recent = sum(1 for r in history if r.tool == tool and r.args_hash == sig)
    if unknown >= cfg.unknown_tool_threshold:
        return ("critical", "unknown_tool_repeat", unknown, f"unknown-tool:{tool}:{name}", None)
    if streak >= cfg.global_circuit_breaker_threshold:
        return ("critical", "global_circuit_breaker", streak, f"global:{tool}:{sig}:{latest}", None)
    if is_poll and cfg.known_poll_no_progress:
        if streak >= cfg.critical_threshold:
            return ("critical", "known_poll_no_progress", streak, f"poll:{tool}:{sig}:{latest}", None)
        if streak >= cfg.warning_threshold:
            return ("warning", "known_poll_no_progress", streak, f"poll:{tool}:{sig}:{latest}", None)
    if cfg.ping_pong and pp >= cfg.warning_threshold:
        key = "pingpong:" + "|".join(sorted((sig, pp_sig), key=lambda s: s.encode("utf-16-be")))
        level = "critical" if pp >= cfg.critical_threshold and pp_evidence else "warning"
        return (level, "ping_pong", pp, key, pp_tool)
    if not is_poll and cfg.generic_repeat:
        if streak >= cfg.critical_threshold:
            return ("critical", "generic_repeat", streak, f"generic:{tool}:{sig}:{latest}", None)
        if recent >= cfg.warning_threshold:
            return ("warning", "generic_repeat", recent, f"generic:{tool}:{sig}", None)
    return None


_records = st.builds(
    lambda tool, sig, result, unknown: Record(tool, sig, None, 0, result, unknown),
    st.sampled_from(["exec", "read"]),
    st.sampled_from(["exec:a", "exec:b", "read:a", "x"]),  # "x": a gateway's hash shared by both tools
    st.sampled_from([None, "r1", "r2"]),
    st.sampled_from([None, None, "ghost", "gone"]),
)
_configs = st.builds(
    lambda w, c, b, u, toggles: (
        fleet(
            enabled=True,
            warningThreshold=w,
            criticalThreshold=w + c,
            globalCircuitBreakerThreshold=w + c + b,
            unknownToolThreshold=u,
            detectors=dict(zip(("genericRepeat", "knownPollNoProgress", "pingPong"), toggles, strict=True)),
        ).default
    ),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 4),
    st.tuples(*[st.booleans()] * 3),
)


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(_records, max_size=14),
    st.sampled_from(["exec", "read"]),
    st.sampled_from(["exec:a", "exec:b", "read:a", "x", "new"]),
    st.booleans(),
    _configs,
)
def test_detect_matches_the_spec_measured_in_full(history, tool, sig, is_poll, cfg):
    """`detect` returns early for most calls (nothing in the window to count);
    that shortcut must never hide a detection."""
    found = detect(history, tool, sig, is_poll, cfg, Counter(r.args_hash for r in history))
    got = (
        None if found is None else (found.level, found.detector, found.count, found.warning_key, found.paired_tool_name)
    )
    assert got == _spec_detect(history, tool, sig, is_poll, cfg)
