"""The worker's and the fleet stage's numbers, kept in prometheus_client metrics.

One set of counters feeds both outputs: `/metrics` renders them (``install``)
and the periodic summary log line reads them (``WorkerMetrics.summary``).
Consumer lag and active runs are computed when scraped, from the partitions the
worker owns at that moment, so a revoked partition disappears from both.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# A `_created` series per counter doubles the page and no dashboard reads it.
disable_created_metrics()

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

#: Seconds: a healthy event costs tens of microseconds, a slow one (RocksDB
#: flush, GC pause, rebalance) milliseconds.
EVENT_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Seconds from the gateway's publish to the worker's send of the verdict: a
#: few milliseconds when healthy, tens under load, and up to the gateway's
#: verdict timeout (2 s by default in the OpenClaw plugin) and beyond when not.
VERDICT_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: Seconds: an event stamped longer ago than this, or later than the worker's
#: clock, says more about the clocks or a replayed trace than about latency,
#: and is counted apart instead of in the histogram.
LATENCY_WINDOW = 3600.0

#: Decisions the summary line counts on their own (allow is the healthy case).
SUMMARY_DECISIONS = ("warn", "block", "abort")
#: Counter family -> its field in the summary log line.
SUMMARY_NAMES = {
    "loopwarden_events": "events",
    "loopwarden_verdicts": "verdicts",
    "loopwarden_duplicates": "duplicates",
    "loopwarden_guard_armed": "guards_armed",
    "loopwarden_deadletter": "deadlettered",
    "loopwarden_deadletter_failed": "deadletter_failed",
    "loopwarden_expired": "expired",
    "loopwarden_states_unreadable": "states_unreadable",
    "loopwarden_states_reset": "states_reset",
    "loopwarden_verdicts_shrunk": "verdicts_shrunk",
    "loopwarden_batches": "chunks",
}


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Ownership:
    """What the worker owns right now: its active partitions of the events
    topics (its own and its tenants') and their high watermarks. The defaults own nothing."""

    def owned(self) -> Iterable[TopicPartition]:
        return ()

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def tenant(self, topic: str) -> str | None:
        """The tenant whose events topic this is; None for the worker's own."""
        return None


class Served(Protocol):
    """The events topics a worker serves (streams.worker.tenants.Routes)."""

    def __contains__(self, topic: object) -> bool: ...

    def tenant(self, topic: str) -> str | None: ...


class _PerEvent(Collector):
    """The counters raised for every event, kept as plain counts and turned
    into counter families when scraped: a prometheus_client counter takes a
    lock and several calls per increment, which would show in the worker's
    per-event cost."""

    def __init__(self) -> None:
        self.events: collections.Counter[str] = collections.Counter()
        self.verdicts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.aborts: collections.Counter[str] = collections.Counter()
        self.duplicates = 0
        self.guard_armed = 0

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "loopwarden_events", "Events applied by the engine, by event type (duplicates included).", labels=["type"]
        )
        for event_type, n in self.events.items():
            events.add_metric([event_type], n)
        yield events
        verdicts = CounterMetricFamily(
            "loopwarden_verdicts",
            "Verdicts published, by decision, detector and, in shadow mode, what enforcing would have "
            'decided ("none" when no detector fired, or when enforcing decides the same).',
            labels=["decision", "detector", "shadow_decision"],
        )
        for labels, n in self.verdicts.items():
            verdicts.add_metric(list(labels), n)
        yield verdicts
        aborts = CounterMetricFamily(
            "loopwarden_aborts",
            "Abort verdicts published, by error: the guard's, the budget's, escalation's or recovery's "
            "(loop_recovery_exhausted); each run's first and the calls answered by it after.",
            labels=["error"],
        )
        for error, n in self.aborts.items():
            aborts.add_metric([error], n)
        yield aborts
        yield CounterMetricFamily(
            "loopwarden_duplicates", "Events dropped as duplicates (seq not above the run's last seq).", self.duplicates
        )
        yield CounterMetricFamily(
            "loopwarden_guard_armed", "Compactions that armed the post-compaction guard.", self.guard_armed
        )


class _Owned(Collector):
    """Consumer lag and active runs, computed at scrape time for the
    partitions owned then; positions of partitions no longer owned are dropped."""

    def __init__(self, ownership: Ownership) -> None:
        self.ownership = ownership
        # last offset taken, by (topic, partition) tuple (Faust's TP compares equal)
        self.positions: dict[tuple[str, int], int] = {}
        self.held: dict[int, int] = {}  # runs stored per partition, at the last sweep

    def collect(self) -> Iterator[Metric]:
        owned = {TopicPartition(*tp) for tp in self.ownership.owned()}
        mine = {tp.partition for tp in owned}
        for stale in [tp for tp in self.positions if tp not in owned]:
            del self.positions[stale]
        for gone in [partition for partition in self.held if partition not in mine]:
            del self.held[gone]
        lag = GaugeMetricFamily(
            "loopwarden_consumer_lag",
            "Messages between this worker's position and the partition's high watermark, per events topic "
            'served (tenant: the tenant whose topic it is, "" for the worker\'s own).',
            labels=["topic", "partition", "tenant"],
        )
        for tp in sorted(owned):
            offset = self.positions.get(tp)
            highwater = None if offset is None else self.ownership.highwater(tp)
            if offset is not None and highwater is not None and highwater >= 0:
                # the high watermark is the offset the next produced message gets
                tenant = self.ownership.tenant(tp.topic) or ""
                lag.add_metric([tp.topic, str(tp.partition), tenant], max(0, highwater - offset - 1))
        runs = sum(self.held.values())
        yield GaugeMetricFamily(
            "loopwarden_active_runs", "Runs with state held by this worker (its assigned partitions).", value=runs
        )
        yield lag


class Metrics:
    """A registry of its own per process role, so two in one process count apart."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # process_* (CPU, memory, open files), python_info and python_gc_*, as every Python exporter has them
        for standard in (ProcessCollector, PlatformCollector, GCCollector):
            standard(registry=self.registry)

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(f"loopwarden_{name}", help, labels, registry=self.registry)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


class FleetMetrics(Metrics):
    """The fleet stage's counters: its operator log lines, totalled, and the verdicts behind them."""

    def __init__(self) -> None:
        super().__init__()
        self.incidents = self.counter(
            "fleet_incidents", "Incident records published, by status (open, update).", ("status",)
        )
        self.verdicts = self.counter(
            "fleet_verdicts",
            "Block and abort verdicts taken by their fingerprint's tally, by decision (one seen again included).",
            ("decision",),
        )
        self.bad_verdicts = self.counter(
            "fleet_bad_verdicts", "Records of the decision topic that are not verdicts, skipped."
        )


class WorkerMetrics(Metrics):
    """The stream worker's metrics."""

    def __init__(self, ownership: Ownership | None = None, scraped: bool = True) -> None:
        super().__init__()
        #: Whether anything can scrape `/metrics`: per-event timings and
        #: consumer positions are only kept then.
        self.scraped = scraped
        registry = self.registry
        counter = self.counter

        self._per_event = _PerEvent()
        registry.register(self._per_event)
        self.deadletters = counter(
            "deadletter",
            "Malformed events sent to the dead-letter topic, by kind of refusal (not_json, invalid, ...).",
            ("kind",),
        )
        self.deadletter_failed = counter(
            "deadletter_failed",
            "Malformed events that could not be dead-lettered either (they stay only in their source topic).",
        )
        self.expired = counter("expired", "Runs expired after the idle TTL.")
        self.states_unreadable = counter(
            "states_unreadable", "Stored run states this version cannot read (the run starts afresh)."
        )
        self.states_reset = counter("states_reset", "Run states too large to store (only the last seq is kept).")
        self.verdicts_shrunk = counter(
            "verdicts_shrunk", "Verdicts too large for one message, sent with their long fields shortened."
        )
        self.batches = counter(
            "batches", "Batches finished: verdicts acknowledged, states written, events acknowledged."
        )
        self.processing = Histogram(
            "loopwarden_event_processing_seconds",
            "Time to decode one event, load its run and apply the engine (per event).",
            buckets=EVENT_BUCKETS,
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "loopwarden_batch_seconds",
            "Time for one batch: engine, verdicts sent and acknowledged by the broker, states written.",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.verdict_latency = Histogram(
            "loopwarden_verdict_latency_seconds",
            "From the gateway's publish of an event (its `ts`, seconds since the epoch) to the worker's send of "
            "its verdict; events without a numeric `ts`, or stamped outside the hour before the worker's clock, "
            "are left out.",
            buckets=VERDICT_LATENCY_BUCKETS,
            registry=registry,
        )
        self.latency_out_of_window = counter(
            "verdict_latency_out_of_window",
            "Verdicts of events whose `ts` is later than the worker's clock or more than an hour before it "
            "(clocks apart, a replayed trace): left out of the latency histogram.",
        )
        self.fetch_held = Gauge(
            "loopwarden_fetch_held",
            "1 while the broker holds each fetch of events to fill it (--fetch-hold: events stream in), "
            "0 while a fetch is answered at its first event.",
            registry=registry,
        )
        self._owned = _Owned(ownership or Ownership())
        registry.register(self._owned)

    # -- call sites --------------------------------------------------------

    def outcome(self, event_type: str, outcome: Any) -> None:
        """Everything one `engine.apply` Outcome says: the event, a duplicate,
        an armed guard, and each verdict."""
        counts = self._per_event
        counts.events[event_type] += 1
        if outcome.duplicate:
            counts.duplicates += 1
        if outcome.armed:
            counts.guard_armed += 1
        for verdict in outcome.verdicts:
            counts.verdicts[(verdict.decision, verdict.detector or "none", verdict.shadow_decision or "none")] += 1
            if verdict.error is not None:
                counts.aborts[verdict.error] += 1

    def deadletter(self, kind: str = "other") -> None:
        self.deadletters.labels(kind=kind).inc()

    def processed(self, seconds: float) -> None:
        self.processing.observe(seconds)

    def verdict_sent(self, ts: float | str | None) -> None:
        """A verdict was sent for an event the gateway stamped ``ts``."""
        if ts.__class__ is float:
            age = time.time() - ts  # type: ignore[operator]
            if 0 <= age <= LATENCY_WINDOW:
                self.verdict_latency.observe(age)
            else:
                self.latency_out_of_window.inc()

    def batch(self, seconds: float | None = None) -> None:
        """One batch finished, in `seconds` when measured."""
        self.batches.inc()
        if seconds is not None:
            self.batch_seconds.observe(seconds)

    def offset_seen(self, tp: tuple[str, int], offset: int) -> None:
        """The offset of an event taken: the consumer's position for the lag."""
        self._owned.positions[tp] = offset

    def runs_held(self, partition: int, runs: int) -> None:
        """Runs stored in one partition, as counted by the expiry sweep."""
        self._owned.held[partition] = runs

    # -- outputs -----------------------------------------------------------

    def summary(self) -> dict[str, int]:
        """The counters as the summary log line names them (zeros left out):
        read from the registry, as a scrape reads them."""
        out: dict[str, int] = {}

        def add(name: str, value: float) -> None:
            if value:
                out[name] = out.get(name, 0) + int(value)

        for family in self.registry.collect():
            name = SUMMARY_NAMES.get(family.name)
            if name is None:
                continue
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                add(name, sample.value)
                if name == "verdicts" and sample.labels["decision"] in SUMMARY_DECISIONS:
                    add(sample.labels["decision"], sample.value)
                elif name == "deadlettered":
                    add(f"deadlettered.{sample.labels['kind']}", sample.value)
        return out


def install(app: Any, metrics: Metrics, path: str = "/metrics") -> Any:
    """Add a `GET /metrics` page to a Faust app's web server; returns the view.

    Call before the app starts."""

    @app.page(path, name="loopwarden_metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        # aiohttp refuses a charset inside `content_type`; a full header is fine.
        return web.bytes(metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    return metrics_page


class FaustOwnership(Ownership):
    """The worker's ownership as its Faust app knows it: active partitions of
    the events topics `served` (never standbys; a tenant's counts from its
    first assignment) and the consumer's high watermarks."""

    def __init__(self, app: Any, served: Served) -> None:
        self.app = app
        self.served = served

    def owned(self) -> Iterable[TopicPartition]:
        served = self.served
        return [
            TopicPartition(tp.topic, tp.partition) for tp in self.app.assignor.assigned_actives() if tp.topic in served
        ]

    def tenant(self, topic: str) -> str | None:
        return self.served.tenant(topic)

    def highwater(self, tp: TopicPartition) -> int | None:
        from faust.types import TP

        return self.app.consumer.highwater(TP(tp.topic, tp.partition))
