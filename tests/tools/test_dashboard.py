"""`loopwarden dashboard`: its board (what the page shows), and the page
itself in headless Chromium while a trace flows through a real worker and
fleet stage."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from subprocess import Popen
from typing import IO

import msgspec
import pytest

from browser import Browser, chromium_path
from builders import cli_environ, run_cli
from emulated_worker import make_topics
from helpers import LOOPWARDEN, REPO, FleetStage, Worker, names, produce
from schemas.codec import decode_incident, decode_verdict
from schemas.verdicts import Verdict
from schemas.incidents import Incident
from schemas.topics import tenant_topics
from schemas.configfile import load_for_cli
from streams.kafka import clients as kafka_clients
from streams.tools.timelines import Timeline, Timelines
from streams.tools.dashboard import DEFAULT_PAIR, IN_FLIGHT_SECONDS, LATEST, Board
from streams.kafka.topics import ensure

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet-trace.jsonl"
CONFIG = ROOT / "examples" / "loopwarden.json5"
NOW = 1796187600.0
INCIDENT = {
    "fingerprint": "f",
    "detector": "generic_repeat",
    "tool_name": "exec",
    "window_start": 1796187600,
    "window_end": 1796188500,
    "status": "open",
    "runs": 5,
    "agents": 1,
    "agent_ids": ["a"],
    "sample_run_ids": ["r"],
    "first_ts": NOW,
    "last_ts": NOW,
    "scope": "agent",
    "message": None,
}


def verdict(run: str, decision: str = "allow", agent: str | None = "a") -> Verdict:
    return Verdict(run_id=run, seq=1, tool_call_id="c", tool_name="exec", decision=decision, agent_id=agent)


def test_the_board_counts_minutes_lists_blocks_and_keeps_runs_in_flight():
    board = Board()
    ms = int(NOW * 1000)
    for n, decision in enumerate(["allow", "allow", "warn", "block", "abort"]):
        board.verdict(verdict(f"r{n}", decision), ms + 1000 * n)
    board.verdict(verdict("old", "block"), ms - int(IN_FLIGHT_SECONDS * 1000) - 60_000)  # an earlier minute
    shown = board.snapshot(NOW + 10)
    this_minute = shown["chart"][-1]
    assert (this_minute["t"], this_minute["allow"], this_minute["warn"], this_minute["block"]) == (NOW, 2, 1, 1)
    assert sum(m["block"] for m in shown["chart"]) == 2 and len(shown["chart"]) == 30
    assert [b["run_id"] for b in shown["latest"]] == ["old", "r4", "r3"]  # newest first as read
    assert [r["run_id"] for r in shown["runs"]] == ["r3", "r2", "r1", "r0"]  # not aborted, not idle
    for n in range(LATEST + 10):
        board.verdict(verdict(f"b{n}", "block"), ms)
    assert len(board.snapshot(NOW)["latest"]) == LATEST


def test_the_board_keeps_tenants_apart_and_filters_by_tenant():
    """Equal run ids of two tenants are two runs; `only` shows one tenant's
    (DEFAULT_PAIR: the default pair's), None every tenant's."""
    board = Board()
    ms = int(NOW * 1000)
    board.verdict(verdict("r", "block"), ms)
    board.verdict(verdict("r", "allow"), ms, "acme")
    board.verdict(verdict("r", "abort"), ms, "globex")
    board.incident(Incident(**{**INCIDENT, "tenant": "acme"}), ms)
    board.incident(Incident(**INCIDENT), ms)
    every = board.snapshot(NOW)
    assert every["tenants"] == ["acme", "globex"] and len(every["incidents"]) == 2
    assert sorted((r["tenant"] or "-", r["calls"]) for r in every["runs"]) == [("-", 1), ("acme", 1)]
    acme = board.snapshot(NOW, "acme")
    assert [r["tenant"] for r in acme["runs"]] == ["acme"] and acme["latest"] == []
    assert [i["tenant"] for i in acme["incidents"]] == ["acme"] and acme["chart"][-1]["allow"] == 1
    default = board.snapshot(NOW, DEFAULT_PAIR)
    assert [(b["tenant"], b["decision"]) for b in default["latest"]] == [(None, "block")]
    assert [i["tenant"] for i in default["incidents"]] == [None] and default["chart"][-1]["block"] == 1
    assert [b["tenant"] for b in board.snapshot(NOW, "globex")["latest"]] == ["globex"]


def test_a_start_point_that_is_not_one_exits_2():
    done = run_cli("--from", "yesterday", command="dashboard")
    assert done.returncode == 2 and b"expected earliest, latest, a time" in done.stderr


def test_a_taken_port_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--port", str(port), "--bootstrap", "127.0.0.1:9", command="dashboard")
    assert done.returncode == 1 and f"cannot listen on 127.0.0.1:{port}".encode() in done.stderr


def launch(bootstrap: str, port: int, log: IO[bytes], *options: str, ignore_sigint: bool = False) -> Popen[bytes]:
    """`loopwarden dashboard` as a process; with ``ignore_sigint``, as a shell
    starts a background job: with SIGINT ignored."""
    return subprocess.Popen(
        [*LOOPWARDEN, "dashboard", "--bootstrap", bootstrap, "--port", str(port), *options],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env=cli_environ(),
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )


def stop(dashboard: Popen[bytes], signum: signal.Signals) -> int:
    """Its exit status once ``signum`` stopped it; one that is still running
    20 s later is killed, and the test fails."""
    dashboard.send_signal(signum)
    try:
        return dashboard.wait(20)
    except subprocess.TimeoutExpired:
        dashboard.kill()
        dashboard.wait()
        raise AssertionError(f"the dashboard did not stop within 20 s of {signum.name}") from None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.integration
def test_the_page_shows_incidents_and_blocked_runs_live_in_chromium(broker, tmp_path):
    """The page is open (with its access token) before the trace is published; incidents,
    blocked runs and a run's timeline appear in its DOM as the worker and the stage publish."""
    binary = chromium_path()
    offline = run_cli("--config", str(CONFIG), str(FLEET), command="incidents").stdout.splitlines()
    final = {}
    for line in offline:
        incident = decode_incident(line)
        final[incident.fingerprint] = incident.runs
    replayed = run_cli("--config", str(CONFIG), str(FLEET)).stdout.splitlines()
    blocked = {v.run_id for v in map(decode_verdict, replayed) if v.decision == "block"}
    topics = names("dash")
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text("dashboard-test-token-1\n")
    lines = FLEET.read_bytes().splitlines()
    log = open(tmp_path / "dashboard.log", "wb")
    dashboard = launch(
        broker.bootstrap,
        port,
        log,
        "--from",
        "earliest",
        "--decisions-topic",
        topics["decisions"],
        "--incidents-topic",
        topics["incidents"],
        "--events-topic",
        topics["events"],
        "--config",
        str(CONFIG),
        "--token-file",
        str(token_file),
    )

    async def scenario(stage: FleetStage) -> str:
        browser = await Browser(binary, tmp_path / "profile").open()
        try:
            for _ in range(100):  # the dashboard may still be starting
                # The token in the address is traded for a cookie, which the feed and the timeline carry.
                await browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/?token=dashboard-test-token-1")
                await asyncio.sleep(0.3)
                if await browser.evaluate("!!document.getElementById('incidents')"):
                    break
            assert await browser.evaluate("location.href") == f"http://127.0.0.1:{port}/"  # the token left it
            await browser.wait_for("document.getElementById('status').textContent.startsWith('live')", 30, "feed")
            produce(broker.bootstrap, topics["events"], lines[:600])
            produce(broker.bootstrap, topics["events"], lines[600:])
            rows = "[...document.querySelectorAll('#incidents tbody tr[data-fingerprint]')]"
            shown = await browser.wait_for(
                f"{rows}.length === {len(final)} && {rows}.map(tr => [tr.dataset.fingerprint, +tr.cells[4].textContent])"
                f".every(([f, n]) => ({json.dumps(final)})[f] === n) && {rows}.map(tr => tr.dataset.fingerprint)",
                120,
                "incidents with their final counts",
            )
            assert sorted(shown) == sorted(final)
            latest = await browser.wait_for(
                "[...document.querySelectorAll('#latest a.run')].map(a => a.dataset.run)", 30, "blocked runs"
            )
            assert latest and set(latest) <= blocked
            await browser.evaluate("document.querySelector('#incidents a.run[data-run=\"heartbeat-0\"]').click()")
            return await browser.wait_for(
                "document.getElementById('timeline').textContent.includes('summary:') &&"
                " document.getElementById('timeline').textContent",
                60,
                "the run's timeline",
            )
        finally:
            await browser.close()

    try:
        with Worker(broker.bootstrap, topics, tmp_path, "worker", config=CONFIG, partitions=1) as worker:
            worker.wait_assigned()
            stage = FleetStage(broker.bootstrap, topics, tmp_path, "fleet").start()
            try:
                timeline = asyncio.run(scenario(stage))
            finally:
                stage.stop()
    finally:
        stop(dashboard, signal.SIGINT)
        log.close()
    assert timeline.startswith("run heartbeat-0: 24 events, agent heartbeat")
    assert "BLOCK unknown_tool_repeat" in timeline
    assert "published on the decision topic: 12 of 12 verdicts identical" in timeline


@pytest.mark.integration
def test_the_page_shows_each_tenant_and_filters_by_it_in_chromium(broker, tmp_path):
    """The same verdicts on the default decisions topic and on a tenant's: the
    page lists the tenant, shows both, shows only the tenant's once it is
    chosen, and a click on its run explains it from the tenant's topics."""
    binary = chromium_path()
    events = FLEET.read_bytes().splitlines()
    replayed = run_cli("--config", str(CONFIG), str(FLEET)).stdout.splitlines()
    topics = names("dashten")
    tenant = "t-" + topics["app_id"].removeprefix("dashten-")
    ensure(broker.bootstrap, [(topics[kind], 1, {}) for kind in ("events", "decisions", "incidents")], 1)
    ensure(broker.bootstrap, [(topic, 1, {}) for topic in tenant_topics(tenant)], 1)
    # fewer blocks and aborts than the page lists, so that neither side's push the other's out
    support = [line for line in replayed if decode_verdict(line).agent_id == "support"]
    heartbeat = [line for line in replayed if decode_verdict(line).agent_id == "heartbeat"]
    # from now: the tenants other tests left on the shared broker published before
    start = str(int(time.time() * 1000) - 1000)
    produce(broker.bootstrap, topics["decisions"], support)
    produce(broker.bootstrap, tenant_topics(tenant)[0], events)
    produce(broker.bootstrap, tenant_topics(tenant)[1], heartbeat)
    port = free_port()
    log = open(tmp_path / "dashboard.log", "wb")
    options = ["--from", start, "--tenant-refresh", "1s", "--config", str(CONFIG)]
    for kind in ("decisions", "incidents", "events"):
        options += [f"--{kind}-topic", topics[kind]]
    dashboard = launch(broker.bootstrap, port, log, *options)
    latest = "[...document.querySelectorAll('#latest tbody tr')].map(tr => tr.cells[1].textContent)"

    async def scenario() -> tuple[list[str], str]:
        browser = await Browser(binary, tmp_path / "profile").open()
        try:
            for _ in range(100):  # the dashboard may still be starting
                await browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
                await asyncio.sleep(0.3)
                if await browser.evaluate("!!document.getElementById('tenant')"):
                    break
            await browser.wait_for(
                f"[...document.querySelectorAll('#tenant option')].some(o => o.value === {json.dumps(tenant)})",
                60,
                "the tenant among the filter's options",
            )
            await browser.wait_for(
                f"{latest}.includes('-') && {latest}.includes({json.dumps(tenant)})", 60, "both tenants' blocks"
            )
            await browser.evaluate(
                f"(s => {{ s.value = {json.dumps(tenant)}; s.dispatchEvent(new Event('change')); }})"
                "(document.getElementById('tenant'))"
            )
            shown = await browser.wait_for(
                f"{latest}.length > 0 && {latest}.every(t => t === {json.dumps(tenant)}) && {latest}", 30, "one tenant"
            )
            await browser.evaluate("document.querySelector('#latest a.run').click()")
            timeline = await browser.wait_for(
                "document.getElementById('timeline').textContent.includes('summary:') &&"
                " document.getElementById('timeline').textContent",
                60,
                "the run's timeline",
            )
            return shown, timeline
        finally:
            await browser.close()

    try:
        shown, timeline = asyncio.run(scenario())
    finally:
        stop(dashboard, signal.SIGINT)
        log.close()
    assert shown and set(shown) == {tenant}
    assert timeline.startswith("run heartbeat-"), timeline
    assert "published on the decision topic:" in timeline and "verdicts identical" in timeline, timeline
    served = (tmp_path / "dashboard.log").read_text()
    assert f"event=tenant_added tenant={tenant}" in served


@pytest.mark.integration
def test_a_timeline_is_read_within_its_window_and_kept_until_the_topics_grow(broker):
    """A run whose records are older than the window is not scanned for; a
    timeline asked again is served from the cache until a topic grows."""
    topics = names("timelines")
    ensure(broker.bootstrap, [(topics[kind], 2, {}) for kind in ("events", "decisions")], 1)
    events = [line for line in FLEET.read_bytes().splitlines() if b'"heartbeat-0"' in line]
    replayed = run_cli("--config", str(CONFIG), "-", stdin=b"\n".join(events)).stdout.splitlines()
    two_hours_ago = int((time.time() - 7200) * 1000)
    producer = kafka_clients.producer(broker.bootstrap, acks="all")
    for topic, lines in ((topics["events"], events), (topics["decisions"], replayed)):
        for line in lines:
            producer.send(topic, key=b"heartbeat-0", value=line, timestamp_ms=two_hours_ago)
    producer.flush()
    producer.close()
    config = load_for_cli(str(CONFIG), None, io.StringIO())[0]

    async def ask(window: float) -> tuple[list[Timeline], int]:
        timelines = Timelines(broker.bootstrap, config, None, window)
        answers = [await timelines.get("heartbeat-0", topics["events"], topics["decisions"]) for _ in range(2)]
        produce(broker.bootstrap, topics["events"], events[:1], keys=[b"another-run"])
        answers.append(await timelines.get("heartbeat-0", topics["events"], topics["decisions"]))
        return answers, timelines.scans

    recent, scans = asyncio.run(ask(3600.0))
    assert not any(t.found for t in recent) and scans == 2  # the second answer was the cached one
    whole, scans = asyncio.run(ask(0))
    assert whole[0] == whole[1] == whole[2] and scans == 2
    assert whole[0].found and "published on the decision topic: 12 of 12 verdicts identical" in whole[0].text


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_it_with_a_page_open_even_when_started_ignoring_sigint(broker, tmp_path, signum):
    """Started as a shell starts a background job (SIGINT ignored), SIGINT or
    SIGTERM still stops it cleanly and at once: while a page holds the live
    feed open, one topic is being read and the other does not exist yet."""
    decisions = make_topics(broker.bootstrap, 1, "dashstop")["decisions"]
    produce(broker.bootstrap, decisions, [msgspec.json.encode(verdict("r0", "block"))])
    port = free_port()
    path = tmp_path / "dashboard.log"
    with open(path, "wb") as log:
        dashboard = launch(
            broker.bootstrap,
            port,
            log,
            "--decisions-topic",
            decisions,
            "--incidents-topic",
            names("dashstop")["incidents"],
            ignore_sigint=True,
        )
        try:
            deadline = time.monotonic() + 60
            while b"event=waiting" not in path.read_bytes():  # the incident topic's reader is waiting for it
                assert dashboard.poll() is None and time.monotonic() < deadline, path.read_text()
                time.sleep(0.2)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/events", timeout=30) as feed:
                while b'"run_id": "r0"' not in feed.readline():  # the decision topic's reader has read it
                    assert time.monotonic() < deadline, path.read_text()
                status = stop(dashboard, signum)
        finally:
            if dashboard.poll() is None:
                dashboard.kill()
                dashboard.wait()
    text = path.read_text()
    assert status == 0, text
    assert f"event=stopping signal={signum.name}" in text
