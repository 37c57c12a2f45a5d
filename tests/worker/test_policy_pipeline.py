"""A policy through a real worker (real Kafka, real RocksDB): shadow mode
publishes what replay does, every decision `allow`, and its `shadow_decision`
is what enforce mode decides for the same trace up to the first divergence."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import (
    LOOPWARDEN,
    REPO,
    Worker,
    by_run,
    consume,
    make_trace,
    names,
    produce,
    reference,
    values,
    write_config,
)
from streams.worker.settings import Topics
from streams.worker.topics import ensure_topics

pytestmark = pytest.mark.integration

POLICY = {"escalation": {"enabled": True, "blockedCalls": 2, "window": 6}, "budget": {"maxToolCalls": 10}}


def _policy(directory: Path, name: str, document: dict) -> Path:
    path = directory / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_shadow_policy_through_the_worker(broker, tmp_path: Path) -> None:
    t = names("shadow")
    config = write_config(tmp_path)
    shadow = _policy(tmp_path, "shadow.json", {"mode": "shadow", **POLICY})
    enforce = _policy(tmp_path, "enforce.json", POLICY)
    lines = make_trace(runs=24, events_per_run=24, seed=3)
    expected = reference(lines, config, shadow)
    ensure_topics(
        broker.bootstrap,
        Topics(events=t["events"], decisions=t["decisions"], deadletter=t["deadletter"], partitions=4),
    )
    produce(broker.bootstrap, t["events"], lines)
    with Worker(broker.bootstrap, t, tmp_path, "w1", config=config, extra=["--policy", str(shadow)]):
        records = consume(broker.bootstrap, t["decisions"], count=len(expected), timeout=90, settle=1.0)
    published = by_run(values(records))
    assert published == by_run(expected), "the worker publishes what replay writes"

    shadowed = [json.loads(v) for run in published.values() for v in run]
    assert {v["decision"] for v in shadowed} == {"allow"}
    assert {v["error"] for v in shadowed} == {None}
    assert {"warn", "block", "abort"} <= {v["shadow_decision"] for v in shadowed}
    would_abort = {v["detector"] for v in shadowed if v["shadow_decision"] == "abort"}
    assert {"tool_call_budget", "blocks_ignored"} <= would_abort

    enforced = by_run(reference(lines, config, enforce))
    compared = 0
    for run, verdicts in published.items():
        for shadow_line, enforce_line in zip(verdicts, enforced[run], strict=False):
            s, e = json.loads(shadow_line), json.loads(enforce_line)
            assert s["seq"] == e["seq"]
            assert s["shadow_decision"] == (None if e["decision"] == "allow" else e["decision"]), (run, s, e)
            assert (s["detector"], s["count"], s["message"]) == (e["detector"], e["count"], e["message"])
            compared += 1
            if e["decision"] in ("block", "abort"):
                break  # enforce mode's gateway did not run this call: the runs part here
    assert compared > len(published)


def test_bad_policy_refuses_to_start(tmp_path: Path) -> None:
    """A policy with a broken constraint: exit 2 naming the field's path, before anything connects."""
    bad = _policy(tmp_path, "bad.json", {"agents": {"cheap-model": {"escalation": {"window": 2}}}})
    proc = subprocess.run(
        [*LOOPWARDEN, "worker", "--bootstrap", "127.0.0.1:1", "--policy", str(bad), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "agents.cheap-model.escalation.window: must be at least blockedCalls (3), got 2" in proc.stderr
