"""The trace `apply(..., trace=True)` returns is the path the engine took: its
last step's decision is the event's verdict, for every event of spec §8's
stories and of the hashing vectors, under each policy; and tracing changes
neither the verdicts nor the state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.codec import decode_event
from schemas.config import FleetConfig, LoopDetectionConfig
from schemas.policy import FleetPolicy, parse_policy
from schemas.state import RunState
from stories import POLICY, section_8_trace
from streams.engine import apply
from streams.engine.trace import Trace

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "hashing.json"
CONFIG = FleetConfig(
    default=LoopDetectionConfig(
        enabled=True, warning_threshold=3, critical_threshold=5, global_circuit_breaker_threshold=6
    )
)
POLICIES = {
    "none": None,
    "section 8": parse_policy(POLICY),
    "shadow": parse_policy({"mode": "shadow"}),
    "budget and escalation": parse_policy(
        {"budget": {"maxToolCalls": 9}, "escalation": {"enabled": True, "blockedCalls": 2, "window": 4}}
    ),
    "escalation without recovery": parse_policy(
        {"recovery": {"enabled": False}, "escalation": {"enabled": True, "blockedCalls": 2, "window": 4}}
    ),
}
SPEC_ORDER = ["aborted", "budget", "detectors", "turn", "latch", "recovery", "escalation"]


def vector_lines() -> list[bytes]:
    """Each hashing vector as a run that repeats its call and outcome seven
    times, with a compaction after the second: enough to warn, block and
    arm the guard where the outcome stays the same."""
    lines = []
    for n, case in enumerate(json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]):
        run, seq = f"vector-{n}", 0
        outcome = "".join(f', "{field}": {case[field]}' for field in ("result", "error") if case.get(field))
        args = f', "args": {case["args"]}' if case.get("args") else ""
        for i in range(7):
            head = f'"run_id": "{run}", "tool_call_id": "c{i}", "tool_name": "{case["tool"]}"{args}'
            lines.append(f'{{"type": "tool_call", "seq": {seq}, {head}}}'.encode())
            lines.append(f'{{"type": "tool_result", "seq": {seq + 1}, {head}{outcome}}}'.encode())
            seq += 2
            if i == 1:
                lines.append(f'{{"type": "compaction", "run_id": "{run}", "seq": {seq}}}'.encode())
                seq += 1
        lines.append(f'{{"type": "run_end", "run_id": "{run}", "seq": {seq}}}'.encode())
    return lines


def traces(lines: list[bytes], policy: FleetPolicy | None) -> list[tuple[list, Trace]]:
    """Every event's verdicts and trace, each run's state carried along."""
    states: dict[str, RunState | None] = {}
    out = []
    for line in lines:
        event = decode_event(line)
        outcome = apply(states.get(event.run_id), event, CONFIG, policy, trace=True)
        states[event.run_id] = outcome.state
        assert outcome.trace is not None
        out.append((outcome.verdicts, outcome.trace))
    return out


SOURCES = {"section 8 stories": lambda: section_8_trace(CONFIG, parse_policy(POLICY))[0], "vectors": vector_lines}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("policy", POLICIES)
def test_the_last_step_decides_the_verdict(source, policy):
    seen = set()
    for verdicts, trace in traces(SOURCES[source](), POLICIES[policy]):
        verdict = verdicts[0] if verdicts else None
        assert trace.decision == (verdict.decision if verdict else None)
        if verdict is None:
            continue
        last = trace.steps[-1]
        assert (last.shadow_decision, last.detector) == (verdict.shadow_decision, verdict.detector)
        if last.rule != "escalation" or verdict.detector == "blocks_ignored":  # escalation counts blocked calls
            assert last.count == verdict.count
        call_rules = [step.rule for step in trace.steps if step.rule != "guard"]
        assert call_rules == sorted(call_rules, key=SPEC_ORDER.index), "steps out of policy spec §2's order"
        seen.update((step.rule, step.decision, step.shadow_decision) for step in trace.steps)
    # each source reaches warnings, blocks and aborts, so the comparison above covers them
    decisions = {shadow or decision for _, decision, shadow in seen}
    assert {"allow", "warn", "block", "abort"} <= decisions


@pytest.mark.parametrize("policy", POLICIES)
def test_a_count_is_held_against_its_threshold(policy):
    escalation = POLICIES["budget and escalation"].default  # the same settings in both policies that escalate
    escalated = set()
    for _, trace in traces(vector_lines(), POLICIES[policy]):
        for step in trace.steps:
            if step.rule == "detectors" and step.detector is not None:
                assert step.count is not None and step.threshold is not None and step.count >= step.threshold
            if step.rule == "guard":
                assert step.count == step.threshold == CONFIG.default.window_size
            if step.rule == "escalation":
                assert step.threshold == escalation.blocked_calls and 0 <= step.count <= escalation.window
                if step.detector == "blocks_ignored":
                    assert step.count >= step.threshold
                    escalated.add(policy)
    if policy == "escalation without recovery":  # with recovery on, recovery ends these runs first
        assert escalated


def test_tracing_changes_nothing():
    lines, _ = section_8_trace(CONFIG, parse_policy(POLICY))
    lines += vector_lines()
    plain: dict[str, RunState | None] = {}
    traced: dict[str, RunState | None] = {}
    for line in lines:
        event = decode_event(line)
        a = apply(plain.get(event.run_id), event, CONFIG, parse_policy(POLICY))
        b = apply(traced.get(event.run_id), decode_event(line), CONFIG, parse_policy(POLICY), trace=True)
        assert a.trace is None
        assert (a.verdicts, a.state, a.armed, a.duplicate) == (b.verdicts, b.state, b.armed, b.duplicate)
        plain[event.run_id], traced[event.run_id] = a.state, b.state
