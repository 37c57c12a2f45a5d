"""loopwarden against the gateway's own loop detector, from the published openclaw package.

The package is installed with npm when the test runs (infra/node/ensure-openclaw.sh, cached after
the first time); only a machine whose npm cannot reach the registry skips, and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import refdiff

# every rolling detector of the reference, blocking and warning, and both holes spec 7.4 closes
EXERCISED = (
    "block/generic_repeat",
    "warn/generic_repeat",
    "block/global_circuit_breaker",
    "block/known_poll_no_progress",
    "warn/known_poll_no_progress",
    "block/ping_pong",
    "warn/ping_pong",
    "block/unknown_tool_repeat",
    "warn/argument_churn",
)


@pytest.fixture(scope="module")
def reference() -> refdiff.Reference:
    try:
        return refdiff.install()
    except refdiff.Unreachable as exc:
        pytest.skip(str(exc))


def _agree(reference: refdiff.Reference, workdir: Path, seeds: range, runs: int, events: int) -> None:
    results = [result for seed in seeds for result in refdiff.run_seed(reference, seed, runs, events, workdir)]
    seen = sum((r.seen for r in results), start=refdiff.Counter())
    assert [label for label in EXERCISED if not seen[label]] == [], "the traces no longer exercise these"
    divergences = [d for r in results for d in r.divergences]
    shown = "\n".join(json.dumps({**d, "reproducer": refdiff.reproducer(workdir, d)[-12:]}) for d in divergences[:5])
    assert not divergences, f"{refdiff.summary(results)}\nfirst divergences (last 12 events of each run):\n{shown}"
    rules = sum((r.by_rule for r in results), start=refdiff.Counter())
    ruled = (
        "unknown_tool_streak_skips_vetoes",
        "ping_pong_evidence_skips_vetoes",
        "latch_holds_until_another_call_runs",
    )
    assert all(rules[rule] for rule in ruled), refdiff.summary(results)


def test_replay_decides_as_the_gateway_detector(reference: refdiff.Reference, tmp_path: Path) -> None:
    _agree(reference, tmp_path, range(1, 3), runs=250, events=16000)


@pytest.mark.heavy
def test_replay_decides_as_the_gateway_detector_at_length(reference: refdiff.Reference, tmp_path: Path) -> None:
    _agree(reference, tmp_path, range(1, 21), runs=500, events=40000)


def _verdict(decision: str, detector: str | None = None, count: int = 0, key: str | None = None) -> dict:
    level = {"block": "critical", "warn": "warning", "allow": "warning" if detector else "none"}[decision]
    return {"decision": decision, "level": level, "detector": detector, "count": count, "warning_key": key}


def _line(seq: int, reference: dict, **modes: dict) -> dict:
    spec = modes.get("spec", reference)
    rest = {
        "spec": spec,
        "unknownSkip": modes.get("unknownSkip", reference),
        "pingPongSkip": modes.get("pingPongSkip", reference),
        "latch": modes.get("latch", reference),
    }
    return {"run_id": "run-x-00000", "seq": seq, "tool_name": "t", **reference, "modes": rest}


def test_a_stricter_verdict_counts_only_when_one_rule_gives_it() -> None:
    """The allowance is re-checked per rule, never granted to any verdict that is merely stricter."""
    block = _verdict("block", "unknown_tool_repeat", 10, "unknown-tool:t:x")
    allowed = _verdict("allow")
    ruled = _line(1, allowed, spec=block, unknownSkip=block)
    unruled = _line(2, allowed)  # no rule turns this allow into a block
    wrong_count = _line(3, allowed, spec=block, unknownSkip=block)
    mine = [
        {"run_id": "run-x-00000", "seq": 1, **block},
        {"run_id": "run-x-00000", "seq": 2, **block},
        {"run_id": "run-x-00000", "seq": 3, **block, "count": 11},
    ]
    result = refdiff.compare(7, lambda _: "unknown_tool", [ruled, unruled, wrong_count], mine)
    assert result.by_rule == {"unknown_tool_streak_skips_vetoes": 1}
    assert [d["seq"] for d in result.divergences] == [2, 3]


def test_a_latch_block_counts_only_where_the_latched_module_gives_it() -> None:
    block = _verdict("block", "generic_repeat", 20, "generic:t:a:r")
    warned = _verdict("allow", "generic_repeat", 12, "generic:t:a")
    latched = _line(1, warned, spec=block, latch=block)
    unlatched = _line(2, warned)  # no latch in the module's run: loopwarden's block is its own
    mine = [{"run_id": "run-x-00000", "seq": n, **block} for n in (1, 2)]
    result = refdiff.compare(7, lambda _: "stuck_retry", [latched, unlatched], mine)
    assert result.by_rule == {"latch_holds_until_another_call_runs": 1}
    assert [d["seq"] for d in result.divergences] == [2]


def test_a_bucket_difference_counts_only_after_a_rule_changed_that_key() -> None:
    key = "pingpong:a|b"
    warn, quiet = _verdict("warn", "ping_pong", 21, key), _verdict("allow", "ping_pong", 21, key)
    block = _verdict("block", "ping_pong", 20, key)
    first = _line(1, _verdict("warn", "ping_pong", 20, key), spec=block, pingPongSkip=block)
    later = _line(2, quiet, spec=warn, pingPongSkip=warn)  # the reference used up the key's bucket at seq 1
    lone = _line(
        3, _verdict("allow", "ping_pong", 21, "pingpong:c|d"), spec=_verdict("warn", "ping_pong", 21, "pingpong:c|d")
    )
    mine = [
        {"run_id": "run-x-00000", "seq": 1, **block},
        {"run_id": "run-x-00000", "seq": 2, **warn},
        {"run_id": "run-x-00000", "seq": 3, **_verdict("warn", "ping_pong", 21, "pingpong:c|d")},
    ]
    result = refdiff.compare(7, lambda _: "ping_pong", [first, later, lone], mine)
    assert result.by_rule == {"ping_pong_evidence_skips_vetoes": 1, "warning_bucket_after_rule": 1}
    assert [d["seq"] for d in result.divergences] == [3]
