"""The worker's metrics: names and labels an operator scrapes, their values
after events, the summary line read from the same counters, and the lag and
active-runs figures limited to the partitions owned when scraped."""

from __future__ import annotations

from types import SimpleNamespace

import faust
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.verdicts import Verdict
from streams.kafka import clients as kafka_clients
import streams.observability.metrics as metrics_module
from streams.engine import Outcome
from streams.observability.metrics import CONTENT_TYPE, Ownership, TopicPartition, WorkerMetrics, install

EVENTS = "loopwarden.events"


class Owned(Ownership):
    """Partitions owned and their high watermarks, changed by the test."""

    def __init__(self, highwater: dict[TopicPartition, int]) -> None:
        self.highwaters = highwater

    def owned(self) -> list[TopicPartition]:
        return list(self.highwaters)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highwaters.get(tp)


def scrape(metrics: WorkerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, parsed by prometheus_client's own parser."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }


def lag_series(metrics: WorkerMetrics) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["topic"], dict(labels)["partition"]): value
        for (name, labels), value in scrape(metrics).items()
        if name == "loopwarden_consumer_lag"
    }


def verdict(decision: str, detector: str | None = None, shadow: str | None = None) -> Verdict:
    return Verdict(
        run_id="r",
        seq=3,
        tool_call_id="c",
        tool_name="exec",
        decision=decision,
        detector=detector,
        shadow_decision=shadow,
    )


def feed(metrics: WorkerMetrics) -> None:
    metrics.outcome("tool_call", Outcome(None, [verdict("block", "generic_repeat")]))
    metrics.outcome("tool_call", Outcome(None, [verdict("allow")]))
    metrics.outcome("tool_call", Outcome(None, [verdict("allow", "ping_pong", "block")]))
    metrics.outcome("compaction", Outcome(None, [], armed=3))
    metrics.outcome("tool_call", Outcome(None, [], duplicate=True))
    metrics.deadletter("not_json")
    metrics.deadletter("too_large")
    metrics.deadletter("too_large")
    metrics.deadletter_failed.inc()
    metrics.expired.inc(4)
    metrics.processed(0.0003)
    metrics.batch(0.02)


def test_names_labels_and_values_after_events():
    metrics = WorkerMetrics()
    feed(metrics)
    values = scrape(metrics)
    assert values[("loopwarden_events_total", (("type", "tool_call"),))] == 4
    assert values[("loopwarden_events_total", (("type", "compaction"),))] == 1

    def verdicts(decision: str, detector: str, shadow: str = "none") -> float:
        labels = (("decision", decision), ("detector", detector), ("shadow_decision", shadow))
        return values[("loopwarden_verdicts_total", labels)]

    assert verdicts("block", "generic_repeat") == 1
    assert verdicts("allow", "none") == 1
    assert verdicts("allow", "ping_pong", "block") == 1  # shadow mode: what enforcing would do
    assert values[("loopwarden_duplicates_total", ())] == 1
    assert values[("loopwarden_guard_armed_total", ())] == 1
    assert values[("loopwarden_deadletter_total", (("kind", "not_json"),))] == 1
    assert values[("loopwarden_deadletter_total", (("kind", "too_large"),))] == 2
    assert values[("loopwarden_deadletter_failed_total", ())] == 1
    assert values[("loopwarden_expired_total", ())] == 4
    assert values[("loopwarden_event_processing_seconds_count", ())] == 1
    assert values[("loopwarden_event_processing_seconds_bucket", (("le", "0.0005"),))] == 1
    assert values[("loopwarden_event_processing_seconds_bucket", (("le", "0.00025"),))] == 0
    assert values[("loopwarden_batch_seconds_count", ())] == 1
    assert values[("loopwarden_batches_total", ())] == 1
    assert values[("loopwarden_active_runs", ())] == 0
    assert not any(name.endswith("_created") for name, _labels in values)


def test_the_text_keeps_the_names_operators_scrape():
    text = WorkerMetrics().render().decode()
    for line in (
        "# TYPE loopwarden_events_total counter",
        "# TYPE loopwarden_verdicts_total counter",
        "# TYPE loopwarden_aborts_total counter",
        "# TYPE loopwarden_deadletter_total counter",
        "# TYPE loopwarden_duplicates_total counter",
        "# TYPE loopwarden_guard_armed_total counter",
        "# TYPE loopwarden_active_runs gauge",
        "# TYPE loopwarden_consumer_lag gauge",
        "# TYPE loopwarden_event_processing_seconds histogram",
        "# TYPE loopwarden_batch_seconds histogram",
    ):
        assert line in text.splitlines(), line


def test_summary_reads_the_same_counters():
    metrics = WorkerMetrics()
    assert metrics.summary() == {}
    feed(metrics)
    metrics.batch()  # a batch not timed still counts
    assert metrics.summary() == {
        "events": 5,
        "verdicts": 3,
        "block": 1,
        "duplicates": 1,
        "guards_armed": 1,
        "deadlettered": 3,
        "deadlettered.not_json": 1,
        "deadlettered.too_large": 2,
        "deadletter_failed": 1,
        "expired": 4,
        "chunks": 2,
    }
    assert scrape(metrics)[("loopwarden_batches_total", ())] == 2


def test_lag_is_computed_when_scraped_and_dropped_on_revoke():
    p0, p1 = TopicPartition(EVENTS, 0), TopicPartition(EVENTS, 1)
    owned = Owned({p0: 100, p1: 50})
    metrics = WorkerMetrics(owned)
    metrics.offset_seen(p0, 89)
    metrics.offset_seen(p1, 49)
    assert lag_series(metrics) == {(EVENTS, "0"): 10, (EVENTS, "1"): 0}
    owned.highwaters[p0] = 130  # produced meanwhile, nothing consumed: the scrape sees it
    assert lag_series(metrics)[(EVENTS, "0")] == 40
    del owned.highwaters[p1]  # revoked
    assert lag_series(metrics) == {(EVENTS, "0"): 40}
    owned.highwaters[p1] = 60  # assigned back: no stale position from before
    assert lag_series(metrics) == {(EVENTS, "0"): 40}
    metrics.offset_seen(p1, 55)
    assert lag_series(metrics) == {(EVENTS, "0"): 40, (EVENTS, "1"): 4}


def test_lag_names_the_tenant_whose_topic_it_is():
    class Tenants(Owned):
        def tenant(self, topic: str) -> str | None:
            return "acme" if topic == "loopwarden.acme.events" else None

    own, acme = TopicPartition(EVENTS, 0), TopicPartition("loopwarden.acme.events", 0)
    metrics = WorkerMetrics(Tenants({own: 10, acme: 20}))
    metrics.offset_seen(own, 8)
    metrics.offset_seen(acme, 14)
    series = {
        dict(labels)["topic"]: (dict(labels)["tenant"], value)
        for (name, labels), value in scrape(metrics).items()
        if name == "loopwarden_consumer_lag"
    }
    assert series == {EVENTS: ("", 1), "loopwarden.acme.events": ("acme", 5)}


def test_active_runs_count_only_owned_partitions():
    owned = Owned({TopicPartition(EVENTS, 0): 0, TopicPartition(EVENTS, 1): 0})
    metrics = WorkerMetrics(owned)
    metrics.runs_held(0, 5)
    metrics.runs_held(1, 7)
    assert scrape(metrics)[("loopwarden_active_runs", ())] == 12
    del owned.highwaters[TopicPartition(EVENTS, 1)]
    assert scrape(metrics)[("loopwarden_active_runs", ())] == 5


def test_two_workers_in_one_process_count_apart():
    first, second = WorkerMetrics(), WorkerMetrics()
    first.deadletter("invalid")
    assert second.summary() == {}


def test_install_adds_the_page_to_a_faust_app():
    app = faust.App(
        "metrics-install-test", **kafka_clients.faust_connection("127.0.0.1:1"), web_enabled=True, autodiscover=False
    )
    view = install(app, WorkerMetrics())
    assert view.view_path == "/metrics"
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_verdict_latency_is_observed_from_the_events_ts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "time", SimpleNamespace(time=lambda: 1_000.0))
    metrics = WorkerMetrics()
    metrics.verdict_sent(1_000.0 - 0.012)  # published 12 ms before the send
    metrics.verdict_sent(1_000.0 - 0.3)
    for not_a_publish_time in (None, "2026-12-02T05:00:00Z"):
        metrics.verdict_sent(not_a_publish_time)
    for implausible in (1_000.5, 1_000.0 - 3_601):  # later than the worker's clock, more than an hour before it
        metrics.verdict_sent(implausible)
    values = scrape(metrics)

    def bucket(le: str) -> float:
        return values[("loopwarden_verdict_latency_seconds_bucket", (("le", le),))]

    assert values[("loopwarden_verdict_latency_seconds_count", ())] == 2
    assert values[("loopwarden_verdict_latency_seconds_sum", ())] == pytest.approx(0.312)
    assert (bucket("0.01"), bucket("0.015"), bucket("0.25"), bucket("0.5"), bucket("+Inf")) == (0, 1, 1, 2, 2)
    assert "# TYPE loopwarden_verdict_latency_seconds histogram" in metrics.render().decode().splitlines()
    assert values[("loopwarden_verdict_latency_out_of_window_total", ())] == 2


def test_the_standard_process_and_python_metrics_are_exported() -> None:
    names = {name for name, _ in scrape(WorkerMetrics())}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
    assert any(name.startswith("python_gc_") for name in names)


def test_aborts_are_counted_by_error():
    metrics = WorkerMetrics()
    for error in ("loop_recovery_exhausted", "loop_recovery_exhausted", "compaction_loop_persisted"):
        aborted = verdict("abort", "generic_repeat")
        aborted.error = error
        metrics.outcome("tool_call", Outcome(None, [aborted]))
    metrics.outcome("tool_call", Outcome(None, [verdict("block", "generic_repeat")]))
    values = scrape(metrics)
    assert values[("loopwarden_aborts_total", (("error", "loop_recovery_exhausted"),))] == 2
    assert values[("loopwarden_aborts_total", (("error", "compaction_loop_persisted"),))] == 1
    assert sum(value for (name, _), value in values.items() if name == "loopwarden_aborts_total") == 3
