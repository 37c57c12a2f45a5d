"""`loopwarden dashboard`: one live page for operators.

It reads the decision and incident topics with consumers of its own (no
consumer group: it never joins, rebalances or commits, so it cannot take a
partition from a worker), from a chosen point, and keeps a bounded summary
(`Board`): verdicts per minute by decision, the incidents, the latest blocks
and aborts, the runs in flight. The page (dashboard.html, plain HTML and
JavaScript, nothing fetched from elsewhere) gets that summary as server-sent
events; a click on a run asks for its `explain` timeline, computed by
streams/tools/explain.py from the topics, as `loopwarden explain` does.
Every tenant's decisions topic is read too: each verdict, run and incident
carries its tenant, and the page filters by it (`/events?tenant=NAME`, `-`
for the default pair).
With ``--token-file`` every request must carry the token (streams/tools/access.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any

import msgspec

from schemas.codec import decode_incident, decode_verdict
from schemas.config import FleetConfig
from schemas.incidents import Incident
from schemas.policy import FleetPolicy
from schemas.topics import tenant_topics
from schemas.verdicts import Verdict
from streams.kafka import clients as kafka_clients
from streams.kafka.clients import PLAINTEXT, KafkaSecurity
from streams.listen import CannotListen, cannot_listen, check_free
from streams.observability import logs
from streams.tools import access, hosts
from streams.tools.timelines import Timelines
from streams.worker.tenants import TenantWatch

log = logging.getLogger("loopwarden.dashboard")

DECISIONS = ("allow", "warn", "block", "abort")
#: What the board keeps: the chart's minutes, the blocks and aborts listed,
#: the incidents listed, the runs it remembers, and how long a run without a
#: new verdict still counts as in flight.
CHART_MINUTES = 30
LATEST = 50
INCIDENTS = 100
RUNS = 5000
IN_FLIGHT_SECONDS = 300.0
#: How long one try to reach the broker may take (tries repeat every 2 s), and
#: how long a stop waits for the readers and for open pages: a stop is never
#: held up longer than that by a broker that does not answer or a page left open.
CONNECT_SECONDS = 5.0
STOP_SECONDS = 2.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


DEFAULT_PAIR = "-"
"""How the page and `/events?tenant=` name the default topic pair (no tenant's name can be spelt so)."""


def _shown(tenant: str | None, only: str | None) -> bool:
    """Whether an item of `tenant` passes the page's filter (`only`: None for every tenant)."""
    return only is None or only == (tenant or DEFAULT_PAIR)


class Board:
    """The page's state, fed by the decision topics (the default pair's and
    every tenant's) and the incident topic; every part bounded, every item
    with its tenant (None: the default pair)."""

    def __init__(self) -> None:
        self.minutes: OrderedDict[int, Counter[tuple[str | None, str]]] = OrderedDict()
        self.latest: deque[dict[str, Any]] = deque(maxlen=LATEST)
        self.incidents: OrderedDict[tuple[str | None, str, int], dict[str, Any]] = OrderedDict()
        self.runs: OrderedDict[tuple[str | None, str], dict[str, Any]] = OrderedDict()
        self.tenants: set[str] = set()
        self.version = 0

    def verdict(self, verdict: Verdict, at_ms: int, tenant: str | None = None) -> None:
        if tenant is not None:
            self.tenants.add(tenant)
        minute = at_ms // 60_000 * 60
        counts = self.minutes.get(minute)
        if counts is None:
            counts = self.minutes[minute] = Counter()
            while len(self.minutes) > CHART_MINUTES * 2:
                self.minutes.popitem(last=False)
        counts[tenant, verdict.decision] += 1
        at = at_ms / 1000
        if verdict.decision in ("block", "abort"):
            self.latest.appendleft(
                {
                    "at": at,
                    "tenant": tenant,
                    "run_id": verdict.run_id,
                    "agent_id": verdict.agent_id,
                    "decision": verdict.decision,
                    "tool_name": verdict.tool_name,
                    "detector": verdict.detector,
                    "count": verdict.count,
                    "message": verdict.message,
                }
            )
        key = (tenant, verdict.run_id)
        run = self.runs.pop(key, None) or {"tenant": tenant, "run_id": verdict.run_id, "calls": 0, "blocked": 0}
        run.update(agent_id=verdict.agent_id, last=verdict.decision, tool_name=verdict.tool_name, at=at)
        run["calls"] += 1
        run["blocked"] += verdict.decision == "block"
        run["aborted"] = verdict.decision == "abort"
        self.runs[key] = run
        if len(self.runs) > RUNS:
            self.runs.popitem(last=False)
        self.version += 1

    def incident(self, incident: Incident, at_ms: int) -> None:
        if incident.tenant is not None:
            self.tenants.add(incident.tenant)
        key = (incident.tenant, incident.fingerprint, incident.window_start)
        self.incidents.pop(key, None)
        self.incidents[key] = {**msgspec.to_builtins(incident), "at": at_ms / 1000}
        if len(self.incidents) > INCIDENTS:
            self.incidents.popitem(last=False)
        self.version += 1

    def snapshot(self, now: float, only: str | None = None) -> dict[str, Any]:
        """What the page shows at `now` (seconds) of tenant `only` (None: all;
        DEFAULT_PAIR: the default pair's): the chart's last minutes, incidents by runs,
        blocks and aborts newest first, runs with a verdict in the last five minutes and not aborted."""
        this_minute = int(now) // 60 * 60
        chart = []
        for minute in range(this_minute - 60 * (CHART_MINUTES - 1), this_minute + 60, 60):
            counts: Counter[str] = Counter()
            for (tenant, decision), n in self.minutes.get(minute, Counter()).items():
                if _shown(tenant, only):
                    counts[decision] += n
            chart.append({"t": minute, **{d: counts[d] for d in DECISIONS}})
        in_flight = [
            r
            for r in reversed(self.runs.values())
            if _shown(r["tenant"], only) and not r["aborted"] and now - r["at"] <= IN_FLIGHT_SECONDS
        ]
        incidents = [i for i in self.incidents.values() if _shown(i["tenant"], only)]
        return {
            "now": now,
            "tenant": only,
            "tenants": sorted(self.tenants),
            "chart": chart,
            "incidents": sorted(incidents, key=lambda i: (-i["runs"], -i["at"])),
            "latest": [b for b in self.latest if _shown(b["tenant"], only)],
            "runs": in_flight[:100],
            "runs_in_flight": len(in_flight),
        }


@dataclass(frozen=True)
class Source:
    """Where the board reads from, and where `explain` looks."""

    bootstrap: str
    decisions_topic: str
    incidents_topic: str
    events_topic: str
    start: str
    """earliest, latest, or a point `loopwarden audit --since` accepts (a time, or a duration ago)."""
    security: KafkaSecurity = PLAINTEXT
    tenant_refresh: float = 30.0
    """How often to look for tenants' decisions topics to read too (0: none)."""
    explain_window: float = 3600.0
    """How far back a run's timeline is read, in seconds (0: from the start of the topics)."""

    def topics_of(self, tenant: str | None) -> tuple[str, str]:
        """The (events, decisions) topics a run of `tenant` is explained from."""
        return (self.events_topic, self.decisions_topic) if tenant is None else tenant_topics(tenant)


async def _seek(consumer: Any, tps: list[Any], start: str) -> None:
    if start == "earliest":
        await consumer.seek_to_beginning(*tps)
    elif start == "latest":
        await consumer.seek_to_end(*tps)
    else:
        from streams.tools.audit import parse_since

        found = await consumer.offsets_for_times({tp: parse_since(start) for tp in tps})
        for tp in tps:
            if found.get(tp) is None:
                await consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, found[tp].offset)


async def follow(source: Source, topic: str, take: Any, ready: asyncio.Event | None = None) -> None:
    """Feed every record of `topic` from the source's start to `take(value, timestamp_ms)`;
    waits for a topic that does not exist yet (the incident topic before the fleet stage runs)."""
    from aiokafka import TopicPartition

    from streams.kafka.topics import describe_partitions

    # Asked without creating the topic, so that the stage which owns it creates it with its partitions.
    said = False
    while True:
        try:
            partitions = await asyncio.to_thread(
                describe_partitions, source.bootstrap, [topic], timeout=CONNECT_SECONDS, security=source.security
            )
            problem = None if partitions else "no such topic yet"
        except Exception as exc:  # the broker is down or unreachable: the page waits for it
            partitions, problem = {}, f"{type(exc).__name__}: {exc}"
        if partitions:
            break
        if not said:
            logs.event(log, logging.WARNING, f"waiting for {topic}", event="waiting", topic=topic, problem=problem)
            said = True
        await asyncio.sleep(2.0)
    consumer = kafka_clients.aio_consumer(
        source.bootstrap,
        security=source.security,
        group_id=None,
        enable_auto_commit=False,
        client_id="loopwarden-dashboard",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions[topic])]
        consumer.assign(tps)
        await _seek(consumer, tps, source.start)
        if ready is not None:
            ready.set()
        while True:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for records in batch.values():
                for record in records:
                    take(record.value, record.timestamp)
    finally:
        await consumer.stop()


async def follow_tenants(source: Source, board: Board) -> None:
    """Read every tenant's decisions topic as well, each found at once and
    every `tenant_refresh` as the worker finds them (streams/worker/tenants.py)."""
    readers: list[asyncio.Task[None]] = []

    def read(tenant: str, partitions: int) -> None:
        take = _feeder(board, decode_verdict, partial(Board.verdict, tenant=tenant), "a verdict")
        readers.append(asyncio.create_task(follow(source, tenant_topics(tenant)[1], take)))

    watch = TenantWatch(source.bootstrap, source.security, None, read, log)
    try:
        while True:
            await watch.refresh()
            await asyncio.sleep(source.tenant_refresh)
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


def _feeder(board: Board, decode: Any, add: Any, what: str) -> Any:
    def take(value: bytes, at_ms: int) -> None:
        try:
            item = decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logs.event(log, logging.WARNING, f"not {what}: skipped", event="bad_record", error=str(exc)[:200])
            return
        add(board, item, at_ms)

    return take


def create_app(
    source: Source,
    config: FleetConfig,
    policy: FleetPolicy | None,
    board: Board,
    token: str | None = None,
    names: frozenset[str] = hosts.allowed_names("127.0.0.1"),
) -> Any:
    """The aiohttp application: the page, its live feed and the explain timeline;
    only for requests whose Host is one of `names` or the address reached, and
    with ``token``, only for those that carry it."""
    from aiohttp import web

    from streams.kafka.reader import ReadError

    timelines = Timelines(source.bootstrap, config, policy, source.explain_window, source.security)
    page = resources.files("streams.tools").joinpath("dashboard.html").read_bytes()

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8")

    async def feed(request: web.Request) -> web.StreamResponse:
        only = request.query.get("tenant") or None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        sent = -1
        try:
            while True:
                if board.version != sent:
                    sent = board.version
                    await response.write(b"data: " + json.dumps(board.snapshot(time.time(), only)).encode() + b"\n\n")
                else:
                    await response.write(b": idle\n\n")  # finds a closed connection
                await asyncio.sleep(1.0)
        except ConnectionResetError:  # the page was closed
            return response

    async def explain_run(request: web.Request) -> web.Response:
        run_id = request.query.get("run", "")
        if not run_id:
            return web.Response(status=400, text="missing ?run=RUN_ID")
        tenant = request.query.get("tenant", DEFAULT_PAIR)
        try:
            events, decisions = source.topics_of(None if tenant == DEFAULT_PAIR else tenant)
        except ValueError as exc:
            return web.Response(status=400, text=str(exc))
        try:
            timeline = await timelines.get(run_id, events, decisions)
        except ReadError as exc:  # no events topic, or the broker is unreachable
            return web.Response(status=503, text=f"cannot read run {run_id}: {exc}")
        return web.Response(text=timeline.text, status=200 if timeline.found else 404)

    checks = [hosts.middleware(names), *([access.middleware(token)] if token else [])]
    app = web.Application(middlewares=checks)
    app.router.add_get("/", index)
    app.router.add_get("/events", feed)
    app.router.add_get("/explain", explain_run)
    return app


async def serve(
    source: Source,
    config: FleetConfig,
    policy: FleetPolicy | None,
    host: str,
    port: int,
    token: str | None = None,
    names: frozenset[str] = frozenset(),
) -> None:
    from aiohttp import web

    board = Board()
    # access_log=None: no line per request. The feed's handlers never end on
    # their own, so a stop cancels them after STOP_SECONDS.
    runner = web.AppRunner(
        create_app(source, config, policy, board, token, names), access_log=None, shutdown_timeout=STOP_SECONDS
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:  # the port is taken, or the address is not this host's
        await runner.cleanup()
        raise cannot_listen(host, port, exc) from None
    readers = [
        asyncio.create_task(
            follow(source, source.decisions_topic, _feeder(board, decode_verdict, Board.verdict, "a verdict"))
        ),
        asyncio.create_task(
            follow(source, source.incidents_topic, _feeder(board, decode_incident, Board.incident, "an incident"))
        ),
        *([asyncio.create_task(follow_tenants(source, board))] if source.tenant_refresh > 0 else []),
    ]
    logs.event(
        log,
        logging.INFO,
        f"dashboard on http://{host}:{port}/",
        event="serving",
        **source.security.log_fields(),
        decisions=source.decisions_topic,
        incidents=source.incidents_topic,
        start=source.start,
        token="required" if token else "none",
        hosts=",".join(sorted(names)),
    )
    stopped = _stop_signals()
    try:
        done, _ = await asyncio.wait([stopped, *readers], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopped}:
            task.result()  # a reader that failed stops the page, with its error
        logs.event(log, logging.INFO, "dashboard stopping", event="stopping", signal=stopped.result())
    finally:
        for signum in STOP_SIGNALS:
            asyncio.get_running_loop().remove_signal_handler(signum)  # a second one interrupts the stop
        for task in readers:
            task.cancel()
        await asyncio.wait(readers, timeout=STOP_SECONDS)
        await runner.cleanup()


def _stop_signals() -> asyncio.Future[str]:
    """Resolved with the name of the first SIGINT or SIGTERM. Handled here
    rather than left to asyncio.run, which does not handle SIGINT in a process
    that started with it ignored (a background job of a shell), and leaves
    SIGTERM to kill the process without closing its connections."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[str] = loop.create_future()

    def on_signal(signum: signal.Signals) -> None:
        if not received.done():
            received.set_result(signum.name)

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    return received


def _check_refusal(bootstrap: str, security: KafkaSecurity) -> None:
    """ConnectionRefused when the brokers refuse this client (TLS, SASL): the
    page stops. Brokers that do not answer yet are no reason to stop: the
    readers wait for them and say so (`follow`), however long that takes."""
    try:
        kafka_clients.check_connection(bootstrap, security, retry=False)
    except kafka_clients.KafkaUnreachable:
        pass


def main(args: Any) -> int:
    """The `loopwarden dashboard` command (argparse namespace from streams.cli)."""
    from schemas.configfile import load_for_cli
    from streams.kafka.options import default_bootstrap, security_from_args

    logs.setup("info", "logfmt")
    token_file = args.token_file or os.environ.get(access.ENV)
    try:
        token = access.read_token(token_file) if token_file else None
    except access.BadToken as exc:
        print(f"loopwarden dashboard: {exc}", file=sys.stderr)
        return 2
    if token is None and not hosts.is_loopback(args.host):
        print(
            f"loopwarden dashboard: --host {args.host} is reachable beyond this machine and every run's timeline"
            " would be open to it: pass --token-file, or listen on 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    config, policy = load_for_cli(args.config, args.policy, sys.stderr)
    names = hosts.allowed_names(args.host, args.allow_host)
    bootstrap, security = default_bootstrap(args.bootstrap), security_from_args(args)
    source = Source(
        bootstrap,
        args.decisions_topic,
        args.incidents_topic,
        args.events_topic,
        args.start,
        security,
        args.tenant_refresh,
        args.explain_window,
    )
    try:
        check_free(args.host, args.port)  # named at once, before any broker is asked
        _check_refusal(bootstrap, security)
        asyncio.run(serve(source, config, policy, args.host, args.port, token, names))
    except CannotListen as exc:
        print(f"loopwarden dashboard: {exc}", file=sys.stderr)
        return 1
    return 0
