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
gateways. All public methods are thread-safe. `GuardClient` numbers the
events and ties together the parts beside it: the publisher, the decision
reader, the waiters (verdicts matched to checks), the runs, the fallback
verdict and local hashing.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from schemas import topics
from schemas.events import MAX_TURN_CHARS, Event, ToolCall, ToolResult
from streams.client.local_hashing import local_call_fields, local_outcome_fields, minimal_args
from streams.client.endpoint import Endpoint
from streams.client.publisher import Publisher, WireCompaction, WireRunEnd, WireToolCall, WireToolResult
from streams.client.reader import DecisionReader
from streams.client.runs import Call, Run, Runs
from streams.client.verdict import POLICIES, ClientVerdict, Policy, decode_verdict, fallback
from streams.client.waiters import Waiter, Waiters
from streams.engine.hashing import classify
from streams.engine.stablejson import normalize_payload
from streams.kafka.clients import PLAINTEXT, KafkaSecurity

log = logging.getLogger("loopwarden.client")


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
        self.stats: collections.Counter[str] = collections.Counter()
        """published, publish_failed, verdicts, duplicates, late, foreign (answers to seqs this client did not
        publish), timeouts, fail_open, fail_closed, aborts, read_bytes (keys and values read from the decisions topic)"""
        endpoint = Endpoint(bootstrap_servers, security, client_id, self.stats)
        self._publisher = Publisher(endpoint, self.events_topic, dict(producer_config or {}))
        self._reader = DecisionReader(
            endpoint,
            self.decisions_topic,
            dict(consumer_config or {}),
            self._publisher.partitions,
            self._deliver,
            reply_partition,
            instance_id,
        )
        self._runs = Runs(remember_ended_runs)
        self._waiters = Waiters(dedupe_window)
        self._call_ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]

    @property
    def reply_partition(self) -> int | None:
        """The decisions partition this client reads and names on its events
        (from `instance_id` once the reader knows the partition count); None: all of them."""
        return self._reader.reply_partition

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> GuardClient:
        """Connect the producer and start the decision reader; returns self."""
        if self._reader.thread is not None:
            return self
        self._publisher.start(self.timeout)
        self._reader.start()
        if not self._reader.ready.wait(self.start_timeout):
            log.warning(
                "loopwarden: decision reader not ready after %.1fs (topic %s); checks follow %s until it is",
                self.start_timeout,
                self.decisions_topic,
                self.policy,
            )
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Flush pending events, stop the reader; pending checks fall back."""
        self._reader.stop()
        self._publisher.close(timeout)
        self._reader.join(timeout)
        self._waiters.fail_all("closed")

    def __enter__(self) -> GuardClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ready(self) -> bool:
        """True once the decision reader is positioned and reading."""
        return self._reader.ready.is_set()

    # -- runs --------------------------------------------------------------

    def begin_run(self, run_id: str, *, first_seq: int = 0) -> None:
        """Declare a run explicitly, e.g. one resumed after a gateway restart
        whose next seq was persisted. Not needed otherwise: a run starts at
        seq 0 on its first event."""
        self._runs.begin(run_id, first_seq)

    def aborted(self, run_id: str) -> ClientVerdict | None:
        """The abort verdict of a run, if loopwarden aborted it (from a call's
        or a result's verdict)."""
        run = self._runs.get(run_id)
        return run.aborted if run else None

    def _publish(self, run: Run, event: Event, waiter: Waiter | None) -> int:
        """Stamp the event, assign the run's next seq and send, under the
        run's lock so that seq order is send order. Returns the seq."""
        event.ts = time.time()
        with run.lock:
            seq = event.seq = run.next_seq
            run.next_seq += 1
            if waiter is not None:
                self._waiters.add((event.run_id, seq), waiter)
            if self.reply_partition is not None and isinstance(event, (ToolCall, ToolResult)):
                event.reply_partition = self.reply_partition  # the events a verdict may answer
            self._publisher.send(event, waiter)
        return seq

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
        event = WireToolCall(
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
        run = self._runs.open(run_id)
        if agent_id is not None and run.agent_id is None:
            run.agent_id = agent_id
        waiter = Waiter()
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
        self._waiters.discard((call.run_id, call.seq))
        call._waiter = None
        if got and waiter.verdict is not None:
            if waiter.verdict.decision == "abort":
                self._mark_aborted(call.run_id, waiter.verdict)
            return waiter.verdict
        reason = waiter.error or ("timeout" if self.ready else "timeout (decision reader not ready)")
        if reason.startswith("timeout"):
            self.stats["timeouts"] += 1
        self.stats[self.policy] += 1
        return fallback(self.policy, reason, limit, call.run_id, call.seq, call.tool_call_id, call.tool_name)

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
        event = WireToolResult(run_id=call.run_id, seq=0, tool_call_id=call.tool_call_id, tool_name=call.tool_name)
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
        run = self._runs.open(call.run_id)
        waiter = Waiter() if wait and run.compacted and run.aborted is None else None
        seq = self._publish(run, event, waiter)
        if waiter is None:
            return None
        waiter.done.wait(wait)
        self._waiters.discard((call.run_id, seq))
        if waiter.verdict is not None and waiter.verdict.decision == "abort":
            self._mark_aborted(call.run_id, waiter.verdict)
        return waiter.verdict

    def compaction(self, run_id: str, *, agent_id: str | None = None) -> int:
        """Publish a compaction retry (arms the post-compaction guard); returns its seq."""
        run = self._runs.open(run_id)
        run.compacted = True
        return self._publish(run, WireCompaction(run_id=run_id, seq=0, agent_id=agent_id), None)

    def run_end(self, run_id: str) -> int:
        """Publish the end of a run (frees its state in loopwarden); returns its seq.

        The run's next seq is remembered (bounded), so a run id used again
        continues numbering above it, as loopwarden requires."""
        run = self._runs.open(run_id)
        seq = self._publish(run, WireRunEnd(run_id=run_id, seq=0), None)
        self._runs.end(run_id, run)
        return seq

    def flush(self, timeout: float | None = None) -> None:
        """Block until every published event is acknowledged by the broker."""
        self._publisher.flush(timeout)

    # -- verdicts ----------------------------------------------------------

    def _mark_aborted(self, run_id: str, verdict: ClientVerdict) -> None:
        if self._runs.mark_aborted(run_id, verdict):
            self.stats["aborts"] += 1

    def _deliver(self, key: bytes | None, value: bytes) -> None:
        """One message from the decisions topic (runs on the reader thread)."""
        if key is None:
            return
        try:
            run_id = key.decode()
        except UnicodeDecodeError:
            return
        run = self._runs.get(run_id)
        if run is None:
            return  # another gateway's run: not even decoded
        try:
            verdict = decode_verdict(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("loopwarden: unreadable verdict for run %s: %s", run_id, exc)
            return
        if verdict.run_id != run_id or not run.published(verdict.seq):
            # Not an answer to an event this client published (another
            # process's events under the same run id): it must not end the run.
            self.stats["foreign"] += 1
            return
        new, waiter = self._waiters.match((verdict.run_id, verdict.seq))
        if not new:
            self.stats["duplicates"] += 1
            return
        self.stats["verdicts"] += 1
        if verdict.decision == "abort":
            self._mark_aborted(verdict.run_id, verdict)
        if waiter is not None:
            waiter.resolve(verdict)
        elif verdict.decision != "abort":
            self.stats["late"] += 1  # its check already gave up (or it is a result's)
