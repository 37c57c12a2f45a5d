"""A gateway's tool loop guarded by loopwarden, with a scripted agent that
gets stuck on purpose. It shows the three things a gateway must handle:

1. a warning (the call runs; the warning text goes back to the model),
2. a block (the call does not run; the block text goes back to the model),
3. a compaction abort (after a context compaction the agent walks back into
   the same loop; loopwarden aborts the run).

Against a running worker (e.g. `loopwarden up` in another terminal):

    python examples/gateway_loop.py --bootstrap 127.0.0.1:9092

Against a secure broker it takes the `LOOPWARDEN_*` TLS and SASL variables
(docs/SECURITY.md), e.g. `set -a; . DIR/secrets/gateway.env`.

Self-contained (starts a local broker and a worker with a demo config whose
thresholds are small, so the loop is short; takes ~20 s):

    python examples/gateway_loop.py --start

Add `--local-hashing` to send only hashes (see docs/CLIENT.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streams.client import ClientVerdict, GuardClient  # noqa: E402
from streams.kafka.clients import PLAINTEXT, SecurityError, security_from  # noqa: E402

DEMO_CONFIG = {
    "tools": {
        "loopDetection": {
            "enabled": True,
            "warningThreshold": 3,
            "criticalThreshold": 5,
            "globalCircuitBreakerThreshold": 8,
            "postCompactionGuard": {"windowSize": 3},
        }
    }
}


# --------------------------------------------------------------------------
# The "tools" and the "model"
# --------------------------------------------------------------------------


def run_tool(name: str, args: dict) -> dict:
    """Fake tools: the test suite keeps failing the same way."""
    if name == "exec":
        return {
            "content": [{"type": "text", "text": "FAILED tests/test_api.py::test_login - KeyError: 'token'"}],
            "details": {
                "status": "completed",
                "exitCode": 1,
                "durationMs": 812,
                "pid": os.getpid(),
                "aggregated": "FAILED tests/test_api.py::test_login - KeyError: 'token'",
            },
        }
    if name == "read":
        return {"content": [{"type": "text", "text": "def login(user):\n    return session['token']\n"}]}
    return {"content": [{"type": "text", "text": "ok"}]}


def say(verdict: ClientVerdict, tool: str, args: dict) -> None:
    call = f"seq {verdict.seq:>3}  {tool} {json.dumps(args)}"
    if verdict.fallback:
        print(f"{call}\n        -> {verdict.decision.upper()} by {verdict.fallback}: {verdict.message}")
    elif verdict.decision == "allow":
        print(f"{call}  -> allow")
    else:
        print(
            f"{call}\n        -> {verdict.decision.upper()} ({verdict.detector}, count {verdict.count})\n"
            f"           {verdict.message}"
        )


def agent(client: GuardClient, run_id: str, max_steps: int = 40) -> str:
    """A scripted agent: retries the failing tests until loopwarden blocks it,
    then its context overflows (compaction) and it walks back into a loop."""
    seen: set[str] = set()
    tool, args = "exec", {"command": "pytest -x tests/test_api.py"}
    for _ in range(max_steps):
        call = client.tool_call(run_id, tool, args, agent_id="demo-agent")
        verdict = client.check(call)
        say(verdict, tool, args)
        seen.add(verdict.decision)
        if verdict.decision == "abort":
            return "aborted"
        if not verdict.allowed:
            # The gateway does not run the tool and gives the block text to the
            # model; this model "changes approach": compaction, then reading code.
            print("        (the tool did not run; the model gets the message instead)")
            print("        ... the context overflows: the gateway compacts the transcript and retries the turn")
            client.compaction(run_id, agent_id="demo-agent")
            tool, args = "read", {"path": "src/auth.py"}
            continue
        abort = client.tool_result(call, result=run_tool(tool, args), wait=2.0)
        if abort is not None:
            print(f"        -> ABORT on the result ({abort.detector}, count {abort.count})\n           {abort.message}")
            return "aborted"
    return "gave up"


# --------------------------------------------------------------------------
# Plumbing for --start
# --------------------------------------------------------------------------


@contextlib.contextmanager
def local_stack(config: dict):
    """A temporary broker and a worker; yields the bootstrap address."""
    from streams.tools.broker import LocalBroker
    from streams.kafka.topics import Topics
    from streams.kafka.topics import ensure_topics

    workdir = Path(tempfile.mkdtemp(prefix="loopwarden-demo-"))
    config_path = workdir / "demo.json"
    config_path.write_text(json.dumps(config))
    with LocalBroker() as broker:
        ensure_topics(broker.bootstrap, Topics(partitions=3))
        log = open(workdir / "worker.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streams.cli",
                "worker",
                "--bootstrap",
                broker.bootstrap,
                "--config",
                str(config_path),
                "--data-dir",
                str(workdir / "data"),
                "--standby-replicas",
                "0",
                "--app-id",
                f"demo-{uuid.uuid4().hex[:6]}",
                "--partitions",
                "3",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        print(f"started a broker at {broker.bootstrap} and a worker (log: {workdir / 'worker.log'})")
        try:
            yield broker.bootstrap
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
            log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("LOOPWARDEN_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--start", action="store_true", help="start a local broker and a worker for the demo")
    parser.add_argument("--local-hashing", action="store_true", help="send only hashes, never args or results")
    parser.add_argument("--policy", choices=("fail_open", "fail_closed"), default="fail_open")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each verdict")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

    try:
        security = PLAINTEXT if args.start else security_from()
    except SecurityError as exc:
        print(f"security settings: {exc}", file=sys.stderr)
        return 2
    stack = local_stack(DEMO_CONFIG) if args.start else contextlib.nullcontext(args.bootstrap)
    with stack as bootstrap:
        with GuardClient(
            bootstrap, timeout=args.timeout, policy=args.policy, local_hashing=args.local_hashing, security=security
        ) as client:
            if args.start:  # the first verdict waits out the worker's start-up
                started = time.monotonic()
                warm = client.check(
                    client.tool_call(f"warmup-{uuid.uuid4().hex[:6]}", "read", {"path": "x"}), timeout=90
                )
                print(f"worker answering after {time.monotonic() - started:.1f}s ({warm.decision})\n")
            run_id = f"demo-{uuid.uuid4().hex[:8]}"
            print(f"run {run_id} (local hashing {'on' if args.local_hashing else 'off'}, policy {args.policy})")
            outcome = agent(client, run_id)
            client.run_end(run_id)
            print(f"\nrun {run_id}: {outcome}; client stats: {dict(client.stats)}")
            print(f"explain it:  loopwarden explain {run_id} --bootstrap {bootstrap}")
    return 0 if outcome == "aborted" else 1


if __name__ == "__main__":
    sys.exit(main())
