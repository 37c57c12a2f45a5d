"""Scraping `/metrics` from a running `loopwarden worker --web-port P` and
`loopwarden fleet --web-port P`."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from kafka.admin import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from schemas.topics import tenant_topics
from streams.kafka import clients as kafka_clients
from streams.tools.broker import free_port

from builders import unknown_tool_blocks
from emulated_worker import RealWorker, make_topics
from helpers import FleetStage, make_trace, names, produce
from schemas.codec import encode_verdict
from schemas.verdicts import Verdict
from streams.kafka.topics import Topics
from streams.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample-trace.jsonl"
SAMPLE_CONFIG = ROOT / "examples" / "loopwarden.json5"


def scrape(port: int) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, "", ""


def answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:  # not listening yet
        return False
    return True


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(values: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in values.items() if k == prefix or k.startswith(prefix + "{"))


def _other_addresses() -> list[str]:
    """This machine's addresses other than loopback (IPv4)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    found = {info[4][0] for info in infos}
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: the kernel picks the outgoing address
        found.add(probe.getsockname()[0])
    return sorted(a for a in found if not a.startswith("127."))


def assert_metrics_only_on_loopback(port: int) -> None:
    """`/metrics` and nothing of Faust's own (`/table/...` would show any run's
    history); and the port refuses connections on every other address."""
    for path in ("/table/runs/", "/table/runs/any-run/", "/router/", "/graph/", "/stats/"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
        assert refused.value.code == 404, path
    others = _other_addresses()
    if not others:
        pytest.skip("this machine has no address besides loopback")
    for address in others:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, port), timeout=5).close()


def test_worker_serves_metrics(broker, tmp_path):
    topics = make_topics(broker.bootstrap)
    port = free_port()
    with RealWorker(
        broker.bootstrap, topics, tmp_path, "--config", str(SAMPLE_CONFIG), "--web-port", str(port)
    ) as worker:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline:
            assert worker.alive(), worker.log_tail()
            try:
                status, content_type, body = scrape(port)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        assert status is not None, f"the worker's web server never answered on port {port}\n{worker.log_tail()}"
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        assert_metrics_only_on_loopback(port)

        lines = [line for line in SAMPLE.read_bytes().splitlines() if line.strip()]
        producer = kafka_clients.producer(broker.bootstrap, acks="all")
        for line in lines:
            producer.send(topics["events"], key=json.loads(line)["run_id"].encode(), value=line)
        producer.send(topics["events"], key=b"junk", value=b"not json")
        producer.flush()
        producer.close()

        deadline = time.monotonic() + 90
        values: dict[str, float] = {}
        while time.monotonic() < deadline:
            values = samples(scrape(port)[2])
            if (
                total(values, "loopwarden_events_total") >= len(lines)
                and total(values, "loopwarden_deadletter_total") >= 1
            ):
                break
            time.sleep(0.5)
        assert total(values, "loopwarden_events_total") == len(lines), values
        assert total(values, "loopwarden_verdicts_total") == 73
        assert (
            values[
                'loopwarden_verdicts_total{decision="abort",detector="compaction_loop_persisted",shadow_decision="none"}'
            ]
            >= 1
        )
        assert total(values, "loopwarden_deadletter_total") == 1
        assert values["loopwarden_event_processing_seconds_count"] >= len(lines)
        assert "loopwarden_active_runs" in values
        assert any(k.startswith("loopwarden_consumer_lag{") for k in values)


def lag_by_topic(text: str) -> dict[str, set[tuple[str, str]]]:
    """loopwarden_consumer_lag's series: topic -> {(tenant label, value)}."""
    found: dict[str, set[tuple[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "loopwarden_consumer_lag":
            for sample in family.samples:
                labels = sample.labels
                found.setdefault(labels["topic"], set()).add((labels["tenant"], str(int(sample.value))))
    return found


def test_consumer_lag_covers_every_tenants_events_topic(broker, tmp_path):
    """Two tenants' pairs on the broker, served by one worker: each tenant's
    events topic has its lag series, labelled with the tenant, beside the
    worker's own (tenant ""), and every one reads 0 once all is taken."""
    topics = make_topics(broker.bootstrap)
    tenants = [f"lag{uuid.uuid4().hex[:8]}" for _ in range(2)]
    pairs = {name: tenant_topics(name) for name in tenants}
    admin = kafka_clients.admin(broker.bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 3, 1) for pair in pairs.values() for topic in pair])
        port = free_port()
        with RealWorker(
            broker.bootstrap, topics, tmp_path, "--config", str(SAMPLE_CONFIG), "--web-port", str(port)
        ) as worker:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not answers(port):
                assert worker.alive(), worker.log_tail()
                time.sleep(0.5)
            lines = make_trace(runs=6, events_per_run=4, seed=31, prefix="lag")
            produce(broker.bootstrap, topics["events"], lines)
            for events, _ in pairs.values():
                produce(broker.bootstrap, events, lines)
            wanted = {topics["events"]: ""} | {pairs[name][0]: name for name in tenants}
            deadline = time.monotonic() + 90
            lag: dict[str, set[tuple[str, str]]] = {}
            while time.monotonic() < deadline:
                assert worker.alive(), worker.log_tail()
                lag = lag_by_topic(scrape(port)[2])
                if all(lag.get(topic) == {(tenant, "0")} for topic, tenant in wanted.items()):
                    break
                time.sleep(0.5)
            assert {topic: lag.get(topic) for topic in wanted} == {
                topic: {(tenant, "0")} for topic, tenant in wanted.items()
            }, worker.log_tail()
            assert set(lag) == set(wanted), lag
    finally:
        # Other tests' workers on this broker would serve them too.
        admin.delete_topics([topic for pair in pairs.values() for topic in pair])
        admin.close()


def test_fleet_stage_serves_metrics(broker, tmp_path):
    """Verdicts straight on the decision topic: four runs blocked on one
    unknown tool open an incident at two runs and update it at four; an allow
    is not counted; a record that is not a verdict is skipped. The page counts
    each, as the operator log reports them."""
    topics = names("fleet-metrics")
    ensure_topics(broker.bootstrap, Topics(topics["events"], topics["decisions"], topics["deadletter"], partitions=1))
    allowed = Verdict(run_id="r9", seq=1, tool_call_id="c", tool_name="nope", decision="allow", ts=1796187600.0)
    port = free_port()
    options = ["--min-runs", "2", "--web-port", str(port)]
    with FleetStage(broker.bootstrap, topics, tmp_path, "fleet", partitions=1, extra=options) as stage:
        stage.wait_for(lambda: answers(port), 90, f"a /metrics page on port {port}")
        status, content_type, body = scrape(port)
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        assert total(samples(body), "loopwarden_fleet_incidents_total") == 0
        assert_metrics_only_on_loopback(port)

        lines = [*unknown_tool_blocks(4), encode_verdict(allowed), b"not a verdict"]
        produce(broker.bootstrap, topics["decisions"], lines, keys=[b"r"] * len(lines))
        stage.wait_for(
            lambda: stage.lines("incident_update") and stage.lines("bad_verdict"), 90, "the update and the skip"
        )
        values = samples(scrape(port)[2])
    assert values['loopwarden_fleet_incidents_total{status="open"}'] == 1, values
    assert values['loopwarden_fleet_incidents_total{status="update"}'] == 1
    assert total(values, "loopwarden_fleet_verdicts_total") == 4
    assert values['loopwarden_fleet_verdicts_total{decision="block"}'] == 4
    assert values["loopwarden_fleet_bad_verdicts_total"] == 1


def test_fetches_are_held_while_events_stream_in_and_released_after(broker, tmp_path):
    """``loopwarden_fetch_held`` follows the stream: 1 while events arrive at two
    or more per --fetch-hold, 0 once they stop (the worker's own fetches, on a real broker)."""
    topics = make_topics(broker.bootstrap)
    port = free_port()
    lines = make_trace(400, 30)  # 12,000 events
    producer = kafka_clients.producer(broker.bootstrap, acks=1, enable_idempotence=False)
    with RealWorker(broker.bootstrap, topics, tmp_path, "--fetch-hold", "50ms", "--web-port", str(port)) as worker:
        assert wait_for(lambda: answers(port), worker), worker.log_tail()
        assert samples(scrape(port)[2])["loopwarden_fetch_held"] == 0

        held = []
        for start in range(0, len(lines), 20):  # about 20 events per 10 ms: 40 per 50 ms hold
            for line in lines[start : start + 20]:
                producer.send(topics["events"], key=json.loads(line)["run_id"].encode(), value=line)
            producer.flush()
            time.sleep(0.01)
            if start % 400 == 0:
                held.append(samples(scrape(port)[2])["loopwarden_fetch_held"])
            if held and held[-1] == 1:
                break
        producer.close()
        assert held[-1] == 1, f"never held while streaming: {held}\n{worker.log_tail()}"
        assert wait_for(lambda: samples(scrape(port)[2])["loopwarden_fetch_held"] == 0, worker), worker.log_tail()


def wait_for(check, worker, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert worker.alive(), worker.log_tail()
        if check():
            return True
        time.sleep(0.25)
    return False
