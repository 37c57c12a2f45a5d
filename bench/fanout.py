"""Fan-out of the decision topic: how many verdict bytes the gateways read, for each byte the worker produced.

    python -m bench.fanout [--clients 50] [--runs 2] [--calls 10] [--decisions-partitions 64] [--out FILE]

Starts a local broker (unless --bootstrap) and one real `loopwarden worker`,
then runs `--clients` `GuardClient`s at once, each in a thread with runs of
its own (`guard` then `tool_result`, a looping command, so every decision
appears), twice: every client reading the whole decision topic (no reply
partition: the behaviour before reply routing), and every client naming its
own reply partition (client i reads partition i mod `--decisions-partitions`).
For each mode: the bytes (keys and values) the clients read from the
decision topic (`stats["read_bytes"]`), the bytes of the verdicts the worker
produced there in that mode, and their ratio. docs/SCALING.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.pipeline import common
from streams.kafka.clients import PLAINTEXT
from streams.kafka.reader import TopicReader
from streams.client import GuardClient

MODES = ("whole_topic", "reply_partition")


def _drive(client: GuardClient, prefix: str, runs: int, calls: int, failures: list[str]) -> None:
    for r in range(runs):
        run_id = f"{prefix}-run{r}"
        for _ in range(calls):
            call, verdict = client.guard(run_id, "exec", {"command": "make test"})
            if verdict.fallback is not None:
                failures.append(f"{run_id} seq {call.seq}: {verdict.fallback_reason}")
            if verdict.allowed:
                client.tool_result(call, result={"content": [{"type": "text", "text": "FAIL"}]})
        client.run_end(run_id)


def topic_bytes(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records, key + value bytes) of a whole topic, read without a group."""
    records = size = 0
    with TopicReader(bootstrap, "loopwarden-bench", PLAINTEXT) as reader:
        for record in reader.whole(topic):
            records += 1
            size += len(record.value or b"") + len(record.key or b"")
    return records, size


def measure(
    bootstrap: str, names: dict[str, str], mode: str, clients: int, runs: int, calls: int, partitions: int
) -> dict[str, Any]:
    """One mode on fresh decisions bytes: the worker's output before and after, the clients' reads."""
    _, before = topic_bytes(bootstrap, names["decisions"])
    tag = uuid.uuid4().hex[:6]
    gateways = [
        GuardClient(
            bootstrap,
            events_topic=names["events"],
            decisions_topic=names["decisions"],
            timeout=60,
            reply_partition=i % partitions if mode == "reply_partition" else None,
        ).start()
        for i in range(clients)
    ]
    failures: list[str] = []
    try:
        threads = [
            threading.Thread(target=_drive, args=(g, f"{mode}-{tag}-g{i}", runs, calls, failures))
            for i, g in enumerate(gateways)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        time.sleep(2.0)  # the readers take what is left of the topic
    finally:
        for gateway in gateways:
            gateway.close()
    records, after = topic_bytes(bootstrap, names["decisions"])
    produced = after - before
    read = sum(g.stats["read_bytes"] for g in gateways)
    return {
        "mode": mode,
        "clients": clients,
        "verdicts": sum(g.stats["verdicts"] for g in gateways),
        "produced_bytes": produced,
        "read_bytes": read,
        "ratio": round(read / produced, 2) if produced else None,
        "fallbacks": len(failures),
        "seconds": round(elapsed, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__)
    p.add_argument("--bootstrap", help="a running broker (default: start a temporary one)")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--runs", type=int, default=2, help="runs per client (default 2)")
    p.add_argument("--calls", type=int, default=10, help="calls per run (default 10)")
    p.add_argument("--partitions", type=int, default=12, help="events topic partitions (default 12)")
    p.add_argument("--decisions-partitions", type=int, default=64, help="decision topic partitions (default 64)")
    p.add_argument("--out", type=Path, help="write the record (JSON) here too")
    args = p.parse_args(argv)
    config = common.workdir("fanout")
    (config / "loopwarden.json").write_text(
        json.dumps({"tools": {"loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}}})
    )
    rows = []
    with common.broker(args.bootstrap) as bootstrap:
        names = common.topic_names("fanout")
        common.create_topics(bootstrap, names, args.partitions, args.decisions_partitions)
        extra = ["--config", str(config / "loopwarden.json"), "--tenant-refresh", "0"]
        with common.worker(bootstrap, names, config, "worker", args.partitions, extra) as worker:
            worker.wait_log("event=ready")
            for mode in MODES:
                rows.append(
                    measure(bootstrap, names, mode, args.clients, args.runs, args.calls, args.decisions_partitions)
                )
    print(common.table(rows, list(rows[0])))
    record = {"figure": "fanout", "args": vars(args) | {"out": str(args.out)}, "results": rows}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    return 0 if all(row["fallbacks"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
