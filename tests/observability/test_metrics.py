"""The Prometheus registry and its text rendering (no extra dependency)."""

from __future__ import annotations

import math
import re
import threading
import urllib.request

import pytest

from schemas.verdicts import Verdict
from streams.engine import Outcome
from streams.observability.metrics import CONTENT_TYPE, Counter, Histogram, Registry, WorkerMetrics, install, serve

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*\})? \S+$')


def parse(text: str) -> dict[str, float]:
    """Sample line -> value, checking every line is valid exposition format."""
    values = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert SAMPLE.match(line), line
        name, _, value = line.rpartition(" ")
        values[name] = float(value)
    return values


def test_counter_gauge_render():
    reg = Registry()
    events = reg.counter("x_events_total", "Events by type.", ["type"])
    runs = reg.gauge("x_active_runs", "Active runs.")
    events.inc(type="tool_call")
    events.inc(2, type="tool_result")
    runs.set(7)
    runs.dec()
    text = reg.render()
    assert "# HELP x_events_total Events by type.\n# TYPE x_events_total counter\n" in text
    assert "# TYPE x_active_runs gauge\n" in text
    values = parse(text)
    assert values['x_events_total{type="tool_call"}'] == 1
    assert values['x_events_total{type="tool_result"}'] == 2
    assert values["x_active_runs"] == 6
    assert text.endswith("\n")


def test_counter_rules():
    with pytest.raises(ValueError):
        Counter("bad_name", "must end in _total")
    c = Counter("ok_total", "x", ["a"])
    with pytest.raises(ValueError):
        c.inc(-1, a="1")
    with pytest.raises(ValueError):
        c.inc(b="1")  # wrong label
    with pytest.raises(ValueError):
        Counter("ok_total", "x", ["le"])
    reg = Registry()
    reg.counter("dup_total", "x")
    with pytest.raises(ValueError):
        reg.counter("dup_total", "x")


def test_label_and_help_escaping():
    reg = Registry()
    c = reg.counter("esc_total", 'Help with \\ and\nnewline.', ["v"])
    c.inc(v='a"b\\c\nd')
    text = reg.render()
    assert "# HELP esc_total Help with \\\\ and\\nnewline." in text
    assert 'esc_total{v="a\\"b\\\\c\\nd"} 1' in text
    parse(text)


def test_histogram_buckets_are_cumulative():
    h = Histogram("lat_seconds", "Latency.", buckets=(0.1, 0.5, 1.0))
    for value in (0.05, 0.1, 0.3, 0.7, 2.0):
        h.observe(value)
    values = parse(h.render())
    assert values['lat_seconds_bucket{le="0.1"}'] == 2  # le is inclusive
    assert values['lat_seconds_bucket{le="0.5"}'] == 3
    assert values['lat_seconds_bucket{le="1"}'] == 4
    assert values['lat_seconds_bucket{le="+Inf"}'] == 5
    assert values["lat_seconds_count"] == 5
    assert math.isclose(values["lat_seconds_sum"], 3.15)
    assert "# TYPE lat_seconds histogram" in h.render()


def test_labelled_histogram():
    h = Histogram("h_seconds", "x", ["kind"], buckets=(1,))
    h.observe(0.5, kind="a")
    values = parse(h.render())
    assert values['h_seconds_bucket{kind="a",le="1"}'] == 1
    assert values['h_seconds_count{kind="a"}'] == 1


def test_gauge_function_and_failure():
    reg = Registry()
    g = reg.gauge("fn_gauge", "x")
    g.set_function(lambda: 42)
    assert "fn_gauge 42\n" in reg.render()
    g.set_function(lambda: 1 / 0)
    assert "fn_gauge NaN\n" in reg.render()  # a broken callback never breaks the scrape


def test_worker_metrics_from_outcomes():
    reg = Registry()
    m = WorkerMetrics(reg)
    block = Verdict(run_id="r", seq=3, tool_call_id="c", tool_name="exec", decision="block", level="critical",
                    detector="generic_repeat", count=20)  # fmt: skip
    allow = Verdict(run_id="r", seq=4, tool_call_id="c", tool_name="exec", decision="allow")
    m.outcome("tool_call", Outcome(None, [block]))
    m.outcome("tool_call", Outcome(None, [allow]))
    m.outcome("compaction", Outcome(None, [], armed=3))
    m.outcome("tool_call", Outcome(None, [], duplicate=True))
    m.deadletter("not_json")
    m.processed(0.0003)
    m.offset_seen("loopwarden.events", 2, offset=90, highwater=100)
    m.active_runs.set(5)
    values = parse(reg.render())
    assert values['loopwarden_events_total{type="tool_call"}'] == 3
    assert values['loopwarden_events_total{type="compaction"}'] == 1
    assert values['loopwarden_verdicts_total{decision="block",detector="generic_repeat"}'] == 1
    assert values['loopwarden_verdicts_total{decision="allow",detector="none"}'] == 1
    assert values["loopwarden_duplicates_total"] == 1
    assert values["loopwarden_guard_armed_total"] == 1
    assert values['loopwarden_deadletter_total{kind="not_json"}'] == 1
    assert values["loopwarden_event_processing_seconds_count"] == 1
    assert values['loopwarden_consumer_lag{topic="loopwarden.events",partition="2"}'] == 9
    assert values["loopwarden_active_runs"] == 5


def test_thread_safety():
    reg = Registry()
    c = reg.counter("t_total", "x", ["k"])
    h = reg.histogram("t_seconds", "x")

    def work():
        for i in range(10_000):
            c.inc(k=str(i % 3))
            h.observe(0.001)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.value(k=str(k)) for k in range(3)) == 40_000
    assert h.count() == 40_000


def test_standalone_server():
    reg = Registry()
    reg.counter("srv_total", "x").inc()
    server = serve(0, registry=reg)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            assert "srv_total 1" in response.read().decode()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    finally:
        server.shutdown()
        server.server_close()


def test_install_adds_a_faust_page():
    """`install` registers a page on the app's web server (checked without
    starting a worker: the view is in the app's routes)."""
    import faust

    app = faust.App("metrics-install-test", broker="kafka://127.0.0.1:1", web_enabled=True, autodiscover=False)
    view = install(app, Registry())
    assert view.view_path == "/metrics"
