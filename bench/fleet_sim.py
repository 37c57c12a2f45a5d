"""Fleet simulation: many gateways, each reading only its reply partition,
against real `loopwarden worker`s, with what the gateways see measured.

    python -m bench.fleet_sim [--gateways 200] [--processes 2] [--rate 2000] [--seconds 60]
                              [--workers 2] [--nodes 1|3] [--kill-leader-at S] [--check] [--out FILE]

Starts a local broker (`--nodes 1`) or a three-node cluster (`--nodes 3`),
unless --bootstrap names one; makes the topics (the decisions topic with one
partition per gateway); starts `--workers` workers; then runs the gateways
(bench/fleet_gateways.py) in `--processes` processes for `--seconds`, at
about `--rate` tool calls a second in all. Measured in the same run:

- the verdict latency each call saw (publish to verdict read, same clock),
  its p50/p99/max, and the calls that got no verdict within `--timeout`;
- the brokers' bytes: "in" is what the run's topics grew by in the brokers'
  log segments (record batches as stored, one replica: each partition's
  largest copy over the brokers' log dirs); "out" is what
  consumers fetch: the events once (the workers), the verdicts once (each
  gateway reads only its partition; counted on the gateway side, keys and
  values), and the followers' copies, (replication factor - 1) x in;
- each worker's CPU (user + system, /proc/PID/stat) per window, in cores,
  and the gateway processes' own CPU over the run (all of them, in cores).

With `--kill-leader-at S` (a cluster) the broker leading most of the events
and decisions partitions is SIGKILLed S seconds in, and the figures are
reported before, during (from the kill until every partition has a live
leader, plus `--window` seconds) and after. `--check` compares every verdict
the gateways read with `loopwarden replay` of the events they published.
"""

from __future__ import annotations

import argparse
import dataclasses
import concurrent.futures
import io
import json
import math
import multiprocessing
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.fleet_gateways import Outcome, Share, published
from bench.leaders import busiest_leader, wait_leaders
from bench.pipeline import common
from bench.stats import percentile

EVENTS_PER_CALL = 2.1  # the fleet trace's events per tool call (results, compactions, run ends)


# -- what the brokers stored ---------------------------------------------------


def log_bytes(log_dirs: Sequence[Path], prefix: str) -> dict[str, int]:
    """Topic -> bytes of its log segments, for the topics named ``prefix``…:
    each partition's largest copy over ``log_dirs`` (the leader's, or the
    surviving one's when a broker was killed), so one replica is counted."""
    largest: dict[str, int] = {}
    for log_dir in log_dirs:
        for part in log_dir.glob(f"{prefix}*-*"):
            size = sum(f.stat().st_size for f in part.glob("*.log"))
            largest[part.name] = max(largest.get(part.name, 0), size)
    sizes: dict[str, int] = {}
    for name, size in largest.items():
        topic = name.rpartition("-")[0]
        sizes[topic] = sizes.get(topic, 0) + size
    return sizes


# -- worker CPU ---------------------------------------------------------------------


class CpuSampler:
    """(wall time, CPU seconds per worker) once a second, in a thread."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.samples: list[tuple[float, list[float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), [common.cpu_seconds(pid) for pid in self.pids]))
            self._stop.wait(1.0)

    def share(self, start: float, end: float) -> list[float]:
        """Each worker's CPU over [start, end), in cores (1.0 = one core busy)."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return [math.nan] * len(self.pids)
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return [round((b - a) / (t1 - t0), 2) for a, b in zip(c0, c1, strict=True)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


# -- figures ------------------------------------------------------------------------


def window(name: str, calls: Sequence[tuple[float, float | None]], start: float, end: float, cpu: CpuSampler) -> dict:
    """The figures of the calls published in [start, end)."""
    inside = [latency for sent, latency in calls if start <= sent < end]
    answered = [latency for latency in inside if latency is not None]
    return {
        "window": name,
        "seconds": round(end - start, 1),
        "calls": len(inside),
        "calls_per_s": round(len(inside) / (end - start), 1) if end > start else math.nan,
        "p50_ms": round(percentile(answered, 0.50) * 1000, 1),
        "p99_ms": round(percentile(answered, 0.99) * 1000, 1),
        "max_ms": round(max(answered) * 1000, 1) if answered else math.nan,
        "timeouts": len(inside) - len(answered),
        "worker_cpu": cpu.share(start, end),
    }


def longest_gap(calls: Sequence[tuple[float, float | None]]) -> float:
    """The longest time between two consecutive verdicts the fleet read, in seconds."""
    answers = sorted(sent + latency for sent, latency in calls if latency is not None)
    return max((b - a for a, b in zip(answers, answers[1:], strict=False)), default=math.nan)


def replay_matches(share: Share, outcome: Outcome) -> dict[str, int]:
    """The gateways' verdicts against `loopwarden replay` of the events they published."""
    from schemas.configfile import load_config
    from streams.tools.replay import replay

    out = io.BytesIO()
    replay(published(share, outcome), load_config(None).config, out, io.StringIO())
    want = {_ident(line): line for line in out.getvalue().splitlines()}
    got = {_ident(line): line for line in outcome.lines}
    return {
        "replay_verdicts": len(want),
        "missing": sum(1 for ident in want if ident not in got),
        "different": sum(1 for ident, line in want.items() if ident in got and got[ident] != line),
        "unexpected": sum(1 for ident in got if ident not in want),
    }


def _ident(line: bytes) -> tuple[str, int]:
    verdict = msgspec.json.decode(line)
    return verdict["run_id"], verdict["seq"]


def merge(outcomes: Sequence[Outcome]) -> Outcome:
    total = Outcome()
    for o in outcomes:
        total.calls += o.calls
        total.published.update(o.published)
        total.lines += o.lines
        for name in ("sent_bytes", "read_bytes", "verdicts", "duplicates", "late", "publish_failed", "cpu_seconds"):
            setattr(total, name, getattr(total, name) + getattr(o, name))
    return total


# -- the run ------------------------------------------------------------------------


def simulate(
    args: argparse.Namespace, bootstrap: str, cluster: Any, names: dict[str, str], worker_pids: list[int]
) -> dict[str, Any]:
    calls = args.rate * args.seconds
    events = int(calls * EVENTS_PER_CALL * 1.5) + 100 * args.gateways
    runs = max(args.gateways * args.slots * 2, events // 40)
    events = max(events, runs * 40)  # the trace's runs are about 40 events long
    context = multiprocessing.get_context("spawn")
    manager = context.Manager()
    ready, start = manager.Queue(), manager.Queue()
    shares = [
        Share(
            bootstrap=bootstrap,
            events_topic=names["events"],
            decisions_topic=names["decisions"],
            gateways=range(p, args.gateways, args.processes),
            fleet=args.gateways,
            trace_runs=runs,
            trace_events=events,
            seed=args.seed,
            slots=args.slots,
            think=args.gateways * args.slots / args.rate,
            timeout=args.timeout,
            ready=ready,
            start=start,
            seconds=args.seconds,
            settle=args.settle,
            keep_verdicts=args.check,
            idempotent=args.nodes > 1,
        )
        for p in range(args.processes)
    ]
    cpu = CpuSampler(worker_pids)
    failover: dict[str, Any] = {}
    with manager, concurrent.futures.ProcessPoolExecutor(args.processes, mp_context=context) as pool:
        futures = [pool.submit(_run_share, share) for share in shares]
        for _ in shares:  # each process made its share of the trace and positioned its readers
            _wait_ready(ready, futures)
        start_at = time.time() + 1.0
        for _ in shares:
            start.put(start_at)
        if args.kill_leader_at is not None:
            failover = kill_leader(cluster, names, start_at + args.kill_leader_at)
        outcome = merge([f.result() for f in futures])
    cpu.close()
    end = start_at + args.seconds
    rows = [window("whole run", outcome.calls, start_at, end, cpu)]
    if failover:
        killed, served = failover["killed_at"], failover["leaders_back_at"]
        after = served + args.window
        rows += [
            window("before", outcome.calls, start_at, killed, cpu),
            window("during", outcome.calls, killed, after, cpu),
            window("after", outcome.calls, after, end, cpu),
        ]
    result: dict[str, Any] = {
        "windows": rows,
        "verdicts": outcome.verdicts,
        "duplicates": outcome.duplicates,
        "late": outcome.late,
        "publish_failed": outcome.publish_failed,
        "longest_gap_s": round(longest_gap(outcome.calls), 2),
        "gateway_cpu": round(outcome.cpu_seconds / args.seconds, 2),
        "gateway_sent_bytes": outcome.sent_bytes,
        "gateway_read_bytes": outcome.read_bytes,
    }
    if failover:
        result["failover"] = {k: v for k, v in failover.items() if not k.endswith("_at")} | {
            "kill_s": round(failover["killed_at"] - start_at, 1),
            "failover_window_s": round(failover["leaders_back_at"] - failover["killed_at"], 2),
        }
    if args.check:
        whole = dataclasses.replace(shares[0], gateways=range(args.gateways))
        result["check"] = replay_matches(whole, outcome) | {"gateways_verdicts": len(outcome.lines)}
    return result


def _wait_ready(ready: Any, futures: Sequence[concurrent.futures.Future[Outcome]]) -> None:
    """One process's ready message; a process that failed first raises its error here."""
    import queue

    while True:
        try:
            ready.get(timeout=1.0)
            return
        except queue.Empty:
            for future in futures:
                if future.done():
                    future.result()
                    raise RuntimeError("a gateway process ended before it was ready") from None


def _run_share(share: Share) -> Outcome:
    from bench.fleet_gateways import run

    return run(share)


def kill_leader(cluster: Any, names: dict[str, str], at: float) -> dict[str, Any]:
    """SIGKILL the broker leading most events and decisions partitions at ``at``;
    return when, and when every partition of both had a live leader again."""
    time.sleep(max(0.0, at - time.time()))
    topics = [names["events"], names["decisions"]]
    node = busiest_leader(cluster, topics)
    killed_at = time.time()
    cluster.kill(node)
    return {"killed_node": node, "killed_at": killed_at, "leaders_back_at": wait_leaders(cluster, topics, without=node)}


def bytes_per_verdict(before: dict[str, int], after: dict[str, int], replication: int, verdicts: int, names) -> dict:
    grown = {topic: after.get(topic, 0) - before.get(topic, 0) for topic in after}
    stored = sum(grown.values())
    fetched = grown.get(names["events"], 0) + grown.get(names["decisions"], 0) + (replication - 1) * stored
    per = max(1, verdicts)
    return {
        "log_bytes_by_topic": grown,
        "broker_in_per_verdict": round(stored / per),
        "broker_out_per_verdict": round(fetched / per),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--bootstrap", help="a running broker (default: start --nodes of them)")
    p.add_argument("--log-dir", type=Path, action="append", default=[], help="its log dirs, for the bytes in")
    p.add_argument("--nodes", type=int, default=1, choices=(1, 3), help="brokers to start (default 1)")
    p.add_argument("--gateways", type=int, default=200)
    p.add_argument("--processes", type=int, default=2, help="gateway processes (default 2)")
    p.add_argument("--slots", type=int, default=8, help="runs each gateway plays at once (default 8)")
    p.add_argument("--rate", type=float, default=2000, help="tool calls a second in all, aimed at (default 2000)")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--settle", type=float, default=3, help="seconds the readers go on after the last call")
    p.add_argument("--timeout", type=float, default=5, help="a gateway's verdict timeout (default 5 s)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--partitions", type=int, default=12, help="events topic partitions (default 12)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kill-leader-at", type=float, help="seconds in: SIGKILL the busiest leader (--nodes 3)")
    p.add_argument("--window", type=float, default=10, help="seconds after the leaders are back still 'during'")
    p.add_argument("--check", action="store_true", help="compare every verdict read with replay's")
    p.add_argument("--out", type=Path, help="write the record (JSON) here too")
    args = p.parse_args(argv)
    if args.kill_leader_at is not None and (args.nodes < 3 or args.bootstrap):
        p.error("--kill-leader-at needs a cluster this command starts (--nodes 3)")
    workdir = common.workdir("fleet")
    with brokers(args, workdir) as (bootstrap, cluster, log_dirs, replication):
        names = common.topic_names("fleet")
        common.create_topics(bootstrap, names, args.partitions, args.gateways)
        before = log_bytes(log_dirs, names["app_id"])
        extra = ["--tenant-refresh", "0"]
        workers = [
            common.worker(bootstrap, names, workdir, f"worker{i}", args.partitions, extra) for i in range(args.workers)
        ]
        for w in workers:
            w.start()
        try:
            for w in workers:
                w.wait_log("event=ready")
            result = simulate(args, bootstrap, cluster, names, [w.pid for w in workers])
        finally:
            for w in workers:
                w.stop()
                shutil.rmtree(workdir / f"{Path(w.log_path).stem}-data", ignore_errors=True)  # the logs stay
        after = log_bytes(log_dirs, names["app_id"])
    if log_dirs:
        result |= bytes_per_verdict(before, after, replication, result["verdicts"], names)
    result["names"] = names
    result["worker_logs"] = str(workdir)
    report(args, result)
    check = result.get("check", {})
    wrong = check.get("missing", 0) + check.get("different", 0) + check.get("unexpected", 0)
    return 0 if result["windows"][0]["calls"] and not wrong else 1


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    rows = result["windows"]
    print(common.table(rows, list(rows[0])))
    skip = {"windows", "log_bytes_by_topic", "names"}
    for key, value in result.items():
        if key not in skip:
            print(f"{key}: {json.dumps(value)}")
    record = {"figure": "fleet_sim", "argv": sys.argv, "args": {k: str(v) for k, v in vars(args).items()}, **result}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))


class brokers:
    """The broker(s) of the run: (bootstrap, cluster or None, log dirs, replication factor)."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self._broker: Any = None

    def __enter__(self) -> tuple[str, Any, list[Path], int]:
        if self.args.bootstrap:
            return self.args.bootstrap, None, self.args.log_dir, 1
        from streams.tools.broker import KRAFT_DIR, LocalBroker
        from streams.tools.cluster import LocalCluster

        if self.args.nodes == 1:
            self._broker = LocalBroker(data_dir=self.workdir / "broker", quick_jit=False, heap="768m").start()
            return self._broker.bootstrap, None, [self.workdir / "broker" / KRAFT_DIR], 1
        self._broker = LocalCluster(self.workdir / "cluster", self.args.nodes, quick_jit=False).start()
        dirs = [self.workdir / "cluster" / f"node-{n}" / KRAFT_DIR for n in self._broker.nodes]
        return self._broker.bootstrap, self._broker, dirs, min(3, self.args.nodes)

    def __exit__(self, *exc: object) -> None:
        if self._broker is not None:
            self._broker.stop(remove_data=True)


if __name__ == "__main__":
    sys.exit(main())
