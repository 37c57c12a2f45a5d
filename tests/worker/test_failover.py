"""A replicated cluster loses a broker mid-stream: what the gateways see.

Three brokers (the session's cluster), two workers and the fleet stage;
gateways play examples/fleet-trace.jsonl at a steady pace, each run waiting
for its call's verdict (or its 5 s timeout) before going on, each gateway
reading its own reply partition. While they play: the broker leading most
events and decisions partitions is SIGKILLed, the stage is SIGKILLed and
restarted, the broker is started again, then a worker is SIGKILLed.

Afterwards every run's verdicts on the decision topic are replay's (none
lost, none conflicting), the gateways read all of them, and the stage's
incidents, deduplicated, are what `loopwarden incidents` prints. Each fault
has a window, measured here: the broker's from the kill until every
partition the pipeline uses has a live leader, the worker's from the kill
until the other worker has all partitions and is ready. No call published
after a window closed may time out. The figures (timeouts, longest gap
between verdicts, the windows) are printed (visible with -s) as one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fleet_gateways import Outcome, Share, published, run
from bench.fleet_sim import longest_gap
from bench.leaders import busiest_leader, wait_leaders
from builders import run_cli
from helpers import FleetStage, Worker, by_run, consume, dedupe_key, incidents_until, names, reference
from streams.kafka.topics import Topics
from streams.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet-trace.jsonl"
CONFIG = ROOT / "examples" / "loopwarden.json5"
GATEWAYS = 6
PARTITIONS = 4
TIMEOUT = 5.0  # the gateways' verdict timeout (the client's default)


@contextlib.contextmanager
def logs_kept(cluster, logs: Path) -> Iterator[None]:
    """On a failure, the brokers' logs are copied next to the workers' and the stage's, and the directory named."""
    try:
        yield
    except BaseException as exc:
        for node_id, node in cluster.nodes.items():
            with contextlib.suppress(OSError):
                shutil.copy(node.log_file, logs / f"broker-{node_id}.log")
        raise AssertionError(f"{exc}\n(broker, worker and stage logs kept in {logs})") from exc


def until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def taken_over(survivor: Worker, readies: int) -> bool:
    """The surviving worker was given every partition and said it was ready since."""
    assigned = survivor.assignments()
    return len(survivor.lines("ready")) > readies and bool(assigned) and assigned[-1] == set(range(PARTITIONS))


def test_a_broker_a_stage_and_a_worker_killed_mid_stream_lose_no_verdict(cluster, tmp_path: Path) -> None:
    lines = FLEET.read_bytes().splitlines()
    t = names("failover")
    topics = Topics(t["events"], t["decisions"], t["deadletter"], partitions=PARTITIONS, decisions_partitions=GATEWAYS)
    ensure_topics(cluster.bootstrap, topics)
    offline = run_cli("--config", str(CONFIG), str(FLEET), command="incidents")
    assert offline.returncode == 0, offline.stderr
    wanted = {dedupe_key(line) for line in offline.stdout.splitlines()}
    share = Share(
        bootstrap=cluster.bootstrap,
        events_topic=t["events"],
        decisions_topic=t["decisions"],
        gateways=range(GATEWAYS),
        fleet=GATEWAYS,
        trace_runs=0,
        trace_events=0,
        seed=0,
        slots=8,  # every run of a gateway at once
        think=2.0,
        timeout=TIMEOUT,
        ready=queue.Queue(),
        start=queue.Queue(),
        seconds=600,
        settle=3.0,
        keep_verdicts=True,
        idempotent=True,
        lines=lines,
    )
    workers = [Worker(cluster.bootstrap, t, tmp_path, name, config=CONFIG, partitions=PARTITIONS) for name in "ab"]
    stage = FleetStage(cluster.bootstrap, t, tmp_path, "fleet")
    outcome: list[Outcome] = []
    gateways = threading.Thread(target=lambda: outcome.append(run(share)), daemon=True)
    faults: list[dict] = []
    with logs_kept(cluster, tmp_path):
        try:
            for process in (*workers, stage):
                process.start()
            for process in (*workers, stage):
                process.wait_for(lambda p=process: p.lines("ready"), 120, "ready")
            gateways.start()
            share.ready.get(timeout=120)
            start = time.time() + 0.5
            share.start.put(start)
            # the broker leading most events and decisions partitions
            until(start + 10)
            node = busiest_leader(cluster, [t["events"], t["decisions"]])
            killed = time.time()
            cluster.kill(node)
            used = [t["events"], t["decisions"], f"{t['app_id']}-runs-changelog", "__consumer_offsets"]
            faults.append(
                {"fault": f"SIGKILL broker {node}", "at": killed, "until": wait_leaders(cluster, used, without=node)}
            )
            # the stage, once
            until(killed + 5)
            stage.stop(signal.SIGKILL)
            stage = FleetStage(cluster.bootstrap, t, tmp_path, "fleet").start()
            # the broker back
            until(killed + 15)
            back = time.time()
            cluster.restart(node)
            faults.append({"fault": f"restart broker {node}", "at": back, "until": time.time()})
            # a worker
            until(back + 5)
            readies = len(workers[1].lines("ready"))
            gone = time.time()
            workers[0].stop(signal.SIGKILL)
            workers[1].wait_for(lambda: taken_over(workers[1], readies), 120, "every partition, ready")
            faults.append({"fault": "SIGKILL worker a", "at": gone, "until": time.time()})
            gateways.join(300)
            assert outcome, "the gateways finished their runs"
            records = incidents_until(cluster.bootstrap, t["incidents"], wanted, 120)
        finally:
            for process in (*workers, stage):
                if process.proc is not None and process.proc.poll() is None:
                    process.stop(signal.SIGKILL)
        played = outcome[0]
        sent = published(share, played)
        assert len(sent) == len(lines), "every event of the trace was published"
        expected = reference(sent, CONFIG)
        on_topic = [
            r.value for r in consume(cluster.bootstrap, t["decisions"], count=len(expected), timeout=60, settle=2)
        ]
        first: dict[tuple[str, int], bytes] = {}
        conflicting = 0
        for line in on_topic:
            conflicting += first.setdefault(_ident(line), line) != line
        want = {_ident(line): line for line in expected}
        lost = [ident for ident in want if ident not in first]
        assert not lost and not conflicting, f"lost {lost[:5]} ({len(lost)}), conflicting {conflicting}"
        assert first == want, "the decision topic holds exactly replay's verdicts"
        assert by_run(on_topic) == by_run(expected), "each run's verdicts in replay's order"
        assert {_ident(line): line for line in played.lines} == want, "the gateways read every verdict"
        assert {dedupe_key(r) for r in records} == wanted, "the stage's incidents are the offline ones"
        timeouts = [sent for sent, latency in played.calls if latency is None]
        figures = {
            "calls": len(played.calls),
            "verdicts": len(want),
            "repeats": len(on_topic) - len(first),
            "timeouts": len(timeouts),
            "late": played.late,
            "max_latency_s": round(max(lat for _, lat in played.calls if lat is not None), 2),
            "longest_gap_s": round(longest_gap(played.calls), 2),
            "faults": [
                {"fault": f["fault"], "at_s": round(f["at"] - start, 1), "window_s": round(f["until"] - f["at"], 2)}
                for f in faults
            ],
            "timeouts_at_s": [round(sent - start, 1) for sent in sorted(timeouts)],
        }
        print(f"\nFAILOVER {json.dumps(figures)}")
        beyond = [
            round(sent - start, 1)
            for sent in timeouts
            if not any(f["at"] - TIMEOUT <= sent <= f["until"] for f in faults)
        ]
        assert not beyond, f"calls published outside every failover window timed out: {beyond}; {figures}"


def _ident(line: bytes) -> tuple[str, int]:
    verdict = json.loads(line)
    return verdict["run_id"], verdict["seq"]
