"""The processor: events in, verdicts and dead letters out, in order.

The consumer hands over fetched batches (``feed``, see
streams/worker/transport.py); the processing task takes their events one by
one, decodes each exactly as ``loopwarden replay`` does, loads the run's state
(streams/worker/store.py), applies the engine and sends the verdict without
waiting. Each event joins the open checkpoint (streams/worker/checkpoint.py),
which acknowledges it once its verdicts and the state it left are durable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable
from typing import Any, NoReturn

import faust
import msgspec
from msgspec import UNSET
from faust.types.tuples import Message

from schemas import topics
from schemas.codec import BadEvent, decode_event, encode_verdict
from schemas.config import FleetConfig
from schemas.policy import FleetPolicy
from schemas.verdicts import Verdict
from streams.engine.entry import apply_safely
from streams.observability import logs
from streams.observability.metrics import FaustOwnership, WorkerMetrics
from streams.worker.checkpoint import Checkpoint, Checkpoints
from streams.worker.settings import EXACTLY_ONCE, Settings
from streams.worker.stages import StageTrace
from streams.worker.expansion import Oversized
from streams.worker.tenants import Routes
from streams.worker.store import RunStates

log = logging.getLogger("loopwarden.worker")

#: A verdict must fit in one Kafka message (brokers refuse messages over
#: ~1 MB by default). Only pathological events come near it.
MAX_VERDICT_BYTES = 512 * 1024
MAX_FIELD_CHARS = 4096
#: Events taken from one fetched batch (up to thousands) between two chances
#: for the rest of the worker to run.
TAKES_PER_YIELD = 500


class Processor:
    """State and behaviour of the worker's processing; one per worker process."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        config: FleetConfig,
        table: Any,
        policy: FleetPolicy | None = None,
        decisions_partitions: int = 1,
    ) -> None:
        self.app = app
        self.settings = settings
        self.config = config
        self.policy = policy
        # The events topics the transport feeds (streams.worker.transport.Intake), each with its route.
        self.topics = Routes(settings.topics.events, settings.topics.decisions, decisions_partitions)
        self.deadletter = settings.topics.deadletter
        self.exactly_once = settings.processing_guarantee == EXACTLY_ONCE
        # Per-event timings and consumer positions only when the web server
        # that serves them is on: no per-event cost otherwise.
        self.metrics = WorkerMetrics(FaustOwnership(app, self.topics), scraped=settings.web_port is not None)
        self._reported: dict[str, int] = {}
        self.states = RunStates(app, table, self.metrics, self.behind)
        self.checkpoints = Checkpoints(self.states, self._ack, settings.flush_interval, self._finished)
        # (when the consumer's poll returned it, when it was fed, the batch), not taken yet
        self.pending: deque[tuple[float, float, list[Message]]] = deque()
        self.polled_at = self.fed_at = 0.0  # of the batch being taken
        # Stage clocks for the latency benchmark; None (the default) costs nothing per event.
        self.trace = StageTrace(settings.trace_stages) if settings.trace_stages else None
        self.in_flight = 0  # fed, not finished yet
        self._fed = asyncio.Event()
        self._drained = asyncio.Event()
        self._transactional: dict[int, str] = {}

    # -- intake ------------------------------------------------------------

    def feed(self, messages: list[Message], polled_at: float) -> None:
        """A batch fetched by the consumer (already tracked for commits)."""
        self.pending.append((polled_at, time.time(), messages))
        self.in_flight += len(messages)
        self._fed.set()

    def room(self) -> Awaitable[None] | None:
        """None while fewer than ``max_in_flight`` events are unfinished."""
        if self.in_flight < self.settings.max_in_flight:
            return None
        self._drained.clear()
        return self._drained.wait()

    def behind(self) -> bool:
        """Whether at least half of ``max_in_flight`` events are unfinished:
        the worker is not keeping up, so its verdicts wait in that backlog
        rather than behind a changelog batch, and its changelog batches are
        larger (``Producer.records_batch_bytes_behind``).
        Keeping up, about a checkpoint's events are in flight (1,000-2,000
        at 2,000 calls/s against a limit of 20,000)."""
        return self.in_flight * 2 >= self.settings.max_in_flight

    def fetches_held(self, held: bool) -> None:
        self.metrics.fetch_held.set(held)
        log.debug("fetches %s", "held" if held else "released", extra={"fields": {"event": "fetch_hold", "held": held}})

    async def run(self) -> None:
        """Take every fed event in order, for as long as the worker runs.

        Events taken are acknowledged by their checkpoint only; Faust waits
        for that before it stops or rebalances. If this task stops, whatever
        was not acknowledged is redelivered."""
        finisher = asyncio.ensure_future(self._finish_checkpoints())
        pending = self.pending
        checkpoints = self.checkpoints
        batch_size = self.settings.batch_size
        try:
            while True:
                if not pending:
                    self._fed.clear()
                    await self._fed.wait()
                    continue
                self.polled_at, self.fed_at, batch = pending.popleft()
                for n, message in enumerate(batch, 1):
                    await self.take(message)
                    if len(checkpoints.open.messages) >= batch_size:
                        checkpoints.close()
                    if n % TAKES_PER_YIELD == 0:
                        await asyncio.sleep(0)  # the producer, finisher and timers get their turn
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            _exit_for_redelivery("cannot take an event", exc)
        finally:
            finisher.cancel()

    async def _finish_checkpoints(self) -> None:
        try:
            await self.checkpoints.run()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # Verdicts could not be delivered (or the table refused a write):
            # nothing of this checkpoint was acknowledged, so exiting now makes
            # Kafka redeliver it; going on could commit past it.
            _exit_for_redelivery("cannot finish a batch", exc)

    def _ack(self, message: Message) -> None:
        self.app.consumer.ack(message)

    def _finished(self, checkpoint: Checkpoint) -> None:
        metrics = self.metrics
        metrics.batch(time.perf_counter() - checkpoint.started if metrics.scraped else None)
        self.in_flight -= checkpoint.size
        self._drained.set()
        if self.trace is not None:
            self.trace.flush()

    async def take(self, message: Message) -> None:
        """Decode, apply, send; the event joins the open checkpoint."""
        raw = message.value
        metrics = self.metrics
        trace = self.trace
        if trace is not None:
            taken = time.time()
        if metrics.scraped:
            started = time.perf_counter()
            metrics.offset_seen(message.tp, message.offset)
        tid = self._transactional_id(message.partition) if self.exactly_once else None
        checkpoint = self.checkpoints.join(message)
        try:
            if not raw:
                if raw.__class__ is Oversized:  # a whole batch refused as it was fetched
                    raise BadEvent("batch_too_large", raw.reason)
                raise BadEvent("empty", "empty message: no value")
            if len(raw) > self.settings.max_event_bytes:
                limit = self.settings.max_event_bytes
                raise BadEvent("too_large", f"event too large: {len(raw)} bytes (limit {limit})")
            decoded = decode_event(raw)
            key = decoded.run_id.encode()
            if message.key != key:
                raise BadEvent(
                    "key_mismatch", f"message key {_show_key(message.key)} is not the event's run_id {decoded.run_id!r}"
                )
            route = self.topics[message.topic]
            reply = getattr(decoded, "reply_partition", UNSET)
            reply = None if reply is UNSET else reply  # None: the run id's partition
            if reply is not None and reply >= route.partitions:
                raise BadEvent(
                    "reply_partition",
                    f"reply_partition {reply} is not a partition of {route.decisions} (it has {route.partitions})",
                )
            slot = (message.partition, route.prefix + key)
            entry = self.states.load(slot)
            try:
                outcome = apply_safely(
                    entry.stored.state, decoded, self.config, self.policy, self.settings.max_seq_jump
                )
            except BadEvent:
                raise
            except Exception as exc:  # an engine bug must not stop the fleet
                log.exception(
                    "engine failed on an event",
                    extra={"fields": {"event": "engine_error", "run_id": decoded.run_id, "seq": decoded.seq}},
                )
                raise BadEvent("engine_error", f"engine error: {type(exc).__name__}: {exc}") from None
        except BadEvent as exc:
            checkpoint.sent.append(await self._dead_letter(message, exc, tid))
            return
        self.states.hold(slot, entry, checkpoint)
        touched = checkpoint.touch(slot, entry)
        metrics.outcome(type(decoded).__struct_config__.tag, outcome)
        if metrics.scraped:
            metrics.processed(time.perf_counter() - started)
        if outcome.duplicate:
            return
        entry.stored.state = outcome.state
        touched.dirty = True
        for verdict in outcome.verdicts:
            data = encode_verdict(verdict)
            if len(data) > MAX_VERDICT_BYTES:
                data = self._shrunk(verdict, len(data))
            sent = await self.app.producer.send(route.decisions, key, data, reply, None, None, transactional_id=tid)
            checkpoint.sent.append(sent)
            if metrics.scraped:
                metrics.verdict_sent(decoded.ts)
            if trace is not None:
                trace.sent(decoded.run_id, decoded.seq, decoded.ts, self.polled_at, self.fed_at, taken, sent)
            if verdict.decision != "allow":
                self._log_verdict(verdict, route.tenant)
        if outcome.armed:
            logs.event(
                log,
                logging.INFO,
                f"post-compaction guard armed for {outcome.armed} attempts",
                event="guard_armed",
                run_id=decoded.run_id,
                seq=decoded.seq,
                attempts=outcome.armed,
            )

    def _shrunk(self, verdict: Verdict, size: int) -> bytes:
        """A verdict too large for one message, with its long strings cut."""
        self.metrics.verdicts_shrunk.inc()
        logs.event(
            log,
            logging.ERROR,
            "verdict too large; long fields shortened",
            event="verdict_shrunk",
            run_id=verdict.run_id[:200],
            seq=verdict.seq,
            size=size,
        )
        changes = {}
        for name in ("run_id", "tool_call_id", "tool_name", "message", "warning_key", "paired_tool_name"):
            value = getattr(verdict, name)
            if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
                changes[name] = value[:MAX_FIELD_CHARS] + "…[truncated]"
        return encode_verdict(msgspec.structs.replace(verdict, **changes))

    def _transactional_id(self, partition: int) -> str:
        tid = self._transactional.get(partition)
        if tid is None:
            group = self.app.assignor.group_for_topic(self.settings.topics.events)
            tid = self._transactional[partition] = f"{self.app.conf.id}-{group}-{partition}"
        return tid

    async def _dead_letter(self, message: Message, refusal: BadEvent, tid: str | None) -> Awaitable[Any]:
        """Send the refused event to the dead-letter topic; it counts as
        dead-lettered once the broker has acknowledged it. A dead letter the
        producer refuses outright (larger than it may send) is logged and
        counted as ``deadletter_failed``: it stays only in its source topic,
        and the worker goes on rather than fail on it at every restart."""
        kind, reason = refusal.kind, str(refusal)
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
            (topics.HEADER_REASON, reason.encode("utf-8", "replace")),
            (topics.HEADER_KIND, kind.encode()),
            (topics.HEADER_SOURCE_TOPIC, str(message.topic).encode()),
            (topics.HEADER_SOURCE_PARTITION, str(message.partition).encode()),
            (topics.HEADER_SOURCE_OFFSET, str(message.offset).encode()),
        ]
        try:
            future = await self.app.producer.send(
                self.deadletter, message.key, message.value, None, None, headers, transactional_id=tid
            )
        except Exception as exc:
            self.metrics.deadletter_failed.inc()
            logs.event(
                log,
                logging.ERROR,
                "cannot dead-letter an event; it stays only in its source topic",
                event="deadletter_failed",
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            return _done()

        def delivered(sent: asyncio.Future[Any]) -> None:
            if sent.cancelled() or sent.exception() is not None:
                return  # the checkpoint fails on it: nothing acknowledged, the event comes again
            self.metrics.deadletter(kind)

        future.add_done_callback(delivered)
        return future

    def _log_verdict(self, verdict: Verdict, tenant: str | None) -> None:
        decision = verdict.decision
        logs.event(
            log,
            logging.ERROR if decision == "abort" else logging.WARNING,
            {"warn": "warning delivered", "block": "tool call blocked", "abort": "run aborted"}[decision],
            event=decision,
            **({"tenant": tenant} if tenant is not None else {}),
            run_id=verdict.run_id,
            seq=verdict.seq,
            tool=verdict.tool_name,
            detector=verdict.detector,
            count=verdict.count,
            warning_key=verdict.warning_key,
            **({"error": verdict.error} if decision == "abort" else {}),
        )

    # -- timers ------------------------------------------------------------

    async def sweep(self) -> int:
        """Expire runs idle longer than the TTL (streams.worker.store.RunStates.sweep)."""
        expired = await self.states.sweep(self.settings.ttl)
        if expired:
            self.metrics.expired.inc(expired)
            logs.event(log, logging.INFO, "idle runs expired", event="expired", runs=expired, ttl=self.settings.ttl)
        return expired

    async def report(self, final: bool = False) -> None:
        """A summary line when something happened since the last one."""
        counts = self.metrics.summary()
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
