"""State: worker RSS and RocksDB size per 100,000 active runs.

    python -m bench.pipeline.state --runs 100000 --calls 1 [--bootstrap HOST:PORT]
    python -m bench.pipeline.state --runs 5000 --calls 40      # histories full (historySize 30)

Publishes ``--calls`` tool_call/tool_result pairs for each of ``--runs`` runs
(all runs open at once: every run's first call, then every run's second ...;
varied healthy ``read`` calls, so the default config allows them all and
each call enters the run's history), runs one worker with default settings
(--standby-replicas 0) until every verdict is out, then reports: the
worker's RSS growth over its idle size after assignment (a high-water
mark: the chunks in flight while every run was busy), the RSS of a worker
started afresh on the same data once the first stopped (the runs held, no
event in flight), the RocksDB data
directory on disk (while running; after a clean stop, which flushes the
memtables; and after a full compaction of the stopped worker's databases,
which drops the overwritten versions of each run), the encoded run states (msgpack ``StoredRun``, what RocksDB and
the changelog store per run, computed offline with the same engine), each
scaled to 100,000 runs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from bench.pipeline import common as c


def trace(runs: int, calls: int) -> list[tuple[bytes, bytes]]:
    enc = msgspec.json.Encoder()
    out = []
    for k in range(calls):
        for i in range(runs):
            run = f"st-{i:07d}"
            call = {
                "type": "tool_call",
                "run_id": run,
                "seq": 2 * k + 1,
                "tool_call_id": f"call_{i:07d}_{k}",
                "tool_name": ("read", "exec", "web_fetch", "edit")[k % 4],
                "args": {"path": f"src/pkg{i % 211}/module{k}.py", "offset": k * 10, "limit": 2000},
            }
            result = {
                "type": "tool_result",
                "run_id": run,
                "seq": 2 * k + 2,
                "tool_call_id": call["tool_call_id"],
                "tool_name": call["tool_name"],
                "result": {"content": [{"type": "text", "text": f"contents of module {k} of run {i} " * 4}]},
            }
            out.append((run.encode(), enc.encode(call)))
            out.append((run.encode(), enc.encode(result)))
    return out


def offline_state_bytes(messages: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """(total encoded StoredRun bytes, runs) after applying every event."""
    from schemas.state import StoredRun
    from schemas.codec import encode_stored
    from schemas.codec import decode_event
    from schemas.configfile import load_config
    from streams.engine import apply

    config = load_config(None).config
    states: dict[str, object] = {}
    for _key, value in messages:
        event = decode_event(value)
        states[event.run_id] = apply(states.get(event.run_id), event, config).state
    total = sum(len(encode_stored(StoredRun(time.time(), s))) for s in states.values())  # type: ignore[arg-type]
    return total, len(states)


def compact(data: Path) -> None:
    """Compact every RocksDB database under ``data`` (the worker stopped):
    what the store settles at once RocksDB has dropped overwritten versions."""
    import rocksdict

    for current in data.rglob("CURRENT"):
        db = rocksdict.Rdict(str(current.parent), options=rocksdict.Options(raw_mode=True))
        try:
            db.compact_range(None, None)
        finally:
            db.close()


def main() -> int:
    p = c.parser(__doc__)
    p.add_argument("--runs", type=int, default=100000)
    p.add_argument("--calls", type=int, default=1, help="tool calls per run (default 1)")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("worker_args", nargs="*", help="extra `loopwarden worker` options (after --)")
    args = p.parse_args()
    messages = trace(args.runs, args.calls)
    expected = args.runs * args.calls
    encoded, runs = offline_state_bytes(messages)
    per = 100000 / args.runs
    rows = []
    with c.broker(args.bootstrap) as bootstrap:
        for _ in range(args.repeat):
            names = c.topic_names("state")
            c.create_topics(bootstrap, names, args.partitions)
            asyncio.run(c.produce_all(bootstrap, names["events"], messages))
            work = c.workdir("state")
            w = c.worker(bootstrap, names, work, "w0", args.partitions, args.worker_args)
            data = work / "w0-data"
            with w:
                w.wait_log("event=assigned", 180)
                time.sleep(1.0)
                rss0 = c.rss_bytes(w.pid)
                disk0 = c.dir_bytes(data)
                out = asyncio.run(c.collect(bootstrap, names["decisions"], expected, timeout=args.timeout))
                time.sleep(3.0)  # the last chunk's table writes
                rss1 = c.rss_bytes(w.pid)
                disk1 = c.dir_bytes(data)
            disk2 = c.dir_bytes(data)
            # The same runs, held by a worker started afresh on that data
            # dir: what they cost in memory once no event is in flight.
            with c.worker(bootstrap, names, work, "w0", args.partitions, args.worker_args) as again:
                again.wait_log("event=assigned", 180, count=2)
                time.sleep(3.0)
                rss2 = c.rss_bytes(again.pid)
            compact(data)
            disk3 = c.dir_bytes(data)
            span, rate = c.span_rate([t for t, _ in out], len(messages))
            rows.append(
                {
                    "runs": args.runs,
                    "calls_per_run": args.calls,
                    "verdicts": len(out),
                    "events_per_s": rate,
                    "rss_idle_mb": rss0 / 1e6,
                    "rss_after_mb": rss1 / 1e6,
                    "rss_per_100k_runs_mb": (rss1 - rss0) * per / 1e6,
                    "rss_restarted_mb": rss2 / 1e6,
                    "rss_restarted_per_100k_runs_mb": (rss2 - rss0) * per / 1e6,
                    "rocksdb_running_mb": (disk1 - disk0) / 1e6,
                    "rocksdb_stopped_mb": disk2 / 1e6,
                    "disk_per_run_bytes_running": (disk1 - disk0) / args.runs,
                    "disk_per_run_bytes_stopped": disk2 / args.runs,
                    "rocksdb_compacted_mb": disk3 / 1e6,
                    "disk_per_run_bytes_compacted": disk3 / args.runs,
                    "encoded_state_per_run_bytes": encoded / runs,
                }
            )
            print(c.table(rows[-1:], list(rows[-1])), flush=True)
    summary = {k: c.median([r[k] for r in rows]) for k in rows[0] if isinstance(rows[0][k], float)}
    print("\nmedians:")
    print(c.table([summary], list(summary)))
    c.record("state", args, {"runs": rows, "median": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
