"""The verdict round trip an OpenClaw gateway sees, during a real agent run.

A real `openclaw agent --local` run (the plugin loaded, a scripted model
making `--calls` tool calls with distinct arguments, so every verdict is
`allow`) against a local broker and a real `loopwarden worker`. The plugin
logs, at debug level, how long each `before_tool_call` waited for its verdict:
publish, the worker's decision, and the verdict read back. The first call is
reported apart (it can include the plugin's start-up).

Baseline, in the same run and against the same worker: the Python gateway
client (`GuardClient.guard`, kafka-python) doing the same number of calls.

    .venv/bin/python -m bench.openclaw_roundtrip [--calls 60] [--local-hashing]

Writes bench/out/openclaw-roundtrip-<time>.json with every sample.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "openclaw")]

from helpers import Worker, names  # noqa: E402
from openclaw_gateway import gateway_home, install  # noqa: E402
from scripted_model import Reply, ScriptedModel, ToolCall, tool_messages  # noqa: E402

from bench.stats import percentile  # noqa: E402
from streams.tools.broker import LocalBroker  # noqa: E402
from streams.client import GuardClient  # noqa: E402

WAITED = re.compile(r"loopwarden: verdict run=\S+ seq=\d+ tool=\S+ decision=(\w+) waited_ms=(\d+)")


def summary(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "p50": statistics.median(samples), "p99": percentile(samples, 0.99), "max": max(samples)}


def gateway_samples(bootstrap: str, topics: dict[str, str], calls: int, local_hashing: bool, work: Path) -> list[float]:
    openclaw = install()

    def script(messages: list[dict[str, Any]]) -> Any:
        done = len(tool_messages(messages))
        return Reply("done") if done >= calls else ToolCall("exec", {"command": f"echo step {done}"})

    with ScriptedModel(script) as model:
        home = gateway_home(
            work,
            model.base_url,
            {
                "bootstrap": bootstrap,
                "eventsTopic": topics["events"],
                "decisionsTopic": topics["decisions"],
                "localHashing": local_hashing,
            },
            logging={"consoleLevel": "debug"},
        )
        done = openclaw.run_agent(home, "Run the steps.")
    if done.returncode != 0:
        raise SystemExit(f"openclaw agent failed ({done.returncode}):\n{done.stderr[-3000:]}")
    waits = [(decision, float(ms)) for decision, ms in WAITED.findall(done.stderr)]
    if len(waits) != calls or any(decision != "allow" for decision, _ in waits):
        raise SystemExit(f"expected {calls} allow verdicts in the gateway's log, found {waits}")
    return [ms for _, ms in waits]


def client_samples(bootstrap: str, topics: dict[str, str], calls: int) -> list[float]:
    samples = []
    with GuardClient(
        bootstrap, events_topic=topics["events"], decisions_topic=topics["decisions"], timeout=10.0
    ) as client:
        run_id = f"baseline-{time.time_ns()}"
        for step in range(calls):
            started = time.perf_counter()
            call, verdict = client.guard(run_id, "exec", {"command": f"echo step {step}"})
            samples.append((time.perf_counter() - started) * 1000)
            if verdict.is_fallback:
                raise SystemExit(f"baseline call {step} got no verdict: {verdict.fallback_reason}")
            client.tool_result(call, result={"content": [{"type": "text", "text": f"step {step}"}]})
        client.run_end(run_id)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--local-hashing", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lw-openclaw-bench-") as tmp, LocalBroker() as broker:
        work = Path(tmp)
        config = work / "loopwarden.json"
        config.write_text(json.dumps({"tools": {"loopDetection": {"enabled": True}}}))
        topics = names("bench-openclaw")
        with Worker(broker.bootstrap, topics, work, "worker", config=config, partitions=3) as worker:
            worker.wait_assigned()
            baseline = client_samples(broker.bootstrap, topics, args.calls)
            gateway = gateway_samples(broker.bootstrap, topics, args.calls, args.local_hashing, work)
    steady = gateway[1:]
    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "calls": args.calls,
        "local_hashing": args.local_hashing,
        "gateway_first_call_ms": gateway[0],
        "gateway_ms": summary(steady),
        "python_client_ms": summary(baseline[1:]),
        "ratio_p50": statistics.median(steady) / statistics.median(baseline[1:]),
        "samples": {"gateway": gateway, "python_client": baseline},
    }
    out = REPO / "bench" / "out" / f"openclaw-roundtrip-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    g, b = report["gateway_ms"], report["python_client_ms"]
    print(
        f"verdict round trip over {args.calls} calls (first call apart: {gateway[0]:.0f} ms), local hashing {'on' if args.local_hashing else 'off'}"
    )
    print(
        f"  OpenClaw plugin (before_tool_call wait):  p50 {g['p50']:.1f} ms  p99 {g['p99']:.1f} ms  max {g['max']:.1f} ms"
    )
    print(
        f"  Python client baseline (guard):           p50 {b['p50']:.1f} ms  p99 {b['p99']:.1f} ms  max {b['max']:.1f} ms"
    )
    print(f"  ratio of medians (plugin / client): {report['ratio_p50']:.2f}")
    print(f"  samples: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
