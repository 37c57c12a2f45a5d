"""Throughput of one `loopwarden worker` (not collected by pytest).

Publishes a synthetic trace (interleaved runs, every detector) to fresh
topics, starts one worker subprocess on them, waits for every verdict, and
prints the rate from the first to the last verdict (broker timestamps), the
worker's CPU time while processing, and whether the verdicts equal `replay`.

    python bench/worker_bench.py --bootstrap 127.0.0.1:9092 --runs 2000
    python bench/worker_bench.py --bootstrap 127.0.0.1:9092 --runs 2000 --guarantee exactly_once

Without --bootstrap a temporary local broker is started (and stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

# the same worker harness the integration tests drive
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import Worker, by_run, consume, make_trace, names, produce, reference, values, write_config  # noqa: E402

from streams.kafka.topics import Topics  # noqa: E402
from streams.kafka.topics import ensure_topics  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a running broker (default: start a temporary one)")
    parser.add_argument("--runs", type=int, default=2000, help="runs of ~25 events each (default 2000)")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--guarantee", default="at_least_once", choices=("at_least_once", "exactly_once"))
    parser.add_argument("worker_args", nargs="*", help="extra `loopwarden worker` options (after --)")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from streams.tools.broker import LocalBroker

            bootstrap = stack.enter_context(LocalBroker()).bootstrap
        work = Path(tempfile.mkdtemp(prefix="loopwarden-bench-"))
        config = write_config(work)
        lines = make_trace(args.runs, 25)
        expected = reference(lines, config)
        topics = names("bench")
        ensure_topics(
            bootstrap,
            Topics(
                events=topics["events"],
                decisions=topics["decisions"],
                deadletter=topics["deadletter"],
                partitions=args.partitions,
            ),
        )
        started = time.monotonic()
        produce(bootstrap, topics["events"], lines)
        print(f"published {len(lines)} events in {time.monotonic() - started:.1f}s; expecting {len(expected)} verdicts")
        worker = Worker(
            bootstrap,
            topics,
            work,
            "worker",
            config=config,
            partitions=args.partitions,
            extra=["--processing-guarantee", args.guarantee, "--stats-interval", "60s", *args.worker_args],
        )
        with worker:
            worker.wait_assigned(120)
            cpu_before = cpu_seconds(worker.proc.pid)  # type: ignore[union-attr]
            records = consume(bootstrap, topics["decisions"], count=len(expected), timeout=1200)
            cpu = cpu_seconds(worker.proc.pid) - cpu_before  # type: ignore[union-attr]
        stamps = sorted(r.timestamp for r in records)
        span = (stamps[-1] - stamps[0]) / 1000 if len(stamps) > 1 else float("nan")
        same = by_run(values(records)) == by_run(expected)
        print(
            f"guarantee={args.guarantee} events={len(lines)} verdicts={len(records)} "
            f"first->last verdict={span:.1f}s rate={len(lines) / span:.0f} events/s "
            f"worker cpu={cpu:.1f}s ({len(lines) / cpu:.0f} events per cpu-second) equal_to_replay={same}"
        )
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
