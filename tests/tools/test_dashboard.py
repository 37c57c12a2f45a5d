"""`loopwarden dashboard`: its board (what the page shows), and the page
itself in headless Chromium while a trace flows through a real worker and
fleet stage."""

from __future__ import annotations

import asyncio
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
from streams.tools.dashboard import IN_FLIGHT_SECONDS, LATEST, Board

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet-trace.jsonl"
CONFIG = ROOT / "examples" / "loopwarden.json5"
NOW = 1796187600.0


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
                f"{rows}.length === {len(final)} && {rows}.map(tr => [tr.dataset.fingerprint, +tr.cells[3].textContent])"
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
