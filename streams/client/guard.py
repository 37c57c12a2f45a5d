"""The gateway client: publish a run's events, wait for each call's verdict.

A gateway embeds one `GuardClient` per process::

    client = GuardClient("kafka:9092", policy="fail_open", timeout=2.0)
    client.start()
    call = client.tool_call(run_id, "exec", {"command": "make test"}, agent_id="builder")
    verdict = client.check(call)  # waits for loopwarden's answer
    if verdict.allowed:  # allow or warn (show verdict.message on warn)
        result = run_the_tool(...)
        client.tool_result(call, result=result)
    else:  # block or abort: do not run the tool
        ...
    client.run_end(run_id)
    client.close()

What it does for the gateway:

- numbers every event of a run (`seq`, 0, 1, 2 …, per run) and publishes it
  to the events topic keyed by run id, so a run lands on one partition in order;
- reads the decisions topic on one background thread and hands each verdict
  to the `check` waiting for it, matched by `(run_id, seq)`; a verdict seen
  twice (at-least-once delivery) is dropped the second time;
- when no verdict comes within `timeout`, or the event cannot be published,
  follows the configured policy: `fail_open` allows the call and logs a
  warning, `fail_closed` blocks it. The returned verdict then has
  `fallback` set to the policy applied and `fallback_reason` saying why, and
  a message that says so;
- optional local hashing (`local_hashing=True`): args and results are hashed
  in the gateway with the engine's own code and only hashes, tool names and
  the few args the engine needs to classify a call (`{"action": ...}` for
  `process` and `message`) are published. Tool arguments and outputs then
  never leave the gateway; see docs/CLIENT.md for the trade-off.

Built on kafka-python (no asyncio), so it fits threaded and synchronous
gateways. All public methods are thread-safe.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
from kafka.partitioner.default import murmur2
from msgspec import UNSET

from schemas.events import MAX_TURN_CHARS, Compaction, Event, RunEnd, ToolCall, ToolResult
from schemas import topics
from schemas.verdicts import Verdict
from streams.kafka import clients as kafka_clients
from streams.kafka.clients import PLAINTEXT, KafkaSecurity
from streams.engine.hashing import args_hash as engine_args_hash
from streams.engine.hashing import classify, result_outcome, wire_fields
from streams.engine.stablejson import normalize_payload

Policy = Literal["fail_open", "fail_closed"]
POLICIES: tuple[str, ...] = ("fail_open", "fail_closed")

log = logging.getLogger("loopwarden.client")


class ClientVerdict(Verdict, kw_only=True):
    """A verdict as the gateway sees it: the wire `Verdict`, plus whether it
    came from loopwarden or from the client's fallback policy.

    `fallback` is None for a real verdict, else the policy applied
    (`"fail_open"` or `"fail_closed"`); `fallback_reason` then says why
    (`"timeout"`, `"publish_failed: …"`, `"closed"`)."""

    fallback: Literal["fail_open", "fail_closed"] | None = None
    fallback_reason: str | None = None

    @property
    def allowed(self) -> bool:
        """True when the tool may run (allow or warn)."""
        return self.decision in ("allow", "warn")

    @property
    def is_fallback(self) -> bool:
        return self.fallback is not None


_verdict_decoder = msgspec.json.Decoder(ClientVerdict)
_encode = msgspec.json.encode


# The wire events, written without the fields left at their defaults (the
# worker reads those as absent): an event carries only what the gateway gave.
class _ToolCall(ToolCall, omit_defaults=True):
    pass


class _ToolResult(ToolResult, omit_defaults=True):
    pass


class _Compaction(Compaction, omit_defaults=True):
    pass


class _RunEnd(RunEnd, omit_defaults=True):
    pass


def minimal_args(tool: str, args: Any) -> Any:
    """The part of a call's args that the engine needs besides the hash:
    `{"action": …}` for `process` and `message` (it decides whether the call
    polls or sends, and so how its result is hashed); nothing for other tools."""
    if tool in ("process", "message") and isinstance(args, dict) and isinstance(args.get("action"), str):
        return {"action": args["action"]}
    return UNSET


def local_call_fields(tool_name: str, norm_args: Any) -> dict[str, Any]:
    """What a locally hashing gateway publishes of a call's args (normalised
    by `normalize_payload`): the args hash and `minimal_args`."""
    fields: dict[str, Any] = {"args_hash": engine_args_hash(tool_name, norm_args)}
    small = minimal_args(tool_name, norm_args)
    if small is not UNSET:
        fields["args"] = small
    return fields


def local_outcome_fields(tool_name: str, kind: int, result: Any, error: Any) -> dict[str, Any]:
    """What a locally hashing gateway publishes of a call's outcome instead of
    the result or error itself: every field of spec §7.5 the payload gives
    (`kind` is how its call was classified). The OpenClaw plugin computes the
    same fields; tests/vectors/hashing.json pins both."""
    return wire_fields(
        result_outcome(
            tool_name,
            kind,
            normalize_payload(result) if result is not UNSET else UNSET,
            normalize_payload(error) if error is not UNSET else UNSET,
        )
    )


@dataclass(slots=True)
class Call:
    """A published tool call: pass it to `check` and then to `tool_result`.

    `args` is kept in memory only (for hashing the result locally, or for
    repeating the args on the result event); it is never logged."""

    run_id: str
    seq: int
    tool_call_id: str
    tool_name: str
    args: Any = UNSET
    args_hash: str | None = None
    kind: int = 0  # how the call was classified: how its result is hashed locally
    published_at: float = 0.0
    _waiter: _Waiter | None = field(default=None, repr=False)


class _Waiter:
    __slots__ = ("done", "error", "verdict")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.verdict: ClientVerdict | None = None
        self.error: str | None = None

    def resolve(self, verdict: ClientVerdict) -> None:
        if not self.done.is_set():
            self.verdict = verdict
            self.done.set()

    def fail(self, error: str) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


class _Run:
    __slots__ = ("agent_id", "aborted", "compacted", "first_seq", "lock", "next_seq")

    def __init__(self, next_seq: int) -> None:
        self.lock = threading.Lock()
        self.first_seq = next_seq  # seqs in [first_seq, next_seq) are this client's
        self.next_seq = next_seq
        self.compacted = False  # only then can a result abort the run
        self.agent_id: str | None = None
        self.aborted: ClientVerdict | None = None


class GuardClient:
    """Publishes a run's events and waits for verdicts. See the module docs.

    Parameters:
        bootstrap_servers: Kafka bootstrap address(es).
        events_topic / decisions_topic: topic names; by default `$LOOPWARDEN_EVENTS_TOPIC` and
            `$LOOPWARDEN_DECISIONS_TOPIC` (a tenant's gateway.env sets them), else the worker's defaults.
        timeout: seconds `check` waits for a verdict before the policy applies.
        policy: `"fail_open"` (allow, log a warning) or `"fail_closed"` (block).
        local_hashing: hash args and results in the gateway; send only hashes.
        client_id: Kafka client id (shows in broker logs and quotas).
        start_timeout: seconds `start()` waits for the decision reader to be
            positioned; if it is not ready by then, `start()` logs a warning and
            returns, and checks follow the policy until it is.
        security: TLS and SASL settings (`kafka_clients.security_from()` reads
            the `LOOPWARDEN_*` variables); plaintext when not given.
        reply_partition / instance_id: read only this partition of the
            decisions topic (or the one a message keyed by `instance_id`
            goes to), and name it on every call and result, so the worker
            publishes their verdicts there; neither: read every partition.
        producer_config / consumer_config: extra kafka-python settings.
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        events_topic: str | None = None,
        decisions_topic: str | None = None,
        timeout: float = 5.0,
        policy: Policy = "fail_open",
        local_hashing: bool = False,
        client_id: str = "loopwarden-gateway",
        start_timeout: float = 15.0,
        security: KafkaSecurity = PLAINTEXT,
        producer_config: dict[str, Any] | None = None,
        consumer_config: dict[str, Any] | None = None,
        remember_ended_runs: int = 10_000,
        dedupe_window: int = 100_000,
        reply_partition: int | None = None,
        instance_id: str | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if reply_partition is not None and instance_id is not None:
            raise ValueError("give reply_partition or instance_id, not both")
        if reply_partition is not None and reply_partition < 0:
            raise ValueError(f"reply_partition must not be negative, got {reply_partition!r}")
        if instance_id is not None and not instance_id:
            raise ValueError("instance_id must be a non-empty string")
        self.bootstrap_servers = bootstrap_servers
        self.events_topic = events_topic or topics.events_topic()
        self.decisions_topic = decisions_topic or topics.decisions_topic()
        self.timeout = timeout
        self.policy: Policy = policy
        self.local_hashing = local_hashing
        self.client_id = client_id
        self.start_timeout = start_timeout
        self.security = security
        self.instance_id = instance_id
        self.reply_partition = reply_partition
        """The decisions partition this client reads and names on its events
        (from `instance_id` once the reader knows the partition count); None: all of them."""
        self._producer_config = dict(producer_config or {})
        self._consumer_config = dict(consumer_config or {})
        self._producer: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._ended: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._remember_ended = remember_ended_runs
        self._waiters: dict[tuple[str, int], _Waiter] = {}
        self._seen: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        self._dedupe_window = dedupe_window
        self._call_ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self.stats: collections.Counter[str] = collections.Counter()
        """published, publish_failed, verdicts, duplicates, late, foreign (answers to seqs this client did not
        publish), timeouts, fail_open, fail_closed, aborts, read_bytes (keys and values read from the decisions topic)"""

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> GuardClient:
        """Connect the producer and start the decision reader; returns self."""
        if self._thread is not None:
            return self
        config: dict[str, Any] = {
            "client_id": self.client_id,
            "acks": "all",
            "enable_idempotence": True,  # retries never reorder or double a run's events
            "linger_ms": 0,
            "max_block_ms": max(100, int(self.timeout * 1000)),
            "retries": 5,
            # A known protocol version: the constructor then does not block
            # probing the broker, so a gateway starts even while Kafka is down
            # (its checks follow the policy until Kafka is back).
            "api_version": (3, 0),
            "reconnect_backoff_max_ms": 2000,  # back within ~2 s of the broker
        }
        config.update(self._producer_config)
        self._producer = kafka_clients.producer(self.bootstrap_servers, security=self.security, **config)
        self._stop.clear()
        self._thread = threading.Thread(target=self._read_decisions, name="loopwarden-decisions", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.start_timeout):
            log.warning(
                "loopwarden: decision reader not ready after %.1fs (topic %s); checks follow %s until it is",
                self.start_timeout,
                self.decisions_topic,
                self.policy,
            )
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Flush pending events, stop the reader; pending checks fall back."""
        self._stop.set()
        if self._producer is not None:
            try:
                self._producer.flush(timeout=timeout)
            except Exception as exc:  # closing must not raise on a dead broker
                log.warning("loopwarden: flush on close failed: %s", exc)
            self._producer.close(timeout=timeout)
            self._producer = None
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            waiters = list(self._waiters.values())
            self._waiters.clear()
        for waiter in waiters:
            waiter.fail("closed")

    def __enter__(self) -> GuardClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ready(self) -> bool:
        """True once the decision reader is positioned and reading."""
        return self._ready.is_set()

    # -- runs --------------------------------------------------------------

    def begin_run(self, run_id: str, *, first_seq: int = 0) -> None:
        """Declare a run explicitly, e.g. one resumed after a gateway restart
        whose next seq was persisted. Not needed otherwise: a run starts at
        seq 0 on its first event."""
        with self._lock:
            if run_id not in self._runs:
                self._runs[run_id] = _Run(first_seq)

    def aborted(self, run_id: str) -> ClientVerdict | None:
        """The abort verdict of a run, if loopwarden aborted it (from a call's
        or a result's verdict)."""
        with self._lock:
            run = self._runs.get(run_id)
            return run.aborted if run else None

    def _run(self, run_id: str) -> _Run:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = _Run(self._ended.pop(run_id, 0))
            return run

    def _publish(self, run: _Run, event: Event, waiter: _Waiter | None) -> int:
        """Stamp the event, assign the run's next seq and send, under the
        run's lock so that seq order is send order. Returns the seq."""
        event.ts = time.time()
        with run.lock:
            seq = event.seq = run.next_seq
            run.next_seq += 1
            if waiter is not None:
                with self._lock:
                    self._waiters[(event.run_id, seq)] = waiter
            if self.reply_partition is not None and isinstance(event, (ToolCall, ToolResult)):
                event.reply_partition = self.reply_partition  # the events a verdict may answer
            self._send(event.run_id, seq, event, waiter)
        return seq

    def _send(self, run_id: str, seq: int, event: Event, waiter: _Waiter | None) -> None:
        producer = self._producer
        if producer is None:
            self._publish_failed(run_id, seq, waiter, "client not started")
            return
        try:
            future = producer.send(self.events_topic, key=run_id.encode(), value=_encode(event))
        except Exception as exc:  # KafkaTimeoutError when metadata is unavailable, etc.
            self._publish_failed(run_id, seq, waiter, f"{type(exc).__name__}: {exc}")
            return
        self.stats["published"] += 1
        future.add_errback(lambda exc: self._publish_failed(run_id, seq, waiter, f"{type(exc).__name__}: {exc}"))

    def _publish_failed(self, run_id: str, seq: int, waiter: _Waiter | None, error: str) -> None:
        self.stats["publish_failed"] += 1
        log.warning("loopwarden: cannot publish event run=%s seq=%s: %s", run_id, seq, error)
        if waiter is not None:
            waiter.fail(f"publish_failed: {error}")

    # -- events ------------------------------------------------------------

    def tool_call(
        self,
        run_id: str,
        tool_name: str,
        args: Any = UNSET,
        *,
        tool_call_id: str | None = None,
        agent_id: str | None = None,
        session_key: str | None = None,
        args_hash: str | None = None,
        turn: str | None = None,
    ) -> Call:
        """Publish a tool call; returns the `Call` to pass to `check` and `tool_result`.

        `args` may be omitted (hashed as "no args"); `args_hash` lets a
        gateway that already hashes pass its own. `agent_id` picks the
        per-agent config; the run keeps the first one it is given. `turn`
        names the model response that made the call: publish all calls of a
        turn, then `check_turn` them together (spec §8.1)."""
        if not tool_name:
            raise ValueError("tool_name must be a non-empty string")
        if turn is not None and not 1 <= len(turn) <= MAX_TURN_CHARS:
            raise ValueError(f"turn must be a string of 1 to {MAX_TURN_CHARS} characters, got {len(turn)}")
        call_id = tool_call_id or f"lw-{self._prefix}-{next(self._call_ids)}"
        norm_args = normalize_payload(args) if args is not UNSET else UNSET
        kind = classify(tool_name, norm_args)
        event = _ToolCall(
            run_id=run_id, seq=0, tool_call_id=call_id, tool_name=tool_name, agent_id=agent_id, session_key=session_key
        )
        if turn is not None:
            event.turn = turn
        if self.local_hashing:
            fields = local_call_fields(tool_name, norm_args)
            args_hash = event.args_hash = args_hash or fields["args_hash"]
            event.args = fields.get("args", UNSET)
        else:
            event.args = args
            event.args_hash = args_hash or None
        run = self._run(run_id)
        if agent_id is not None and run.agent_id is None:
            run.agent_id = agent_id
        waiter = _Waiter()
        call = Call(run_id, -1, call_id, tool_name, args, args_hash, kind, time.monotonic(), waiter)
        call.seq = self._publish(run, event, waiter)
        return call

    def check(self, call: Call, timeout: float | None = None) -> ClientVerdict:
        """Wait for the verdict of `call`; never raises for a missing verdict.

        Returns loopwarden's verdict, or, on timeout or publish failure, a
        fallback verdict per the policy (`verdict.fallback` is set)."""
        waiter = call._waiter
        if waiter is None:
            raise ValueError(f"call run={call.run_id} seq={call.seq} was already checked")
        limit = self.timeout if timeout is None else timeout
        got = waiter.done.wait(limit)
        with self._lock:
            self._waiters.pop((call.run_id, call.seq), None)
        call._waiter = None
        if got and waiter.verdict is not None:
            if waiter.verdict.decision == "abort":
                self._mark_aborted(call.run_id, waiter.verdict)
            return waiter.verdict
        reason = waiter.error or ("timeout" if self._ready.is_set() else "timeout (decision reader not ready)")
        if reason.startswith("timeout"):
            self.stats["timeouts"] += 1
        return self._fallback(call, reason, limit)

    def check_turn(self, calls: Sequence[Call], timeout: float | None = None) -> list[ClientVerdict]:
        """The verdicts of one turn's calls, waiting at most `timeout` for all of them.

        A gateway runs the turn only when every verdict allows its call, and
        otherwise runs none and reports each call's `tool_result` as a veto
        (`{"details": {"status": "blocked", "deniedReason": "tool-loop"}}`):
        that is the reference gateway's "the first critical loop blocks the
        whole batch" (spec §8.1)."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        return [self.check(call, max(0.0, deadline - time.monotonic())) for call in calls]

    def guard(self, run_id: str, tool_name: str, args: Any = UNSET, **kwargs: Any) -> tuple[Call, ClientVerdict]:
        """`tool_call` and `check` in one step: returns (call, verdict).

        Once the run is aborted nothing more is published for it: the call
        (seq -1, never sent) is answered with the stored abort."""
        timeout = kwargs.pop("timeout", None)
        aborted = self.aborted(run_id)
        if aborted is not None:
            call_id = kwargs.get("tool_call_id") or f"lw-{self._prefix}-{next(self._call_ids)}"
            return Call(run_id, -1, call_id, tool_name, args), aborted
        call = self.tool_call(run_id, tool_name, args, **kwargs)
        return call, self.check(call, timeout)

    def tool_result(
        self,
        call: Call,
        *,
        result: Any = UNSET,
        error: Any = UNSET,
        result_hash: str | None = None,
        wait: float | None = None,
    ) -> ClientVerdict | None:
        """Publish the outcome of a call that ran.

        Pass the tool's `result` (the object with `content`/`details`), or
        `error` (message text) when it failed. A result gets a verdict only
        when the post-compaction guard aborts the run; with `wait` (seconds)
        this returns that abort verdict if it comes in time, else None. As
        no verdict means "not aborted", waiting costs the full `wait` for
        such results, so it is skipped for runs that have had no compaction
        (only those can be aborted). Without `wait` an abort is still
        recorded (`aborted(run_id)`) and the run's next call is answered
        `abort` anyway."""
        event = _ToolResult(run_id=call.run_id, seq=0, tool_call_id=call.tool_call_id, tool_name=call.tool_name)
        if self.local_hashing:
            event.args_hash = call.args_hash
            event.args = minimal_args(call.tool_name, normalize_payload(call.args) if call.args is not UNSET else UNSET)
            if result_hash is None:
                fields = local_outcome_fields(call.tool_name, call.kind, result, error)
                result_hash = fields.pop("result_hash", None)
                for name, value in fields.items():
                    setattr(event, name, value)
        else:
            event.args = call.args
            event.result = result
            event.error = error
        event.result_hash = result_hash
        run = self._run(call.run_id)
        waiter = _Waiter() if wait and run.compacted and run.aborted is None else None
        seq = self._publish(run, event, waiter)
        if waiter is None:
            return None
        waiter.done.wait(wait)
        with self._lock:
            self._waiters.pop((call.run_id, seq), None)
        if waiter.verdict is not None and waiter.verdict.decision == "abort":
            self._mark_aborted(call.run_id, waiter.verdict)
        return waiter.verdict

    def compaction(self, run_id: str, *, agent_id: str | None = None) -> int:
        """Publish a compaction retry (arms the post-compaction guard); returns its seq."""
        run = self._run(run_id)
        run.compacted = True
        return self._publish(run, _Compaction(run_id=run_id, seq=0, agent_id=agent_id), None)

    def run_end(self, run_id: str) -> int:
        """Publish the end of a run (frees its state in loopwarden); returns its seq.

        The run's next seq is remembered (bounded), so a run id used again
        continues numbering above it, as loopwarden requires."""
        run = self._run(run_id)
        seq = self._publish(run, _RunEnd(run_id=run_id, seq=0), None)
        with self._lock:
            self._runs.pop(run_id, None)
            self._ended[run_id] = run.next_seq
            while len(self._ended) > self._remember_ended:
                self._ended.popitem(last=False)
        return seq

    def flush(self, timeout: float | None = None) -> None:
        """Block until every published event is acknowledged by the broker."""
        if self._producer is not None:
            self._producer.flush(timeout=timeout)

    # -- verdicts ----------------------------------------------------------

    def _fallback(self, call: Call, reason: str, limit: float) -> ClientVerdict:
        policy = self.policy
        self.stats[policy] += 1
        what = "allowed without a loop check" if policy == "fail_open" else "blocked"
        if reason.startswith("timeout"):
            why = f"no verdict within {limit:g}s"
        else:
            why = reason
        message = f"loopwarden unavailable ({why}); policy {policy}: the call was {what}." + (
            "" if policy == "fail_open" else " Retry later or ask an operator to check the loop guard."
        )
        log.warning("loopwarden: run=%s seq=%s tool=%s: %s", call.run_id, call.seq, call.tool_name, message)
        return ClientVerdict(
            run_id=call.run_id,
            seq=call.seq,
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            decision="allow" if policy == "fail_open" else "block",
            level="none" if policy == "fail_open" else "critical",
            message=message,
            fallback=policy,
            fallback_reason=reason,
        )

    def _mark_aborted(self, run_id: str, verdict: ClientVerdict) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None and run.aborted is None:
                run.aborted = verdict
                self.stats["aborts"] += 1

    def _deliver(self, key: bytes | None, value: bytes) -> None:
        """One message from the decisions topic (runs on the reader thread)."""
        if key is None:
            return
        try:
            run_id = key.decode()
        except UnicodeDecodeError:
            return
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            return  # another gateway's run: not even decoded
        try:
            verdict = _verdict_decoder.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("loopwarden: unreadable verdict for run %s: %s", run_id, exc)
            return
        if verdict.run_id != run_id or not run.first_seq <= verdict.seq < run.next_seq:
            # Not an answer to an event this client published (another
            # process's events under the same run id): it must not end the run.
            self.stats["foreign"] += 1
            return
        ident = (verdict.run_id, verdict.seq)
        with self._lock:
            if ident in self._seen:
                self.stats["duplicates"] += 1
                return
            self._seen[ident] = None
            if len(self._seen) > self._dedupe_window:
                self._seen.popitem(last=False)
            waiter = self._waiters.get(ident)
        self.stats["verdicts"] += 1
        if verdict.decision == "abort":
            self._mark_aborted(verdict.run_id, verdict)
        if waiter is not None:
            waiter.resolve(verdict)
        elif verdict.decision != "abort":
            self.stats["late"] += 1  # its check already gave up (or it is a result's)

    def _decision_partitions(self) -> set[int]:
        """The decision topic's partitions, asked through the producer, whose
        wait is bounded by ``max_block_ms``: the consumer's own lookup waits
        without a bound, so with Kafka down the reader would never see
        ``close()``."""
        from kafka.errors import KafkaTimeoutError

        producer = self._producer
        if producer is None:
            raise RuntimeError("client closed")
        try:
            partitions = producer.partitions_for(self.decisions_topic)
        except KafkaTimeoutError:
            partitions = None
        if not partitions:
            raise RuntimeError(f"topic {self.decisions_topic} not found, or Kafka unreachable")
        return partitions

    def _reply_partitions(self, partitions: set[int]) -> set[int]:
        """The partitions to read: the reply partition (resolved from the
        instance id the first time), else all of them."""
        if self.instance_id is not None and self.reply_partition is None:
            hashed = murmur2(self.instance_id.encode()) & 0x7FFFFFFF
            self.reply_partition = sorted(partitions)[hashed % len(partitions)]  # Kafka's partition for the key
        if self.reply_partition is None:
            return partitions
        if self.reply_partition not in partitions:
            raise ValueError(
                f"reply_partition {self.reply_partition} is not a partition of {self.decisions_topic} "
                f"(it has {len(partitions)})"
            )
        return {self.reply_partition}

    def _read_decisions(self) -> None:
        """The reader thread: manual assignment of every partition of the
        decisions topic, positioned at the end (no consumer group, no commits:
        a gateway only needs verdicts for events it publishes from now on)."""
        from kafka import TopicPartition

        consumer = None
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if consumer is None:
                    config: dict[str, Any] = {
                        "client_id": f"{self.client_id}-decisions",
                        "group_id": None,
                        "enable_auto_commit": False,
                        "fetch_max_wait_ms": 100,
                        "api_version": (3, 0),
                        "reconnect_backoff_max_ms": 2000,
                    }
                    config.update(self._consumer_config)
                    partitions = self._reply_partitions(self._decision_partitions())
                    consumer = kafka_clients.consumer(self.bootstrap_servers, security=self.security, **config)
                    tps = [TopicPartition(self.decisions_topic, p) for p in sorted(partitions)]
                    consumer.assign(tps)
                    consumer.seek_to_end(*tps)
                    for tp in tps:
                        consumer.position(tp)  # resolve now: later verdicts are not missed
                    self._ready.set()
                    backoff = 0.2
                batch = consumer.poll(timeout_ms=100)
                for records in batch.values():
                    for record in records:
                        self.stats["read_bytes"] += len(record.value or b"") + len(record.key or b"")
                        self._deliver(record.key, record.value)
            except Exception as exc:  # keep reading across broker outages
                if self._stop.is_set():
                    break
                log.warning("loopwarden: decision reader: %s: %s (retrying)", type(exc).__name__, exc)
                if consumer is not None and not self._ready.is_set():
                    consumer.close()
                    consumer = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        if consumer is not None:
            try:
                consumer.close()
            except Exception:
                pass
