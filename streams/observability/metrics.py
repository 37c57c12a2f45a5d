"""Prometheus metrics with no extra dependency.

A small registry of counters, gauges and histograms rendered in the
Prometheus text exposition format (version 0.0.4), plus the worker's own
metric set (`WorkerMetrics`) and two ways to serve it:

- `install(app)` adds a `/metrics` page to a Faust app's web server;
- `serve(port)` runs a tiny standalone HTTP server in a thread (for tools and
  processes without Faust).

All operations are thread-safe and cheap (a dict lookup and an add under a
lock), so the worker can count every event.

Wiring in the worker (what to call where) is described in `WIRING` below and,
as a patch, in docs/AUDIT.md ("Metrics").
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# Seconds; a healthy event costs tens of microseconds, a slow one (RocksDB
# flush, GC pause, rebalance) milliseconds.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**63:
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{name}="{_escape_label(value)}"' for name, value in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL.match(label) or label.startswith("__") or label == "le":
                raise ValueError(f"invalid label name {label!r} for {name}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, Any]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {tuple(labels)}")
        return tuple("" if labels[n] is None else str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> str:
        return "\n".join([*self.header(), *self.samples()]) + "\n"


class Counter(_Metric):
    """A value that only goes up (events, verdicts, refusals)."""

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        if not self.labelnames:
            self._values[()] = 0.0

    def inc(self, amount: float = 1.0, **labels: Any) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot go down ({amount})")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: Any) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels_text(self.labelnames, key)} {_format_value(v)}" for key, v in items]


class Gauge(_Metric):
    """A value that goes up and down (active runs, consumer lag).

    `set_function(fn)` makes an unlabelled gauge read its value at scrape
    time instead (e.g. the size of a table)."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._function: Callable[[], float] | None = None
        if not self.labelnames:
            self._values[()] = 0.0

    def set(self, value: float, **labels: Any) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: Any) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: Any) -> None:
        self.inc(-amount, **labels)

    def remove(self, **labels: Any) -> None:
        """Drop one labelled series (a partition that was revoked)."""
        key = self._key(labels)
        with self._lock:
            self._values.pop(key, None)

    def set_function(self, function: Callable[[], float]) -> None:
        if self.labelnames:
            raise ValueError(f"{self.name}: set_function needs an unlabelled gauge")
        self._function = function

    def value(self, **labels: Any) -> float:
        if self._function is not None:
            return float(self._function())
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        if self._function is not None:
            try:
                value = float(self._function())
            except Exception:  # a failing callback must not break the scrape
                value = math.nan
            return [f"{self.name} {_format_value(value)}"]
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels_text(self.labelnames, key)} {_format_value(v)}" for key, v in items]


class Histogram(_Metric):
    """Observations counted in cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Iterable[float] = DEFAULT_BUCKETS
    ) -> None:
        super().__init__(name, help, labelnames)
        bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct and non-empty")
        self.buckets = tuple(bounds)
        # per label set: [count per bucket (non-cumulative, last is +Inf), sum]
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        if not self.labelnames:
            self._series[()] = ([0] * (len(self.buckets) + 1), [0.0])

    def observe(self, value: float, **labels: Any) -> None:
        key = self._key(labels)
        index = bisect.bisect_left(self.buckets, value)  # le is inclusive
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = ([0] * (len(self.buckets) + 1), [0.0])
            series[0][index] += 1
            series[1][0] += value

    def count(self, **labels: Any) -> int:
        with self._lock:
            series = self._series.get(self._key(labels))
            return sum(series[0]) if series else 0

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((key, (list(counts), total[0])) for key, (counts, total) in self._series.items())
        lines = []
        for key, (counts, total) in items:
            cumulative = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                cumulative += n
                le = f'le="{_format_value(bound)}"'
                lines.append(f"{self.name}_bucket{_labels_text(self.labelnames, key, le)} {cumulative}")
            labels = _labels_text(self.labelnames, key)
            lines.append(f"{self.name}_sum{labels} {_format_value(total)}")
            lines.append(f"{self.name}_count{labels} {cumulative}")
        return lines


class Registry:
    """Metrics by name, rendered in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def register(self, metric: _Metric) -> Any:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name!r} already registered")
            self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help, labelnames))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, help, labelnames))

    def histogram(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Iterable[float] = DEFAULT_BUCKETS
    ) -> Histogram:
        return self.register(Histogram(name, help, labelnames, buckets))

    def get(self, name: str) -> _Metric:
        return self._metrics[name]

    def render(self) -> str:
        with self._lock:
            metrics = list(self._metrics.values())
        return "".join(metric.render() for metric in metrics)


class WorkerMetrics:
    """The stream worker's metrics. Each method is one line at its call site."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.events = registry.counter(
            "loopwarden_events_total", "Events applied by the engine, by event type (duplicates included).", ["type"]
        )
        self.verdicts = registry.counter(
            "loopwarden_verdicts_total",
            'Verdicts published, by decision and detector ("none" when no detector fired).',
            ["decision", "detector"],
        )
        self.deadletters = registry.counter(
            "loopwarden_deadletter_total",
            "Malformed events sent to the dead-letter topic, by kind of refusal (not_json, invalid, ...).",
            ["kind"],
        )
        self.duplicates = registry.counter(
            "loopwarden_duplicates_total", "Events dropped as duplicates (seq not above the run's last seq)."
        )
        self.guard_armed = registry.counter(
            "loopwarden_guard_armed_total", "Compactions that armed the post-compaction guard."
        )
        self.active_runs = registry.gauge(
            "loopwarden_active_runs", "Runs with state held by this worker (its assigned partitions)."
        )
        self.processing = registry.histogram(
            "loopwarden_event_processing_seconds",
            "Time to decode one event, load its run and apply the engine (per event).",
        )
        self.batches = registry.histogram(
            "loopwarden_batch_seconds",
            "Time for one batch: engine, verdicts sent and acknowledged by the broker, states written.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.lag = registry.gauge(
            "loopwarden_consumer_lag",
            "Messages between this worker's position and the partition's high watermark.",
            ["topic", "partition"],
        )

    # -- call sites --------------------------------------------------------

    def event(self, event_type: str) -> None:
        self.events.inc(type=event_type)

    def verdict(self, decision: str, detector: str | None) -> None:
        self.verdicts.inc(decision=decision, detector=detector or "none")

    def outcome(self, event_type: str, outcome: Any) -> None:
        """Everything one `engine.apply` Outcome says: the event, a duplicate,
        an armed guard, and each verdict."""
        self.events.inc(type=event_type)
        if outcome.duplicate:
            self.duplicates.inc()
        if outcome.armed:
            self.guard_armed.inc()
        for verdict in outcome.verdicts:
            self.verdicts.inc(decision=verdict.decision, detector=verdict.detector or "none")

    def deadletter(self, kind: str = "other") -> None:
        self.deadletters.inc(kind=kind)

    def duplicate(self) -> None:
        self.duplicates.inc()

    def processed(self, seconds: float) -> None:
        self.processing.observe(seconds)

    def batch(self, seconds: float) -> None:
        self.batches.observe(seconds)

    def set_lag(self, topic: str, partition: int, lag: float) -> None:
        self.lag.set(max(0.0, lag), topic=topic, partition=partition)

    def offset_seen(self, topic: str, partition: int, offset: int, highwater: int | None) -> None:
        """Lag from one consumed message: the high watermark is the offset the
        next produced message will get, so lag = highwater - offset - 1."""
        if highwater is not None and highwater >= 0:
            self.set_lag(topic, partition, highwater - offset - 1)


REGISTRY = Registry()
METRICS = WorkerMetrics(REGISTRY)


def render(registry: Registry | None = None) -> str:
    """The whole registry in Prometheus text format."""
    return (registry or REGISTRY).render()


def install(app: Any, registry: Registry | None = None, path: str = "/metrics") -> Any:
    """Add a `GET /metrics` page to a Faust app's web server; returns the view.

    Call once, at import time of the app module, before the worker starts.
    """
    registry = registry or REGISTRY

    @app.page(path, name="loopwarden_metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        # aiohttp refuses a charset inside `content_type`; a full header is fine.
        return web.bytes(render(registry).encode(), headers={"Content-Type": CONTENT_TYPE})

    return metrics_page


def serve(port: int, host: str = "127.0.0.1", registry: Registry | None = None) -> Any:
    """Serve `/metrics` from a daemon thread; returns the server (`.shutdown()`
    stops it, `.server_address` has the bound port when `port` is 0)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    registry = registry or REGISTRY

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.split("?")[0].rstrip("/") != "/metrics":
                self.send_error(404)
                return
            body = render(registry).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="loopwarden-metrics", daemon=True)
    thread.start()
    return server


WIRING = """\
Worker wiring (streams/worker/app.py); the full patch is in docs/AUDIT.md, "Metrics".

  imports:   from streams.observability.metrics import METRICS
             from streams.observability.metrics import install as install_metrics
  create_app, before the agent is declared:
             if settings.web_port is not None: install_metrics(app)
  Processor.take, first lines:
             started = time.perf_counter()
             METRICS.offset_seen(msg.topic, msg.partition, msg.offset, self.app.consumer.highwater(msg.tp))
  Processor.take, after counts["events"] += 1 (before the duplicate return):
             METRICS.outcome(type(decoded).__struct_config__.tag, outcome)
             METRICS.processed(time.perf_counter() - started)
  Processor._dead_letter, after kind = refusal_kind(reason):
             METRICS.deadletter(kind)
  Chunk.__init__: self.started = time.perf_counter()  (add "started" to __slots__)
  Processor._finisher, after self.closed.popleft():
             METRICS.batch(time.perf_counter() - chunk.started)
  Processor.sweep: count the keys scanned in active partitions (held), then
             METRICS.active_runs.set(held - expired)
"""
