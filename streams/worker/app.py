"""The stream processor: a Faust app, partitioned by run id.

    loopwarden.events ──▶ intake ──▶ engine.apply ──▶ loopwarden.decisions
                           │                ╰── bad input ──▶ loopwarden.deadletter
                           ╰── runs table (RocksDB + changelog), written after the verdicts

The consumer hands each fetched batch of events to the processor in one call
(streams/worker/intake.py: Faust's per-message delivery costs more than everything
else together). The processor takes the events in order, decodes each exactly
as ``loopwarden replay`` does, loads the run's state (from the in-memory
overlay of runs in flight, else the table), applies the engine and sends the
verdict without waiting. Events are grouped into chunks; a finisher task
waits until the broker has acknowledged a chunk's verdicts and dead letters,
then writes the states the chunk left to the table, and only then
acknowledges the chunk's events to Faust, whose offset commits follow the
acknowledgements. No durable record gets ahead of the published verdicts, so
a crash anywhere makes Kafka redeliver events whose verdicts are recomputed
byte for byte (docs/PROCESSING.md says why this is enough).

Faust is used with raw bytes everywhere (no models, no serializer work); the
verdict bytes are exactly ``encode_verdict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable
from typing import Any, NoReturn

import faust
import msgspec
from faust.types.tuples import Message
from faust.worker import Worker as FaustWorker

from schemas.codec import BadEvent, decode_event, encode_verdict
from schemas.config import FleetConfig
from schemas.state import RunState, StoredRun
from schemas.verdicts import Verdict
from streams.observability import logs
from streams.apply import apply_safely
from streams.worker import intake
from streams.worker.faust_fixes import harden_faust
from streams.worker.runtable import RunTable, decode_stored, encode_stored, touched_at
from streams.worker.settings import EXACTLY_ONCE, Settings, format_duration

log = logging.getLogger("loopwarden.worker")

TABLE_NAME = "runs"

#: A run's stored state and a verdict must each fit in one Kafka message
#: (brokers refuse messages over ~1 MB by default). Only pathological
#: events (megabyte-long tool names or error texts) come near these.
MAX_STATE_BYTES = 512 * 1024
MAX_VERDICT_BYTES = 512 * 1024
MAX_FIELD_CHARS = 4096
#: Producer request limit: a dead letter carries an event of up to
#: --max-event-bytes unchanged, plus headers.
PRODUCER_MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: State writes between two chances for the processor to take new events.
WRITES_PER_YIELD = 200
#: Events taken from one fetched batch (up to thousands) between two chances
#: for the rest of the worker to run.
TAKES_PER_YIELD = 500
#: Per-partition producer batch: room for a few hundred stored states, not
#: Faust's 16 KiB (three full states), which splits one flush into thousands of requests.
PRODUCER_BATCH_BYTES = 512 * 1024

# Dead-letter headers: the value stays the original bytes, untouched.
H_REASON = "loopwarden.reason"
H_KIND = "loopwarden.kind"
H_TOPIC = "loopwarden.source.topic"
H_PARTITION = "loopwarden.source.partition"
H_OFFSET = "loopwarden.source.offset"
H_KEY = "loopwarden.source.key"


class Chunk:
    """Events taken in a row, finished together: their verdicts and dead
    letters must be acknowledged by the broker before the states they left
    are written and the events themselves are acknowledged to Faust."""

    __slots__ = ("messages", "sent", "touched", "snapshots", "started")

    def __init__(self) -> None:
        self.started = 0.0  # perf_counter() when its first event joins
        self.messages: list[Message] = []
        self.sent: list[Awaitable[Any]] = []
        # (partition, run key) -> [message, live entry, dirty]
        self.touched: dict[tuple[int, bytes], list[Any]] = {}
        self.snapshots: list[tuple[Message, bytes, bytes]] = []


class Processor:
    """State and behaviour of the worker's processing; one per worker process.

    The consumer hands over fetched batches (``feed``, see streams/worker/intake.py);
    the processing task takes their events one by one, applies the engine at
    once and sends the verdicts without waiting. Events accumulate in the open
    *chunk*; a finisher task closes it after ``flush_interval`` (or when it
    holds ``batch_size`` events), snapshotting the states it left as bytes,
    waits until the broker has acknowledged every message the chunk sent,
    writes the snapshots to the table, and only then acknowledges the chunk's
    events to Faust (which commits offsets only of acknowledged events).
    While a chunk waits for its acknowledgements the processing goes on into
    the next one, so waiting for the broker costs latency, not throughput.
    The newest state of every run in flight is kept in memory (``live``) so
    later events of the run see it.
    """

    def __init__(self, app: faust.App, settings: Settings, config: FleetConfig, table: Any) -> None:
        self.app = app
        self.settings = settings
        self.config = config
        self.runs = RunTable(app, table)
        self.decisions = settings.topics.decisions
        self.deadletter = settings.topics.deadletter
        self.exactly_once = settings.processing_guarantee == EXACTLY_ONCE
        self.counts: Counter[str] = Counter()
        self._reported: dict[str, int] = {}
        # (partition, run key) -> [StoredRun, chunk that touched it last]
        self.live: dict[tuple[int, bytes], list[Any]] = {}
        self.open = Chunk()
        self.closed: deque[Chunk] = deque()
        self.pending: deque[list[Message]] = deque()  # fed, not taken yet
        self.in_flight = 0  # fed, not finished yet
        self._fed = asyncio.Event()
        self._wake = asyncio.Event()  # the open batch got its first event
        self._queued = asyncio.Event()  # a batch was closed
        self._drained = asyncio.Event()
        self._transactional: dict[int, str] = {}
        # Prometheus metrics (streams/observability/metrics.py) only when the web server
        # that serves them is on: no per-event cost otherwise.
        self.metrics: Any = None
        if settings.web_port is not None:
            from streams.observability.metrics import METRICS

            self.metrics = METRICS

    # -- intake ------------------------------------------------------------

    def feed(self, messages: list[Message]) -> None:
        """A batch fetched by the consumer (already tracked for commits)."""
        self.pending.append(messages)
        self.in_flight += len(messages)
        self._fed.set()

    def room(self) -> Awaitable[None] | None:
        """None while fewer than ``max_in_flight`` events are unfinished."""
        if self.in_flight < self.settings.max_in_flight:
            return None
        self._drained.clear()
        return self._drained.wait()

    async def run(self) -> None:
        """Take every fed event in order, for as long as the worker runs.

        Events taken are acknowledged by the finisher only; Faust waits for
        that before it stops or rebalances. If this task stops, whatever was
        not acknowledged is redelivered."""
        finisher = asyncio.ensure_future(self._finisher())
        pending = self.pending
        batch_size = self.settings.batch_size
        try:
            while True:
                if not pending:
                    self._fed.clear()
                    await self._fed.wait()
                    continue
                for n, message in enumerate(pending.popleft(), 1):
                    await self.take(message)
                    if len(self.open.messages) >= batch_size:
                        self._close_open()
                    if n % TAKES_PER_YIELD == 0:
                        await asyncio.sleep(0)  # the producer, finisher and timers get their turn
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            _exit_for_redelivery("cannot take an event", exc)
        finally:
            finisher.cancel()

    async def take(self, message: Message) -> None:
        """Decode, apply, send; the event joins the open chunk."""
        chunk = self.open
        raw = message.value
        metrics = self.metrics
        if metrics is not None:
            started = time.perf_counter()
            metrics.offset_seen(message.topic, message.partition, message.offset, self.app.consumer.highwater(message.tp))
        tid = self._transactional_id(message.partition) if self.exactly_once else None
        chunk.messages.append(message)
        if len(chunk.messages) == 1:
            chunk.started = time.perf_counter()
            self._wake.set()
        try:
            if not raw:
                raise BadEvent("empty", "empty message: no value")
            if len(raw) > self.settings.max_event_bytes:
                raise BadEvent("too_large", f"event too large: {len(raw)} bytes (limit {self.settings.max_event_bytes})")
            decoded = decode_event(raw)
            key = decoded.run_id.encode()
            if message.key != key:
                raise BadEvent("key_mismatch", f"message key {_show_key(message.key)} is not the event's run_id {decoded.run_id!r}")
            slot = (message.partition, key)
            entry = self.live.get(slot)
            if entry is None:
                entry = self.live[slot] = [self._load(message, key), chunk]
            try:
                outcome = apply_safely(entry[0].state, decoded, self.config)
            except BadEvent:
                raise
            except Exception as exc:  # an engine bug must not stop the fleet
                log.exception(
                    "engine failed on an event",
                    extra={"fields": {"event": "engine_error", "run_id": decoded.run_id, "seq": decoded.seq}},
                )
                raise BadEvent("engine_error", f"engine error: {type(exc).__name__}: {exc}") from None
        except BadEvent as exc:
            chunk.sent.append(await self._dead_letter(message, exc, tid))
            return
        entry[1] = chunk
        touched = chunk.touched.get(slot)
        if touched is None:
            touched = chunk.touched[slot] = [message, entry, False]
        self.counts["events"] += 1
        if metrics is not None:
            metrics.outcome(type(decoded).__struct_config__.tag, outcome)
            metrics.processed(time.perf_counter() - started)
        if outcome.duplicate:
            self.counts["duplicates"] += 1
            return
        entry[0].state = outcome.state
        touched[0] = message
        touched[2] = True
        for verdict in outcome.verdicts:
            data = encode_verdict(verdict)
            if len(data) > MAX_VERDICT_BYTES:
                data = self._shrunk(verdict, len(data))
            chunk.sent.append(
                await self.app.producer.send(self.decisions, key, data, None, None, None, transactional_id=tid)
            )
            self.counts["verdicts"] += 1
            if verdict.decision != "allow":
                self._log_verdict(verdict)
        if outcome.armed:
            self.counts["guards_armed"] += 1
            logs.event(
                log,
                logging.INFO,
                f"post-compaction guard armed for {outcome.armed} attempts",
                event="guard_armed",
                run_id=decoded.run_id,
                seq=decoded.seq,
                attempts=outcome.armed,
            )

    def _load(self, message: Message, key: bytes) -> StoredRun:
        data = self.runs.get(message.partition, key)
        if data is None:
            return StoredRun(0.0, RunState())
        try:
            return decode_stored(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Not written by this version: start the run afresh rather than
            # stop every run of the partition behind it.
            self.counts["states_unreadable"] += 1
            logs.event(
                log, logging.ERROR, "stored run state unreadable; starting the run afresh",
                event="state_unreadable", run_id=key.decode("utf-8", "replace")[:200], error=str(exc)[:200],
            )  # fmt: skip
            return StoredRun(0.0, RunState())

    def _close_open(self) -> None:
        """Snapshot the states the open chunk left and queue it."""
        chunk, self.open = self.open, Chunk()
        now = time.time()
        for (_partition, key), (message, entry, dirty) in chunk.touched.items():
            if dirty:
                stored = entry[0]
                stored.touched = now
                chunk.snapshots.append((message, key, self._encode_state(key, stored)))
        self.closed.append(chunk)
        self._queued.set()

    def _encode_state(self, key: bytes, stored: StoredRun) -> bytes:
        """The stored run's bytes; a state that cannot be stored (too large
        for one message) keeps only its last seq, so the worker never stalls
        on one pathological run."""
        try:
            data = encode_stored(stored)
            if len(data) <= MAX_STATE_BYTES:
                return data
            problem = f"{len(data)} bytes (limit {MAX_STATE_BYTES})"
        except (OverflowError, TypeError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        self.counts["states_reset"] += 1
        logs.event(
            log, logging.ERROR, "run state cannot be stored; keeping only its last seq",
            event="state_reset", run_id=key.decode("utf-8", "replace")[:200], problem=problem,
        )  # fmt: skip
        stored.state = RunState(last_seq=stored.state.last_seq)
        return encode_stored(stored)

    def _shrunk(self, verdict: Verdict, size: int) -> bytes:
        """A verdict too large for one message, with its long strings cut."""
        self.counts["verdicts_shrunk"] += 1
        logs.event(
            log, logging.ERROR, "verdict too large; long fields shortened",
            event="verdict_shrunk", run_id=verdict.run_id[:200], seq=verdict.seq, size=size,
        )  # fmt: skip
        changes = {}
        for name in ("run_id", "tool_call_id", "tool_name", "message", "warning_key", "paired_tool_name"):
            value = getattr(verdict, name)
            if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
                changes[name] = value[:MAX_FIELD_CHARS] + "…[truncated]"
        return encode_verdict(msgspec.structs.replace(verdict, **changes))

    async def _finisher(self) -> None:
        ack = self.app.consumer.ack
        try:
            while True:
                if not self.closed:
                    if not self.open.messages:
                        self._wake.clear()
                        await self._wake.wait()
                        continue
                    gather_for = self.open.started + self.settings.flush_interval - time.perf_counter()
                    if gather_for > 0:
                        # Let the batch gather: a run touched again meanwhile
                        # is stored once. The processor closes a full batch itself.
                        self._queued.clear()
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._queued.wait(), gather_for)
                        continue
                    self._close_open()
                chunk = self.closed[0]
                if chunk.sent:
                    # Delivery acknowledged by the broker (acks=all) before any
                    # state is written: the table never gets ahead of the
                    # published verdicts.
                    await asyncio.gather(*chunk.sent)
                written = await self._write(chunk)
                if written:
                    # The changelog holds the states before the events are
                    # acknowledged, so a worker that takes the partition over
                    # restores at least what the committed offsets imply.
                    await asyncio.gather(*written)
                for message in chunk.messages:
                    ack(message)
                self.closed.popleft()
                if self.metrics is not None:
                    self.metrics.batch(time.perf_counter() - chunk.started)
                self.in_flight -= len(chunk.messages)
                self.counts["chunks"] += 1
                self._drained.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # Verdicts could not be delivered (or the table refused a write):
            # nothing of this chunk was acknowledged, so exiting now makes
            # Kafka redeliver it; going on could commit past it.
            _exit_for_redelivery("cannot finish a batch", exc)

    async def _write(self, chunk: Chunk) -> list[Awaitable[Any]]:
        put = self.runs.put
        written = []
        for n, (message, key, data) in enumerate(chunk.snapshots, 1):
            written.append(await put(message.partition, key, data))
            if n % WRITES_PER_YIELD == 0:
                await asyncio.sleep(0)  # new events get their verdicts meanwhile
        live = self.live
        for slot, (_event, entry, _dirty) in chunk.touched.items():
            if entry[1] is chunk and live.get(slot) is entry:
                del live[slot]  # no later chunk uses it: the table has it now
        return written

    def _transactional_id(self, partition: int) -> str:
        tid = self._transactional.get(partition)
        if tid is None:
            group = self.app.assignor.group_for_topic(self.settings.topics.events)
            tid = self._transactional[partition] = f"{self.app.conf.id}-{group}-{partition}"
        return tid

    async def _dead_letter(self, message: Any, refusal: BadEvent, tid: str | None) -> Awaitable[Any]:
        kind, reason = refusal.kind, str(refusal)
        if self.metrics is not None:
            self.metrics.deadletter(kind)
        self.counts["deadlettered"] += 1
        self.counts[f"deadlettered.{kind}"] += 1
        logs.event(
            log,
            logging.WARNING,
            "event dead-lettered",
            event="deadletter",
            kind=kind,
            reason=reason[:300],
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
        )
        headers = [
            (H_REASON, reason.encode("utf-8", "replace")),
            (H_KIND, kind.encode()),
            (H_TOPIC, str(message.topic).encode()),
            (H_PARTITION, str(message.partition).encode()),
            (H_OFFSET, str(message.offset).encode()),
        ]
        try:
            return await self.app.producer.send(
                self.deadletter, message.key, message.value, None, None, headers, transactional_id=tid
            )
        except Exception as exc:  # e.g. larger than the producer may send
            self.counts["deadletter_failed"] += 1
            logs.event(
                log, logging.ERROR, "cannot dead-letter an event; it stays only in its source topic",
                event="deadletter_failed", topic=message.topic, partition=message.partition,
                offset=message.offset, error=f"{type(exc).__name__}: {exc}"[:300],
            )  # fmt: skip
            return _done()

    def _log_verdict(self, verdict: Verdict) -> None:
        decision = verdict.decision
        self.counts[decision] += 1
        logs.event(
            log,
            logging.ERROR if decision == "abort" else logging.WARNING,
            {"warn": "warning delivered", "block": "tool call blocked", "abort": "run aborted"}[decision],
            event=decision,
            run_id=verdict.run_id,
            seq=verdict.seq,
            tool=verdict.tool_name,
            detector=verdict.detector,
            count=verdict.count,
            warning_key=verdict.warning_key,
        )

    # -- timers ------------------------------------------------------------

    async def sweep(self) -> int:
        """Expire runs idle longer than the TTL, in partitions this worker
        owns as active (never standbys, never while rebalancing)."""
        if self.app.rebalancing:
            return 0
        cutoff = time.time() - self.settings.ttl
        expired = held = 0
        for partition in self.runs.active_partitions():
            for seen, (key, value) in enumerate(self.runs.scan(partition), 1):
                held += 1
                if seen % 1024 == 0:
                    await asyncio.sleep(0)  # a large table does not hold up the processor
                    if self.app.rebalancing or partition not in self.runs.active_partitions():
                        break
                try:
                    recent = touched_at(value) >= cutoff
                except (msgspec.DecodeError, msgspec.ValidationError):
                    recent = False  # unreadable: expire it like an idle run
                if recent or (partition, key) in self.live:
                    continue  # recent, or in flight right now
                if await self.runs.expire(partition, key, cutoff):
                    expired += 1
            await asyncio.sleep(0)
        if self.metrics is not None:
            self.metrics.active_runs.set(held - expired)
        if expired:
            self.counts["expired"] += expired
            logs.event(log, logging.INFO, "idle runs expired", event="expired", runs=expired, ttl=self.settings.ttl)
        return expired

    async def report(self, final: bool = False) -> None:
        """A summary line when something happened since the last one."""
        counts = dict(self.counts)
        if counts == self._reported and not final:
            return
        delta = {k: v - self._reported.get(k, 0) for k, v in counts.items()}
        self._reported = counts
        logs.event(
            log,
            logging.INFO,
            "final counts" if final else "processing summary",
            event="summary",
            **{k.replace(".", "_"): v for k, v in sorted(counts.items())},
            **({} if final else {"new_events": delta.get("events", 0)}),
        )


#: Young-generation collections every 50,000 net allocations instead of 700,
#: and full ones rarely: a gateway waits while the worker collects.
GC_THRESHOLDS = (50_000, 50, 1_000)


def settle_gc() -> None:
    """Once the worker runs: move what start-up built (Faust, the app, the
    modules) out of the collector's way, and collect young objects in larger,
    rarer passes. Measured in bench/README.md ("Decision latency"): p99 at
    2,000 calls/s about halved."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _exit_for_redelivery(what: str, exc: BaseException) -> NoReturn:
    """Stop the process without acknowledging anything more: Kafka redelivers
    every event not finished, which is safe, whereas going on could commit
    past events that never got their verdicts."""
    log.critical(
        f"{what}; exiting so that its events are redelivered",
        exc_info=exc,
        extra={"fields": {"event": "fatal", "error": type(exc).__name__}},
    )
    logging.shutdown()
    os._exit(70)


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


def _show_key(key: bytes | None) -> str:
    if key is None:
        return "(none)"
    try:
        return repr(key.decode())
    except UnicodeDecodeError:
        return repr(key)


def create_app(settings: Settings, config: FleetConfig, events_partitions: int) -> tuple[faust.App, Processor]:
    """The Faust app with its topic, table, processing task and timers."""
    app = faust.App(
        settings.app_id,
        broker=settings.broker_url,
        autodiscover=False,
        store="rocksdb://",
        datadir=str(settings.data_dir),
        processing_guarantee=settings.processing_guarantee,
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=events_partitions,
        topic_replication_factor=settings.topics.replication_factor,
        topic_disable_leader=True,
        table_standby_replicas=settings.standby_replicas,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=settings.heartbeat_interval,
        broker_commit_interval=settings.commit_interval,
        stream_recovery_delay=settings.recovery_delay,
        consumer_auto_offset_reset="earliest",
        producer_linger_ms=settings.linger_ms,
        producer_max_request_size=PRODUCER_MAX_REQUEST_BYTES,
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        web_enabled=settings.web_port is not None,
        web_port=settings.web_port or 6066,
        web_host="127.0.0.1",
    )
    events = app.topic(
        settings.topics.events,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=events_partitions,
    )
    table = app.Table(
        TABLE_NAME,
        key_type=bytes,  # bytes types mean the "raw" serializer: no codec work
        value_type=bytes,
        partitions=events_partitions,
        help="per-run loop-detection state (StoredRun, msgpack)",
        options={
            "write_buffer_size": 4 * 1024 * 1024,
            "max_write_buffer_number": 2,
            "block_cache_size": 8 * 1024 * 1024,
            "block_cache_compressed_size": 0,
        },
    )
    harden_faust(app)
    if settings.web_port is not None:
        from streams.observability.metrics import install as install_metrics

        install_metrics(app)  # GET /metrics on the web server
    processor = Processor(app, settings, config, table)
    app.topics.add(events)  # subscribed, acknowledged, committed as an agent's topic would be
    intake.install(app, settings.topics.events, processor)

    async def process() -> None:
        settle_gc()
        await processor.run()

    app.task(process, traced=False)
    # Timer functions take no argument: Faust passes the app to one that does.
    async def sweep() -> None:
        await processor.sweep()

    async def report() -> None:
        await processor.report()

    app.timer(settings.effective_sweep_interval, name="loopwarden.sweep")(sweep)
    app.timer(settings.stats_interval, name="loopwarden.report")(report)

    @app.on_before_shutdown.connect
    async def _final_counts(sender: Any, **kwargs: Any) -> None:
        await processor.report(final=True)

    @app.on_partitions_assigned.connect
    async def _assigned(sender: Any, assigned: Any = (), **kwargs: Any) -> None:
        mine = sorted(tp.partition for tp in app.assignor.assigned_actives() if tp.topic == settings.topics.events)
        logs.event(
            log, logging.INFO, "partitions assigned", event="assigned",
            topic=settings.topics.events, partitions=",".join(map(str, mine)) or "none",
        )  # fmt: skip

    return app, processor


class Worker(FaustWorker):
    """Faust's worker (its log lines keep the name), with two changes to how a
    signal (SIGTERM, SIGINT) stops it. Neither can lose an event: one is
    acknowledged only once its verdict is delivered.

    - An error raised while the signal stops the start-up is the stop, not a
      failure: exit 0. Faust stops every service, also those still starting,
      and one can fail instead of stopping. Seen while the table's changelog
      topic is declared: the conductor awaits the same declaration, the stop
      cancels its task and with it the future it shares with the declaration
      (mode's ``StampedeWrapper``), whose ``set_result`` then raises
      InvalidStateError. An error raised before any signal still exits 1.
    - A stop not finished `stop_timeout` seconds after the signal ends the
      process (status 1, one `stop_overdue` error line), before the
      supervisor's grace period does and as its SIGKILL would. Seen, rarely,
      when the signal lands while the consumer is joining its group.
    """

    def __init__(self, app: faust.App, *, stop_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.stop_timeout = stop_timeout
        self._watchdog: threading.Timer | None = None

    def _flag_as_shutdown_by_signal(self) -> None:
        super()._flag_as_shutdown_by_signal()  # Faust's SIGTERM and SIGINT handlers both call it
        if self._watchdog is None:  # a thread: the event loop may be what is stuck
            self._watchdog = threading.Timer(self.stop_timeout, self._stop_overdue)
            self._watchdog.daemon = True
            self._watchdog.start()

    def _stop_overdue(self) -> None:
        logs.event(
            log, logging.ERROR, f"stop not finished {format_duration(self.stop_timeout)} after the signal: exiting",
            event="stop_overdue", stop_timeout=self.stop_timeout,
        )  # fmt: skip
        logging.shutdown()
        os._exit(1)

    async def start(self) -> None:
        try:
            await super().start()
        except Exception as exc:
            if not self._shutdown_immediately:  # Faust sets it on SIGTERM/SIGINT, before stopping
                raise
            logs.event(
                log, logging.WARNING, "start-up stopped by a signal", event="startup_interrupted",
                error=f"{type(exc).__name__}: {exc}"[:300],
            )  # fmt: skip


def run_worker(settings: Settings) -> int:
    """``loopwarden worker``: load config, make topics, run until stopped.

    Returns the process exit code; a config error raises ConfigError (the CLI
    turns it into exit 2) before anything connects to Kafka.
    """
    from schemas.configfile import load_config
    from streams.worker.topics import TopicError, describe_partitions, ensure_topics

    logs.setup(settings.loglevel, settings.log_format, library_level=settings.faust_loglevel)
    resolved = load_config(settings.config_path)
    for note in resolved.notes:
        logs.event(log, logging.WARNING, note, event="config_corrected")
    try:
        if settings.create_topics:
            states = ensure_topics(settings.bootstrap, settings.topics)
            for state in states:
                if state.created:
                    logs.event(
                        log, logging.INFO, "topic created", event="topic_created",
                        topic=state.name, partitions=state.partitions,
                    )  # fmt: skip
            partitions = states[0].partitions
        else:
            found = describe_partitions(settings.bootstrap, [settings.topics.events])
            if settings.topics.events not in found:
                raise TopicError(f"events topic {settings.topics.events} does not exist (and --no-create-topics)")
            partitions = found[settings.topics.events]
    except TopicError as exc:
        logs.event(log, logging.ERROR, str(exc), event="startup_failed")
        return 1
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.processing_guarantee == EXACTLY_ONCE:
        logs.event(
            log, logging.WARNING,
            "exactly_once puts verdicts in Kafka transactions but not the run table; see docs/PROCESSING.md",
            event="guarantee",
        )  # fmt: skip
    app, _processor = create_app(settings, resolved.config, partitions)
    logs.event(
        log,
        logging.INFO,
        "worker starting",
        event="starting",
        app_id=settings.app_id,
        bootstrap=settings.bootstrap,
        events=settings.topics.events,
        decisions=settings.topics.decisions,
        deadletter=settings.topics.deadletter,
        partitions=partitions,
        guarantee=settings.processing_guarantee,
        standby_replicas=settings.standby_replicas,
        ttl=settings.ttl,
        data_dir=str(settings.data_dir),
        config=settings.config_path or os.environ.get("LOOPWARDEN_CONFIG") or "(defaults)",
    )
    worker = Worker(
        app,
        stop_timeout=settings.stop_timeout,
        loglevel=settings.loglevel,
        quiet=True,
        override_logging=False,
        redirect_stdouts=False,
    )
    worker.spinner = None  # no terminal animation: the log is the interface
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
